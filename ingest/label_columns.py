"""Pure: a labels file's header row → which column is the path, which the split, which the label(s).

The rules are ``ingest/label_rows.py``'s layout: names stripped, folded to NFC and matched ignoring case, each
named once; the path column is ``path``, else the first; ``split`` with ``splits``; the label column ``label``,
else every other column (``many``) or the one other.

    columns_of("labels.csv", ["path", "Label"], splits=False, many=False)
    # Columns(path=0, split=None, labels=(1,), names=['Label'], width=2)
"""

from __future__ import annotations

import dataclasses
import re

from ..format.errors import InputError
from .label_formats import column_key, fold

PATH_COLUMN, SPLIT_COLUMN, LABEL_COLUMN = "path", "split", "label"
# In a label: it breaks the line it is printed on (the summary, TFDS's one-name-per-line file), is invisible (two
# classes would print alike: a zero-width space, a word joiner), reorders the text printed after it (bidi overrides
# and isolates), or is no character at all (a lone surrogate, which only a JSON \ud800 escape gives and UTF-8 cannot
# write). The joiners U+200C/U+200D and the marks U+200E/U+200F stay: Persian words and emoji sequences need them.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\u200b\u2060\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def unseen(character: str) -> str:
    """What a character ``CONTROL`` finds is, in words: ``the control character U+001B``."""
    code = ord(character)
    what = "lone surrogate" if 0xD800 <= code <= 0xDFFF else \
        "control character" if code < 0xA0 or code in (0x2028, 0x2029) else "invisible character"
    return f"the {what} U+{code:04X}"


def _bad_header(path: str, problem: str, fix: str) -> InputError:
    return InputError(f"{path}: {problem}; {fix}")


@dataclasses.dataclass(frozen=True)
class Columns:
    """Which column is the path, which the split (None: none), which the label, and the label columns' names."""

    path: int
    split: int | None
    labels: tuple[int, ...]
    names: list[str]
    width: int


def columns_of(path: str, header: list[str], splits: bool, many: bool) -> Columns:
    """The columns of a header: the path column (``path``, else the first), the split column (``split``, only with
    ``splits``), and the label column(s): ``label``, else ``label[i]`` spread by JSON Lines, else every other column
    (``many``) or the one other; names compared stripped, NFC and ignoring case, each named once.

    Raises:
      InputError: a control character in a name, a name twice, an unwanted ``split`` column, no label column.
    """
    names = [fold(name.strip()) for name in header]
    control = next((name for name in names if CONTROL.search(name)), None)
    if control is not None:  # a label column's name is printed, in the summary and by info
        raise _bad_header(path, f"header names a column holding {unseen(CONTROL.search(control).group())} (got "
                        f"{control!r:.60})", "name the columns in visible text")
    first: dict[str, int] = {}  # a name, matched ignoring case -> its column
    for i, name in enumerate(names):
        key = column_key(name)
        if name and key in first:  # which of them is the label (or the split) would be a guess
            other = names[first[key]]
            alike = "" if other == name else f", as {other!r:.60} and {name!r:.60}"
            raise _bad_header(path, f"header names the column {other!r:.60} twice{alike} (got {header!r:.100})",
                            "give each column its own name (names are matched ignoring case and surrounding spaces)")
        first.setdefault(key, i)
    at = first.get(PATH_COLUMN, 0)
    split = first.get(SPLIT_COLUMN)
    split = None if split == at else split
    if split is not None and not splits:
        raise _bad_header(path, f"has a {names[split]!r:.60} column (got {header!r:.100}), but episodes take their "
                        "split from folders", "drop the column and lay episodes out as SRC/<split>/...")
    rest = [i for i in range(len(names)) if i not in (at, split)]
    label = first.get(LABEL_COLUMN)
    spread = [i for i in rest if column_key(names[i]).startswith(LABEL_COLUMN + "[")]  # JSON: "label": [0.5, 2.0]
    if label is not None and label != at:
        labels = [label]
    elif spread:
        if not many and len(spread) > 1:  # JSON: "label": [0.5, 2.0] is a vector, one value each episode
            raise _bad_header(path, f"gives the label as a list of {len(spread)} numbers (got {header!r:.100}), a "
                            "vector, but an episode's label is one value", "give each episode one number or class name")
        labels = spread
    elif len(rest) == 1 or (many and rest):
        if not all(names[i] for i in rest):
            raise _bad_header(path, f"header leaves a label column unnamed (got {header!r:.100})",
                            "name every column, or drop the empty one")
        labels = rest
    else:
        problem = "has no label column" if not rest else "has more than two columns and none named 'label'"
        raise _bad_header(path, f"header {problem} (got {header!r:.100})",
                        "give it a header of the path column and a `label` column")
    return Columns(at, split, tuple(labels), [names[i] for i in labels], len(names))
