"""The shard cache inside a reader's tf.data pipeline: fetch ahead in the epoch's file order, read the local copy.

After the per-epoch file shuffle, each shard's fetch into the cache (``store.py``) is started a few files ahead of
the reads, in a thread of ``ahead.py``'s pool (not a tf.data thread: a fetch blocks for its whole download), so the
cache fills in exactly the order the reader's seeded shuffle picks; each element leaves as ``(index, path, local)``:
the verified local copy, or the remote path to read when the shard could not be cached (no room, or its downloads
failed; logged). A local copy needs no guard against re-conversion (``readers/guard.py``): its bytes are the
manifest's, checked by sha256. A remote read keeps it.

The fetch is Python, registered under fixed names (``START``, ``WAIT``) in every process that imports
``tfshard.readers``, so the ops also run on tf.data service workers (``tfshard service worker``): a service ships the
graph, not a Python closure, and each worker caches in the folder of that name on its own host.

Pins: a pipeline built in this process keeps every copy it has fetched pinned while it lives (a copy an open
reader uses is never evicted; with a limit below the pipeline's shards, the copies it holds stay, and the rest are
read remotely each epoch instead of evicting one another), and its fetches stop when it is gone (``store.py``'s
stop: one queued then does not download). On a service worker a copy is pinned from its fetch until its read has
its first record, or for ``holds.READ_HOLD_S`` at most, however the read ends (``holds.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import threading
import uuid
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import script_ops  # the registry of Python ops, to register ours under a fixed name

from ...format.objects import scheme_of, uses_fsspec
from ...format.sizes import parse_size
from ...format.storage import default_cache_folder
from ..python_steps import register_exit_hook
from . import budget
from .ahead import MAX_THREADS, FetchPool, UnknownTicket
from .folder import checked_directory, held_bytes
from .holds import ReadHolds
from .store import CacheFolderError, Shard, ShardStore

log = logging.getLogger(__name__)

START, WAIT = "tfshard_shard_cache_start_v1", "tfshard_shard_cache_wait_v1"
RELEASE, HELD_HERE = "tfshard_shard_cache_release_v1", "tfshard_shard_cache_held_here_v1"
FETCH_AHEAD = 2  # shards fetched beyond the files being read
# The default folder's limit, for shards TensorFlow cannot read (s3://, https://...) with no shard_cache given: at
# most this, and at most 90% of the disk's free space.
DEFAULT_LIMIT = 50 * 10**9
_default_limits: dict[str, int] = {}  # default folder -> its limit, chosen (and said in the log) once per process
_stores: dict[tuple[str, int], ShardStore] = {}
_sessions: weakref.WeakValueDictionary[str, CacheSession] = weakref.WeakValueDictionary()
# Reentrant, as the pins' lock (``store.py``): a pipeline's finalizer takes both, and the GC runs it on whatever
# allocation triggers a collection, the ones made while this thread holds either lock too.
_registry_lock = threading.RLock()


def store_for(directory: str, limit: int) -> ShardStore:
    """This process's ``ShardStore`` of a folder and limit (one, so copies it verified are not hashed again)."""
    key = (os.path.abspath(directory), limit)
    with _registry_lock:
        if key not in _stores:
            _stores[key] = ShardStore(directory, limit)
        return _stores[key]


def checked_limit(directory: str, limit, where: str) -> int:
    """``shard_cache_limit`` in bytes; None: what the cache holds now plus 90% of its disk's free space."""
    if limit is not None:
        return parse_size(limit, "shard_cache_limit")
    directory = checked_directory(directory)  # a URL or a file is refused before anything is made
    limit = budget.default_limit(held_bytes(directory), shutil.disk_usage(directory).free)
    log.info("%s: shard cache %s limited to %d bytes (90%% of the free disk); pass shard_cache_limit to choose",
             where, directory, limit)
    return limit


def _default_limit(directory: str, where: str, scheme: str | None) -> int:
    """The default folder's limit: chosen at its first use in this process, then kept (so the log says it once)."""
    with _registry_lock:
        if directory not in _default_limits:
            checked = checked_directory(directory)
            free = budget.default_limit(held_bytes(checked), shutil.disk_usage(checked).free)
            _default_limits[directory] = min(DEFAULT_LIMIT, free)
            log.info("%s: %s:// shards are read from verified local copies in %s (limit %d bytes, the default: the "
                     "smaller of 50 GB and 90%% of the free disk); pass shard_cache=DIR and shard_cache_limit=SIZE, "
                     "or set TFSHARD_CACHE, to choose", where, scheme, directory, _default_limits[directory])
        return _default_limits[directory]


def default_folder() -> str:
    """The shard cache of shards TensorFlow cannot read when a reader is given no ``shard_cache``: ``$TFSHARD_CACHE``,
    else ``$XDG_CACHE_HOME/tfshard``, else ``~/.cache/tfshard``."""
    return default_cache_folder()


class ShardCache:
    """A reader's ``shard_cache=DIR, shard_cache_limit=SIZE``, checked when the reader is called.

    Raises:
      ValueError: a URL or symlink for ``DIR``, a bad limit, or (``session``) a limit below one of the shards.
    """

    def __init__(self, directory: str, limit, where: str):
        if not isinstance(directory, (str, os.PathLike)) or not str(directory):
            raise TypeError(f"{where}: shard_cache must be a folder path (got {directory!r})")
        directory = os.fspath(directory)
        try:
            default = None if limit is not None else next(
                (store for (folder, _), store in _stores.items() if folder == os.path.abspath(directory)), None)
            if default is not None:  # no limit given: the one this process chose for the folder before
                self.limit, self.store = default.limit, default
            else:
                self.limit = checked_limit(directory, limit, where) if "://" not in directory else 0
                self.store = store_for(directory, self.limit)
        except (CacheFolderError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: shard_cache: {e}") from e
        self.directory, self.where = self.store.directory, where

    def session(self, shards) -> CacheSession:
        """The cache's use by one pipeline reading ``shards`` (``files.ShardFile``s, in the pipeline's order)."""
        largest = max(shards, key=lambda s: s.info.bytes)
        self.check_room(largest.info.bytes, largest.path)
        if any(uses_fsspec(s.path) for s in shards):  # no remote read to fall back on: every shard needs its copy
            total = sum({s.info.sha256: s.info.bytes for s in shards}.values())
            if total > self.limit:
                raise ValueError(
                    f"{self.where}: shard_cache_limit={self.limit} bytes is below this pipeline's {len(shards)} "
                    f"shards ({total} bytes); {scheme_of(shards[0].path)}:// shards are read only from verified "
                    f"local copies, so raise shard_cache_limit to at least {total} bytes (or read a share of the "
                    "shards per pipeline with input_context)")
        return CacheSession(self, shards)

    def check_room(self, size: int, name: str, limit_name: str = "shard_cache_limit") -> None:
        """Raises a ValueError naming the shard ``name`` of ``size`` bytes when the limit cannot hold it."""
        if not budget.room(0, size, self.limit):
            raise ValueError(
                f"{self.where}: {limit_name}={self.limit} bytes is below the shard {name} ({size} bytes), so it "
                f"would never be cached; raise the limit to at least {size} bytes (a few shards more lets it fetch "
                "ahead)")


@dataclasses.dataclass(frozen=True)
class ShardCacheArg:
    """A reader's ``shard_cache=``/``shard_cache_limit=`` as given, handed down to where the shards are checked."""

    directory: str | None = None
    limit: str | int | None = None

    def session(self, where: str, shards) -> CacheSession | None:
        """The pipeline's ``CacheSession`` of ``shards``; None without a ``shard_cache``, unless TensorFlow cannot
        read the shards (``s3://``, ``https://``...): they then go through the default folder (``default_folder``)."""
        if self.directory is None and any(uses_fsspec(s.path) for s in shards):
            directory = default_folder()
            limit = _default_limit(directory, where, scheme_of(shards[0].path)) if self.limit is None else self.limit
            return ShardCache(directory, limit, where).session(shards)
        if self.directory is None:
            if self.limit is not None:
                raise ValueError(f"{where}: shard_cache_limit={self.limit!r} without shard_cache; pass "
                                 "shard_cache=DIR too, or drop the limit")
            return None
        return ShardCache(self.directory, self.limit, where).session(shards)


class CacheSession:
    """One pipeline's shards and the copies it holds pinned (released when the pipeline is gone)."""

    def __init__(self, cache: ShardCache, shards):
        self.cache, self.id = cache, uuid.uuid4().hex
        self.shards = [Shard(s.info.sha256, s.info.bytes, s.path) for s in shards]
        # TensorFlow cannot read these remotely (s3://, https://...): a shard without its copy fails its read
        self.local_only = any(uses_fsspec(s.remote) for s in self.shards)
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self.stop = threading.Event()  # set when the pipeline is gone: its fetches still queued download nothing
        _sessions[self.id] = self
        weakref.finalize(self, _release_all, cache.store, self.held, self.id, self.stop)

    def fetch(self, shard: Shard) -> str | None:
        found = self.cache.store.fetch(shard, self.stop)
        if found is not None:
            with self._lock:
                if shard.sha256 in self.held:
                    self.cache.store.unpin(shard.sha256)  # one pin per copy this pipeline holds
                else:
                    self.held.add(shard.sha256)
        return found

    def localized(self, files: tf.data.Dataset, ahead: int) -> tf.data.Dataset:
        """``(index, path)`` elements → ``(index, path to read, local)``: each fetch is queued ahead of its element
        (a prefetch of tickets) and runs in one of the pipeline's ``ahead`` threads (``ahead.py``), in order.

        At most ``ahead`` downloads at once, in the epoch's order: with every queued file downloading, the interleave
        (which takes inputs well ahead) had 48 downloads share the bandwidth, none done until nearly all were, and
        nothing to read meanwhile (an epoch from an empty cache at 0.52-0.63x the reader without one).
        """
        register_exit_hook()  # Python ops of the pipeline (python_steps.py)
        shas = tf.constant([s.sha256 for s in self.shards])
        sizes = tf.constant([s.size for s in self.shards], tf.int64)
        key = tf.constant(self.id)
        directory, limit = tf.constant(self.cache.directory), tf.constant(self.cache.limit, tf.int64)
        threads = tf.constant(max(1, ahead), tf.int64)

        def start(index, path):
            ticket = tf.raw_ops.EagerPyFunc(
                input=[threads, key, directory, limit, tf.gather(shas, index), tf.gather(sizes, index), path],
                token=START, Tout=[tf.int64])[0]
            return index, path, tf.ensure_shape(ticket, [])

        def wait(index, path, ticket):  # with the shard again: a ticket restored from a checkpoint is not here
            found, local = tf.raw_ops.EagerPyFunc(
                input=[ticket, key, directory, limit, tf.gather(shas, index), tf.gather(sizes, index), path],
                token=WAIT, Tout=[tf.string, tf.bool])
            return index, tf.ensure_shape(found, []), tf.ensure_shape(local, [])

        return files.map(start).prefetch(max(1, ahead)).map(wait)

    def read(self, index, path, local, open_local, read_remote) -> tf.data.Dataset:
        """The records of one shard: ``open_local(path)`` of its verified copy (released at its first record, if it
        was pinned for the read: on a service worker, or after the pipeline's session is gone; ``holds.py``), or
        ``read_remote(index, path)``.

        A ``tf.cond`` between the two datasets, so each file builds and iterates only its own: with both behind
        filters and concatenated, every record of a local copy went through the unused remote reader's stages
        too, at 4-7x the CPU of reading the copy alone (``benchmarks/network.py``).
        """
        def cached():
            sha = tf.gather(tf.constant([s.sha256 for s in self.shards]), index)
            key, directory = tf.constant(self.id), tf.constant(self.cache.directory)
            limit = tf.constant(self.cache.limit, tf.int64)

            def released_at_first(position, record):  # the copy is open then: its pin is no longer needed
                def release():
                    done = tf.raw_ops.EagerPyFunc(input=[key, directory, limit, sha], token=RELEASE, Tout=[tf.string])
                    with tf.control_dependencies(done):
                        return tf.identity(record)

                return tf.cond(tf.equal(position, 0), release, lambda: record)

            # Where this process built the pipeline, its session holds the pins and the release has nothing to do:
            # the copy is read with no per-record stage (asked once per shard: a service worker answers False).
            here = tf.raw_ops.EagerPyFunc(input=[key], token=HELD_HERE, Tout=[tf.bool])[0]
            return tf.cond(tf.ensure_shape(here, []), lambda: open_local(path),
                           lambda: open_local(path).enumerate().map(released_at_first))

        if self.local_only:
            return tf.cond(local, cached, lambda: _uncached(path, self.cache.directory, self.cache.limit))
        return tf.cond(local, cached, lambda: read_remote(index, path))


def _uncached(path: tf.Tensor, directory: str, limit: int) -> tf.data.Dataset:
    """A read of a shard TensorFlow cannot open remotely that has no local copy: one error naming it and the fix."""
    def fail(path_):
        message = tf.strings.join([
            path_, f": could not be cached in the shard cache {directory} (limit {limit} bytes: full of copies live "
            "readers hold, or its download failed or did not match the manifest; see the log), and a shard of this "
            "store is read only from a verified local copy; raise shard_cache_limit, or fix what the log names"])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(path_)

    return tf.data.Dataset.from_tensors(path).map(fail)


def _release_all(store: ShardStore, held: set[str], key: str, stop: threading.Event) -> None:
    stop.set()
    with _registry_lock:
        _gone[key] = None
        while len(_gone) > _GONE_KEPT:
            _gone.popitem(last=False)
        pool = _pools.pop(key, None)
    if pool is not None:
        pool.close()
    for sha in list(held):
        store.unpin(sha)
    held.clear()


# --- the Python ops, under fixed names in every process (a service worker runs them from a shipped graph) --------

def _text(value) -> str:
    value = value.numpy() if hasattr(value, "numpy") else value
    return value.decode() if isinstance(value, bytes) else str(value)


_pools: dict[str, FetchPool] = {}  # session key -> the threads of its pipeline's fetches


_SHARED = "shared"  # the pool of fetches whose pipeline was not built here (a service worker's): one per process
_holds = ReadHolds()  # the pins of those fetches, each let go at its read's first record or when its hold runs out
# Keys of pipelines built here and gone since (an iterator keeps its dataset, so theirs are being torn down): an op
# of theirs still running fetches nothing.
_gone: collections.OrderedDict[str, None] = collections.OrderedDict()
_GONE_KEPT = 4096


def _pool_for(key: str, threads: int) -> FetchPool:
    """The pool of a pipeline built in this process (closed with it); else the process's shared pool, which a
    long-lived service worker keeps for every pipeline it runs instead of one pool per pipeline."""
    with _registry_lock:
        if key not in _sessions:
            key, threads = _SHARED, MAX_THREADS
        if key not in _pools:
            _pools[key] = FetchPool(threads)
        return _pools[key]


def _fetcher(key, directory, limit, sha, size, remote):
    """``(session key, shard, its fetch, the store of a hold)`` of the ops' inputs; the store is None for a pipeline
    built here (its session holds the pins)."""
    key = _text(key)
    session = _sessions.get(key)
    shard = Shard(_text(sha), int(size), _text(remote))
    if session is not None:
        return key, shard, session.fetch, None
    # A service worker (or a pipeline already gone): the copy is held for its read (holds.py).
    store = store_for(_text(directory), int(limit))
    return key, shard, lambda s: _holds.fetch(store, key, s), store


def _start(threads, *shard_inputs):
    key, shard, fetch, _ = _fetcher(*shard_inputs)
    if key in _gone:
        return np.int64(0)  # no ticket: its wait (if any) reads remotely
    return np.int64(_pool_for(key, int(threads)).start(key, shard.sha256, lambda: fetch(shard)))


def _wait(ticket, *shard_inputs):
    key, shard, fetch, held_in = _fetcher(*shard_inputs)
    if key in _gone:
        return shard.remote.encode(), np.bool_(False)
    pool = _pools.get(key) or _pools.get(_SHARED)
    try:
        if pool is None:
            raise UnknownTicket(f"no fetches of {key!r} here")
        found = pool.result(int(ticket), key, shard.sha256)
        if held_in is not None:
            found = _holds.waited(held_in, key, shard, found)
    except UnknownTicket:  # restored from a checkpoint, or its pipeline is gone: fetched now
        found = fetch(shard)
    return (found or shard.remote).encode(), np.bool_(found is not None)


def _release(key, directory, limit, sha):
    if _sessions.get(_text(key)) is None:
        _holds.release(_text(key), _text(sha))
    return b""


def _held_here(key):
    return np.bool_(_sessions.get(_text(key)) is not None)


def _register() -> None:
    registry = script_ops._py_funcs  # noqa: SLF001 (the only way to give a Python op a name a shipped graph finds)
    for token, function, outputs in ((START, _start, [tf.int64]), (WAIT, _wait, [tf.string, tf.bool]),
                                     (RELEASE, _release, [tf.string]), (HELD_HERE, _held_here, [tf.bool])):
        wrapped = script_ops.EagerFunc(function, outputs, False)
        _registered.append(wrapped)  # the registry holds its functions weakly
        registry._funcs[token] = wrapped  # noqa: SLF001


_registered: list = []
_register()
