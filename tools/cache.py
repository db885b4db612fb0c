"""``tfshard cache OUT DIR``: fill a shard cache ahead of a job (say, when a node starts), several shards at once.

Each shard of the chosen splits goes through the same ``ShardStore.fetch`` a reader uses: a copy already there is
checked (sha256 and size, once), a missing or bad one is downloaded under a reserved temporary name, verified and
renamed. Shards are fetched in manifest order, and the copies this fill makes stay pinned until it ends, so with a
limit below the dataset it stops caching at the limit instead of evicting its own copies; copies of other
datasets no live reader pins are evicted least recently used first.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

from tqdm import tqdm

from ..format.dataset import load_manifest
from ..format.storage import join, prefer_small_gcs_blocks
from ..readers.shard_cache.pipeline import ShardCache
from ..readers.shard_cache.store import Shard

DEFAULT_FETCHES = 8


@dataclasses.dataclass(frozen=True)
class FillReport:
    """What ``fill_shard_cache`` did: shards and bytes now cached, downloaded by it, and left to remote reads."""

    directory: str
    limit: int
    cached: int
    cached_bytes: int
    downloaded_bytes: int
    not_cached: list[str]

    def lines(self) -> list[str]:
        lines = [f"{self.directory}: {self.cached} shards ({self.cached_bytes / 1e6:,.1f} MB) cached and verified, "
                 f"{self.downloaded_bytes / 1e6:,.1f} MB downloaded (limit {self.limit / 1e6:,.1f} MB)"]
        if self.not_cached:
            lines.append(f"{len(self.not_cached)} shards not cached (over the limit, or their download failed; "
                         f"readers read them remotely), e.g. {self.not_cached[0]}")
        return lines


def fill_shard_cache(path: str, directory: str, limit=None, *, splits=None, fetches: int = DEFAULT_FETCHES,
                     progress: bool = True) -> FillReport:
    """Caches the shards of ``path`` (all splits, or ``splits``) in ``directory`` under ``limit`` bytes.

    Args:
      path: a dataset folder (``gs://`` or local) holding ``dataset.json``.
      directory: the shard cache folder the readers' ``shard_cache=`` names.
      limit: the most the folder may hold (``"200GB"``, bytes); None: 90% of its disk's free space.
      splits: names of splits to cache; None: all.
      fetches: shards downloaded at once.
      progress: a progress bar (bytes) on stderr.

    Raises:
      ValueError: a split that does not exist, a cache folder that is not a local folder, or a limit below one
        shard.

    Example:
      fill_shard_cache("gs://bucket/photos-tfr", "/mnt/ssd/tfshard-cache", "200GB").lines()
    """
    if path.startswith("gs://"):
        prefer_small_gcs_blocks()
    manifest = load_manifest(path)
    chosen = list(manifest.splits) if splits is None else list(splits)
    for name in chosen:
        if name not in manifest.splits:
            raise ValueError(f"{path}: no split {name!r} (got splits {sorted(manifest.splits)}); pass one of those")
    shards = [Shard(s.sha256, s.bytes, join(path, s.file)) for name in chosen for s in manifest.splits[name].shards]
    cache = ShardCache(directory, limit, path)
    if shards:
        largest = max(shards, key=lambda s: s.size)
        cache.check_room(largest.size, largest.remote, "--limit")
    store, limit = cache.store, cache.limit
    before = store.downloaded_bytes
    cached, not_cached = [], []
    bar = tqdm(total=sum(s.size for s in shards), unit="B", unit_scale=True, desc="caching shards",
               disable=not progress)
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, fetches)) as pool:
            for shard, found in zip(shards, pool.map(store.fetch, shards)):
                (cached if found else not_cached).append(shard)
                bar.update(shard.size)
    finally:
        bar.close()
        for shard in cached:
            store.unpin(shard.sha256)
    return FillReport(store.directory, limit, len(cached), sum(s.size for s in cached),
                      store.downloaded_bytes - before, [s.remote for s in not_cached])
