"""Shard planning: the pure arithmetic that turns inputs and sizes into shard specs.

No TensorFlow here. The writer only walks the list this module returns, so the
plan can be tested exhaustively and reused unchanged by other runners (Beam).

Policy, in order (no hidden ladder):
  1. ``num_shards`` given: exactly that many shards per split.
  2. otherwise ``ceil(split bytes / target_bytes)`` shards.
  3. either way at least ``min_shards`` (for multi-worker readers that shard by
     file), and never more shards than records, so no shard is empty.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

from ..format.names import shard_file_name
from ..format.sizes import parse_size  # noqa: F401 (the converter's name for it)

DEFAULT_SHARD_BYTES = 128 * 2**20

@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One planned shard: which records (by position in the split's order) go in it.

    Attributes:
      split: split name, e.g. ``"train"``.
      index: 0-based shard index within the split.
      num_shards: number of shards in the split.
      start: first record position (inclusive) in the split's record order.
      stop: last record position (exclusive).
      planned_bytes: sum of the input sizes in ``[start, stop)``.
      file_name: the shard's final file name.
    """

    split: str
    index: int
    num_shards: int
    start: int
    stop: int
    planned_bytes: int
    file_name: str

    def __post_init__(self):
        if not 0 <= self.index < self.num_shards:
            raise ValueError(f"ShardSpec.index: must be in [0, {self.num_shards}) (got {self.index!r})")
        if not 0 <= self.start < self.stop:
            raise ValueError(
                f"ShardSpec: need 0 <= start < stop, a non-empty shard (got start={self.start!r}, stop={self.stop!r})"
            )

    @property
    def num_records(self) -> int:
        return self.stop - self.start


def shuffled_order(count: int, seed: int | None) -> list[int]:
    """The write-time record order: ``range(count)`` shuffled by ``seed``, or as is when ``seed`` is None."""
    order = list(range(count))
    if seed is not None:
        random.Random(seed).shuffle(order)
    return order


def count_shards(
    total_bytes: int,
    num_records: int,
    *,
    target_bytes: int = DEFAULT_SHARD_BYTES,
    num_shards: int | None = None,
    min_shards: int = 1,
) -> int:
    """Returns how many shards a split gets, by the policy in the module docstring.

    >>> count_shards(300 * 2**20, 5000), count_shards(10, 5, num_shards=2)
    (3, 2)

    Raises:
      ValueError: an argument is out of range, or the split has fewer records than
        the shards asked for.
    """
    if num_records <= 0:
        raise ValueError(f"count_shards: num_records must be positive (got {num_records!r})")
    if target_bytes <= 0:
        raise ValueError(f"count_shards: target_bytes must be positive (got {target_bytes!r})")
    if num_shards is not None and num_shards <= 0:
        raise ValueError(f"count_shards: num_shards must be positive (got {num_shards!r}); or leave it unset")
    if min_shards <= 0:
        raise ValueError(f"count_shards: min_shards must be positive (got {min_shards!r})")
    if num_shards is None:
        # A few records larger than the target: one record per shard is as close as it gets.
        wanted = min(max(1, math.ceil(total_bytes / target_bytes)), num_records)
    else:
        wanted = num_shards
    wanted = max(wanted, min_shards)
    if wanted > num_records:
        raise ValueError(
            f"shard plan: {wanted} shards asked for but the split has only {num_records} records (got "
            f"num_shards={num_shards!r}, min_shards={min_shards!r}); ask for at most {num_records} shards"
        )
    return wanted


def shard_boundaries(sizes: Sequence[int], num_shards: int) -> list[int]:
    """Splits records (in order) into ``num_shards`` contiguous, non-empty runs of near-equal bytes.

    Returns ``num_shards + 1`` positions; shard ``i`` holds ``[b[i], b[i+1])``. Each
    boundary sits where the running byte total first reaches ``i/num_shards`` of the
    total, nudged so every shard keeps at least one record.

    >>> shard_boundaries([10, 10, 10, 10], 2)
    [0, 2, 4]
    """
    n = len(sizes)
    if not 1 <= num_shards <= n:
        raise ValueError(f"shard_boundaries: num_shards must be in [1, {n}] (got {num_shards!r})")
    total = sum(sizes)
    bounds = [0]
    running = 0
    position = 0
    for i in range(1, num_shards):
        goal = total * i / num_shards
        lowest = bounds[-1] + 1  # this shard keeps one record
        highest = n - (num_shards - i)  # each later shard keeps one record
        while position < lowest or (position < highest and running + sizes[position] / 2 <= goal):
            running += sizes[position]
            position += 1
        bounds.append(position)
    bounds.append(n)
    return bounds


def plan_split(
    split: str,
    sizes: Sequence[int],
    *,
    target_bytes: int = DEFAULT_SHARD_BYTES,
    num_shards: int | None = None,
    min_shards: int = 1,
    compression: str | None = None,
    generation: int = 0,
) -> list[ShardSpec]:
    """Plans the shards of one split whose records, in write order, have ``sizes`` bytes (``generation`` g > 0:
    an append's shards, ``train-g000g-...``).

    >>> [(s.file_name, s.start, s.stop) for s in plan_split("val", [5, 5, 5], num_shards=2)]
    [('val-00000-of-00002.tfrecord', 0, 2), ('val-00001-of-00002.tfrecord', 2, 3)]
    """
    n = count_shards(sum(sizes), len(sizes), target_bytes=target_bytes, num_shards=num_shards, min_shards=min_shards)
    bounds = shard_boundaries(sizes, n)
    return [
        ShardSpec(
            split=split,
            index=i,
            num_shards=n,
            start=bounds[i],
            stop=bounds[i + 1],
            planned_bytes=sum(sizes[bounds[i] : bounds[i + 1]]),
            file_name=shard_file_name(split, i, n, compression, generation),
        )
        for i in range(n)
    ]
