"""The shard cache's budget: how many bytes it may hold, whether a shard fits, which copies make room. Pure.

Every byte counts against ``limit``: complete copies and downloads in progress (reserved at their full size before
the first byte arrives), so the folder never holds more than the limit. When a shard does not fit, the least
recently used copies no live reader pins are evicted, oldest first, until it does; when even all of them would not
make room, the shard is read remotely instead. ``store.py`` carries that out under the folder lock.

    room(usage=150, size=60, limit=200)  # False: 210 > 200
    eviction_order([Copy("a", "a.tfrecord", 50, used_ns=2), Copy("b", "b.tfrecord", 40, used_ns=1)], pinned={"b"})
    # [Copy(sha256='a', ...)]: b is pinned
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

SHARE_OF_FREE = 0.9  # no shard_cache_limit: what the cache holds now plus this share of its disk's free space


@dataclasses.dataclass(frozen=True)
class Copy:
    """A complete shard copy in the cache: its sha256, path, size in bytes and last use (access time, ns)."""

    sha256: str
    path: str
    size: int
    used_ns: int


def default_limit(held: int, free: int) -> int:
    """The limit when none is given: the ``held`` bytes the cache holds now plus ``SHARE_OF_FREE`` of ``free``."""
    return held + int(free * SHARE_OF_FREE)


def room(usage: int, size: int, limit: int) -> bool:
    """Whether a shard of ``size`` bytes fits beside the ``usage`` bytes the cache holds, under ``limit``."""
    return usage + size <= limit


def eviction_order(copies: Iterable[Copy], pinned: set[str]) -> list[Copy]:
    """The copies an evictor may remove, least recently used first (ties by sha256); a pinned copy never."""
    return sorted((c for c in copies if c.sha256 not in pinned), key=lambda c: (c.used_ns, c.sha256, c.path))
