"""``tfshard cache OUT DIR``: fill a shard cache ahead of a job (say, when a node starts), several shards at once.

Each shard of the chosen splits goes through the same ``ShardStore.fetch`` a reader uses: a copy already there is
checked (sha256 and size, once), a missing or bad one is downloaded under a reserved temporary name, verified and
renamed. Shards are fetched in manifest order, and the copies this fill makes stay pinned until it ends, so with a
limit below the dataset it stops caching at the limit instead of evicting its own copies; copies of other
datasets no live reader pins are evicted least recently used first.

Ctrl-C, SIGTERM or a fetch's error stops it within moments: every wait and download of the fetches looks at a stop
event in short slices, queued shards are not started, and the copies it pinned are let go (a fetch thread stuck in
a remote read past ``STOP_WAIT_S`` is left behind: a daemon, it ends with the process, and the next fetch of its
shard removes what it left).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

from tqdm import tqdm

from ..format.dataset import load_manifest
from ..format.storage import join, prefer_small_gcs_blocks
from ..readers.files import DatasetInfo, check_shards
from ..readers.shard_cache.pipeline import ShardCache
from ..readers.shard_cache.store import Shard, ShardStore, Stopped

DEFAULT_FETCHES = 8
STOP_WAIT_S = 5.0  # for the fetch threads to end once stopped, before the command ends without them


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
    listed = [(name, i, shard) for name in chosen for i, shard in enumerate(manifest.splits[name].shards)]
    shards = [Shard(s.sha256, s.bytes, join(path, s.file)) for _, _, s in listed]
    cache = ShardCache(directory, limit, path)
    if listed:
        name, index, largest = max(listed, key=lambda entry: entry[2].bytes)
        check_shards(DatasetInfo(path, manifest), name, [index])  # a manifest's lie, not the limit, is then the error
        cache.check_room(largest.bytes, join(path, largest.file), "--limit")
    store, limit = cache.store, cache.limit
    before = store.downloaded_bytes
    bar = tqdm(total=sum(s.size for s in shards), unit="B", unit_scale=True, desc="caching shards",
               disable=not progress)
    fill = _Fill(store, shards, max(1, fetches))
    try:
        found = fill.run(bar.update)
    finally:
        fill.close()
        bar.close()
    cached = [shard for shard, path in zip(shards, found) if path is not None]
    return FillReport(store.directory, limit, len(cached), sum(s.size for s in cached),
                      store.downloaded_bytes - before, [s.remote for s, path in zip(shards, found) if path is None])


class _Fill:
    """``shards`` fetched into ``store`` on ``threads`` daemon threads, in manifest order, each copy pinned until
    ``close``; ``close`` stops them (queued shards never start) and lets every pin go, however the fill ended."""

    def __init__(self, store: ShardStore, shards: list[Shard], threads: int):
        self.store, self.shards, self.stop = store, shards, threading.Event()
        self._next = iter(range(len(shards)))
        self._lock = threading.Lock()
        self._found: dict[int, str | None] = {}  # shard index -> its pinned copy, or None (read remotely)
        self._closed = False
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # (index, error or None) of each fetch that ended
        self._threads = [threading.Thread(target=self._work, name=f"tfshard-cache-fill-{i + 1}", daemon=True)
                         for i in range(min(threads, len(shards)))]

    def run(self, done) -> list[str | None]:
        """Each shard's copy (None: not cached), once all are fetched; ``done(size)`` after each. Raises the first
        fetch's error; Ctrl-C (or SIGTERM as ``KeyboardInterrupt``) raises between two short waits."""
        for thread in self._threads:
            thread.start()
        for _ in self.shards:
            while True:
                try:
                    index, error = self._done.get(timeout=0.1)  # short: a signal's handler runs between two
                    break
                except queue.Empty:
                    continue
            if error is not None:
                raise error
            done(self.shards[index].size)
        with self._lock:
            return [self._found[i] for i in range(len(self.shards))]

    def _work(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                index = next(self._next, None)
            if index is None:
                return
            shard = self.shards[index]
            try:
                path = self.store.fetch(shard, self.stop)
            except Stopped:
                return
            except BaseException as e:  # noqa: BLE001 (raised by run, in the caller's thread)
                self.stop.set()  # the fill fails: the other fetches stop too
                self._done.put((index, e))
                return
            with self._lock:
                if self._closed:  # finished after close let the pins go: this one goes too
                    if path is not None:
                        self.store.unpin(shard.sha256)
                    return
                self._found[index] = path
            self._done.put((index, None))

    def close(self) -> None:
        """Stops the fetches, waits up to ``STOP_WAIT_S`` for their threads, and unpins every copy they got."""
        self.stop.set()
        deadline = time.monotonic() + STOP_WAIT_S
        for thread in self._threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._closed = True
            for index, path in self._found.items():
                if path is not None:
                    self.store.unpin(self.shards[index].sha256)
