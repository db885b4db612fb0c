"""What an episode picture draws: features, channels, steps (decided before anything is read), and how (from a
channel's dtype and the steps drawn). Pure numpy.

A feature's channels are the elements of one step, flattened (a ``[T, 2, 3]`` feature has 6, named ``[0, 0]`` to
``[1, 2]``). A series longer than the pixels it is drawn on becomes its min/max envelope per pixel column, so a
year of hourly steps reads like a week of them. Booleans are drawn as a heat strip, integers of a few values
(``MAX_CATEGORIES``) as a strip of a colour per value, other integers as steps (``kind_of``).

    envelope(np.arange(10.0), 5)   # (array([0., 2., 4., 6., 8.]), array([1., 3., 5., 7., 9.]), array([0, 2, ...]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_FEATURES = 6  # "a handful": the features drawn when none is chosen, in name order
MAX_PANELS = 16  # features drawn at most (chosen with --feature); the plot says how many more there are
MAX_CHANNELS = 16  # channels drawn of one feature when none is chosen; a strip each
MAX_STRIPS = 64  # strips of the whole picture (about 40 inches): a choice past it is refused
# An integer channel with at most this many distinct values over the steps drawn is drawn as categories, a colour
# each: matplotlib's ten distinct colours, and as many a legend names beside a strip. An action, a class id per
# step, a weekday fit; hours of the day (24) or counts do not, and are drawn as steps.
MAX_CATEGORIES = 10


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


def runs(steps: int, columns: int) -> np.ndarray:
    """The first index of each of ``min(columns, steps)`` (at least 1) runs of consecutive steps, as even as whole
    steps allow: the steps under each pixel column of a strip."""
    columns = max(1, min(columns, steps))
    return (np.arange(columns, dtype=np.int64) * steps) // columns


def envelope(values: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(low, high, first)``: the min and max of ``values`` over each of ``columns`` runs of consecutive steps
    (NaN ignored; a run of only NaN stays NaN), and each run's first index. What a line of ``len(values)`` points
    drawn on ``columns`` pixels shows, without drawing them all."""
    values = np.asarray(values, np.float64)
    first = runs(len(values), columns)
    return np.fmin.reduceat(values, first), np.fmax.reduceat(values, first), first


def column_means(values: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(means, first)``: the mean over each of ``columns`` runs of consecutive steps (a boolean's share of
    True), and each run's first index: a heat strip's cells."""
    values = np.asarray(values, np.float64)
    first = runs(len(values), columns)
    counts = np.diff(np.append(first, len(values)))
    return np.add.reduceat(values, first) / counts, first


def column_modes(codes: np.ndarray, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(modes, first)``: the most frequent of ``codes`` (small integers from 0) over each of ``columns`` runs of
    consecutive steps, a tie going to the value met first in the run, and each run's first index: the cells of a
    strip of categories. A value rarer than another in every run it is in does not show.

        column_modes(np.array([0, 0, 2, 1]), 2)   # (array([0, 2]), array([0, 2])): 2 and 1 tie, 2 comes first
    """
    codes = np.asarray(codes, np.int64)
    if not len(codes):
        return codes, codes
    first = runs(len(codes), columns)
    run = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(codes))))
    width = int(codes.max()) + 1
    counts = np.bincount(run * width + codes, minlength=len(first) * width).reshape(len(first), width)
    top = counts[run, codes] == counts.max(axis=1)[run]  # the steps holding one of their run's most frequent values
    at = np.minimum.reduceat(np.where(top, np.arange(len(codes)), len(codes)), first)
    return codes[at], first


def categories(values: Sequence[np.ndarray]) -> np.ndarray:
    """The distinct values of one channel over the steps drawn of every episode shown, sorted."""
    arrays = [np.ravel(v) for v in values]
    return np.unique(np.concatenate(arrays)) if arrays else np.array([])


def kind_of(dtype: np.dtype, values: Sequence[np.ndarray] | None = None) -> str:
    """How a channel is drawn, from its dtype and ``values``, its steps drawn of each episode shown:

    - ``"heat"``: booleans, a strip of the share of True under each pixel column;
    - ``"categories"``: integers taking 1 to ``MAX_CATEGORIES`` distinct values over ``values`` (an action, a
      class id per step), a strip of a colour per value;
    - ``"steps"``: other integers (and any integer when ``values`` is None), as steps or their envelope;
    - ``"line"``: floats (complex as its real part), as a line or its envelope.

        kind_of(np.int32, [np.arange(100) % 4])   # "categories"; with % 24 (hours of the day): "steps"
    """
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "heat"
    if not np.issubdtype(dtype, np.integer):
        return "line"
    if values is not None and 0 < len(categories(values)) <= MAX_CATEGORIES:
        return "categories"
    return "steps"
