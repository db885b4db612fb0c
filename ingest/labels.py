"""A labels CSV (``--labels FILE``): one row per input, its path relative to SRC and its label. Pure Python.

The file is streamed once with ``csv.reader`` and only ``{path: (row, value)}`` is kept, so time and memory are
linear in rows. Nothing here knows what an input is: the caller matches the rows against the files it found
(``match_rows``) and decides what a bad row costs (a recorded reject or a one-line error).

The layout:
  - a header row; the first column is the path (``/`` separators; the split folder included, ``train/run3.npy``);
  - the label column is the one named ``label``, else the second column (more than two columns need a ``label``);
  - row N is line N of the file (the header is row 1); blank lines are skipped; header names and labels are
    stripped of spaces, paths are taken as written (a file name may end in a space).

The kind of label is decided over every value (``label_kind``): all integers → classes in numeric order;
all numbers, one not an integer → ``"value"`` (float32); anything else → class names, sorted.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import posixpath
import re
import struct
from collections.abc import Iterable

from ..format.storage import NotRegularFileError, file_kind, open_regular
from .errors import InputError

MAX_LABELS_BYTES = 1 << 30  # checked before the file is read
LABEL_COLUMN = "label"
_INTEGER = re.compile(r"[+-]?[0-9]+")
_FIX = "fix the labels file (a header row, then one `path,label` row per input)"


@dataclasses.dataclass(frozen=True)
class RowProblem:
    """A row of the labels file that labels nothing: its number, its text, why (with the fix), and the input it
    names when it names one (that input is then left out)."""

    row: int
    text: str
    problem: str
    path: str | None = None

    def reason(self, labels_file: str) -> str:
        """``labels.csv row 7: ...``: the reason a skipped row is recorded with."""
        return f"{os.path.basename(labels_file)} row {self.row}: {self.problem}"

    def error(self, labels_file: str) -> InputError:
        """The one-line error of this row when bad rows stop the run."""
        what, _, fix = self.problem.partition("; ")
        return InputError(f"{labels_file}: row {self.row}: {what} (got {self.text!r:.120}); {fix or 'fix the row'}, "
                          "or pass --on-error skip to record bad rows and go on")


@dataclasses.dataclass
class LabelRows:
    """What a labels file says: ``{path: (row, value)}`` in file order, and the rows that say nothing usable."""

    file: str
    values: dict[str, tuple[int, str]]
    problems: list[RowProblem]


@dataclasses.dataclass(frozen=True)
class Labels:
    """Each input's label, decided over every value: ``kind`` ``"class"`` (an index into ``class_names``) or
    ``"value"`` (a float32, held as a Python float)."""

    kind: str
    class_names: list[str]
    by_path: dict[str, int | float]


def _bad_file(path: str, problem: str, fix: str = _FIX) -> InputError:
    return InputError(f"{path}: {problem}; {fix}")


def _clean_path(text: str) -> str | None:
    """A row's path made canonical (``./a.npy`` → ``a.npy``), or None when it leaves SRC (absolute, ``..``)."""
    if not text or text.startswith("/") or text.endswith("/") or re.match(r"[A-Za-z]:", text) or "\\" in text:
        return None  # absolute, a folder (normpath would drop its slash), or Windows separators
    clean = posixpath.normpath(text)
    return None if clean == ".." or clean.startswith("../") or clean == "." else clean


def read_rows(path: str) -> LabelRows:
    """Streams a labels CSV into ``{path: (row, value)}``; rows that cannot be used are ``problems``.

    Raises:
      InputError: the file is missing, not a regular file, over ``MAX_LABELS_BYTES``, not UTF-8, has no header,
        or no label column.

    Example:
      read_rows("labels.csv").values  # {'train/run0.npy': (2, 'walk'), 'train/run1.npy': (3, 'sit')}
    """
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise _bad_file(path, "labels file not found", "pass the CSV of `path,label` rows (--labels FILE)") from None
    except NotRegularFileError:
        kind = file_kind(os.stat(path).st_mode)
        raise _bad_file(path, f"labels file is {kind}, not a regular file", "pass a CSV file") from None
    except OSError as e:
        raise _bad_file(path, f"cannot open the labels file ({e.strerror})", "make it readable") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_LABELS_BYTES:
            raise _bad_file(path, f"labels file of {size:,} bytes is over the {MAX_LABELS_BYTES:,}-byte limit",
                            "split the dataset, or shorten the paths")
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        with io.TextIOWrapper(f, encoding="utf-8-sig", newline="") as text:
            reader = csv.reader(text)
            try:
                return _rows(path, reader)
            except UnicodeDecodeError as e:
                raise _bad_file(path, f"not UTF-8 text (near row {reader.line_num + 1}: {e.reason})",
                                "save the labels file as UTF-8") from None
            except csv.Error as e:
                raise _bad_file(path, f"not a CSV file (row {reader.line_num}: {e})") from None


def _rows(path: str, reader) -> LabelRows:
    header = next(reader, None)
    while header is not None and not header:  # blank lines before the header
        header = next(reader, None)
    if header is None:
        raise _bad_file(path, "empty labels file (no header row)", "start it with a header such as `path,label`")
    columns = [c.strip() for c in header]
    if LABEL_COLUMN in columns[1:]:
        label_column = columns.index(LABEL_COLUMN, 1)
    elif len(columns) == 2:
        label_column = 1
    else:
        problem = "has no label column" if len(columns) < 2 else "has more than two columns and none named 'label'"
        raise _bad_file(path, f"header {problem} (got {header!r:.100})",
                        "give it a header of the path column and a `label` column")
    values: dict[str, tuple[int, str]] = {}
    problems: list[RowProblem] = []
    for row in reader:
        if not row:
            continue
        number = reader.line_num
        text = ",".join(row)
        if len(row) != len(columns):
            problems.append(RowProblem(number, text, f"has {len(row)} columns, the header has {len(columns)}; "
                                       "quote a field that holds a comma"))
            continue
        clean = _clean_path(row[0])
        if row[0].endswith("/"):
            problems.append(RowProblem(number, text, f"path {row[0]!r} names a folder, not an episode file; give "
                                       "the file's path relative to SRC, without a trailing /"))
            continue
        if clean is None:
            problems.append(RowProblem(number, text, f"path {row[0]!r} is not inside SRC; give it relative to SRC, "
                                       "with / separators and no .."))
            continue
        if clean in values:
            problems.append(RowProblem(number, text, f"names {clean!r} again (first on row {values[clean][0]}); "
                                       "give each input one row"))
            continue
        values[clean] = (number, row[label_column].strip())
    return LabelRows(path, values, problems)


def _float32(text: str) -> float | None:
    """The float32 nearest ``text`` as a Python float; None for no number, NaN, inf or out of float32 range."""
    try:
        value = float(text)
        return struct.unpack("<f", struct.pack("<f", value))[0] if math.isfinite(value) else None
    except (ValueError, OverflowError):
        return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_label(text: str) -> bool:
    """Whether a value can be a label at all: not empty, and no NaN or inf (as a number, never a class name)."""
    number = _number(text)
    return bool(text) and (number is None or math.isfinite(number))


def label_kind(values: Iterable[str]) -> tuple[str, list[str]]:
    """The kind of label every value is, and the class names: ``("class", names)`` or ``("value", [])``.

    Integers sort numerically (``2, 10, -1`` → ``["-1", "2", "10"]``); any non-integer number among numbers
    makes values; anything else makes class names, sorted as text. Empty values, NaN and inf decide nothing
    (they are bad values whatever the kind).

        label_kind(["2", "10", "-1"]), label_kind(["0.5", "1"])  # (('class', ['-1', '2', '10']), ('value', []))
    """
    texts = {v for v in values if _is_label(v)}
    if texts and all(_INTEGER.fullmatch(v) for v in texts):
        return "class", [str(i) for i in sorted({int(v) for v in texts})]
    if texts and all(_number(v) is not None for v in texts):
        return "value", []
    return "class", sorted(texts)


def _label(value: str, kind: str, index: dict[str, int]) -> int | float | None:
    if not _is_label(value):
        return None
    if kind == "value":
        return _float32(value)
    return index.get(str(int(value)) if _INTEGER.fullmatch(value) else value)


def decide(rows: LabelRows, src: str, inputs: Iterable[str]) -> tuple[Labels, list[RowProblem]]:
    """Each input a row names gets its label; rows naming no input, and bad values, become problems (in row order).

    Args:
      rows: what the labels file says (``read_rows``).
      src: the source folder, to say what a row names that is no input (a folder, another file, nothing).
      inputs: every input found under ``src``, relative, ``/`` separators.

    Returns:
      The labels of the inputs named (kind decided over their values only), and the problems. A problem's
      ``path`` is the input it names when there is one (an input with a bad value is left out), else None.
    """
    known = set(inputs)
    problems = list(rows.problems)
    named = {}
    for path, (row, value) in rows.values.items():
        if path in known:
            named[path] = (row, value)
        else:
            problem = f"{_unknown(src, path)}; fix the path or remove the row"
            problems.append(RowProblem(row, f"{path},{value}", problem))
    kind, class_names = label_kind(v for _, v in named.values())
    index = {c: i for i, c in enumerate(class_names)}
    by_path: dict[str, int | float] = {}
    for path, (row, value) in named.items():
        label = _label(value, kind, index)
        if label is None:
            problems.append(RowProblem(row, f"{path},{value}", _bad_value(value), path))
            continue
        by_path[path] = label
    problems.sort(key=lambda p: p.row)
    return Labels(kind, class_names, by_path), problems


def _bad_value(value: str) -> str:
    if not value:
        return "an empty label; give every row a class name, an integer or a finite number"
    if not math.isfinite(_number(value)):
        return f"label {value!r} is not finite; give a class name, an integer or a finite number"
    return f"label {value!r} is outside float32's range (±3.4e38); scale the values"


def _unknown(src: str, path: str) -> str:
    """Why a row's path names no input: a folder, a file that is no input, or nothing at all."""
    full = os.path.join(src, *path.split("/"))
    if os.path.isdir(full):
        return f"{path!r} is a folder, not an input file"
    if os.path.lexists(full):
        return f"{path!r} is not an input file (wrong extension, hidden, or unreadable)"
    return f"{path!r} does not exist under SRC"
