"""What a window predicts: ``readers.Targets``, the shortcuts for it (``"same"``, ``"label"``, a feature, a horizon),
and the ``WindowSpec`` a reader's arguments give. Pure Python/numpy, no TensorFlow.

``files.py`` (``readers.info(...).num_windows``) and the readers in ``windows/`` both build their spec here, so a
count from the manifest and the windows a reader yields cannot disagree.

    window_spec(256, 16, targets=8)   # WindowSpec(length=256, shift=16, offset=8, width=8)
    as_targets("action", 256, "runs")  # Targets(features='action', width=256, offset=0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Union

import numpy as np

from ...format.records import LABEL_NAME
from .starts import WindowSpec

LABEL = LABEL_NAME  # targets="label": the episode's label (a dataset converted with episode labels)


@dataclasses.dataclass(frozen=True)
class Targets:
    """What a window predicts, as TensorFlow's time-series tutorial puts it (its ``WindowGenerator``'s ``shift`` is
    ``offset`` here, so as not to clash with the reader's ``shift`` between windows).

    The inputs are the window's ``length`` points; the whole span is ``length + offset`` points; the targets are
    the **last ``width`` points of that span**, of ``features`` (default: the input features).

        Targets(width=16, offset=16)             # the next 16 steps (what targets=16 means)
        Targets("action", width=16, offset=16)   # the next 16 steps of another feature
        Targets(width=10, offset=20)             # steps 11..20 after the window: a gap of 10
        Targets(width=1, offset=0)               # the window's own last step
        Targets("y", width=length, offset=0)     # feature y over the same steps (what targets="y" means)

    Attributes:
      features: a feature name (targets are a tensor), a list of names (a dict), or None: the inputs' features,
        in the inputs' structure.
      width: target points, at most ``length + offset``.
      offset: points the span reaches past the inputs.
    """

    features: str | Sequence[str] | None = None
    width: int = dataclasses.field(default=1, kw_only=True)
    offset: int = dataclasses.field(default=0, kw_only=True)

    def __post_init__(self):
        for name, low in (("width", 1), ("offset", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"Targets: {name} must be an integer of at least {low} (got {name}={value!r})")
            object.__setattr__(self, name, int(value))
        if not (self.features is None or isinstance(self.features, str)):
            try:
                names = tuple(self.features)
            except TypeError:
                names = None
            if names == ():
                raise ValueError("Targets: features must name at least one feature (got features=[]); pass None for "
                                 "the inputs' features, or the names to predict")
            if not names or not all(isinstance(n, str) for n in names):
                raise TypeError(f"Targets: features must be None, a feature name or a non-empty list of names "
                                f"(got features={self.features!r}); pass e.g. Targets('action', width=16, offset=16)")
            object.__setattr__(self, "features", names)


TargetsArg = Union[None, str, int, Targets]


def as_targets(targets: TargetsArg, length: int, where: str) -> Targets | str | None:
    """The shortcuts as what they mean: ``None``; ``"same"`` and ``"label"`` (kept: they shape the element their
    own way); a feature name → ``Targets(name, width=length, offset=0)``; an int H → ``Targets(width=H, offset=H)``."""
    if isinstance(targets, bool) or not (targets is None or isinstance(targets, (str, int, np.integer, Targets))):
        raise TypeError(f"{where}: targets must be None, 'same', 'label', a feature name, a horizon or a "
                        f"readers.Targets (got {targets!r})")
    if isinstance(targets, (int, np.integer)):  # a horizon, numpy ints too (length and shift may come from numpy)
        if targets < 1:
            raise ValueError(f"{where}: a forecast horizon must be at least 1 step (got targets={int(targets)!r})")
        return Targets(width=int(targets), offset=int(targets))
    if isinstance(targets, str) and targets not in ("same", LABEL):
        return Targets(targets, width=length, offset=0)
    return targets


def check_label_targets(targets, labelled: bool, where: str) -> None:
    """``targets="label"`` needs a dataset converted with episode labels."""
    if isinstance(targets, str) and targets == LABEL and not labelled:
        raise ValueError(f"{where}: targets='label' needs episode labels, and this data has none; convert with "
                         "class folders (SRC/<class>/<episode>.npy) or --labels FILE")


def window_spec(length: int, shift: int = 1, targets: TargetsArg = None, *, sampling_rate: int = 1,
                time_range=None, padding: str | None = None, where: str = "windows") -> WindowSpec:
    """The ``WindowSpec`` of a reader's arguments (which windows each episode gives), without reading anything."""
    targets = as_targets(targets, length, where)
    offset, width = (targets.offset, targets.width) if isinstance(targets, Targets) else (0, 0)
    try:
        return WindowSpec(length, shift, offset=offset, width=width, sampling_rate=sampling_rate,
                          time_range=time_range, padding=padding)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def label_array(labels: Sequence) -> np.ndarray:
    """Per-episode labels as the reader yields them: int64 for class indices (ints), float32 for values."""
    values = np.asarray(labels)
    if values.dtype.kind in "iub":
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        return values.astype(np.float32)
    raise TypeError(f"labels: ints (class indices) or floats (values), one per episode (got dtype {values.dtype})")
