"""A labels file (``--labels FILE``) applied to the inputs found: each row matched to the input it names, the
kind of label decided over the rows that name one, and every bad row named by its number. Pure Python.

Three steps, three modules: ``label_rows`` reads the file one row at a time (its layout is described there),
``label_kinds`` says what the values mean, and ``decide`` here matches rows to inputs as they are read. A row's path
names an input as written, in the other Unicode normal form (NFC or macOS's NFD), or, without an input's extension,
as the stem of the one input it is (Kaggle's ``id`` column: ``a1b2`` is ``a1b2.jpg``; with ``a1b2.png`` too the row
must say which). Only the rows naming an input are kept, and of the others only the first ``MAX_LISTED_ROWS`` are
listed (``BadRows``), so memory follows the inputs, whatever the file claims.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
from collections.abc import Iterable

from ..format.errors import InputError
from .label_columns import LABEL_COLUMN
from .label_formats import fold
from .label_kinds import LABEL_KINDS, bad_value, label_kind, label_of  # noqa: F401  (LABEL_KINDS for callers)
from .label_rows import (  # noqa: F401  (open_rows, MAX_LISTED_ROWS: for callers)
    MAX_LISTED_ROWS,
    BadRows,
    LabelRows,
    Row,
    RowProblem,
    clean_path,
    open_rows,
)


@dataclasses.dataclass(frozen=True)
class Labels:
    """Each input's label, decided over every value: ``kind`` ``"class"`` (an index into ``class_names``),
    ``"multi"`` (a sorted tuple of such indices) or ``"value"`` (a float32 held as a Python float; a tuple of
    them with several ``columns``). ``by_path`` is keyed by the inputs' own paths, ``splits`` by the same;
    ``rule``: why the kind is what it is, in words (``label_kinds.Kind.rule``)."""

    kind: str
    class_names: list[str]
    by_path: dict[str, int | float | tuple]
    columns: list[str] = dataclasses.field(default_factory=lambda: [LABEL_COLUMN])
    splits: dict[str, str] = dataclasses.field(default_factory=dict)
    rule: str = ""


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
            folded = fold(path)
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
        folded = fold(name)
        if folded in self.known:
            return folded
        if folded in self.folded:
            return self.folded[folded]
        if posixpath.splitext(folded)[1].lower() in self.extensions:
            return None
        return self.stems.get(folded)

    @functools.cached_property
    def _in_folders(self) -> dict[str, list[str]]:
        """The stem of an input's file name -> the inputs in folders with that stem (made at the first row that
        names none)."""
        found: dict[str, list[str]] = {}
        for path in sorted(self.known):
            if "/" in path:
                found.setdefault(posixpath.splitext(_file_name(path))[0], []).append(path)
        return found

    def in_folders(self, name: str) -> list[str]:
        """The inputs in a folder of SRC that ``name``, a name without a folder, is the file name or stem of
        (``run0`` of ``train/run0.npy``: a path written relative to its split folder)."""
        if "/" in name:
            return []
        name = fold(name)
        found = [p for key in dict.fromkeys((name, posixpath.splitext(name)[0])) for p in self._in_folders.get(key, [])]
        return [p for p in found if name in (_file_name(p), posixpath.splitext(_file_name(p))[0])]


def _file_name(path: str) -> str:
    return fold(path.rsplit("/", 1)[1])


def decide(rows: LabelRows, src: str, inputs: Iterable[str], *, kinds: Iterable[str] = ("class", "value"),
           forced: str | None = None) -> tuple[Labels, BadRows]:
    """Each input a row names gets its label; rows naming no input, and bad values, are bad rows.

    Args:
      rows: an open labels file (``label_rows.open_rows``), read here once.
      src: the source folder, to say what a row names that is no input (a folder, another file, nothing).
      inputs: every input found under ``src``, relative, ``/`` separators.
      kinds: the label kinds the inputs can take (episodes: class and value; images: ``LABEL_KINDS``).
      forced: the kind to use (``--label-kind``), else decided over the values (``label_kinds.label_kind``).

    Returns:
      The labels of the inputs named (kind decided over their values only), keyed by the inputs' paths, and the
      bad rows (``BadRows``, in row order). A bad row's ``path`` is the input it names when there is one (an input
      with a bad value is left out), else None.

    Raises:
      InputError: a bad labels file; several label columns with a kind other than ``"value"``.
    """
    if len(rows.columns) > 1 and forced not in (None, "value"):
        raise InputError(f"{rows.file}: has {len(rows.columns)} label columns ({', '.join(rows.columns):.100}) but "
                         f"--label-kind {forced} takes one; name the label column `label`, or pass --label-kind value")
    match = _Matcher(inputs)
    header = rows.header_path
    named = clean_path(header)
    if not rows.header_named and named is not None and match(named) is not None:  # as a row would (an id, ./a.jpg)
        raise InputError(f"{rows.file}: its first row names an input (got {header!r:.80}), so the file has no "
                         "header row; start it with a header such as `path,label`")
    bad = BadRows()
    named: dict[str, Row | RowProblem] = {}  # an input -> its first row (a bad one too: the input is then left out)
    splits = _Splits(rows.file)
    for row in rows:
        found = None if row.path is None else match(row.path)
        if isinstance(row, RowProblem):  # named by its number; the input its path names, if any, is left out
            if found is not None and found not in named:
                named[found] = row = dataclasses.replace(row, path=found)
            bad.add(row if row.path == found else dataclasses.replace(row, path=None))
        elif found is not None and found not in named:
            named[found] = row
            splits.add(row)
        elif not bad.full:  # past the listed ones, a row is only counted
            bad.add(_unmatched(row, found, named, match, src))
        else:
            bad.unlisted += 1
    if rows.lists and "multi" not in kinds:
        raise InputError(f"{rows.file}: gives labels as JSON lists of names, which are multi-label, but an episode "
                         "has one label; give each episode one class name or number")
    named = {path: row for path, row in named.items() if isinstance(row, Row)}
    decided = label_kind((row.value for row in named.values() if isinstance(row.value, str)), tuple(kinds), forced,
                         columns=len(rows.columns), lists=rows.lists, comma=rows.decimal_comma)
    if decided.kind == "multi" and not decided.class_names and named:  # a multi-hot of no classes: nothing to learn
        first = next(iter(named.values()))
        raise InputError(f"{rows.file}: its multi-label values name no class (got {first.value!r:.80} on row "
                         f"{first.number}, and no other row names one); give the images' classes, separated by ;")
    index = {c: i for i, c in enumerate(decided.class_names)}
    by_path: dict[str, int | float | tuple] = {}
    split_of: dict[str, str] = {}
    for path, row in named.items():
        label = label_of(row.value, decided.kind, index, comma=rows.decimal_comma)
        if label is None:
            bad.add(RowProblem(row.number, _shown(row), bad_value(row.value, decided.kind, rows.decimal_comma), path))
            continue
        by_path[path] = label
        if row.split is not None:
            split_of[path] = row.split
    bad.sort(key=lambda p: p.row)
    return Labels(decided.kind, decided.class_names, by_path, list(rows.columns), split_of, decided.rule), bad


class _Splits:
    """The split names rows give, so that one written two ways (``Train`` and ``train``: two splits that print alike
    to a reader asking for ``train``) is refused, naming both rows."""

    def __init__(self, file: str):
        self.file, self.first = file, {}

    def add(self, row: Row) -> None:
        if row.split is None:
            return
        number, name = self.first.setdefault(row.split.casefold(), (row.number, row.split))
        if name != row.split:
            raise InputError(f"{self.file}: row {row.number} names the split {row.split!r}, row {number} "
                             f"{name!r}; write each split one way (split names are case-sensitive folder names)")


def _shown(row: Row) -> str:
    return ",".join((row.path, *((row.value,) if isinstance(row.value, str) else row.value)))


def _unmatched(row: Row, found: str | None, named: dict[str, Row | RowProblem], match: _Matcher,
               src: str) -> RowProblem:
    """The bad row of a row that names no input, or one a row before it named."""
    if found is not None:
        first = named[found]
        number = first.number if isinstance(first, Row) else first.row
        return RowProblem(row.number, _shown(row), f"names {found!r:.80} again (first on row {number}); "
                          "give each input one row")
    spaced = match(row.path.strip()) if row.path != row.path.strip() else None
    if spaced is not None:  # `a.jpg ,cat`, or a cell padded by hand (a space after a CSV delimiter is skipped)
        return RowProblem(row.number, _shown(row), f"{row.path!r:.80} has spaces around it, which the input's name "
                          f"{spaced!r:.80} has not; remove them")
    both = match.shared.get(fold(row.path))
    if both is not None:
        return RowProblem(row.number, _shown(row), f"{row.path!r:.80} is the stem of {len(both)} inputs "
                          f"({', '.join(both[:3]):.200}); give the file name with its extension")
    elsewhere = match.in_folders(row.path)
    if elsewhere and not os.path.lexists(os.path.join(src, row.path)):
        return RowProblem(row.number, _shown(row), f"{row.path!r:.80} does not exist under SRC, but "
                          f"{', '.join(map(repr, elsewhere[:2])):.160} does; give the path relative to SRC, its "
                          "folders included")
    return RowProblem(row.number, _shown(row), f"{_unknown(src, row.path)}; fix the path or remove the row")


def _unknown(src: str, path: str) -> str:
    """Why a row's path names no input: a folder, a file that is no input, or nothing at all."""
    full = os.path.join(src, *path.split("/"))
    if os.path.isdir(full):
        return f"{path!r:.80} is a folder, not an input file"
    if os.path.lexists(full):
        return f"{path!r:.80} is not an input file (wrong extension, hidden, or unreadable)"
    return f"{path!r:.80} does not exist under SRC"
