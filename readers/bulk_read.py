"""A bulk load's one read of its shards (resident episodes): every record handed to a function, now, in any order.

TensorFlow's public TFRecord reader is a tf.data pipeline, and the first iterator of a process costs ~0.05 s of
set-up before its first record; this read is plain file reads, framed and CRC-checked by
``format.tfrecord.read_records``, several shards at a time on threads (on gs:// each read waits on the network).
"""

from __future__ import annotations

import concurrent.futures
import gzip
import threading
import zlib
from collections.abc import Callable

import tensorflow as tf

from ..format.storage import NotRegularFileError, open_for_reading
from ..format.tfrecord import CorruptRecordError, read_records
from .files import ShardFile, stat_all
from .guard import ShardGuard


def read_now(shards: list[ShardFile], each: Callable[[bytes, str], None], *, compression: str | None, fix: str,
             most_record_bytes: int | None = None, at_once: int = 16) -> None:
    """Calls ``each(record, shard path)`` for every serialized record of ``shards`` (as ``check_shards`` found them),
    one call at a time (under a lock), from up to ``at_once`` reader threads, in no set order; returns once all are
    read. The first error of a read or of ``each`` stops the other readers; the error raised is the first in shard
    order among those that failed.

    One guard covers the whole read: after its last record every shard must still be the file ``check_shards`` saw,
    so a shard replaced before its open, or changed while it was read, fails the load (``InvalidArgumentError``
    naming it, as the pipelines' guard does) instead of mixing two datasets in one load. Shards are read ``at_once``
    at a time, each group checked just before it is opened too; a local shard is opened without blocking, so one
    turned into a FIFO meanwhile is refused, never waited on. A record longer than ``most_record_bytes`` is refused
    unread; a read that fails on a shard no longer the one checked reports the change, not the damage.

    Raises:
      tf.errors.InvalidArgumentError: a shard replaced, changed or gone since ``check_shards``.
      tf.errors.DataLossError: a record cut short or failing its CRC (its shard, byte offset and ``fix`` named).

    Example:
      records = []
      read_now(check_shards(dataset, "train", [0, 1]), lambda record, path: records.append(record),
               compression=None, fix="rerun the conversion")  # len(records) == 64
    """
    guard = ShardGuard(shards, strict=True)
    lock, stop = threading.Lock(), threading.Event()

    def unchanged(indices: range, when: str) -> None:
        for index, (found, error) in zip(indices, stat_all([shards[i].path for i in indices])):
            if error is not None or found != shards[index].identity:
                problem = guard.problem(index, when) or f"{shards[index].path}: shard changed {when}"
                raise tf.errors.InvalidArgumentError(None, None, problem)

    def read(index: int) -> None:
        try:
            read_shard(index)
        except BaseException:
            stop.set()  # the other readers stop at their next record
            raise

    def read_shard(index: int) -> None:
        path = shards[index].path
        try:
            file = open_for_reading(path)
        except (OSError, NotRegularFileError) as e:  # gone or swapped since the group's check
            raise tf.errors.InvalidArgumentError(None, None, guard.problem(index, "when it was opened")
                                                 or f"{path}: {e}") from e
        with file as f, (gzip.GzipFile(fileobj=f) if compression == "gzip" else f) as stream:
            try:
                for record in read_records(stream, path, None if compression == "gzip" else shards[index].size,
                                           most_record_bytes):
                    with lock:
                        if stop.is_set():  # checked under the lock: no record is handed on after a failure
                            return
                        try:
                            each(record, path)
                        except BaseException:
                            stop.set()
                            raise
            except (CorruptRecordError, EOFError, gzip.BadGzipFile, zlib.error) as e:
                changed = guard.problem(index, "while it was read")  # a shard rewritten mid-read reads as damaged
                if changed:
                    raise tf.errors.InvalidArgumentError(None, None, changed) from e
                problem = e if isinstance(e, CorruptRecordError) else f"{path}: not a whole gzip stream ({e})"
                raise tf.errors.DataLossError(None, None, f"{problem}; {fix}") from e

    for first in range(0, len(shards), at_once):
        group = range(first, min(first + at_once, len(shards)))
        unchanged(group, "before it was opened")
        if len(group) == 1:  # one shard: no thread to start
            read(group[0])
            continue
        with concurrent.futures.ThreadPoolExecutor(len(group)) as pool:
            futures = [pool.submit(read, i) for i in group]
            try:
                concurrent.futures.wait(futures)  # a reader that fails stops the others (read); the pool waits for them
            except BaseException:  # interrupted
                stop.set()
                raise
        failed = [future.exception() for future in futures if future.exception() is not None]
        if failed:  # the first shard's error in shard order, whichever reader failed first
            raise failed[0]
    unchanged(range(len(shards)), "by the end of its read")
