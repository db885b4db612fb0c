"""Pins of reads for pipelines not built in this process (a tf.data service worker's), released however the read
ends. No TensorFlow here.

A pipeline built in this process holds its copies pinned while it lives (``pipeline.CacheSession``). A service
worker runs a shipped graph, with no Python object whose end it could see, and a read there can end without
reaching its last record: an error mid-shard, an iterator dropped (the job ended), a fetch started ahead whose
shard is never read. So each of its fetches is a *hold*, a pin let go:

* when the read has its first record (``release``): the copy is open then, and an open file stays readable when
  it is evicted (removed) meanwhile, so the pin is no longer needed;
* or else ``hold_s`` after the fetch (or its wait) whatever happened: a read that never had a first record (its
  open failed, its iterator was dropped, its shard was never read) leaves nothing pinned.

A wait whose hold ran out fetches the copy again (checked and pinned anew), so a copy is never read unpinned before
it is open.
"""

from __future__ import annotations

import threading
import time

READ_HOLD_S = 300.0  # from a fetch (or its wait) to the read's first record, at most; then the pin is let go


class ReadHolds:
    """The holds of this process: for each ``(pipeline key, sha256)``, the deadlines and stores of its pins."""

    def __init__(self, hold_s: float = READ_HOLD_S):
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, str], list[list]] = {}  # (key, sha) -> [deadline, store] of each pin, oldest 1st
        self._sweeper: threading.Thread | None = None

    def fetch(self, store, key: str, shard) -> str | None:
        """``store.fetch(shard)``, its pin held for the read of pipeline ``key``."""
        found = store.fetch(shard)
        if found is not None:
            with self._lock:
                self._holds.setdefault((key, shard.sha256), []).append([time.monotonic() + self.hold_s, store])
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep, name="tfshard-read-holds", daemon=True)
                    self._sweeper.start()
        return found

    def waited(self, store, key: str, shard, found: str | None) -> str | None:
        """The copy a fetch started ahead ``found``, once its read is next: its hold runs ``hold_s`` from now, or,
        when it ran out meanwhile, the copy is fetched again."""
        if found is None:
            return None
        with self._lock:
            held = self._holds.get((key, shard.sha256))
            if held:
                held[-1][0] = time.monotonic() + self.hold_s
                return found
        return self.fetch(store, key, shard)

    def release(self, key: str, sha256: str) -> None:
        """Lets go of the oldest hold of ``(key, sha256)`` (none: it ran out already)."""
        with self._lock:
            held = self._holds.get((key, sha256))
            if not held:
                return
            _, store = held.pop(0)
            if not held:
                del self._holds[(key, sha256)]
        store.unpin(sha256)

    def held(self) -> int:
        with self._lock:
            return sum(len(held) for held in self._holds.values())

    def _sweep(self) -> None:
        """Lets go of the holds that ran out, every quarter ``hold_s`` (at most 10 s); ends when none is left."""
        while True:
            time.sleep(min(10.0, self.hold_s / 4))
            now, expired = time.monotonic(), []
            with self._lock:
                for (key, sha), held in list(self._holds.items()):
                    expired += [(store.unpin, sha) for deadline, store in held if deadline <= now]
                    held[:] = [hold for hold in held if hold[0] > now]
                    if not held:
                        del self._holds[(key, sha)]
                done = not self._holds
                if done:
                    self._sweeper = None
            for unpin, sha in expired:
                unpin(sha)
            if done:
                return
