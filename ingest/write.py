"""Writing files into the output folder atomically: shards of pre-framed records, index files, the manifest.

A shard is written under a temporary name and renamed only once it is complete,
so a crash (even ``kill -9``) never leaves a partial file under a final name; the
same holds for the index files and the manifest. The workers send each input's
records already framed (``format/tfrecord.py``), so a shard is bytes appended in
plan order: local files with plain writes, URLs (``gs://``) through ``tf.io.gfile``.
The shard's SHA-256 is computed on a thread beside the writes, from the same
bytes, so it costs the writing loop nothing and the file is never read back.
That thread is the parent's ceiling: one shard is hashed at a time, at ~2 GB/s
with SHA-NI (~22,000 images of 83 KB a second, ``benchmarks/ingest.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf  # shards reach OUT through tf.io.gfile (local or gs://); workers never import this module

from ..format import manifest as manifest_lib
from ..format import untrusted
from ..format.errors import InputError
from ..format.manifest import ShardInfo
from ..format.names import TEMP_PREFIX, index_file_name
from ..format.storage import create_new, is_url, join, write_atomic
from ..format.tfrecord import DeflatePiece, GzipMember
from .kinds.protocol import Kind
from .options import ConvertOptions
from .plan import ShardSpec
from .scan import Rejection

_HASH_INLINE_BYTES = 4096  # hashlib holds the GIL for small buffers: hand those over in batches
_MAX_UNHASHED_BYTES = 64 * 2**20  # the writer waits when the hashing thread is this far behind


def write_text_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` via ``TEMP_PREFIX + name`` and a rename (a rerun removes what a kill left)."""
    write_atomic(path, text.encode("utf-8"), temp_name=TEMP_PREFIX + posixpath.basename(path))


def remove_if_exists(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


class Sha256Thread:
    """SHA-256 of a stream of bytes, computed on its own thread (``hashlib`` releases the GIL on large buffers).

    At most ``max_pending`` bytes wait to be hashed; ``update`` blocks beyond that, so memory stays bounded.
    Small buffers (hashlib holds the GIL for them) are joined and handed over in batches.

    Example:
      hasher = Sha256Thread()
      hasher.update(b"abc")
      hasher.hexdigest()  # 'ba7816bf...', the same as hashlib.sha256(b"abc").hexdigest()
    """

    def __init__(self, max_pending: int = _MAX_UNHASHED_BYTES):
        self._digest = hashlib.sha256()
        self._queue: collections.deque[bytes] = collections.deque()
        self._pending = 0
        self._max_pending = max_pending
        self._small: list[bytes] = []
        self._done = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="tfshard-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._done:
                    self._changed.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, collections.deque()
            for data in batch:
                self._digest.update(data)
            with self._changed:
                self._pending -= sum(map(len, batch))
                self._changed.notify_all()

    def update(self, data: bytes) -> None:
        if len(data) < _HASH_INLINE_BYTES:
            self._small.append(data)
            if len(self._small) < 64:
                return
            data = self._flush_small()
        elif self._small:
            self._hand_over(self._flush_small())
        self._hand_over(data)

    def _flush_small(self) -> bytes:
        joined = b"".join(self._small)
        self._small.clear()
        return joined

    def _hand_over(self, data: bytes) -> None:
        with self._changed:
            while self._pending and self._pending + len(data) > self._max_pending:
                self._changed.wait()
            self._queue.append(data)
            self._pending += len(data)
            self._changed.notify_all()

    def close(self) -> None:
        """Stops the thread once everything queued is hashed."""
        if self._small:
            self._hand_over(self._flush_small())
        with self._changed:
            self._done = True
            self._changed.notify_all()
        self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        return self._digest.hexdigest()


def _open_new(path: str):
    """A fresh file for binary writing; locally never written through a symlink or hard link planted under its name."""
    if is_url(path):
        return tf.io.gfile.GFile(path, "wb")
    return os.fdopen(create_new(path), "wb")


class ShardWriter:
    """Appends one shard's pre-framed records under a temporary name; commits on a clean exit.

    On an exception inside the ``with`` block the temporary file is deleted and
    nothing is renamed. After a clean exit ``info`` describes the committed shard.
    ``before_rename(info)`` is called once the shard (and its index file) are complete under their temporary
    names, before either is renamed to its final name: the engine writes the commit record there, so a kill
    never leaves a file under a final name that no record proves.

    Example:
      data, sizes = format.tfrecord.frame_records([[example_bytes]])
      with ShardWriter("out", "train-00000-of-00001.tfrecord") as writer:
          writer.append(data, sizes)
      writer.info  # ShardInfo(file=..., records=1, bytes=..., sha256=...)

    Args:
      folder: the output folder.
      file_name: the shard's final file name.
      compression: None or ``"gzip"`` (the appended bytes are then pieces of the shard's one gzip member).
      index: also write a DALI ``tfrecord2idx`` index (``<stem>.idx``: one
        "offset size" line per record); uncompressed shards only.
    """

    def __init__(self, folder: str, file_name: str, compression: str | None = None, index: bool = False,
                 before_rename: Callable[[ShardInfo], None] | None = None):
        if index and compression is not None:
            raise ValueError(
                f"{file_name}: an index needs uncompressed shards (got compression={compression!r}); "
                "drop --index or --compression"
            )
        self.folder = folder
        self.file_name = file_name
        self.path = join(folder, file_name)
        self.temp_path = join(folder, TEMP_PREFIX + file_name)
        self.compression = compression
        self._gzip = GzipMember() if compression == "gzip" else None
        self.index_name = index_file_name(file_name) if index else None
        self._before_rename = before_rename
        self.records = 0
        self.bytes = 0
        self.info: ShardInfo | None = None
        self._index_lines: list[str] = []
        self._file = None
        self._hasher: Sha256Thread | None = None

    def __enter__(self) -> ShardWriter:
        self._file = _open_new(self.temp_path)
        self._hasher = Sha256Thread()
        return self

    def append(self, data: bytes | DeflatePiece, record_sizes: Sequence[int]) -> None:
        """Appends framed records (``data``) whose framed sizes before compression are ``record_sizes``; a compressed
        shard's ``data`` is a piece of its one gzip member (``format.tfrecord.deflate_piece``)."""
        if (self._gzip is None) != isinstance(data, bytes):
            raise TypeError(f"{self.file_name}: a {'compressed' if self._gzip else 'plain'} shard appends "
                            f"{'DeflatePiece' if self._gzip else 'bytes'}, not {type(data).__name__}")
        if self.index_name is not None:
            offset = self.bytes
            for size in record_sizes:
                self._index_lines.append(f"{offset} {size}\n")
                offset += size
        self._write(data if self._gzip is None else self._gzip.piece(data))
        self.records += len(record_sizes)

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._hasher.update(data)
        self.bytes += len(data)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:  # a full disk may fail the gzip trailer's write or the flush at the close
            try:
                if exc_type is None and self._gzip is not None:
                    self._write(self._gzip.end())  # with no record (every input rejected), still a gzip file
            finally:
                sha256 = self._hasher.hexdigest()  # ends the hashing thread, whatever failed
                self._file.close()
        except (OSError, tf.errors.OpError):
            remove_if_exists(self.temp_path)
            if exc_type is None:
                raise
            return  # the error that stopped the block is the one to report
        if exc_type is not None:
            remove_if_exists(self.temp_path)
            return
        index_sha256 = index_temp = None
        try:
            if self.index_name is not None:
                data = "".join(self._index_lines).encode()
                index_temp = join(self.folder, TEMP_PREFIX + self.index_name)
                with _open_new(index_temp) as f:
                    f.write(data)
                index_sha256 = hashlib.sha256(data).hexdigest()
            info = ShardInfo(self.file_name, self.records, self.bytes, sha256, self.index_name, index_sha256)
            if self._before_rename is not None:
                self._before_rename(info)  # the commit record: every file under a final name has one
            if index_temp is not None:
                tf.io.gfile.rename(index_temp, join(self.folder, self.index_name), overwrite=True)
            tf.io.gfile.rename(self.temp_path, self.path, overwrite=True)
        except BaseException:
            for path in (self.temp_path, index_temp):
                if path is not None:
                    remove_if_exists(path)
            raise
        self.info = info


@dataclasses.dataclass
class ShardResult:
    """What one committed shard contributed; stored in the state folder for resume."""

    info: manifest_lib.ShardInfo
    stats: Any  # the job's per-shard statistics (ImageShardStats, EpisodeShardStats)
    rejected: list[dict[str, str]]

    def to_json(self) -> str:
        return json.dumps({"info": dataclasses.asdict(self.info), "stats": self.stats.to_dict(),
                           "rejected": self.rejected}, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Any, job, source: str, file_name: str) -> ShardResult:
        """A commit record read back from the state folder; anything unexpected is a ValueError naming ``source``."""
        try:
            info = untrusted.shard_from_dict(raw["info"], source, "info", expected_file=file_name)
            rejected = [{"path": str(r["path"]), "reason": str(r["reason"])} for r in raw["rejected"]]
            return cls(info, job.stats_from_dict(raw["stats"], info.records), rejected)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
            raise ValueError(f"not a commit record tfshard wrote ({type(e).__name__}: {str(e)[:120]})") from None


def write_shard(job: Kind, out: str, spec: ShardSpec, prepared: Iterable[tuple[Any, Any]], options: ConvertOptions,
                on_item: Callable[[Any], None] = lambda item: None, screen: Callable | None = None,
                record: Callable[[ShardResult], None] | None = None) -> ShardResult:
    """Writes one planned shard from its ``(item, EncodedItem | Rejection)`` pairs in plan order; commits it atomically.

    The one place records reach a shard, for the local process pool and the Beam runner alike: the workers
    made and framed the records, so this appends their bytes and adds up their statistics. ``screen(item stats,
    shard stats)``, when given, may turn a prepared input into a chosen ``Rejection`` (``--dedupe``'s copies).
    ``record(result)`` is called before the shard is renamed to its final name (the commit record, ``ingest/state.py``).
    """
    stats, rejected = job.new_stats(), []

    def before_rename(info: ShardInfo) -> None:
        if record is not None:
            record(ShardResult(info, stats, rejected))

    with ShardWriter(out, spec.file_name, options.compression, options.index, before_rename) as writer:
        for item, result in prepared:
            if screen is not None and not isinstance(result, Rejection):
                result = screen(result.stats, stats) or result
            if isinstance(result, Rejection):
                if options.on_error == "fail" and not result.chosen:
                    raise InputError(
                        f"{os.path.join(job.src, result.relpath)}: {result.reason}; "
                        "or pass --on-error skip to leave bad files out"
                    )
                rejected.append({"path": result.relpath, "reason": result.reason})
            else:
                writer.append(result.data, result.record_sizes)
                job.count(result.stats, stats)
            on_item(item)
    return ShardResult(writer.info, stats, rejected)
