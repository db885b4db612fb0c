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

MAX_THREADS = 64
KEPT_PER_THREAD = 4  # finished results kept untaken per thread (a live iterator leaves about one per thread)


class UnknownTicket(LookupError):
    """No fetch under that ticket, owner and name here (taken already, forgotten, or started in another process)."""


class FetchPool:
    """Runs submitted functions in first-in, first-out order on up to ``threads`` daemon threads, started only when
    none is free (each thread's allocations keep an arena of their own: more threads, more resident memory); each
    result is taken once by its ticket, with the owner and name it was started under.

    A ticket can outlive its process (a checkpointed iterator saves the tickets of its fetch-ahead buffer), and a
    restored one may equal a live one here: ``result`` gives a result only under the same owner and name, so a
    caller never takes another shard's fetch, and does the work itself when there is none.

    An iterator deleted mid-epoch never takes the tickets of its fetch-ahead buffer: beyond ``KEPT_PER_THREAD``
    per thread, the oldest finished results nobody took are dropped (their waiter, if any, does the work itself),
    so a dataset iterated for many abandoned epochs does not keep every one.

    Example:
      pool = FetchPool(4)
      ticket = pool.start("pipeline-1", sha256, lambda: store.fetch(shard))   # returns at once
      pool.result(ticket, "pipeline-1", sha256)   # the fetch's path or None (or its error), once it has run
    """

    def __init__(self, threads: int = MAX_THREADS):
        if threads < 1:
            raise ValueError(f"FetchPool: threads must be at least 1 (got {threads!r})")
        self.threads, self._kept = threads, KEPT_PER_THREAD * threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[int, tuple[str, str, Future]] = {}
        self._tickets = itertools.count(1)
        self._started = self._free = 0
        self._lock = threading.Lock()

    def start(self, owner: str, name: str, function: Callable[[], object]) -> int:
        """Queues ``function()``; returns its ticket."""
        future: Future = Future()
        with self._lock:
            ticket = next(self._tickets)
            self._pending[ticket] = (owner, name, future)
            self._drop_untaken()
            if self._free:
                self._free -= 1  # that thread takes it
            elif self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._work, name=f"tfshard-fetch-{self._started}", daemon=True).start()
        self._queue.put((future, function))
        return ticket

    def result(self, ticket: int, owner: str, name: str):
        """The result of the function started under ``ticket``, ``owner`` and ``name`` (raising its exception),
        once it has run.

        Raises:
          UnknownTicket: no such fetch here.
        """
        with self._lock:
            found = self._pending.get(ticket)
            if found is None or found[:2] != (owner, name):
                raise UnknownTicket(f"FetchPool: no fetch of {name!r} for {owner!r} under ticket {ticket!r}")
            del self._pending[ticket]
        return found[2].result()

    def forget(self, owner: str) -> None:
        """Drops the tickets of ``owner`` nobody took (an iterator deleted mid-epoch); their functions still run."""
        with self._lock:
            for ticket in [t for t, (o, _, _) in self._pending.items() if o == owner]:
                del self._pending[ticket]

    def _drop_untaken(self) -> None:
        """Drops the oldest finished results beyond the ones kept. Lock held."""
        excess = len(self._pending) - self._kept
        if excess > 0:
            for ticket in [t for t, (_, _, f) in self._pending.items() if f.done()][:excess]:
                del self._pending[ticket]

    def close(self) -> None:
        """Ends the threads once the functions queued so far have run."""
        with self._lock:
            threads, self._started, self.threads = self._started, 0, 0
        for _ in range(threads):
            self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, function = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as e:  # noqa: BLE001 (handed to the caller of result, which raises it)
                    future.set_exception(e)
            # Not held while waiting for the next: the function's closure keeps its pipeline's session (and pins).
            del item, future, function
            with self._lock:
                self._free += 1
