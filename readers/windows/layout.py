"""What a windows reader gathers and how it shapes each element; the argument checks its modes share.

``Layout`` turns ``features``/``targets`` into the names to gather and the element
structure: a tensor for one feature, a dict for several; ``(x, x)`` for
``targets="same"``; ``(x, y)`` for a target feature; past and future for a horizon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Union

import numpy as np

from ..arguments import MAX_BATCH_SIZE, MAX_WINDOW_STEPS, check_count
from .starts import episode_offsets

Targets = Union[None, str, int]


class Layout:
    """What to gather and how to shape it: inputs (one name → tensors, several → dicts) and targets."""

    def __init__(self, names: list[str], single: bool, targets: Targets, available: Sequence[str], where: str):
        if isinstance(targets, bool) or not (targets is None or isinstance(targets, (str, int, np.integer))):
            raise TypeError(f"{where}: targets must be None, 'same', a feature name or a horizon (got {targets!r})")
        if isinstance(targets, np.integer):  # a horizon from numpy arithmetic, as length and shift may be
            targets = int(targets)
        if isinstance(targets, int) and targets < 1:
            raise ValueError(f"{where}: a forecast horizon must be at least 1 step (got targets={targets!r})")
        if isinstance(targets, str) and targets != "same" and targets not in available:
            raise ValueError(
                f"{where}: targets={targets!r} is neither 'same' nor a feature; the features are {sorted(available)}"
            )
        self.inputs, self.single, self.targets = names, single, targets
        self.horizon = targets if isinstance(targets, int) else 0
        extra = [targets] if isinstance(targets, str) and targets not in ("same", *names) else []
        self.gathered = names + extra

    def shape(self, gathered: dict, length: int):
        """``gathered`` holds windows of ``length + horizon`` steps per name; returns the dataset element."""
        def pick(values):
            return values[self.inputs[0]] if self.single else {n: values[n] for n in self.inputs}

        if self.horizon:
            past = {n: v[:, :length] for n, v in gathered.items()}
            future = {n: v[:, length:] for n, v in gathered.items()}
            return pick(past), pick(future)
        inputs = pick(gathered)
        if self.targets is None:
            return inputs
        if self.targets == "same":  # the autoencoder case: the very same tensor, no second gather or zip
            return inputs, inputs
        return inputs, gathered[self.targets]


def check_window_args(length: int, shift: int, batch_size: int, where: str) -> None:
    for name, value, high in (("length", length, MAX_WINDOW_STEPS), ("shift", shift, MAX_WINDOW_STEPS),
                              ("batch_size", batch_size, MAX_BATCH_SIZE)):
        check_count(value, name, where, high=high)


@dataclasses.dataclass
class Concatenated:
    """Episodes laid end to end in source (episode id) order, each padded with zeros to whole rows of ``row`` steps.

    ``arrays``: one per feature, ``[steps including padding, *shape]``, a whole number of rows long.
    """

    arrays: dict[str, np.ndarray]
    lengths: list[int]
    ids: list[int]
    row: int

    @property
    def offsets(self) -> np.ndarray:
        """Where each episode starts in the arrays, in steps (multiples of ``row``)."""
        return episode_offsets(self.lengths, self.row)

    @property
    def steps(self) -> int:
        """The arrays' length: every episode and its padding."""
        return int(sum(t + (-t % self.row) for t in self.lengths))

    def rows(self, name: str) -> np.ndarray:
        """A feature's array viewed as ``[rows, row, ...]`` (explicit sizes: a zero-width feature has no -1)."""
        array = self.arrays[name]
        return array.reshape(len(array) // self.row, self.row, *array.shape[1:])

    @classmethod
    def of(cls, episodes: dict[str, list[np.ndarray]], ids: list[int], row: int, where: str) -> Concatenated:
        """From per-episode arrays in memory (in the order of ``ids``), each feature's dtype promoted over its
        episodes as ``np.concatenate`` would; episodes of one feature with other trailing shapes are refused."""
        names = list(episodes)
        lengths = [len(e) for e in episodes[names[0]]]
        made = cls({}, lengths, list(ids), row)
        for name, parts in episodes.items():
            parts = [np.asarray(p) for p in parts]
            trailing = sorted({p.shape[1:] for p in parts})
            if len(trailing) > 1:
                raise ValueError(f"{where}: episodes[{name!r}]: every episode of a feature must have the same shape "
                                 f"after its time axis (got {trailing})")
            out = np.zeros((made.steps, *trailing[0]), np.result_type(*parts))
            for offset, part in zip(made.offsets.tolist(), parts):
                out[offset : offset + len(part)] = part
            made.arrays[name] = out
        return made
