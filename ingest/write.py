"""Writing files into the output folder atomically, through TensorFlow's filesystem layer.

Every byte goes through ``tf.io`` so a ``gs://`` output folder works like a local
one. A shard is written under a temporary name and renamed only once it is
complete, so a crash (even ``kill -9``) never leaves a partial file under a
final name; the same holds for the index files and the manifest.
"""

from __future__ import annotations

import hashlib
import posixpath

import tensorflow as tf

from ingest.manifest import ShardInfo
from ingest.plan import index_file_name

TEMP_PREFIX = ".tmp-"
_CHUNK = 4 * 2**20


def join(folder: str, name: str) -> str:
    """Joins a folder (local path or URL such as ``gs://b/x``) and a file name."""
    return posixpath.join(folder, name) if "://" in folder else tf.io.gfile.join(folder, name)


def file_sha256(path: str) -> tuple[str, int]:
    """Returns the sha256 hex digest and the size in bytes of a file."""
    digest = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
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
        self._writer.close()
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
