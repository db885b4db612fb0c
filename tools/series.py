"""What an episode picture draws, decided before anything is read: features, channels, steps. Pure numpy.

A feature's channels are the elements of one step, flattened (a ``[T, 2, 3]`` feature has 6, named ``[0, 0]`` to
``[1, 2]``). A series longer than the pixels it is drawn on becomes its min/max envelope per pixel column, so a
year of hourly steps reads like a week of them; integer and boolean features are drawn as steps or a heat strip.

    envelope(np.arange(10.0), 5)   # (array([0., 2., 4., 6., 8.]), array([1., 3., 5., 7., 9.]), array([0, 2, ...]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_FEATURES = 6  # "a handful": the features drawn when none is chosen, in name order
MAX_PANELS = 16  # features drawn at most (chosen with --feature); the plot says how many more there are
MAX_CHANNELS = 16  # channels drawn of one feature when none is chosen; a strip each
MAX_STRIPS = 64  # strips of the whole picture (about 40 inches): a choice past it is refused


def as_list(value, kind: type) -> list | None:
    """``value`` (one, or several) as a list, or None: ``feature="obs"`` and ``feature=["obs", "act"]`` alike."""
    if value is None:
        return None
    if isinstance(value, kind) or (kind is int and isinstance(value, np.integer)):
        return [value]
    return list(value)


def choose_features(path: str, schema: Mapping[str, Sequence[int]], feature) -> tuple[list[str], int]:
    """The features drawn, in the order given (default: the first ``DEFAULT_FEATURES`` by name whose default
    channels fit ``MAX_STRIPS``), and how many others are left out.

    Raises:
      ValueError: a name the dataset does not have, a repeated one, or more than ``MAX_PANELS``.
    """
    chosen = as_list(feature, str)
    names = sorted(schema)
    if chosen is None:
        picked, strips = [], 0
        for name in names[:DEFAULT_FEATURES]:
            strips += min(channel_count(schema[name]), MAX_CHANNELS) or 1
            if picked and strips > MAX_STRIPS:
                break
            picked.append(name)
        return picked, len(names) - len(picked)
    if not chosen or len(chosen) > MAX_PANELS:
        raise ValueError(f"{path}: choose 1 to {MAX_PANELS} features to draw (got feature={chosen!r}); pass fewer "
                         "--feature")
    for name in chosen:
        if not isinstance(name, str) or name not in schema:
            raise ValueError(f"{path}: no feature {name!r} to draw (got feature={chosen!r}); the dataset has "
                             f"{', '.join(names)}")
    if len(set(chosen)) < len(chosen):
        raise ValueError(f"{path}: a feature named twice (got feature={chosen!r}); pass each --feature once")
    return chosen, len(names) - len(chosen)


def channel_count(shape: Sequence[int]) -> int:
    """Elements of one step of a feature of per-step ``shape``."""
    return int(np.prod(shape, dtype=np.int64))


def channel_name(shape: Sequence[int], channel: int) -> str:
    """``ch 4``, or ``ch 4 [1, 1]`` for an element of a step with more than one axis."""
    if len(shape) <= 1:
        return f"ch {channel}"
    return f"ch {channel} [{', '.join(str(int(i)) for i in np.unravel_index(channel, tuple(shape)))}]"


def choose_channels(path: str, schema: Mapping[str, Sequence[int]], names: Sequence[str],
                    channel) -> dict[str, tuple[list[int], int]]:
    """``{feature: (channels drawn, channels left out)}``: the given channels of every feature drawn, or each
    feature's first ``MAX_CHANNELS``.

    Raises:
      ValueError: a channel that is not an integer, a repeated one, one past a feature's channels, or a choice
        of more strips than ``MAX_STRIPS``.
    """
    chosen = as_list(channel, int)
    if chosen is not None:
        bad = [c for c in chosen if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0]
        if not chosen or bad or len(set(chosen)) < len(chosen):
            raise ValueError(f"{path}: channels are distinct integers from 0 (got channel={chosen!r}); pass each "
                             "--channel once, counting a step's elements from 0")
    drawn = {}
    for name in names:
        count = channel_count(schema[name])
        if chosen is None:
            drawn[name] = (list(range(min(count, MAX_CHANNELS))), max(count - MAX_CHANNELS, 0))
            continue
        past = [c for c in chosen if c >= count]
        if past:
            raise ValueError(f"{path}: feature {name!r} has {count} channels, 0 to {count - 1} (got channel="
                             f"{chosen!r}); pass channels it has, or --feature to draw only features that have them")
        drawn[name] = ([int(c) for c in chosen], count - len(chosen))
    strips = sum(len(channels) or 1 for channels, _ in drawn.values())
    if strips > MAX_STRIPS:
        raise ValueError(f"{path}: {strips} strips (a channel of a feature each) is over the {MAX_STRIPS} one "
                         f"picture holds (got feature={list(names)!r}, channel={chosen!r}); pass fewer --feature "
                         "or --channel")
    return drawn


def time_range_of(text: str) -> tuple:
    """``--time-range`` as ``readers.windows``' ``time_range``: ``"100:500"`` the steps [100, 500), ``"0.5:1"``
    (any number with a point) the fractions [0.5, 1] of each episode. Checked by the readers' rule afterwards."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        if any("." in part for part in parts):
            return float(parts[0]), float(parts[1])
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"--time-range: must be START:STOP, steps (100:500) or fractions of each episode "
                         f"(0.5:1.0) (got {text!r}); pass two numbers around a colon") from None


def envelope(values: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(low, high, first)``: the min and max of ``values`` over each of ``columns`` runs of consecutive steps
    (NaN ignored; a run of only NaN stays NaN), and each run's first index. What a line of ``len(values)`` points
    drawn on ``columns`` pixels shows, without drawing them all."""
    values = np.asarray(values, np.float64)
    columns = max(1, min(columns, len(values)))
    first = (np.arange(columns, dtype=np.int64) * len(values)) // columns
    return np.fmin.reduceat(values, first), np.fmax.reduceat(values, first), first


def column_means(values: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(means, first)``: the mean over each of ``columns`` runs of consecutive steps (a boolean's share of
    True), and each run's first index: a heat strip's cells."""
    values = np.asarray(values, np.float64)
    columns = max(1, min(columns, len(values)))
    first = (np.arange(columns, dtype=np.int64) * len(values)) // columns
    counts = np.diff(np.append(first, len(values)))
    return np.add.reduceat(values, first) / counts, first


def kind_of(dtype: np.dtype) -> str:
    """How a feature is drawn: ``"heat"`` (booleans: a strip of the share of True), ``"steps"`` (integers) or
    ``"line"`` (floats; complex as its real part)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "heat"
    return "steps" if np.issubdtype(dtype, np.integer) else "line"
