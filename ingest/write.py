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

from ..format.names import TEMP_PREFIX, index_file_name, tf_compression_type
from ..format.storage import file_sha256, join
from ..format.manifest import ShardInfo


def write_text_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` via a temporary file and a rename."""
    folder = posixpath.dirname(path)
    temp = join(folder, TEMP_PREFIX + posixpath.basename(path))
    with tf.io.gfile.GFile(temp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)


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
        options = tf.io.TFRecordOptions(compression_type=tf_compression_type(self.compression))
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
