"""A labels file (``--labels FILE``): one row per input, its path relative to SRC and its label. Pure Python.

The file is streamed once (``csv.reader``, or one ``json.loads`` per line) and only ``{path: (row, value)}`` is
kept, so time and memory are linear in rows. Nothing here knows what an input is: the caller matches the rows
against the files it found (``decide``) and decides what a bad row costs (a recorded reject or a one-line error).

The layout, CSV (any name) or JSON Lines (``.jsonl``/``.ndjson``: one object per line):
  - a header row, each column named once; the first column is the path (``/`` separators; a split folder
    included, ``train/run3.npy``), matched in either Unicode normal form (NFC or macOS's NFD). A path without an
    input's extension names the one input it is the stem of (Kaggle's ``id`` column: ``a1b2`` is ``a1b2.jpg``;
    with ``a1b2.png`` too the row must say which);
  - with ``splits=True`` (images), a column named ``split`` gives the input's split;
  - the label column is the one named ``label``; else every other column (``columns=True``, images: several
    columns are a value label of that many floats), or the second column (more than two need a ``label``);
  - in JSON Lines the keys are the columns: ``path`` (else the first key), ``split``, ``label``; a list of names
    is a multi-label value (``["cat", "outdoor"]``; ``["cat"]`` and ``[]`` too), a number is a number;
  - row N is line N of the file (the CSV header is row 1; JSON Lines has no header line, its first object is
    row 1); blank lines are skipped; header names and labels are
    stripped of spaces, paths are taken as written (a file name may end in a space).

The kind of label is decided over every value (``label_kind``), or given (``--label-kind``): a ``;`` in any
value → ``"multi"`` (names separated by ``;``); all integers → classes in numeric order; all numbers, one not an
integer → ``"value"`` (float32); anything else → class names, sorted.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import posixpath
import re
import struct
import typing
import unicodedata
from collections.abc import Iterable

from ..format.names import SPLIT_NAME
from ..format.storage import NotRegularFileError, file_kind, open_regular
from .errors import InputError

MAX_LABELS_BYTES = 1 << 30  # checked before the file is read
LABEL_COLUMN = "label"
SPLIT_COLUMN = "split"
LABEL_KINDS = ("class", "multi", "value")  # what --label-kind takes
MULTI_SEPARATOR = ";"
JSON_LINES = (".jsonl", ".ndjson")
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
    """What a labels file says: ``{path: (row, value)}`` in file order, and the rows that say nothing usable.

    A value is the label text, or with several label columns a tuple of their texts (``columns``, in order);
    ``splits`` maps a path to its ``split`` column when the file has one; ``lists``: the labels are JSON lists of
    names, so multi-label whatever their lengths (``["cat"]``, ``[]``).
    """

    file: str
    values: dict[str, tuple[int, str | tuple[str, ...]]]
    problems: list[RowProblem]
    columns: list[str] = dataclasses.field(default_factory=lambda: [LABEL_COLUMN])
    splits: dict[str, str] = dataclasses.field(default_factory=dict)
    lists: bool = False


@dataclasses.dataclass(frozen=True)
class Labels:
    """Each input's label, decided over every value: ``kind`` ``"class"`` (an index into ``class_names``),
    ``"multi"`` (a sorted tuple of such indices) or ``"value"`` (a float32 held as a Python float; a tuple of
    them with several ``columns``). ``by_path`` is keyed by the inputs' own paths, ``splits`` by the same."""

    kind: str
    class_names: list[str]
    by_path: dict[str, int | float | tuple]
    columns: list[str] = dataclasses.field(default_factory=lambda: [LABEL_COLUMN])
    splits: dict[str, str] = dataclasses.field(default_factory=dict)


def _bad_file(path: str, problem: str, fix: str = _FIX) -> InputError:
    return InputError(f"{path}: {problem}; {fix}")


def _clean_path(text: str) -> str | None:
    """A row's path made canonical (``./a.npy`` → ``a.npy``), or None when it leaves SRC (absolute, ``..``)."""
    if not text or text.startswith("/") or text.endswith("/") or re.match(r"[A-Za-z]:", text) or "\\" in text:
        return None  # absolute, a folder (normpath would drop its slash), or Windows separators
    clean = posixpath.normpath(text)
    return None if clean == ".." or clean.startswith("../") or clean == "." else clean


def read_rows(path: str, *, splits: bool = False, columns: bool = False) -> LabelRows:
    """Streams a labels file into ``{path: (row, value)}``; rows that cannot be used are ``problems``.

    Args:
      path: a CSV file, or JSON Lines when its name ends in ``.jsonl``/``.ndjson``.
      splits: a ``split`` column gives each input's split (images); otherwise such a column is refused.
      columns: without a ``label`` column, every column but the path and the split is a label column.

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
            json_lines = path.lower().endswith(JSON_LINES)
            reader = _JsonLines(path, text) if json_lines else csv.reader(text)
            try:
                return _rows(path, reader, splits=splits, columns=columns)
            except UnicodeDecodeError as e:
                raise _bad_file(path, f"not UTF-8 text (near row {reader.line_num + 1}: {e.reason})",
                                "save the labels file as UTF-8") from None
            except csv.Error as e:
                raise _bad_file(path, f"not a CSV file (row {reader.line_num}: {e})") from None


class _NotARow(typing.NamedTuple):
    """A JSON line that gives no row (a CSV row is a list, so never this): its text and the problem with the fix."""

    text: str
    problem: str


class _JsonLines:
    """JSON Lines as CSV rows: the first object's keys are the header (``path`` first), each object a row of
    texts in that order. A list of names is one ``;``-joined text (its key is then ``listed``: multi-label), a list
    of numbers that many columns."""

    def __init__(self, path: str, text):
        self._path, self._lines, self.line_num, self._keys = path, text, 0, None
        self._pending, self._widths, self.listed = None, {}, set()

    def __iter__(self):
        return self

    def _texts(self, value, key: str) -> list[str] | None:
        if isinstance(value, str):
            return [value]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [repr(value)]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            self.listed.add(key)  # a list is multi-label however long: ["cat"] and [] too (read_rows)
            return [MULTI_SEPARATOR.join(value)]
        if isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return [repr(v) for v in value]
        return None

    def __next__(self) -> list[str]:
        if self._pending is not None:  # the first object's own row, right after the header it gave (line 1 both)
            record, self._pending = self._pending, None
            return self._row(record)
        for line in self._lines:
            self.line_num += 1
            if not line.strip():
                return []
            try:
                record = json.loads(line)
            except ValueError as e:
                raise _bad_file(self._path, f"line {self.line_num} is not JSON ({e})",
                                "write one JSON object per line (JSON Lines)") from None
            if not isinstance(record, dict) or not record:
                if self._keys is None:  # no header to read the rest by
                    raise _bad_file(self._path, f"line {self.line_num} is not a JSON object of the columns "
                                    f"(got {line.strip()!r:.80})",
                                    'start with an object such as {"path": ..., "label": ...}')
                return _NotARow(line.strip(), _JSON_PROBLEMS["not an object"])
            if self._keys is None:  # the header, then this first row
                keys = list(record)
                if "path" in keys:
                    keys.remove("path")
                    keys.insert(0, "path")
                self._keys, self._pending = keys, record
                header = []  # a list of numbers spreads over as many columns: key[0], key[1], ...
                for key in keys:
                    texts = self._texts(record[key], key) or [""]
                    self._widths[key] = len(texts)
                    header += [key] if len(texts) == 1 else [f"{key}[{i}]" for i in range(len(texts))]
                return header
            return self._row(record)
        raise StopIteration

    def _row(self, record: dict) -> list[str]:
        if set(record) != set(self._keys):
            return _NotARow(json.dumps(record)[:200], _JSON_PROBLEMS["keys"])
        fields = []
        for key in self._keys:
            texts = self._texts(record[key], key)
            if texts is None:
                return _NotARow(json.dumps(record)[:200], _JSON_PROBLEMS["value"])
            if len(texts) != self._widths[key]:
                return _NotARow(json.dumps(record)[:200], _JSON_PROBLEMS["width"])
            fields += texts
        return fields


_JSON_PROBLEMS = {  # what _JsonLines says of a line that is no row, and the fix
    "not an object": "is not a JSON object of the columns; write one object per line",
    "keys": "has other keys than the first line; give every line the first line's keys",
    "value": "has a value that is not a text, a number or a list of them (null, true, an object, a mixed list); "
               "give each key a text, a number, or a list of names or of numbers",
    "width": "has a list of numbers of another length than the first line's; give every line's list as many "
               "numbers",
}


def _label_columns(path: str, header: list[str], splits: bool, many: bool) -> tuple[list[int], int | None]:
    """Which columns hold the label, and which the split (None: no split column)."""
    columns = [c.strip() for c in header]
    twice = sorted({c for c in columns if c and columns.count(c) > 1})
    if twice:  # which of them is the label (or the split) would be a guess
        raise _bad_file(path, f"header names the column {twice[0]!r} twice (got {header!r:.100})",
                        "give each column its own name")
    split = columns.index(SPLIT_COLUMN, 1) if SPLIT_COLUMN in columns[1:] else None
    if split is not None and not splits:
        raise _bad_file(path, f"has a {SPLIT_COLUMN!r} column (got {header!r:.100}), but episodes take their split "
                        "from folders", "drop the column and lay episodes out as SRC/<split>/...")
    rest = [i for i in range(1, len(columns)) if i != split]
    if LABEL_COLUMN in columns[1:]:
        return [columns.index(LABEL_COLUMN, 1)], split
    spread = [i for i in rest if columns[i].startswith(LABEL_COLUMN + "[")]  # JSON Lines: "label": [0.5, 2.0]
    if spread:
        return spread, split
    if len(rest) == 1 or (many and rest):
        if not all(columns[i] for i in rest):
            raise _bad_file(path, f"header leaves a label column unnamed (got {header!r:.100})",
                            "name every column, or drop the empty one")
        return rest, split
    problem = "has no label column" if not rest else "has more than two columns and none named 'label'"
    raise _bad_file(path, f"header {problem} (got {header!r:.100})",
                    "give it a header of the path column and a `label` column")


def _rows(path: str, reader, *, splits: bool, columns: bool) -> LabelRows:
    header = next(reader, None)
    while header is not None and not header:  # blank lines before the header
        header = next(reader, None)
    if header is None:
        raise _bad_file(path, "empty labels file (no header row)", "start it with a header such as `path,label`")
    label_columns, split_column = _label_columns(path, header, splits, columns)
    values: dict[str, tuple[int, str | tuple[str, ...]]] = {}
    split_of: dict[str, str] = {}
    problems: list[RowProblem] = []
    width = len(header)
    for row in reader:
        if not row:
            continue
        number = reader.line_num
        text = ",".join(row)
        if isinstance(row, _NotARow):
            problems.append(RowProblem(number, row.text, row.problem))
            continue
        if len(row) != width:
            problems.append(RowProblem(number, text, f"has {len(row)} columns, the header has {width}; "
                                       "quote a field that holds a comma"))
            continue
        clean = _clean_path(row[0])
        if row[0].endswith("/"):
            problems.append(RowProblem(number, text, f"path {row[0]!r} names a folder, not an input file; give "
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
        if split_column is not None:
            split = row[split_column].strip()
            if not SPLIT_NAME.match(split):
                problems.append(RowProblem(number, text, f"split {split!r} is not a split name; use letters, "
                                           "digits or _ (train, val, test)", None))
                continue
            split_of[clean] = split
        label = tuple(row[i].strip() for i in label_columns)
        values[clean] = (number, label[0] if len(label) == 1 else label)
    names = [header[i].strip() for i in label_columns]
    lists = bool(set(names) & getattr(reader, "listed", set()))
    return LabelRows(path, values, problems, names, split_of, lists)


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


def label_kind(values: Iterable[str], kinds: Iterable[str] = LABEL_KINDS, forced: str | None = None
               ) -> tuple[str, list[str]]:
    """The kind of label every value is, and the class names: ``("class", names)``, ``("multi", names)`` or
    ``("value", [])``.

    A ``;`` in any value makes multi-label (when ``kinds`` holds ``"multi"``), its names the parts between the
    ``;``. Integers sort numerically (``2, 10, -1`` → ``["-1", "2", "10"]``); any non-integer number among numbers
    makes values; anything else makes class names, sorted as text. Empty values, NaN and inf decide nothing
    (they are bad values whatever the kind). ``forced`` (``--label-kind``) names the kind instead.

        label_kind(["2", "10", "-1"]), label_kind(["0.5", "1"])  # (('class', ['-1', '2', '10']), ('value', []))
        label_kind(["cat;outdoor", "dog"])  # ('multi', ['cat', 'dog', 'outdoor'])
    """
    values = set(values)
    kind = forced
    if kind is None:
        multi = "multi" in kinds and any(MULTI_SEPARATOR in v for v in values)
        texts = {v for v in values if _is_label(v)}
        if multi:
            kind = "multi"
        elif texts and all(_number(v) is not None for v in texts) and not all(_INTEGER.fullmatch(v) for v in texts):
            kind = "value"
        else:
            kind = "class"
    if kind == "value":
        return "value", []
    if kind == "multi":
        texts = {part for v in values for part in _parts(v)}
    else:
        texts = {v for v in values if _is_label(v)}
    if texts and all(_INTEGER.fullmatch(v) for v in texts):
        return kind, [str(i) for i in sorted({int(v) for v in texts})]
    return kind, sorted(texts)


def _parts(value: str) -> list[str]:
    """A multi-label value's class names: the parts between ``;``, stripped, empty ones dropped."""
    return [part.strip() for part in value.split(MULTI_SEPARATOR) if part.strip()]


def _canonical(text: str) -> str:
    return str(int(text)) if _INTEGER.fullmatch(text) else text


def _label(value: str, kind: str, index: dict[str, int]) -> int | float | tuple | None:
    if kind == "multi":  # an empty value is an image of none of the classes
        found = [_index(part, index) for part in _parts(value)]
        return None if None in found else tuple(sorted(set(found)))
    if isinstance(value, tuple):  # several columns: a value label of that many floats
        numbers = tuple(_float32(v) if _is_label(v) else None for v in value)
        return None if None in numbers else numbers
    if not _is_label(value):
        return None
    if kind == "value":
        return _float32(value)
    return _index(value, index)


def _index(text: str, index: dict[str, int]) -> int | None:
    """A class name's index: as written (``01`` among names such as ``cat``), else as its integer (``01`` among
    integer classes is class ``1``)."""
    found = index.get(text)
    return index.get(_canonical(text)) if found is None else found


def _fold(text: str) -> str:
    """``text`` in Unicode NFC: ``café`` typed (NFC) and ``café`` as macOS writes it (NFD) are one name."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


class _Matcher:
    """``name -> input``: the input itself, else the one input it is in another Unicode normal form (NFC/NFD), else
    the one input whose path without its extension it is (Kaggle's ``id`` column; a name ending in an input's
    extension is a file name, never a stem); None for none, and for a stem two inputs share (``a.jpg``, ``a.png``:
    the row must say which, ``shared`` names them)."""

    def __init__(self, inputs: Iterable[str]):
        self.known = set(inputs)
        self.folded: dict[str, str | None] = {}
        self.stems: dict[str, str | None] = {}
        self.shared: dict[str, list[str]] = {}
        self.extensions: set[str] = set()
        for path in sorted(self.known):
            folded = _fold(path)
            if folded != path:
                self.folded[folded] = None if folded in self.folded else path
            stem, ext = posixpath.splitext(folded)
            if ext:
                self.extensions.add(ext.lower())
                if stem in self.stems:
                    self.shared.setdefault(stem, [self.stems[stem]]).append(path)  # the first, then each other
                    self.stems[stem] = None
                else:
                    self.stems[stem] = path

    def __call__(self, name: str) -> str | None:
        if name in self.known:
            return name
        folded = _fold(name)
        if folded in self.known:
            return folded
        if folded in self.folded:
            return self.folded[folded]
        if posixpath.splitext(folded)[1].lower() in self.extensions:
            return None
        return self.stems.get(folded)


def decide(rows: LabelRows, src: str, inputs: Iterable[str], *, kinds: Iterable[str] = ("class", "value"),
           forced: str | None = None) -> tuple[Labels, list[RowProblem]]:
    """Each input a row names gets its label; rows naming no input, and bad values, become problems (in row order).

    Args:
      rows: what the labels file says (``read_rows``).
      src: the source folder, to say what a row names that is no input (a folder, another file, nothing).
      inputs: every input found under ``src``, relative, ``/`` separators.
      kinds: the label kinds the inputs can take (episodes: class and value; images: ``LABEL_KINDS``).
      forced: the kind to use (``--label-kind``), else decided over the values (``label_kind``).

    Returns:
      The labels of the inputs named (kind decided over their values only), keyed by the inputs' paths, and the
      problems. A problem's ``path`` is the input it names when there is one (an input with a bad value is left
      out), else None.

    Raises:
      InputError: several label columns with a kind other than ``"value"``.
    """
    if len(rows.columns) > 1 and forced not in (None, "value"):
        raise _bad_file(rows.file, f"has {len(rows.columns)} label columns ({', '.join(rows.columns)}) but "
                        f"--label-kind {forced} takes one", "name the label column `label`, or pass --label-kind value")
    match = _Matcher(inputs)
    problems = list(rows.problems)
    named: dict[str, tuple[int, str | tuple]] = {}
    for path, (row, value) in rows.values.items():
        found = match(path)
        shown = f"{path},{value if isinstance(value, str) else ','.join(value)}"
        if found is None and _fold(path) in match.shared:
            both = match.shared[_fold(path)]
            problems.append(RowProblem(row, shown, f"{path!r} is the stem of {len(both)} inputs "
                                       f"({', '.join(both[:3])}); give the file name with its extension"))
        elif found is None:
            problems.append(RowProblem(row, shown, f"{_unknown(src, path)}; fix the path or remove the row"))
        elif found in named:
            problems.append(RowProblem(row, shown, f"names {found!r} again (first on row {named[found][0]}); "
                                       "give each input one row"))
        else:
            named[found] = (row, value, path)
    several = len(rows.columns) > 1
    if forced is None and rows.lists and "multi" in kinds:
        forced = "multi"  # JSON lists of names: multi-label, even when every list holds one name (or none)
    kind, class_names = ("value", []) if several else label_kind((v for _, v, _ in named.values()), tuple(kinds),
                                                                 forced)
    if kind == "multi" and not class_names and named:  # a multi-hot of no classes: nothing to learn, nor to read
        row, value, named_as = next(iter(named.values()))
        raise _bad_file(rows.file, f"its multi-label values name no class (got {value!r} on row {row}, and no "
                        "other row names one)", "give the images' classes, separated by ;")
    index = {c: i for i, c in enumerate(class_names)}
    by_path: dict[str, int | float | tuple] = {}
    splits: dict[str, str] = {}
    for path, (row, value, named_as) in named.items():
        label = _label(value, kind, index)
        if label is None:
            text = value if isinstance(value, str) else ",".join(value)
            problems.append(RowProblem(row, f"{named_as},{text}", _bad_value(value, kind), path))
            continue
        by_path[path] = label
        if named_as in rows.splits:
            splits[path] = rows.splits[named_as]
    problems.sort(key=lambda p: p.row)
    return Labels(kind, class_names, by_path, list(rows.columns), splits), problems


def _bad_value(value: str | tuple, kind: str) -> str:
    if isinstance(value, tuple):
        bad = next(v for v in value if _float32(v) is None)
        return f"label {bad!r} is not a finite float32 number; give every label column a number"
    if kind == "multi":
        return f"label {value!r} holds a class no other row names; fix the row"
    if not value:
        return "an empty label; give every row a class name, an integer or a finite number"
    if kind == "value" and _number(value) is None:
        return f"label {value!r} is not a number (--label-kind value); give a number, or another --label-kind"
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
