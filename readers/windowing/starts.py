"""Window-start arithmetic: which windows an episode gives, and where they start in the resident arrays. Pure
Python/numpy, no TensorFlow.

A window is ``points = length + offset`` points, ``sampling_rate`` steps apart, so it covers
``extent = (points - 1) * sampling_rate + 1`` steps; its inputs are the first ``length`` points and its targets
(when it has step targets) the last ``width`` (``readers.Targets``). Of an episode of ``T`` steps only the steps
``[lo, hi)`` of ``time_range`` are used, counted from ``lo``, exactly as if that slice were the episode. Windows
start ``shift`` steps apart at ``0, shift, 2·shift, ...`` of the slice while they fit in it; with
``padding="start"`` also at ``-shift, -2·shift, ...`` while their last input point still lies in the slice (and
the span's end does): those start before it and are padded, and a mask says which points are real.

    spec = WindowSpec(length=4, shift=2)
    spec.episode_windows(10)            # (0, 4): starts 0, 2, 4, 6
    WindowSpec(length=4, shift=2, padding="start").episode_windows(10)   # (-1, 5): also -2
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

PADDINGS = (None, "start")
INT32_LIMIT = 2**31 - 1  # start rows fit int32 below it; tf.data's skip/take/batch counts are C++ ints
MAX_PADDING = 1 / 64  # rows of g steps may pad the resident arrays by at most this share of the data


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """The shape of every window of a reader, checked on construction.

    Attributes:
      length: input points L.
      shift: steps between window starts.
      offset: points after the inputs the span reaches (``Targets.offset``): ``points = length + offset``.
      width: target points, the last of the span (``Targets.width``); 0 when the targets are not steps.
      sampling_rate: steps between consecutive points (keras' name).
      time_range: ``(a, b)``: floats in [0, 1], the steps ``[⌊a·T⌋, ⌊b·T⌋)`` of each episode; or ints, the steps
        ``[a, b)`` (cut to the episode); None: all steps.
      padding: None, or ``"start"``: windows that begin before the slice too, padded.
    """

    length: int
    shift: int = 1
    offset: int = 0
    width: int = 0
    sampling_rate: int = 1
    time_range: tuple | None = None
    padding: str | None = None

    def __post_init__(self):
        for name, low in (("length", 1), ("shift", 1), ("offset", 0), ("width", 0), ("sampling_rate", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ValueError(f"{name}: must be an integer of at least {low} (got {name}={value!r})")
            object.__setattr__(self, name, int(value))
        if self.width > self.points:
            raise ValueError(f"width: the targets are the last width points of the span of length + offset = "
                             f"{self.points} points (got width={self.width}); pass width <= {self.points}")
        if self.extent > INT32_LIMIT:
            raise ValueError(f"sampling_rate: a window of length + offset = {self.points} points, sampling_rate="
                             f"{self.sampling_rate} steps apart, spans {self.extent} steps, over {INT32_LIMIT} (got "
                             f"sampling_rate={self.sampling_rate}, offset={self.offset}); pass a smaller one")
        if self.padding not in PADDINGS:
            raise ValueError(f"padding: must be None or 'start' (got padding={self.padding!r})")
        if self.time_range is not None:
            object.__setattr__(self, "time_range", check_time_range(self.time_range))

    @property
    def points(self) -> int:
        """Points of the whole span: the inputs, then ``offset`` more (the targets are the last ``width``)."""
        return self.length + self.offset

    @property
    def extent(self) -> int:
        """Steps the span covers."""
        return (self.points - 1) * self.sampling_rate + 1

    @property
    def history(self) -> int:
        """With ``padding="start"``: how far before the slice a window may start, in steps (0 without padding)."""
        if self.padding is None:
            return 0
        return (self.length - 1) * self.sampling_rate  # the last input point must be real: one real input at least

    def bounds(self, steps: int) -> tuple[int, int]:
        """``[lo, hi)``: the steps of an episode of ``steps`` steps that its windows use."""
        if self.time_range is None:
            return 0, steps
        a, b = self.time_range
        if isinstance(a, float):
            return math.floor(a * steps), math.floor(b * steps)
        return min(a, steps), min(b, steps)

    def episode_windows(self, steps: int) -> tuple[int, int]:
        """``(first, count)``: the window starts of an episode are ``first·shift, (first + 1)·shift, ...`` of
        ``count`` windows, in steps from the slice's first step (``first`` < 0 only with padding)."""
        lo, hi = self.bounds(steps)
        used = hi - lo
        last = (used - self.extent) // self.shift if used >= self.extent else None
        if self.padding is None:
            return 0, 0 if last is None else last + 1
        # The earliest start whose last input point is in the slice; the span's end must be in it too, so targets
        # after the inputs are always real. ``last`` < 0: a slice shorter than the span, padded windows only.
        first = -(self.history // self.shift)
        last = (used - self.extent) // self.shift
        return first, max(last - first + 1, 0)

    def count(self, lengths: Sequence[int]) -> int:
        """Windows over all episodes, without building them."""
        return int(sum(self.episode_windows(t)[1] for t in lengths))

    def too_short(self, lengths: Sequence[int]) -> int:
        """Episodes that give no window (shorter than the span, or whose slice is)."""
        return sum(self.episode_windows(t)[1] == 0 for t in lengths)

    def served_by_padding(self, lengths: Sequence[int]) -> int:
        """Of the episodes too short for a window, how many ``padding="start"`` would serve (0 with padding): a
        padded window still needs its span's end in the episode, and its start on a multiple of ``shift``."""
        if self.padding is not None:
            return 0
        return self.too_short(lengths) - dataclasses.replace(self, padding="start").too_short(lengths)

    def starts(self, steps: int) -> np.ndarray:
        """Every window start of one episode, in steps from its slice's first step, in order."""
        first, count = self.episode_windows(steps)
        return (first + np.arange(count, dtype=np.int64)) * self.shift

    def pad_steps(self, row: int = 1) -> int:
        """Steps of ``pad_value`` the resident layout puts before each episode's slice: the history padded
        windows reach into, rounded up to whole rows."""
        return -(-self.history // row) * row


def check_time_range(time_range) -> tuple:
    """``(a, b)`` of two floats ``0 <= a < b <= 1`` or two ints ``0 <= a < b``, as a tuple."""
    try:
        a, b = time_range
    except (TypeError, ValueError):
        raise ValueError(f"time_range: must be a pair (a, b) (got time_range={time_range!r})") from None
    if all(_is_int(v) for v in (a, b)):
        if not 0 <= a < b:
            raise ValueError(f"time_range: steps must be 0 <= a < b (got time_range={time_range!r})")
        if b > INT32_LIMIT:
            raise ValueError(f"time_range: steps must be at most {INT32_LIMIT} (got time_range={time_range!r}); "
                             "pass the end of the episode, or (a, 1.0) for all of it")
        return int(a), int(b)
    if all(isinstance(v, (float, np.floating)) for v in (a, b)):
        if not 0.0 <= a < b <= 1.0:
            raise ValueError(f"time_range: fractions must be 0 <= a < b <= 1 (got time_range={time_range!r}); "
                             "e.g. (0.0, 0.8) to train and (0.8, 1.0) to validate")
        return float(a), float(b)
    raise ValueError(f"time_range: two floats in [0, 1] (fractions of each episode) or two ints (steps), not a mix "
                     f"(got time_range={time_range!r})")


# --- the resident layout: every episode's slice, after its history padding, in rows of g steps --------------------



def segment_steps(spec: WindowSpec, lengths: Sequence[int], row: int = 1) -> list[int]:
    """Steps each episode takes in the resident arrays: its history padding (``pad_steps``), its slice, and zeros
    to a whole number of rows."""
    pad = spec.pad_steps(row)
    out = []
    for t in lengths:
        lo, hi = spec.bounds(t)
        used = pad + hi - lo
        out.append(used + (-used % row))
    return out


def segment_offsets(spec: WindowSpec, lengths: Sequence[int], row: int = 1) -> np.ndarray:
    """Where each episode's segment starts in the resident arrays, in steps (multiples of ``row``)."""
    sizes = np.asarray(segment_steps(spec, lengths, row), dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else np.zeros([0], np.int64)


def row_steps_of(spec: WindowSpec, lengths: Sequence[int], max_padding: float = MAX_PADDING) -> int:
    """Steps per row ``g``: the largest divisor of ``gcd(points, shift)`` whose padding to whole rows stays within
    ``max_padding`` of the data, so a window is ``points / g`` consecutive rows and one gather copies whole blocks.
    1 when points are ``sampling_rate`` > 1 steps apart (a window is no run of consecutive steps then)."""
    if spec.sampling_rate > 1:
        return 1
    common = math.gcd(spec.points, spec.shift)
    budget = max_padding * sum(lengths)
    base = sum(segment_steps(spec, lengths, 1))
    divisors = sorted({d for k in range(1, math.isqrt(common) + 1) if common % k == 0 for d in (k, common // k)})
    return next(g for g in reversed(divisors) if g == 1 or sum(segment_steps(spec, lengths, g)) - base <= budget)


def start_rows(spec: WindowSpec, lengths: Sequence[int], row: int = 1) -> np.ndarray:
    """Every window's first row in the resident arrays, episode by episode in order; int32 below 2**31 rows."""
    if row < 1 or spec.shift % row or (spec.sampling_rate == 1 and spec.points % row) or (
            spec.sampling_rate > 1 and row != 1):
        raise ValueError(f"row: must divide shift={spec.shift} and length + horizon={spec.points} (and be 1 with "
                         f"sampling_rate > 1) (got row={row!r})")
    offsets = segment_offsets(spec, lengths, row)
    pad = spec.pad_steps(row)
    total = int(offsets[-1]) + segment_steps(spec, lengths[-1:], row)[0] if len(lengths) else 0
    dtype = np.int32 if total // row <= INT32_LIMIT else np.int64
    parts = [(offset + pad + spec.starts(t)) // row for offset, t in zip(offsets.tolist(), lengths)]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros([0], dtype)


# --- the plain (length, shift, horizon) forms ---------------------------------------------------------------------


def _plain(length: int, shift: int, horizon: int) -> WindowSpec:
    if length < 1:
        raise ValueError(f"length: must be at least 1 sample (got {length!r})")
    if shift < 1:
        raise ValueError(f"shift: must be at least 1 sample (got {shift!r})")
    if horizon < 0:
        raise ValueError(f"horizon: must be 0 or more samples (got {horizon!r})")
    return WindowSpec(length, shift, offset=horizon, width=horizon)


def window_count(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0) -> int:
    """Number of windows of ``length`` steps (plus a forecast ``horizon``) over all episodes, without building them.

    >>> window_count([10, 3, 7], length=4, shift=2)
    6
    """
    return _plain(length, shift, horizon).count(lengths)


def row_steps(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0,
              max_padding: float = MAX_PADDING) -> int:
    """Steps per row ``g`` of the resident layout (``row_steps_of``): a window is then ``(length + horizon) / g``
    whole rows.

    >>> row_steps([1000, 2000], length=256, shift=16)
    16
    >>> row_steps([10, 3], length=4, shift=2)  # rows of 2 would pad 1 step in 13: over 1/64
    1
    """
    return row_steps_of(_plain(length, shift, horizon), lengths, max_padding)


def episode_offsets(lengths: Sequence[int], row: int = 1) -> np.ndarray:
    """Where each episode starts in the concatenated array (exclusive prefix sum), each padded to whole rows."""
    return segment_offsets(WindowSpec(1), lengths, row)


def window_starts(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0, row: int = 1) -> np.ndarray:
    """Start of every window, episode by episode, in order, in rows of ``row`` steps of the concatenated array
    (episodes padded to whole rows; ``row`` must divide ``shift`` and ``length + horizon``).

    >>> window_starts([10, 3, 7], length=4, shift=2).tolist()
    [0, 2, 4, 6, 13, 15]
    >>> window_starts([10, 3, 7], length=4, shift=2, row=2).tolist()  # episodes at steps 0, 10, 14
    [0, 1, 2, 3, 7, 8]
    """
    return start_rows(_plain(length, shift, horizon), lengths, row)
