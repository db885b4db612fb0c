"""The arguments every reader takes, checked once, up front: numbers against ranges TensorFlow survives, and
the rules for resuming at a step and for an epoch of at least one batch. Pure.

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

from .sampling.plan import is_seed
from .windowing.starts import INT32_LIMIT

DEFAULT_READ_BUFFER_BYTES = 8 * 2**20  # per open shard: the readers' read_buffer_bytes default
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


def check_seed(seed, where) -> int | None:
    """``seed`` as an ``int`` (numpy integers count; bools, floats and strings do not) in ``[0, 2**63 - 1]``, the
    non-negative int64 TensorFlow's seeds hold and the mixtures' ``StreamSpec`` takes; or None (fresh randomness).

    Raises:
      ValueError: naming ``where``, the value, the range and the fix.
    """
    if seed is None:
        return None
    if not is_seed(seed):
        raise ValueError(f"{where}: seed must be None or an integer in [0, 2**63 - 1] (got seed={seed!r}); pass an "
                         "int such as seed=0 for a reproducible order (a larger or negative one, as hash() or "
                         "getrandbits(64) give: seed % 2**63), or None for fresh randomness")
    return int(seed)


def check_optional_count(value, name: str, where: str, *, low: int = 1, high: int = INT32_LIMIT) -> int | None:
    """``check_count``, with None passed through (an argument whose default is chosen for the caller)."""
    return None if value is None else check_count(value, name, where, low=low, high=high, fix="or None for the default")


def check_reading(where: str, *, read_buffer_bytes, num_parallel_reads=None) -> tuple[int, int | None]:
    """The two reading arguments every reader shares."""
    return (check_count(read_buffer_bytes, "read_buffer_bytes", where, high=MAX_READ_BUFFER_BYTES),
            check_optional_count(num_parallel_reads, "num_parallel_reads", where, high=MAX_PARALLEL_READS))


def check_start_step(start_step, where: str) -> int:
    """``start_step`` as an int: a step count saved with the model, so a non-negative integer (numpy ints too)."""
    if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
        raise ValueError(f"{where}: start_step must be a non-negative integer (got start_step={start_step!r}); "
                         "pass the step count saved with the model")
    return int(start_step)


def check_resume(repeat: bool, start_step, where: str, *, shuffle: bool, seed,
                 blockers: list[tuple[bool, str, str]] = ()) -> int:
    """``start_step`` replays the stream up to a step, so the stream must be one run of epochs (``repeat=True``)
    and a pure function of the seed; ``blockers``: a reader's own ``(it applies, the problem, the fix)``.

    Returns:
      ``start_step`` as an int.
    """
    start_step = check_start_step(start_step, where)
    if not start_step:
        return 0
    rules = [
        (not repeat, "repeat=False: resuming at a step needs repeat=True (one stream of epochs)", "pass repeat=True"),
        (shuffle and seed is None, "seed=None: a shuffled stream must be a function of its seed",
         "pass the seed the job started with"),
        *blockers,
    ]
    for applies, problem, fix in rules:
        if applies:
            raise ValueError(f"{where}: start_step={start_step}: cannot resume exactly with {problem}; {fix}")
    return start_step


def check_not_empty(where: str, count: int, unit: str, scope: str, need: int, what: str) -> None:
    """With drop_remainder, a share of fewer ``unit`` than one step takes from it would make an epoch of nothing.

    ``need``: what one step takes from this share; ``what`` says which batch that is, e.g. "batch_size=64".
    """
    if count < need:
        raise ValueError(
            f"{where} has {count} {unit} {scope}, fewer than {what} with drop_remainder=True, so an epoch would "
            "yield no batch; pass a smaller batch_size or drop_remainder=False"
        )


def per_replica_text(batch: int, batch_size: int, replicas: int) -> str:
    return f"the per-replica batch of {batch} (batch_size={batch_size} over {replicas} replicas)"
