"""Fetches started ahead of the reads, in threads of their own. No TensorFlow here.

A fetch blocks for a whole download. Run inside a tf.data op it holds one of TensorFlow's inter-op threads (one
per core) all that time, so a parallel map of fetches downloaded about 2 shards at a time on a 2-core machine,
whatever its ``num_parallel_calls``: an epoch from an empty cache ran at 0.16-0.36x the speed of reading without
one (``benchmarks/network.py``). Here the op only hands the fetch to a thread of this pool and returns a ticket; a
later op waits on the ticket, when the reader needs that shard.

The threads are daemons, so a program that ends does not wait on downloads in flight: a download cut off midway
leaves a part file that the next fetch of that shard removes and starts over (``store.py``).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

MAX_THREADS = 64  # shared by every pipeline of the process; each keeps only its fetch-ahead window in flight


class FetchPool:
    """Runs submitted functions in first-in, first-out order on up to ``threads`` daemon threads (started as
    needed), each result waited for by its ticket.

    Example:
      pool = FetchPool(4)
      ticket = pool.start(store.fetch, shard)   # returns at once; the download runs in a thread
      pool.wait(ticket)                         # the path of the verified copy, or None (or the fetch's error)
    """

    def __init__(self, threads: int = MAX_THREADS):
        if threads < 1:
            raise ValueError(f"FetchPool: threads must be at least 1 (got {threads!r})")
        self.threads = threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[int, Future] = {}
        self._tickets = itertools.count(1)
        self._started = 0
        self._lock = threading.Lock()

    def start(self, function: Callable, *args) -> int:
        """Queues ``function(*args)``; returns its ticket for ``wait``."""
        future: Future = Future()
        with self._lock:
            ticket = next(self._tickets)
            self._pending[ticket] = future
            if self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._work, name=f"tfshard-fetch-{self._started}", daemon=True).start()
        self._queue.put((future, function, args))
        return ticket

    def wait(self, ticket: int):
        """The result of the function of ``ticket`` (raising its exception), once it has run; each ticket once."""
        with self._lock:
            future = self._pending.pop(ticket, None)
        if future is None:
            raise KeyError(f"FetchPool: no fetch started under ticket {ticket!r} (or it was waited on already)")
        return future.result()

    def _work(self) -> None:
        while True:
            future, function, args = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function(*args))
            except BaseException as e:  # noqa: BLE001 (handed to the waiter, which raises it in the reader)
                future.set_exception(e)
