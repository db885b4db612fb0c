"""The numeric arguments every reader takes, checked once, up front, against ranges TensorFlow survives. Pure.

TensorFlow passes some of them on unchecked and dies of a bad one: ``shuffle``
reserves its whole buffer (``shuffle_buffer=2**30`` is a SIGSEGV on a
10-element dataset), ``TFRecordDataset(buffer_size=2**40)`` allocates it, an
interleave of 2**31 files crashes. So each has a range here, generous for any
real job, and a value outside it is one ``ValueError`` showing the value and the range.

    check_count(64, "batch_size", "photos-tfr", high=MAX_BATCH_SIZE)  # 64
    check_count(0, "shuffle_buffer", "photos-tfr", high=MAX_SHUFFLE_BUFFER)  # ValueError: ... in [1, 16777216] ...
"""

from __future__ import annotations

import numpy as np

from .starts import INT32_LIMIT

MAX_BATCH_SIZE = INT32_LIMIT
# 16M elements: of 80 KB JPEG records 1.3 TB, of window indices 128 MB; shuffle reserves it before the first element.
MAX_SHUFFLE_BUFFER = 2**24
MAX_READ_BUFFER_BYTES = 2**30  # per open file, up to 16 at once
MAX_PARALLEL_READS = 4096  # files open at once, a reader thread each
MAX_IMAGE_SIDE = 16384  # output pixels per side; 16384² float32 RGB is 3 GB an image
MAX_WINDOW_STEPS = INT32_LIMIT


def check_count(value, name: str, where: str, *, low: int = 1, high: int = INT32_LIMIT, fix: str = "") -> int:
    """``value`` as an ``int`` (numpy integers count; bools, floats and None do not) within ``[low, high]``.

    Raises:
      ValueError: naming ``where``, the argument, the value, the range and, when given, ``fix``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        hint = f"; {fix}" if fix else ""
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer of at least {low:,}")
        raise ValueError(f"{where}: {name} must be {kind} (got {name}={value!r}), in [{low:,}, {high:,}]{hint}")
    return int(value)


def check_optional_count(value, name: str, where: str, *, low: int = 1, high: int = INT32_LIMIT) -> int | None:
    """``check_count``, with None passed through (an argument whose default is chosen for the caller)."""
    return None if value is None else check_count(value, name, where, low=low, high=high, fix="or None for the default")


def check_reading(where: str, *, read_buffer_bytes, num_parallel_reads=None) -> tuple[int, int | None]:
    """The two reading arguments every reader shares."""
    return (check_count(read_buffer_bytes, "read_buffer_bytes", where, high=MAX_READ_BUFFER_BYTES),
            check_optional_count(num_parallel_reads, "num_parallel_reads", where, high=MAX_PARALLEL_READS))
