"""What a labels file's values mean: the kind of label, decided over every value, and each value as that kind.
Pure Python.

Only plain decimal numbers are numbers: ``12``, ``-0.5``, ``1.``, ``.5``, and with an exponent ``1e-05`` (how pandas
writes small floats). ``float()`` also takes ``nan``, ``inf``, ``Infinity``, ``1_000``, `` 12 `` and digits of other
scripts; here those are names. The kind, unless ``--label-kind`` gives it:
  - a ``;`` in any value → ``"multi"`` (names separated by ``;``);
  - every value an integer → ``"class"``, the classes in numeric order (``01`` is ``1``);
  - every value a decimal number, one not an integer → ``"value"`` (float32);
  - anything else → ``"class"``, the names sorted.
Empty values decide nothing (a bad row, except in multi-label: an input of no class). ``Kind.rule`` says in words
which rule applied, for the summary.

In a file separated by ``;`` (a spreadsheet's export where the comma is the decimal mark), ``comma=True``: where
the labels are read as numbers (``--label-kind value``, several label columns), ``0,5`` is 0.5 too. It never decides
the kind: ``0,5`` might as well be a name, so the rule points it out and says how to read such labels as numbers.
"""

from __future__ import annotations

import math
import re
import struct
import typing
from collections.abc import Iterable

from .label_formats import MULTI_SEPARATOR

LABEL_KINDS = ("class", "multi", "value")  # what --label-kind takes
_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: [0-9], never \d
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DECIMAL_COMMA = re.compile(r"[+-]?[0-9]+,[0-9]+(?:[eE][+-]?[0-9]+)?")  # 0,5 and -1,25e-3; never 1,000,000 or ,5


def is_integer(text: str) -> bool:
    return _INTEGER.fullmatch(text) is not None


_COMPLEMENT = str.maketrans("0123456789", "9876543210")


def _integer(text: str) -> str:
    """An integer's canonical text (``+07`` → ``7``, ``-0`` → ``0``), by its digits: ``int()`` refuses more than
    4,300 of them, and a labels file may hold any number."""
    digits = text.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if text.startswith("-") and digits != "0" else digits


def _numeric_order(canonical: str) -> tuple:
    """A sort key putting canonical integers in numeric order: negatives first, larger magnitudes first among them."""
    if canonical.startswith("-"):
        return 0, -len(canonical), canonical[1:].translate(_COMPLEMENT)
    return 1, len(canonical), canonical


def is_decimal(text: str, comma: bool = False) -> bool:
    """A plain decimal number: ``-0.5``, ``1.``, ``.5``, ``1e-05``; not ``nan``, ``inf``, ``1_000`` or hex. With
    ``comma``, ``0,5`` too (a decimal comma).

        is_decimal("1e-05"), is_decimal("Infinity"), is_decimal("0,5", comma=True)  # (True, False, True)
    """
    return _DECIMAL.fullmatch(text) is not None or (comma and _DECIMAL_COMMA.fullmatch(text) is not None)


def float32(text: str, comma: bool = False) -> float | None:
    """The float32 nearest a decimal number (with ``comma``, one written with a decimal comma too), as a Python
    float; None for no decimal number or out of float32's range (``1e400``, ``3.5e38``)."""
    if not is_decimal(text, comma):
        return None
    value = float(text.replace(",", "."))  # a decimal number is always a float, inf when it overflows float64
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0] if math.isfinite(value) else None
    except OverflowError:
        return None


class Kind(typing.NamedTuple):
    """The kind of every label (``"class"``, ``"multi"`` or ``"value"``), the class names (none for values) and the
    rule that decided it, in words."""

    kind: str
    class_names: list[str]
    rule: str


def parts(value: str) -> list[str]:
    """A multi-label value's class names: the parts between ``;``, stripped, empty ones dropped."""
    return [part.strip() for part in value.split(MULTI_SEPARATOR) if part.strip()]


def _quoted(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def _decided(texts: list[str], kinds: Iterable[str], comma: bool) -> tuple[str, str]:
    """The kind of labels ``texts`` (sorted, none empty) and the rule that decides it."""
    if not texts:
        return "class", "no row labels an input"
    held = next((v for v in texts if MULTI_SEPARATOR in v), None) if "multi" in kinds else None
    if held is not None:
        return "multi", (f"a label holds {MULTI_SEPARATOR!r} (got {_quoted(held)}): names separated by "
                         f"{MULTI_SEPARATOR!r}; pass --label-kind class to keep such names whole")
    name = next((v for v in texts if not is_decimal(v)), None)
    if name is not None:
        comma_mark = is_decimal(name.replace(",", ".", 1))  # 0,5: a number with a decimal comma?
        if comma_mark and comma:  # --label-kind value reads them as numbers when every one is a number
            numbers = all(is_decimal(v, comma=True) for v in texts)
        else:
            numbers = any(map(is_decimal, texts))
        mark = "" if not comma_mark else " (a decimal comma?)" if comma and numbers else \
            " (a decimal comma? write numbers with a point)"  # only with a point can --label-kind value read them
        hint = "; pass --label-kind value to read the labels as numbers" if numbers else ""
        return "class", f"{_quoted(name)} is not a decimal number{mark}: class names, sorted{hint}"
    fractions = [v for v in texts if not is_integer(v)]
    if fractions:  # the example: one with a fraction, rather than 1.0 or 1e3
        shown = next((v for v in fractions if not float(v).is_integer()), fractions[0])
        return "value", (f"every label is a decimal number, and {_quoted(shown)} is not an integer; pass "
                         "--label-kind class to read them as class names")
    return "class", "every label is an integer: classes in numeric order; pass --label-kind value to read them as " \
                    "numbers"


def label_kind(values: Iterable[str], kinds: Iterable[str] = LABEL_KINDS, forced: str | None = None, *,
               columns: int = 1, lists: bool = False, comma: bool = False) -> Kind:
    """The kind of label every value is, its class names, and why (``Kind``).

    Args:
      values: every label (a text each); empty ones decide nothing.
      kinds: the kinds the inputs can take (episodes: no ``"multi"``).
      forced: ``--label-kind``: the kind to use.
      columns: label columns; several are always ``"value"`` (a vector of numbers).
      lists: the labels are JSON lists of names: ``"multi"``, even when every list holds one name (or none).
      comma: numbers may be written with a decimal comma (a file separated by ';'); it only changes the hint.

        label_kind(["2", "10", "-1"])[:2], label_kind(["0.5", "1"])[:2]  # (('class', ['-1', '2', '10']), ('value', []))
        label_kind(["cat;outdoor", "dog"])[:2]  # ('multi', ['cat', 'dog', 'outdoor'])
    """
    values = set(values)
    texts = sorted(v for v in values if v)
    if columns > 1:
        kind, rule = "value", f"{columns} label columns: a vector of numbers"
    elif forced is not None:
        kind, rule = forced, f"--label-kind {forced}"
    elif lists and "multi" in kinds:
        kind, rule = "multi", "the labels are JSON lists of names; pass --label-kind class to read each as one name"
    else:
        kind, rule = _decided(texts, kinds, comma)
    if kind == "value":
        return Kind("value", [], rule)
    if kind == "multi":
        texts = sorted({part for v in values for part in parts(v)})
    if texts and all(map(is_integer, texts)):
        return Kind(kind, sorted({_integer(v) for v in texts}, key=_numeric_order), rule)
    return Kind(kind, texts, rule)


def _index(text: str, index: dict[str, int]) -> int | None:
    """A class name's index: as written (``01`` among names such as ``cat``), else as its integer (``01`` among
    integer classes is class ``1``)."""
    found = index.get(text)
    if found is None and is_integer(text):
        return index.get(_integer(text))
    return found


def label_of(value: str | tuple[str, ...], kind: str, index: dict[str, int], *,
             comma: bool = False) -> int | float | tuple | None:
    """A value as ``kind``: a class index (``index``: name → index), a sorted tuple of them (multi), a float32 (as a
    Python float; ``0,5`` too with ``comma``), or a tuple of float32 with several columns; None for a bad value
    (``bad_value`` says why)."""
    if kind == "multi":  # an empty value is an input of none of the classes
        found = [_index(part, index) for part in parts(value)]
        return None if None in found else tuple(sorted(set(found)))
    if isinstance(value, tuple):  # several columns: a value label of that many floats
        numbers = tuple(float32(v, comma) for v in value)
        return None if None in numbers else numbers
    if not value:
        return None
    return float32(value, comma) if kind == "value" else _index(value, index)


def bad_value(value: str | tuple[str, ...], kind: str, comma: bool = False) -> str:
    """Why ``label_of`` found no label in ``value``, with the fix."""
    point = "" if comma else " (with a decimal point: a comma is one only in a file separated by ';')"
    if isinstance(value, tuple):
        bad = next(v for v in value if float32(v, comma) is None)
        mark = point if is_decimal(bad.replace(",", ".", 1)) else ""
        return f"label {bad!r:.80} is not a finite float32 number; give every label column a decimal number{mark}"
    if kind == "multi":
        return f"label {value!r:.80} holds a class no other row names; fix the row"
    if not value:
        return "an empty label; give every row a class name, an integer or a decimal number"
    if not is_decimal(value, comma):
        mark = point if is_decimal(value.replace(",", ".", 1)) else ""
        return (f"label {value!r:.80} is not a number (--label-kind value); give a decimal number such as 0.5{mark}, "
                "or another --label-kind")
    return f"label {value!r:.80} is outside float32's range (±3.4e38); scale the values"
