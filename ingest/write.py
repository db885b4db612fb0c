"""Writing files into the output folder atomically, through TensorFlow's filesystem layer.

Every byte goes through ``tf.io`` so a ``gs://`` output folder works like a local
one. A shard is written under a temporary name and renamed only once it is
complete, so a crash (even ``kill -9``) never leaves a partial file under a
final name; the same holds for the index files and the manifest.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat

import tensorflow as tf

from .localfs import NotRegularFileError, file_kind, open_regular
from .manifest import ShardInfo
from .plan import index_file_name

TEMP_PREFIX = ".tmp-"
_CHUNK = 4 * 2**20


def join(folder: str, name: str) -> str:
    """Joins a folder (local path or URL such as ``gs://b/x``) and a file name."""
    return posixpath.join(folder, name) if "://" in folder else tf.io.gfile.join(folder, name)


def stat_regular(path: str) -> tuple[int, int]:
    """Size in bytes and mtime (ns) of a regular file, following symlinks.

    Raises:
      FileNotFoundError: nothing is there.
      NotRegularFileError: a folder, FIFO, device or socket (``/dev/zero`` would read forever, a FIFO blocks).
    """
    if "://" in path:
        try:
            st = tf.io.gfile.stat(path)
        except tf.errors.NotFoundError as e:
            raise FileNotFoundError(f"{path}: no such file") from e
        if st.is_directory:
            raise NotRegularFileError(f"{path}: a folder, not a file")
        return int(st.length), int(st.mtime_nsec)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: {file_kind(st.st_mode)}, not a regular file")
    return st.st_size, st.st_mtime_ns


def file_sha256(path: str, max_bytes: int | None = None) -> tuple[str, int]:
    """Returns the sha256 hex digest and the size in bytes of a regular file.

    ``max_bytes``: stop after this many bytes plus one, so a file longer than expected costs
    no more than the expected read (the size returned is then ``max_bytes + 1``).

    Raises:
      NotRegularFileError: not a regular file.
    """
    stat_regular(path)
    digest = hashlib.sha256()
    size = 0
    limit = None if max_bytes is None else max_bytes + 1
    with (tf.io.gfile.GFile(path, "rb") if "://" in path else open_regular(path)) as f:
        while chunk := f.read(_CHUNK if limit is None else min(_CHUNK, limit - size)):
            digest.update(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
    return digest.hexdigest(), size


def write_text_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` via a temporary file and a rename."""
    folder = posixpath.dirname(path)
    temp = join(folder, TEMP_PREFIX + posixpath.basename(path))
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


def check_bucket(path: str) -> None:
    """For an object-store URL, fails fast when its bucket is missing or invisible.

    TensorFlow's recursive ``makedirs`` on a missing gs:// bucket retries forever
    (hundreds of requests a second, no error), so check the bucket root first.
    """
    if "://" not in path:
        return
    scheme, rest = path.split("://", 1)
    root = f"{scheme}://{rest.split('/', 1)[0]}"
    if scheme in ("gs", "s3") and not tf.io.gfile.exists(root):
        raise FileNotFoundError(
            f"{path}: bucket {root} does not exist or is not visible with these credentials; create it or fix the name"
        )


def remove_if_exists(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


class ShardWriter:
    """Writes one shard's records under a temporary name; commits on a clean exit.

    On an exception inside the ``with`` block the temporary file is deleted and
    nothing is renamed. After a clean exit ``info`` describes the committed shard.

    Example:
      with ShardWriter("out", "train-00000-of-00001.tfrecord") as writer:
          writer.write(example_bytes)
      writer.info  # ShardInfo(file=..., records=1, bytes=..., sha256=...)

    Args:
      folder: the output folder.
      file_name: the shard's final file name.
      compression: None or ``"gzip"``.
      index: also write a DALI ``tfrecord2idx`` index (``<stem>.idx``: one
        "offset size" line per record); uncompressed shards only.
    """

    def __init__(self, folder: str, file_name: str, compression: str | None = None, index: bool = False):
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
        self.index_name = index_file_name(file_name) if index else None
        self.records = 0
        self.info: ShardInfo | None = None
        self._offsets: list[tuple[int, int]] = []
        self._next_offset = 0
        self._writer = None

    def __enter__(self) -> "ShardWriter":
        options = tf.io.TFRecordOptions(compression_type="GZIP" if self.compression == "gzip" else "")
        self._writer = tf.io.TFRecordWriter(self.temp_path, options)
        return self

    def write(self, record: bytes) -> None:
        self._writer.write(record)
        self.records += 1
        if self.index_name is not None:
            framed = len(record) + 16  # u64 length, u32 crc of length, data, u32 crc of data
            self._offsets.append((self._next_offset, framed))
            self._next_offset += framed

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._writer.close()  # flushes: a full disk may fail here
        except tf.errors.OpError:
            remove_if_exists(self.temp_path)
            if exc_type is None:
                raise
            return  # the error that stopped the block is the one to report
        if exc_type is not None:
            remove_if_exists(self.temp_path)
            return
        sha256, size = file_sha256(self.temp_path)
        index_sha256 = None
        if self.index_name is not None:
            lines = "".join(f"{offset} {length}\n" for offset, length in self._offsets)
            write_text_atomic(join(self.folder, self.index_name), lines)
            index_sha256 = hashlib.sha256(lines.encode()).hexdigest()
        tf.io.gfile.rename(self.temp_path, self.path, overwrite=True)
        self.info = ShardInfo(self.file_name, self.records, size, sha256, self.index_name, index_sha256)
