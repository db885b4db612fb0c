"""What a windows reader gathers and how it shapes each element; the episodes laid out in memory.

``Layout`` turns ``features``/``targets`` (and ``sampling_rate``, ``time_range``, ``padding``) into a
``WindowSpec`` (``readers/windowing/``: which windows each episode gives), the names to gather (inputs and target
features, gathered together: one gather of the whole span serves both) and the element: a tensor for one feature, a
dict for several; ``(x, x)`` for ``targets="same"``; ``(x, y)`` for step targets; ``(x, label)`` for episode labels;
with ``padding``, inputs ``{"inputs": x, "mask": m}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..arguments import MAX_BATCH_SIZE, MAX_WINDOW_STEPS, check_count
from ..windowing.starts import WindowSpec, segment_offsets, segment_steps
from ..windowing.targets import LABEL, Targets, TargetsArg, as_targets, check_label_targets, label_array, window_spec

LABEL_ARRAY = "episode/label"  # the resident arrays' key of the per-episode labels (no feature has a "/")


def pad_fill(pad_value, dtype: np.dtype, name: str, where: str):
    """``pad_value`` as a value of a feature's dtype, refused when the dtype cannot hold it exactly."""
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # a NaN or too large a value for the dtype: refused below
            value = np.asarray(pad_value).astype(dtype)
        exact = bool(value == pad_value) or (np.isnan(pad_value) and bool(np.isnan(value)))
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        raise ValueError(f"{where}: pad_value={pad_value!r} cannot be held by feature {name!r} of dtype "
                         f"{np.dtype(dtype).name}; pass a pad_value that dtype holds exactly")
    return value


class Layout:
    """What to gather and how to shape it: inputs (one name → tensors, several → dicts) and targets."""

    def __init__(self, names: list[str], single: bool, targets: TargetsArg, available: Sequence[str], where: str, *,
                 length: int, shift: int, sampling_rate: int = 1, time_range=None, padding: str | None = None,
                 pad_value=0, labelled: bool = False):
        given, targets = targets, as_targets(targets, length, where)
        check_label_targets(targets, labelled, where)
        self.inputs, self.single, self.targets = names, single, targets
        self.label = targets == LABEL
        self.same = targets == "same"
        self.spec = window_spec(length, shift, targets, sampling_rate=sampling_rate, time_range=time_range,
                                padding=padding, where=where)
        if isinstance(targets, Targets):
            target_names = list(names) if targets.features is None else (
                [targets.features] if isinstance(targets.features, str) else list(targets.features))
            unknown = [n for n in target_names if n not in available]
            if unknown and isinstance(given, str):
                raise ValueError(f"{where}: targets={given!r} is neither 'same', 'label' nor a feature; the features "
                                 f"are {sorted(available)}")
            if unknown:
                raise ValueError(f"{where}: targets={targets!r}: no feature(s) {unknown}; the features are "
                                 f"{sorted(available)}")
            self.target_names = target_names
            self.target_single = single if targets.features is None else isinstance(targets.features, str)
        else:
            self.target_names, self.target_single = [], False
        if padding is not None and not isinstance(pad_value, (int, float, complex, bool, np.number, np.bool_)):
            raise TypeError(f"{where}: pad_value must be a number (got pad_value={pad_value!r})")
        self.pad_value = pad_value
        self.gathered = names + [n for n in self.target_names if n not in names]

    def point_ranges(self) -> dict[str, tuple[int, int]]:
        """``{name: (first point, points)}``: what of the span each gathered feature needs: an input-only feature
        its first ``length`` points, a target-only one the last ``width``, one that is both the whole span. The
        resident gather takes just those rows, so no step it will not yield is copied (nor sliced off again)."""
        spec = self.spec
        targets = set(self.target_names)
        ranges = {}
        for name in self.gathered:
            if name in self.inputs and name in targets:
                ranges[name] = (0, spec.points)
            elif name in targets:
                ranges[name] = (spec.points - spec.width, spec.width)
            else:
                ranges[name] = (0, spec.length)
        return ranges

    @property
    def masked(self) -> bool:
        """Windows may start before their episode's first step: the inputs carry a mask."""
        return self.spec.padding is not None

    def shape(self, gathered: dict, mask=None, labels=None):
        """``gathered`` holds per name the span's points (``[B, points, ...]``) or just its ``point_ranges``;
        returns the dataset element."""
        spec = self.spec

        def pick(values, names, single):
            return values[names[0]] if single else {n: values[n] for n in names}

        def span(v) -> bool:  # the whole span, not already cut to what is needed
            return v.shape[1] == spec.points != spec.length

        inputs = pick({n: v[:, :spec.length] if span(v) else v for n, v in gathered.items() if n in self.inputs},
                      self.inputs, self.single)
        shaped = inputs if mask is None else {"inputs": inputs, "mask": mask}
        if self.targets is None:
            return shaped
        if self.same:  # the autoencoder case: the very same tensor, no second gather or zip
            return shaped, inputs
        if self.label:
            return shaped, labels
        start = spec.points - spec.width
        targets = {n: gathered[n][:, start:] if start and gathered[n].shape[1] == spec.points else gathered[n]
                   for n in self.target_names}
        return shaped, pick(targets, self.target_names, self.target_single)


def check_window_args(length: int, shift: int, batch_size: int, where: str) -> None:
    for name, value, high in (("length", length, MAX_WINDOW_STEPS), ("shift", shift, MAX_WINDOW_STEPS),
                              ("batch_size", batch_size, MAX_BATCH_SIZE)):
        check_count(value, name, where, high=high)


ALIGNMENT = 64  # bytes: TensorFlow's allocator alignment, which a tensor sharing an array's memory needs


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting at a multiple of ``ALIGNMENT`` bytes, so TensorFlow can view it through
    DLPack and copy it at memory speed (``resident.host_tensor``) instead of converting it."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    skip = -buffer.ctypes.data % ALIGNMENT
    return buffer[skip : skip + size].view(dtype).reshape(shape)


@dataclasses.dataclass
class Concatenated:
    """Episodes laid end to end in source (episode id) order, as the windows of ``spec`` need them: each episode's
    slice (``spec.bounds``) after ``spec.pad_steps(row)`` steps of ``pad_value``, then zeros to whole rows of
    ``row`` steps.

    ``arrays``: one per feature, ``[steps including padding, *shape]``, a whole number of rows long.
    ``lengths``: every episode's whole length (its slice is taken from it).
    """

    arrays: dict[str, np.ndarray]
    lengths: list[int]
    ids: list[int]
    row: int
    spec: WindowSpec
    labels: np.ndarray | None = None  # per episode, in the order of ``ids`` (``label_array``)

    @property
    def offsets(self) -> np.ndarray:
        """Where each episode's segment starts in the arrays, in steps (multiples of ``row``)."""
        return segment_offsets(self.spec, self.lengths, self.row)

    @property
    def pad(self) -> int:
        """Steps of padding before each episode's slice."""
        return self.spec.pad_steps(self.row)

    @property
    def steps(self) -> int:
        """The arrays' length: every segment."""
        return int(sum(segment_steps(self.spec, self.lengths, self.row)))

    def rows(self, name: str) -> np.ndarray:
        """A feature's array viewed as ``[rows, row, ...]`` (explicit sizes: a zero-width feature has no -1)."""
        array = self.arrays[name]
        return array.reshape(len(array) // self.row, self.row, *array.shape[1:])

    def empty(self, dtype: np.dtype, shape: tuple[int, ...], pad_value=0) -> np.ndarray:
        """An array for one feature: ``pad_value`` in every history padding, zeros elsewhere."""
        out = aligned_empty((self.steps, *shape), dtype)
        out.fill(0)
        if self.pad and pad_value:
            for offset in self.offsets.tolist():
                out[offset : offset + self.pad] = pad_value
        return out

    @classmethod
    def of(cls, episodes: dict[str, list[np.ndarray]], ids: list[int], row: int, spec: WindowSpec, where: str,
           pad_value=0, labels: list | None = None) -> Concatenated:
        """From per-episode arrays in memory (in the order of ``ids``), each feature's dtype promoted over its
        episodes as ``np.concatenate`` would; episodes of one feature with other trailing shapes are refused."""
        names = list(episodes)
        lengths = [len(e) for e in episodes[names[0]]]
        made = cls({}, lengths, list(ids), row, spec, None if labels is None else label_array(labels))
        for name, parts in episodes.items():
            parts = [np.asarray(p) for p in parts]
            trailing = sorted({p.shape[1:] for p in parts})
            if len(trailing) > 1:
                raise ValueError(f"{where}: episodes[{name!r}]: every episode of a feature must have the same shape "
                                 f"after its time axis (got {trailing})")
            dtype = np.result_type(*parts)
            out = made.empty(dtype, trailing[0], pad_fill(pad_value, dtype, name, where) if spec.padding else 0)
            for offset, part in zip(made.offsets.tolist(), parts):
                lo, hi = spec.bounds(len(part))
                at = offset + made.pad
                out[at : at + hi - lo] = part[lo:hi]
            made.arrays[name] = out
        return made
