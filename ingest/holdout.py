"""Held-out splits decided at conversion (``--val-fraction``, ``--test-fraction``). Pure Python, no I/O.

For a dataset that has only a training split, each input of ``train`` goes to ``val`` or ``test`` by a seeded
hash of its path relative to SRC (``position``): its split depends on nothing but its own path and the seed, so
adding or removing other files never moves it (keras' ``validation_split`` cuts a sorted list, so one new file
shifts every later one across the cut). ``stratify`` instead gives each class exactly ``round(n * fraction)``
held-out inputs (the ones of lowest hash): exact per-class counts, at the cost of that stability (a new file in a
class can move one other input of that class). The manifest's ``split_rule`` records which was used.

    hold_out({"train": files}, Holdout(val_fraction=0.1), path_of=lambda f: f.relpath, src="photos/")
    # {'train': [...about 90%...], 'val': [...about 10%...]}
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

from ..format.errors import InputError, OptionError

HELD_OUT = ("val", "test")  # the splits made, in the order their fractions are taken from [0, 1)
SOURCE = "train"


@dataclasses.dataclass(frozen=True)
class Holdout:
    """How much of ``train`` to hold out, and how.

    Attributes:
      val_fraction: the share of ``train`` that becomes ``val`` (0: none).
      test_fraction: the share that becomes ``test`` (0: none).
      seed: the hash's seed; another seed is another, equally stable, split.
      stratify: exact per-class counts (class labels only) instead of the per-file hash.
    """

    val_fraction: float = 0.0
    test_fraction: float = 0.0
    seed: int = 0
    stratify: bool = False

    def __post_init__(self):
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise OptionError("{" + name + "}: must be a fraction in [0, 1) (got {got!r}); e.g. 0.1 holds out 10%",
                                  got=value)
        if self.val_fraction + self.test_fraction >= 1:
            raise OptionError("{val_fraction} + {test_fraction}: must leave some of train (got {val!r} + {test!r}); "
                              "hold out less", val=self.val_fraction, test=self.test_fraction)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise OptionError("{split_seed}: must be a non-negative int64 (got {got!r})", got=self.seed)

    @property
    def fractions(self) -> dict[str, float]:
        """The held-out splits asked for, with their fractions."""
        asked = {"val": self.val_fraction, "test": self.test_fraction}
        return {name: float(f) for name, f in asked.items() if f > 0}

    def rule(self) -> dict[str, Any] | None:
        """The manifest's ``split_rule``: None when nothing is held out."""
        if not self.fractions:
            return None
        return {"method": "stratified" if self.stratify else "hash", "seed": self.seed, "from": SOURCE,
                "fractions": self.fractions}


def position(path: str, seed: int) -> float:
    """Where a path falls in [0, 1): the first 8 bytes of SHA-256 of ``"<seed>:<path>"``, as a fraction.

        position("cat/1.jpg", 0) < 0.1  # whether cat/1.jpg is in a 10% val split: the same on every machine
    """
    digest = hashlib.sha256(f"{seed}:{path}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _by_hash(items: list, holdout: Holdout, path_of: Callable) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in (SOURCE, *holdout.fractions)}
    test, val = holdout.test_fraction, holdout.val_fraction
    for item in items:
        u = position(path_of(item), holdout.seed)
        out["test" if u < test else "val" if u < test + val else SOURCE].append(item)
    return out


def _stratified(items: list, holdout: Holdout, path_of: Callable, class_of: Callable) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in (SOURCE, *holdout.fractions)}
    classes: dict[Any, list] = {}
    for item in items:
        classes.setdefault(class_of(item), []).append(item)
    for members in classes.values():
        members.sort(key=lambda item: (position(path_of(item), holdout.seed), path_of(item)))
        n = len(members)
        n_test = math.floor(n * holdout.test_fraction + 0.5)
        n_val = min(n - n_test, math.floor(n * holdout.val_fraction + 0.5))
        out.setdefault("test", []).extend(members[:n_test])
        out.setdefault("val", []).extend(members[n_test:n_test + n_val])
        out[SOURCE].extend(members[n_test + n_val:])
    return {name: files for name, files in out.items() if name in (SOURCE, *holdout.fractions)}


def hold_out(items: dict[str, list], holdout: Holdout, *, path_of: Callable[[Any], str],
             class_of: Callable[[Any], Any] | None = None, src: str = "SRC") -> dict[str, list]:
    """``items`` with ``holdout``'s shares of ``train`` moved to ``val``/``test``; each split stays in path order.

    Args:
      items: split → inputs, in path order.
      holdout: the fractions and the rule.
      path_of: an input's path relative to SRC (what the hash reads).
      class_of: an input's class, for ``stratify``; None when the labels are not classes.
      src: the source folder, for the errors.

    Raises:
      InputError: a held-out split exists already, there is no ``train`` to hold out from, or ``stratify``
        without class labels.
    """
    asked = holdout.fractions
    if not asked:
        return items
    taken = [name for name in asked if items.get(name)]
    if taken:
        raise InputError(f"{src}: already has a {taken[0]!r} split (got --{taken[0]}-fraction "
                         f"{asked[taken[0]]:g}); drop --{taken[0]}-fraction, or merge the {taken[0]} inputs into train")
    if not items.get(SOURCE):
        raise InputError(f"{src}: no {SOURCE!r} inputs to hold a split out of (got splits "
                         f"{sorted(n for n in items if items[n])!r}); lay the inputs out without split folders, "
                         "or as SRC/train/...")
    if holdout.stratify and class_of is None:
        raise InputError(f"{src}: --stratify keeps each class's share exact, so it needs class labels (got "
                         "multi-label or value labels); drop --stratify to hold out by hash")
    split = _stratified if holdout.stratify else _by_hash
    moved = split(items[SOURCE], holdout, path_of, *([class_of] if holdout.stratify else []))
    result = {name: files for name, files in items.items() if name != SOURCE}
    for name, files in moved.items():
        result[name] = sorted(files, key=path_of)
    return result
