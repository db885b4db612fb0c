"""An ordered, memory-bounded parallel map over worker processes.

The workers never import TensorFlow (they decode and validate with PIL/numpy);
the parent writes. Results come back in input order so the output is the same
whatever the number of workers, and at most ``max_pending_bytes`` of input is in
flight at once, so peak memory is bounded by that budget, not by dataset size.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from ..format import stops
from ..format.owners import process_start

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """The CPUs this process may run on (respects affinity masks and cgroup-pinned CPUs)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


_PARENT_POLL_S = 0.5


def _parent_gone(pid: int, start: str | None) -> bool:
    if start is not None:
        return process_start(pid) != start  # gone, or its pid reused by another process
    try:  # no /proc (macOS): the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _watch_parent(pid: int, start: str | None) -> None:
    while not _parent_gone(pid, start):
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _start_worker(parent_pid: int, parent_start: str | None) -> None:
    """Runs first in every worker process.

    Ctrl-C, SIGTERM and SIGHUP are the parent's to handle: it stops the workers (a terminal's SIGINT or SIGHUP, or
    Slurm's SIGTERM, reaches the whole process group, and a worker dying of it mid-task would print its own traceback
    and wedge the pool). And a worker exits within a second once the parent is gone, however it died: with
    ``forkserver`` a worker is the server's child, not ours, and it holds both the server's liveness pipe and its own
    task queue open, so after a ``kill -9`` of the parent the server, the workers and the resource tracker would all
    wait forever, holding the caller's stdout and stderr (``subprocess.run(capture_output=True)`` never returned).
    """
    for signum in stops.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid, parent_start), name="tfshard-parent-watch",
                     daemon=True).start()


@contextlib.contextmanager
def _main_kept_from_children(keep_out: bool):
    """While worker processes start, hides the caller's ``__main__`` from multiprocessing, which otherwise
    imports the calling script (or ``-m`` module) in every worker. A script that imports TensorFlow at its
    top would load it in each worker: seconds per conversion and ~500 MB per worker (measured: 3.0 s vs
    0.03 s to start 2 workers). Only used when the mapped function lives in a module of its own."""
    main = sys.modules.get("__main__")
    if not keep_out or main is None:
        yield
        return
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextlib.contextmanager
def _children_starting():
    """Where worker processes (and the forkserver, and the resource tracker) may start: ``ProcessPoolExecutor()``
    and ``submit()``. Two things about Ctrl-C and SIGTERM here:

    - They are blocked in this thread, so the children, which inherit the mask, never get them: a signal sent to
      the whole process group (a terminal's Ctrl-C, Slurm's scancel) would kill the forkserver, whose death
      ``concurrent.futures`` takes for every worker's (a broken pool and a traceback instead of a clean stop).
    - They are deferred to the end of the block (``stops.deferred``): an exception raised inside ``submit()``,
      midway through starting a worker, left the pool unable to shut down (the conversion hung instead of
      stopping). A stop that arrives meanwhile is raised once the block is done.
    """
    with stops.deferred():
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stops.STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


_WAIT_SLICE_S = 0.1


def _result(future: concurrent.futures.Future):
    """The future's result, waited for in short slices: a Ctrl-C or SIGTERM taken by another thread runs its
    handler in the main thread only once that thread runs Python again, which one long wait in C would put off
    until the worker is done (and ``stops.check`` raises a stop that was swallowed)."""
    while not future.done():
        concurrent.futures.wait([future], timeout=_WAIT_SLICE_S)
        stops.check()
    return future.result()


def _end_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Kills the pool's workers, for a consumer that stopped with chunks still in flight: what they compute would be
    thrown away, and the pool's shutdown would wait for each of them first (a chunk of eight 12-megapixel JPEGs
    resized kept a conversion going 6-13 s after Ctrl-C on a busy machine). They write nothing, the parent writes
    everything, and they ignore the stop signals (``_start_worker``): SIGKILL, then the shutdown finds them gone,
    and every chunk left fails with the pool (nobody asks for it). None is cancelled first: Python 3.11's pool then
    failed a cancelled one on its own thread and printed that thread's traceback (fixed in 3.12).

    A worker killed while it sent its result leaves half a message in the result pipe, and the pool's own thread
    waits for the rest for ever, since this process holds the pipe's writing end too (a stopped append hung so).
    That end is closed here: the wait ends at EOF once the workers are gone, and the pool shuts down broken.
    """
    kill = getattr(pool, "kill_workers", None)  # Python 3.14
    if kill is not None:
        kill()
    else:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError, ValueError):  # already gone, or already closed
                process.kill()
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()


def _map_chunk(fn: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    return [fn(item) for item in chunk]


def _chunks(items: Iterable[T], size_of: Callable[[T], int], chunk_items: int) -> Iterator[tuple[list[T], int]]:
    chunk, chunk_bytes = [], 0
    for item in items:
        chunk.append(item)
        chunk_bytes += size_of(item)
        if len(chunk) == chunk_items:
            yield chunk, chunk_bytes
            chunk, chunk_bytes = [], 0
    if chunk:
        yield chunk, chunk_bytes


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    workers: int,
    size_of: Callable[[T], int] = lambda item: 1,
    max_pending_bytes: int = 256 * 2**20,
    chunk_items: int = 8,
) -> Iterator[R]:
    """Yields ``fn(item)`` for every item, in order, computed by ``workers`` processes.

    ``workers=0`` runs in this process (for debugging and tiny inputs). Workers are
    started with ``forkserver`` (``spawn`` where that is missing): forking a parent
    that has TensorFlow's thread pools running is unsafe.

    Args:
      fn: a picklable top-level function.
      items: the inputs; consumed lazily.
      workers: number of worker processes, or 0.
      size_of: an item's input size in bytes, for the memory budget.
      max_pending_bytes: submit no more once this much input is in flight (at
        least one chunk is always in flight).
      chunk_items: items per task sent to a worker (amortises the IPC).

    Example:
      list(ordered_map(abs, [-1, 2, -3], workers=2))  # [1, 2, 3]
    """
    if workers < 0:
        raise ValueError(f"workers: must be 0 (in-process) or more (got {workers!r})")
    if workers == 0:
        yield from map(fn, items)
        return
    module = getattr(fn, "func", fn).__module__  # fn may be a partial
    keep_main_out = module != "__main__"
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # Import the worker's module once in the server, so each worker forks ready instead of paying
        # ~0.2 CPU-s for numpy/PIL imports (no effect once this process's forkserver is running).
        context.set_forkserver_preload([module] if keep_main_out else ["__main__", module])
    else:
        context = multiprocessing.get_context("spawn")
    chunks = _chunks(items, size_of, chunk_items)
    pending: collections.deque = collections.deque()
    pending_bytes = 0
    me = os.getpid()
    with _children_starting():  # its queues start the resource tracker
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                                      initargs=(me, process_start(me)))
    with pool:
        try:
            exhausted = False
            while True:
                while not exhausted and (not pending or pending_bytes < max_pending_bytes):
                    nxt = next(chunks, None)
                    if nxt is None:
                        exhausted = True
                        break
                    chunk, chunk_bytes = nxt
                    # workers (and the forkserver) start inside submit()
                    with _main_kept_from_children(keep_main_out), _children_starting():
                        future = pool.submit(_map_chunk, fn, chunk)
                    pending.append((future, chunk_bytes))
                    pending_bytes += chunk_bytes
                if not pending:
                    return
                future, chunk_bytes = pending.popleft()
                pending_bytes -= chunk_bytes
                yield from _result(future)
        finally:  # the consumer stopped early (Ctrl-C, SIGTERM, an error, --on-error fail): drop the work left
            if any(not future.done() for future, _ in pending):
                _end_workers(pool)
