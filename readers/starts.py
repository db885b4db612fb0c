"""Window-start arithmetic for sliding windows over concatenated episodes. Pure numpy, no TensorFlow.

Episodes are laid end to end in one array; a window of ``length`` samples with
``shift`` between starts never crosses an episode boundary. Episode ``e`` of
``T_e`` samples contributes ``floor((T_e - span) / shift) + 1`` windows when
``T_e >= span`` (``span`` = window length plus any forecast horizon), none otherwise.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

INT32_LIMIT = 2**31 - 1


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


def episode_offsets(lengths: Sequence[int]) -> np.ndarray:
    """Where each episode starts in the concatenated array (exclusive prefix sum)."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))[:-1]]).astype(np.int64)


def window_starts(lengths: Sequence[int], length: int, shift: int = 1, horizon: int = 0) -> np.ndarray:
    """Start index, in the concatenated array, of every window, episode by episode, in order.

    int32 while the array has fewer than 2**31 samples (4 bytes per window), else int64.

    >>> window_starts([10, 3, 7], length=4, shift=2).tolist()
    [0, 2, 4, 6, 13, 15]
    """
    _check(length, shift, horizon)
    span = length + horizon
    total = int(np.sum(lengths, dtype=np.int64)) if len(lengths) else 0
    dtype = np.int32 if total <= INT32_LIMIT else np.int64
    parts = [
        np.arange(offset, offset + t - span + 1, shift, dtype=np.int64)
        for offset, t in zip(episode_offsets(lengths).tolist(), lengths)
        if t >= span
    ]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros([0], dtype)
