"""A labels file (``--labels FILE``) read one row at a time: CSV in the delimiter its header uses, or JSON Lines.
Pure Python.

A row is one line: no labels file needs a field across lines, so a line that does not parse on its own (an unclosed
quote, text after a closing quote, a NUL, more than ``MAX_ROW_CHARS``) is a bad row named by its number, and the
next line is read as usual (csv would read an unclosed quote on to the end of the file). Rows are yielded as they
are read, so the caller keeps only those that name an input: memory follows the inputs, not what the file claims.
The lines come from ``label_lines`` (bounded, numbered); a file written to while it is read is refused at its end.
A label holding a control, invisible or bidi character or a lone surrogate, or a class name over
``MAX_LABEL_CHARS``, is a bad row naming its input.

The layout, CSV (any name) or JSON Lines (``.jsonl``/``.ndjson``: one object per line):
  - a header row, each column named once. Names are stripped, folded to Unicode NFC and matched ignoring case
    (``Split``, `` Label ``), so two names that differ only in case are refused. The CSV delimiter is the one
    Excel's first line ``sep=;`` names, else the first of ``,``, tab and ``;`` that the header holds (``;``: a
    spreadsheet's export where the decimal mark is a comma). A header naming an input is no header (``decide``);
  - the path column is the one named ``path``, else the first: a path relative to SRC, ``/`` separators
    (``train/run3.npy``), taken as written (a file name may end in a space; spaces after a CSV delimiter are
    skipped); ``labels.decide`` matches it;
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
import os
import posixpath
import re
import typing

from ..format.errors import InputError
from ..format.names import MAX_SPLIT_CHARS, SPLIT_NAME
from .label_columns import CONTROL, LABEL_COLUMN, PATH_COLUMN, SPLIT_COLUMN, columns_of, unseen
from .label_formats import MULTI_SEPARATOR, Csv, JsonLines, column_key, fold
from .label_lines import (
    MAX_ROW_CHARS,
    NUL_OR_BOM,
    SHOWN,
    UNSEEN,
    TooLong,
    bad_file,
    line_problem,
    numbered_lines,
    open_labels,
    text_of,
    version,
)

MAX_LISTED_ROWS = 100  # bad rows naming no input listed in the manifest; the count covers every one
# A label (each class name of a multi-label one) is printed whole by the summary, info and preview, and written in
# every record and in dataset.json; a longer one is a bad row (a caption or a blob in the label column, not a class).
MAX_LABEL_CHARS = 1_000
JSON_LINES = (".jsonl", ".ndjson")
_UNCLEAN = re.compile(r"\\|//|/\.")  # what a canonical relative path never holds (with no . or / first)
# Excel's first line naming the delimiter: sep=; (a tab too), quoted when a CSV writer wrote it as a row: "sep=;"
_SEP_LINE = re.compile(r'(")?sep=(\t|[^"\w\s])(?(1)")')
# No file name holds a lone surrogate but those Python gives undecodable bytes (U+DC80..U+DCFF); only a JSON \ud800
# escape gives one, and it cannot be printed or written as UTF-8.
_NO_FILE_NAME = re.compile("[\ud800-\udc7f\udd00-\udfff]")


@dataclasses.dataclass(frozen=True)
class RowProblem:
    """A row of the labels file that labels nothing: its number, its text (the first ``SHOWN`` characters), why
    (with the fix), and the input it names when it names one (that input is then left out). Read from the file, a
    row whose path is clean carries that path; ``labels.decide`` turns it into the input it names, or None."""

    row: int
    text: str
    problem: str
    path: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "text", self.text[:SHOWN])

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


def clean_path(text: str) -> str | None:
    """A row's path made canonical (``./a.npy`` → ``a.npy``), or None when it leaves SRC (absolute, ``..``)."""
    if text and text[0] not in "./" and text[-1] != "/" and text[1:2] != ":" and not _UNCLEAN.search(text):
        return text  # already canonical: most rows
    if not text or text.startswith("/") or text.endswith("/") or re.match(r"[A-Za-z]:", text) or "\\" in text:
        return None  # absolute, a folder (normpath would drop its slash), or Windows separators
    clean = posixpath.normpath(text)
    return None if clean == ".." or clean.startswith("../") or clean == "." else clean


def _label_problem(label: str | tuple[str, ...]) -> str | None:
    """What makes a row's label no label, whatever its kind turns out to be, or None."""
    texts = (label,) if isinstance(label, str) else label
    control = next((m for m in map(CONTROL.search, texts) if m is not None), None)
    if control is not None:
        return f"label holds {unseen(control.group())}; remove it (a label is one line of visible text)"
    longest = max((part for text in texts for part in text.split(MULTI_SEPARATOR)), key=len)
    if len(longest) > MAX_LABEL_CHARS:
        return (f"label {longest[:40]!r}... of {len(longest):,} characters is over the {MAX_LABEL_CHARS:,}-character "
                "limit of a class name or number; shorten it (a caption or other text is no label)")
    return None


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
        self._binary = open_labels(path)
        self._opened = version(self._binary)
        try:
            self._text = text_of(self._binary)
            self._lines = numbered_lines(path, self._text)
            self._first = None
            header = self._header()
            self._columns = columns_of(path, header, splits, columns)
        except BaseException:
            self._binary.close()
            raise
        self.columns = self._columns.names
        self.header_path = header[self._columns.path]  # the path column's name: a file's if the header is data
        # ... unless a column has a name only a header gives (a row of `path`, `label`, `split` names no input)
        self.header_named = any(column_key(name) in (PATH_COLUMN, SPLIT_COLUMN, LABEL_COLUMN) for name in header)
        self.dialect = self._format.describe()
        # A spreadsheet separates by ';' where a comma is the decimal mark (0,5): there a number may use it
        # (``label_kinds``: only where the labels are read as numbers). Not in a TSV: one from a locale that groups
        # thousands with a comma writes 1,000 for a thousand.
        self.decimal_comma = getattr(self._format, "delimiter", ",") == ";"

    def _header_line(self) -> tuple[int, str]:
        number, line = next(self._lines, None) or (0, None)
        if line is None:
            raise bad_file(self.file, "empty labels file (no header row)",
                           "start it with a header such as `path,label`")
        problem = f"is over {MAX_ROW_CHARS:,} characters" if isinstance(line, TooLong) else \
            "holds a NUL or a byte-order mark (UTF-16 text read as UTF-8?)" if UNSEEN.search(line) else \
            "holds a carriage return: lines end in \\r alone (classic Mac)?" if "\r" in line[:-1] else None
        if problem is not None:
            raise bad_file(self.file, f"header row {problem} (got {line!r:.80})", "save the labels file as UTF-8 "
                           "text, lines ending in \\n or \\r\\n, with a short header row such as `path,label`")
        return number, line

    def _header(self) -> list[str]:
        """The header's names, from the first line (after Excel's ``sep=;`` line, which names the delimiter);
        sets the format the rows are read in."""
        number, line = self._header_line()
        if self.file.lower().endswith(JSON_LINES):
            self._format = JsonLines(line)
            if self._format.problem is not None:  # no header to read the rest by
                raise bad_file(self.file, f"line {number} {self._format.problem.partition('; ')[0]}",
                               'start with an object such as {"path": ..., "label": ...}')
            self._first = number, self._format.first, line
            return self._format.header
        if line.lstrip().startswith("{"):  # no CSV header starts so: JSON Lines under another name
            raise bad_file(self.file, f"header row is a JSON object (got {line!r:.80}), but only a file named "
                           f"{' or '.join(JSON_LINES)} is read as JSON Lines", "rename the labels file to .jsonl")
        named = _SEP_LINE.fullmatch(line.rstrip("\r"))
        if named is not None:
            number, line = self._header_line()
        self._format = Csv(line, named and named.group(2))
        header = self._format.fields(line)
        if isinstance(header, str):
            raise bad_file(self.file, f"header row {header.partition('; ')[0]} (got {line!r:.80})")
        return header

    @property
    def lists(self) -> bool:
        return isinstance(self._format, JsonLines) and any(
            column_key(name) in self._format.listed for name in self.columns)

    def __enter__(self) -> LabelRows:
        return self

    def __exit__(self, *exc) -> None:
        self._binary.close()

    def __iter__(self):
        while True:
            if self._first is not None:  # JSON Lines: the first object is the header and row 1 too
                (number, fields, line), self._first = self._first, None
            else:
                found = next(self._lines, None)
                if found is None:
                    self._unchanged()
                    return
                number, line = found
                problem = line_problem(line)
                if problem is not None:
                    yield RowProblem(number, line, problem)
                    continue
                fields = self._format.fields(line)
            row = self._row(number, fields, line)
            if row is not None:
                yield row

    def _unchanged(self) -> None:
        """Raises when the file was written to while it was read: its rows would be some of one version and some of
        another, or stop where a writer still adds more."""
        now = version(self._binary)
        if now != self._opened:
            raise bad_file(self.file, f"labels file changed while it was read (got {self._opened[0]:,} bytes when "
                           f"opened, {now[0]:,} when read to its end)", "let whatever writes it finish, then run "
                            "again")

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
        if UNSEEN.search(joined):  # a JSON escape: \u0000, \ufeff
            return RowProblem(number, text, NUL_OR_BOM)
        raw = fields[c.path]
        if _NO_FILE_NAME.search(raw):
            return RowProblem(number, text, f"path {raw!r:.80} holds a lone surrogate (half of a \\u escape pair), "
                              "which no file name holds; write the path as it is, in UTF-8")
        clean = clean_path(raw)
        if raw.endswith("/"):
            return RowProblem(number, text, f"path {raw!r:.80} names a folder, not an input file; give the file's "
                              "path relative to SRC, without a trailing /")
        if clean is None:
            windows = "\\" in raw and clean_path(raw.replace("\\", "/")) is not None  # train\cat\1.jpg
            what = "holds \\ separators (a Windows path?)" if windows else "is not inside SRC"
            return RowProblem(number, text, f"path {raw!r:.80} {what}; give it relative to SRC, with / separators "
                              "and no ..")
        split = None
        if c.split is not None:
            split = fields[c.split].strip()
            if not SPLIT_NAME.match(split):
                return RowProblem(number, text, f"split {split!r:.80} is not a split name; use letters, digits or _, "
                                  f"at most {MAX_SPLIT_CHARS} (train, val, test)", clean)
        label = fold(fields[c.labels[0]].strip()) if len(c.labels) == 1 else \
            tuple(fold(fields[i].strip()) for i in c.labels)
        problem = _label_problem(label)
        if problem is not None:  # the row names its input: that input is left out, not counted as without a row
            return RowProblem(number, text, problem, clean)
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
