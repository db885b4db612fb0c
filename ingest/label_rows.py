"""A labels file (``--labels FILE``) read one row at a time: CSV in the delimiter its header uses, or JSON Lines.
Pure Python.

A row is one line: no labels file needs a field across lines, so a line that does not parse on its own (an unclosed
quote, text after a closing quote, a NUL, more than ``MAX_ROW_CHARS``) is a bad row named by its number, and the
next line is read as usual (csv would read an unclosed quote on to the end of the file). Rows are yielded as they
are read, so the caller keeps only those that name an input: memory follows the inputs, not what the file claims.

The layout, CSV (any name) or JSON Lines (``.jsonl``/``.ndjson``: one object per line):
  - a header row, each column named once. Names are stripped, folded to Unicode NFC and matched ignoring case
    (``Split``, `` Label ``), so two names that differ only in case are refused. The CSV delimiter is the one
    Excel's first line ``sep=;`` names, else the first of ``,``, tab and ``;`` that the header holds (``;``: a
    spreadsheet's export where the decimal mark is a comma). A header naming an input is no header (``decide``);
  - the path column is the one named ``path``, else the first: a path relative to SRC, ``/`` separators
    (``train/run3.npy``), taken as written (a file name may end in a space); ``labels.decide`` matches it;
  - with ``splits=True`` (images), a column named ``split`` gives the input's split;
  - the label column is the one named ``label``; else every other column (``columns=True``, images: several
    columns are a value label of that many floats), or the one other column (more need a ``label``);
  - in JSON Lines the keys are the columns; a list of names is a multi-label value (``["cat", "outdoor"]``;
    ``["cat"]`` and ``[]`` too), a list of numbers that many columns; numbers are kept as the file writes them;
  - row N is line N of the file (lines end at ``\\n``; the CSV header is row 1, JSON Lines' first object row 1);
    blank lines are skipped; labels are stripped of spaces and folded to NFC (``café`` typed and as macOS writes
    it are one class).
"""

from __future__ import annotations

import dataclasses
import io
import os
import posixpath
import re
import typing

from ..format.errors import InputError
from ..format.names import SPLIT_NAME
from ..format.storage import NotRegularFileError, file_kind, open_regular
from .label_columns import CONTROL, columns_of
from .label_formats import Csv, JsonLines, column_key, fold

MAX_LABELS_BYTES = 1 << 30  # checked before the file is read
# A longer line is a bad row, skipped a piece at a time (never held whole); csv's own field limit, so no field of a
# row that fits is refused by csv.
MAX_ROW_CHARS = 131_072
MAX_LISTED_ROWS = 100  # bad rows naming no input listed in the manifest; the count covers every one
JSON_LINES = (".jsonl", ".ndjson")
_SHOWN = 200  # characters of a bad row kept to name it
_UNSEEN = re.compile("[\x00\ufeff]")  # in no path or label: a NUL (UTF-16 read as UTF-8), a BOM inside the file
_UNCLEAN = re.compile(r"\\|//|/\.")  # what a canonical relative path never holds (with no . or / first)
_SEP_LINE = re.compile(r'sep=([^"\w\s])')  # Excel's first line naming the delimiter: sep=;
_FIX = "fix the labels file (a header row, then one `path,label` row per input)"


@dataclasses.dataclass(frozen=True)
class RowProblem:
    """A row of the labels file that labels nothing: its number, its text (the first ``_SHOWN`` characters), why
    (with the fix), and the input it names when it names one (that input is then left out)."""

    row: int
    text: str
    problem: str
    path: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "text", self.text[:_SHOWN])

    def reason(self, labels_file: str) -> str:
        """``labels.csv row 7: ...``: the reason a skipped row is recorded with."""
        return f"{os.path.basename(labels_file)} row {self.row}: {self.problem}"

    def error(self, labels_file: str) -> InputError:
        """The one-line error of this row when bad rows stop the run."""
        what, _, fix = self.problem.partition("; ")
        return InputError(f"{labels_file}: row {self.row}: {what} (got {self.text!r:.120}); {fix or 'fix the row'}, "
                          "or pass --on-error skip to record bad rows and go on")


class BadRows(list):
    """The bad rows of a labels file, in the order found: every one that names an input (one per input at most), and
    of the others, which only the file's size bounds, the first ``MAX_LISTED_ROWS``; ``unlisted`` counts the rest.

    Rows are read in order, so the first are the ones kept and a later one is only counted (``full``)."""

    def __init__(self):
        super().__init__()
        self.unnamed = 0  # listed rows that name no input
        self.unlisted = 0

    @property
    def full(self) -> bool:
        """No more room for a row that names no input: it is counted in ``unlisted`` instead."""
        return self.unnamed >= MAX_LISTED_ROWS

    def add(self, problem: RowProblem) -> None:
        if problem.path is None:
            if self.full:
                self.unlisted += 1
                return
            self.unnamed += 1
        self.append(problem)


class Row(typing.NamedTuple):  # a NamedTuple: made once a row, and cheap to make
    """A row naming a path: its number, the path (canonical: ``./a.npy`` is ``a.npy``), the label (a text, or a
    tuple of texts with several label columns) and the split its ``split`` column gives (None without one)."""

    number: int
    path: str
    value: str | tuple[str, ...]
    split: str | None = None


def _bad_file(path: str, problem: str, fix: str = _FIX) -> InputError:
    return InputError(f"{path}: {problem}; {fix}")


def _clean_path(text: str) -> str | None:
    """A row's path made canonical (``./a.npy`` → ``a.npy``), or None when it leaves SRC (absolute, ``..``)."""
    if text and text[0] not in "./" and text[-1] != "/" and text[1:2] != ":" and not _UNCLEAN.search(text):
        return text  # already canonical: most rows
    if not text or text.startswith("/") or text.endswith("/") or re.match(r"[A-Za-z]:", text) or "\\" in text:
        return None  # absolute, a folder (normpath would drop its slash), or Windows separators
    clean = posixpath.normpath(text)
    return None if clean == ".." or clean.startswith("../") or clean == "." else clean


def _open(path: str):
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise _bad_file(path, "labels file not found", "pass the CSV of `path,label` rows (--labels FILE)") from None
    except NotRegularFileError:
        kind = file_kind(os.stat(path).st_mode)
        raise _bad_file(path, f"labels file is {kind}, not a regular file", "pass a CSV file") from None
    except OSError as e:
        raise _bad_file(path, f"cannot open the labels file ({e.strerror})", "make it readable") from None
    size = os.fstat(f.fileno()).st_size
    if size > MAX_LABELS_BYTES:
        f.close()
        raise _bad_file(path, f"labels file of {size:,} bytes is over the {MAX_LABELS_BYTES:,}-byte limit",
                        "split the dataset, or shorten the paths")
    if f.peek(2)[:2] in (b"\xff\xfe", b"\xfe\xff"):
        f.close()
        raise _bad_file(path, "is UTF-16 text (a spreadsheet's 'Unicode text')", "save the labels file as UTF-8 "
                        "(CSV UTF-8)")
    return f


class _TooLong(str):
    """A line over ``MAX_ROW_CHARS``: its first characters, to name it."""


def _lines(path: str, text):
    """``(number, line)`` without its line end, blank lines left out; a line over ``MAX_ROW_CHARS`` is a
    ``_TooLong``, read a piece at a time and never held whole. A file still growing is read no further than the
    size limit (a character is at least a byte)."""
    number = read = 0
    while line := text.readline(MAX_ROW_CHARS + 1):
        number += 1
        read += len(line)
        if len(line) > MAX_ROW_CHARS and not line.endswith("\n"):
            while (rest := text.readline(MAX_ROW_CHARS)) and not rest.endswith("\n") and read <= MAX_LABELS_BYTES:
                read += len(rest)
            yield number, _TooLong(line[:_SHOWN])
        elif line.strip():
            yield number, line[:-1] if line.endswith("\n") else line
        if read > MAX_LABELS_BYTES:
            raise _bad_file(path, f"labels file grew past the {MAX_LABELS_BYTES:,}-byte limit while it was read",
                            "let whatever writes it finish, or split the dataset")


class LabelRows:
    """An open labels file: the label columns' names (``columns``) from its header, then its rows in order by
    iterating (``Row``, or ``RowProblem`` for a row that labels nothing). A context manager: it closes the file.

    ``lists``: the labels are JSON lists of names, so multi-label whatever their lengths; known once every row is
    read. ``dialect``: how the file is read (``"CSV"``, ``"CSV separated by ';'"``, ``"JSON Lines"``).

    Raises (opening, and while iterating):
      InputError: the file is missing, not a regular file, over ``MAX_LABELS_BYTES``, not UTF-8, has no header,
        or no label column.
    """

    def __init__(self, path: str, *, splits: bool = False, columns: bool = False):
        self.file = path
        self._binary = _open(path)
        try:
            # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
            self._text = io.TextIOWrapper(self._binary, encoding="utf-8-sig", newline="\n")
            self._lines = _lines(path, self._text)
            self._number = 0
            self._first = None
            header = self._header()
            self._columns = columns_of(path, header, splits, columns)
        except BaseException:
            self._binary.close()
            raise
        self.columns = self._columns.names
        self.header_path = header[self._columns.path]  # the path column's name: a file's if the header is data
        self.dialect = self._format.describe()

    def _header_line(self) -> tuple[int, str]:
        number, line = self._decoded(next, self._lines, None) or (0, None)
        if line is None:
            raise _bad_file(self.file, "empty labels file (no header row)",
                            "start it with a header such as `path,label`")
        problem = f"is over {MAX_ROW_CHARS:,} characters" if isinstance(line, _TooLong) else \
            "holds a NUL or a byte-order mark (UTF-16 text read as UTF-8?)" if _UNSEEN.search(line) else \
            "holds a carriage return: lines end in \\r alone (classic Mac)?" if "\r" in line[:-1] else None
        if problem is not None:
            raise _bad_file(self.file, f"header row {problem} (got {line!r:.80})", "save the labels file as UTF-8 "
                            "text, lines ending in \\n or \\r\\n, with a short header row such as `path,label`")
        return number, line

    def _header(self) -> list[str]:
        """The header's names, from the first line (after Excel's ``sep=;`` line, which names the delimiter);
        sets the format the rows are read in."""
        number, line = self._header_line()
        if self.file.lower().endswith(JSON_LINES):
            self._format = JsonLines(line)
            if self._format.problem is not None:  # no header to read the rest by
                raise _bad_file(self.file, f"line {number} {self._format.problem.partition('; ')[0]}",
                                'start with an object such as {"path": ..., "label": ...}')
            self._first = number, self._format.first, line
            return self._format.header
        named = _SEP_LINE.fullmatch(line.rstrip("\r"))
        if named is not None:
            number, line = self._header_line()
        self._format = Csv(line, named and named.group(1))
        header = self._format.fields(line)
        if isinstance(header, str):
            raise _bad_file(self.file, f"header row {header.partition('; ')[0]} (got {line!r:.80})")
        return header

    @property
    def lists(self) -> bool:
        return isinstance(self._format, JsonLines) and any(
            column_key(name) in self._format.listed for name in self.columns)

    def __enter__(self) -> LabelRows:
        return self

    def __exit__(self, *exc) -> None:
        self._binary.close()

    def _decoded(self, step, *args):
        try:
            return step(*args)
        except UnicodeDecodeError as e:
            raise _bad_file(self.file, f"not UTF-8 text (near row {self._number + 1}: {e.reason})",
                            "save the labels file as UTF-8") from None

    def __iter__(self):
        while True:
            if self._first is not None:  # JSON Lines: the first object is the header and row 1 too
                (number, fields, line), self._first = self._first, None
            else:
                found = self._decoded(next, self._lines, None)
                if found is None:
                    return
                number, line = found
                self._number = number
                if isinstance(line, _TooLong):
                    yield RowProblem(number, line, f"is over {MAX_ROW_CHARS:,} characters; shorten the row")
                    continue
                fields = self._format.fields(line)
            row = self._row(number, fields, line)
            if row is not None:
                yield row

    def _row(self, number: int, fields: list[str] | str, text: str) -> Row | RowProblem | None:
        """A row from its fields, or what is wrong with it; None for a row of empty fields (a spreadsheet's)."""
        if isinstance(fields, str):
            return RowProblem(number, text, fields)
        joined = "".join(fields)
        if not joined.strip():
            return None
        c = self._columns
        if len(fields) != c.width:
            sep = getattr(self._format, "delimiter", ",")
            return RowProblem(number, text, f"has {len(fields)} column{'s' * (len(fields) != 1)}, the header has "
                              f"{c.width}; quote a field that holds a {sep!r}")
        if _UNSEEN.search(joined):
            return RowProblem(number, text, "holds a NUL or a byte-order mark (files joined together, or UTF-16?); "
                              "save the labels file as UTF-8 text")
        raw = fields[c.path]
        clean = _clean_path(raw)
        if raw.endswith("/"):
            return RowProblem(number, text, f"path {raw!r:.80} names a folder, not an input file; give the file's "
                              "path relative to SRC, without a trailing /")
        if clean is None:
            return RowProblem(number, text, f"path {raw!r:.80} is not inside SRC; give it relative to SRC, with / "
                              "separators and no ..")
        split = None
        if c.split is not None:
            split = fields[c.split].strip()
            if not SPLIT_NAME.match(split):
                return RowProblem(number, text, f"split {split!r:.80} is not a split name; use letters, digits or _ "
                                  "(train, val, test)")
        if len(c.labels) == 1:
            label = fold(fields[c.labels[0]].strip())
            control = CONTROL.search(label)
        else:
            label = tuple(fold(fields[i].strip()) for i in c.labels)
            control = CONTROL.search("".join(label))
        if control is not None:
            return RowProblem(number, text, f"label holds the control character U+{ord(control.group()):04X}; "
                              "remove it (a label is one line of visible text)")
        return Row(number, clean, label, split)


def open_rows(path: str, *, splits: bool = False, columns: bool = False) -> LabelRows:
    """A labels file opened to read its rows once, in order (``LabelRows``); use it as a context manager.

    Args:
      path: a CSV file, or JSON Lines when its name ends in ``.jsonl``/``.ndjson``.
      splits: a ``split`` column gives each input's split (images); otherwise such a column is refused.
      columns: without a ``label`` column, every column but the path and the split is a label column.

    Raises:
      InputError: a bad file (missing, not a regular file, too big, not UTF-8, no header or label column).

    Example:
      with open_rows("labels.csv") as rows:
          list(rows)  # [Row(number=2, path='train/run0.npy', value='walk', split=None), ...]
    """
    return LabelRows(path, splits=splits, columns=columns)
