"""Window-start arithmetic for sliding windows over concatenated episodes. Pure numpy, no TensorFlow.

Episodes are laid end to end in one array; a window of ``length`` samples with
``shift`` between starts never crosses an episode boundary. Episode ``e`` of
``T_e`` samples contributes ``floor((T_e - span) / shift) + 1`` windows when
``T_e >= span`` (``span`` = window length plus any forecast horizon), none otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

INT32_LIMIT = 2**31 - 1  # start rows fit int32 below it; tf.data's skip/take/batch counts are C++ ints
MAX_PADDING = 1 / 64  # row_steps may pad the resident arrays by at most this share of the data


def _check(length: int, shift: int, horizon: int) -> None:
    if length < 1:
        raise ValueError(f"length: must be at least 1 sample (got {length!r})")
    if shift < 1:
        raise ValueError(f"shift: must be at least 1 sample (got {shift!r})")
    if horizon < 0:
        raise ValueError(f"horizon: must be 0 or more samples (got {horizon!r})")


def window_count(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0) -> int:
    """Number of windows over all episodes, without building them.

    >>> window_count([10, 3, 7], length=4, shift=2)
    6
    """
    _check(length, shift, horizon)
    span = length + horizon
    return int(sum((t - span) // shift + 1 for t in lengths if t >= span))


def padding(lengths: Sequence[int], row: int) -> int:
    """Steps added when every episode is padded to a whole number of rows of ``row`` steps."""
    return int(sum(-t % row for t in lengths))


def row_steps(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0,
              max_padding: float = MAX_PADDING) -> int:
    """Steps per row ``g`` of the resident layout: a window is then ``(length + horizon) / g`` whole rows.

    Every window starts at a multiple of ``shift`` inside its episode and spans ``length + horizon``
    steps, so with each episode starting on a row boundary, ``g`` = their greatest common divisor makes
    every window a run of consecutive rows, and one gather of rows copies contiguous blocks instead of
    single steps. Episodes are padded to whole rows; ``g`` is the largest divisor of that gcd whose
    padding stays within ``max_padding`` of the data (1 always qualifies: no padding).

    >>> row_steps([1000, 2000], length=256, shift=16)
    16
    >>> row_steps([10, 3], length=4, shift=2)  # rows of 2 would pad 1 step in 13: over 1/64
    1
    """
    _check(length, shift, horizon)
    common = math.gcd(length + horizon, shift)
    budget = max_padding * sum(lengths)
    divisors = sorted({d for k in range(1, math.isqrt(common) + 1) if common % k == 0 for d in (k, common // k)})
    return next(g for g in reversed(divisors) if g == 1 or padding(lengths, g) <= budget)


def episode_offsets(lengths: Sequence[int], row: int = 1) -> np.ndarray:
    """Where each episode starts in the concatenated array (exclusive prefix sum), each padded to whole rows."""
    padded = [t + (-t % row) for t in lengths]
    return np.concatenate([[0], np.cumsum(np.asarray(padded, dtype=np.int64))[:-1]]).astype(np.int64)


def window_starts(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0, row: int = 1) -> np.ndarray:
    """Start of every window, episode by episode, in order, in rows of ``row`` steps of the concatenated array
    (episodes padded to whole rows; ``row`` must divide ``shift`` and ``length + horizon``).

    int32 while the array has fewer than 2**31 rows (4 bytes per window), else int64.

    >>> window_starts([10, 3, 7], length=4, shift=2).tolist()
    [0, 2, 4, 6, 13, 15]
    >>> window_starts([10, 3, 7], length=4, shift=2, row=2).tolist()  # episodes at steps 0, 10, 14
    [0, 1, 2, 3, 7, 8]
    """
    _check(length, shift, horizon)
    span = length + horizon
    if row < 1 or shift % row or span % row:
        raise ValueError(f"row: must divide shift={shift} and length + horizon={span} (got row={row!r})")
    offsets = episode_offsets(lengths, row)
    rows = (int(offsets[-1]) + lengths[-1] + row - 1) // row if len(lengths) else 0
    dtype = np.int32 if rows <= INT32_LIMIT else np.int64
    parts = [
        np.arange(offset, offset + t - span + 1, shift, dtype=np.int64) // row
        for offset, t in zip(offsets.tolist(), lengths)
        if t >= span
    ]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros([0], dtype)
