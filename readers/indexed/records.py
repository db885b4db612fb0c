"""Where each record of a split is (its shard and byte range), and reading records by position in tf.data.

A record's place comes from its shard's DALI index file (``--index`` at conversion: ``"offset size"`` per framed
record), checked against the shard (offsets rising, every record inside it, as many as the manifest counts) and
against the manifest's sha256 of it; else from one scan of the TFRecord framing of the local file (8-byte length,
4-byte CRC, the data, 4-byte CRC), 8 bytes read per record, each length checked to stay inside the file. A remote
shard without an index is refused: a scan would read it all; a shard cache (``shard_cache=``) gives local copies.

Local records are read a batch at a time by ``pread`` (``pread_batch``), from files that must still be the ones the
table was made of: each file's size, mtime and inode are checked on the open file before its records are read and
again after (not its ctime, which a shard cache's touch of a copy, a chmod or a hard link moves), so a shard
replaced or rewritten mid-epoch (a conversion into OUT while a pipeline reads it) fails the read, naming it, instead
of reading the new file at the old file's offsets; and each record's data must match the CRC32C its framing stores,
as TensorFlow's reader checks it. Remote records are pure tf.data, without either check: ``FixedLengthRecordDataset``
over one record's bytes (its header the bytes before them, its footer those after) yields exactly that record, one
such dataset per element, interleaved in order. A stream with any remote file reads every record so (a mixture of a
local and a remote dataset too).

    table = record_table([checked shards], [paths to read])
    table.offset[:2], table.length[:2]    # (array([12, 1187]), array([1159, 1204])): data starts and lengths
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow as tf

from ...format.storage import file_sha256, is_url, join, open_for_reading, open_regular
from ...format.tfrecord import check_data_crcs, masked_crc
from ..guard import changed_shard
from ..shard_cache.folder import copy_identity

_HEADER, _FOOTER = 12, 4  # a framed record: uint64 length, uint32 masked CRC of it, the data, uint32 masked CRC
_FRAME = _HEADER + _FOOTER
_MAX_INDEX_LINE = 42  # two uint64 in decimal, a space and a newline


@dataclasses.dataclass(frozen=True, eq=False)
class RecordTable:
    """Every record of some shards, in record order: which file holds it and where its data lies.

    Attributes:
      files: the path read for each shard (the shard, or its verified local copy).
      file_sizes: each file's size in bytes.
      identities: each local file's ``(size, mtime_ns, device, inode)`` when the table was made (None for a URL).
      shard: int32 [records], an index into ``files``.
      offset: int64 [records], where the record's data starts in its file.
      length: int64 [records], the data's length in bytes.
    """

    files: tuple[str, ...]
    file_sizes: tuple[int, ...]
    identities: tuple[tuple | None, ...]
    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.shard)


def concatenated(tables: list[RecordTable]) -> RecordTable:
    """The records of ``tables`` one after another, their files renumbered into one list."""
    starts = np.cumsum([0] + [len(t.files) for t in tables])
    return RecordTable(
        files=tuple(f for t in tables for f in t.files), file_sizes=tuple(s for t in tables for s in t.file_sizes),
        identities=tuple(i for t in tables for i in t.identities),
        shard=np.concatenate([t.shard + start for t, start in zip(tables, starts)]).astype(np.int32),
        offset=np.concatenate([t.offset for t in tables]), length=np.concatenate([t.length for t in tables]))


def record_table(dataset_path: str, shards, read_paths: list[str]) -> RecordTable:
    """The records of ``shards`` (``files.ShardFile``s, in split order), read from ``read_paths`` (one per shard).

    Raises:
      ValueError: an index file or a shard whose framing is not the manifest's, or a remote shard without one.
    """
    offsets, lengths, which, identities = [], [], [], []
    for i, (shard, read_path) in enumerate(zip(shards, read_paths)):
        info = shard.info
        # the shard as checked at build (file_identity: size, mtime, device, inode, ctime), or its local copy as found
        # now (before its framing is scanned); ctime left out (see the module docstring)
        identities.append(None if is_url(read_path) else
                          shard.identity[:4] if read_path == shard.path else copy_identity(os.stat(read_path)))
        if info.index_file is not None:
            data, length = index_offsets(join(dataset_path, info.index_file), info)
        elif is_url(read_path):
            raise ValueError(
                f"{shard.path}: a remote shard without an index file cannot be read by record position (got no "
                f"index_file in the manifest); convert with --index (DALI index files), or pass shard_cache=DIR to "
                "read verified local copies")
        else:
            data, length = scan_offsets(read_path, info.bytes, info.records)
        offsets.append(data)
        lengths.append(length)
        which.append(np.full(len(data), i, np.int32))
    return RecordTable(tuple(read_paths), tuple(s.info.bytes for s in shards), tuple(identities),
                       np.concatenate(which) if which else np.zeros(0, np.int32),
                       np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
                       np.concatenate(lengths) if lengths else np.zeros(0, np.int64))


def index_offsets(path: str, info) -> tuple[np.ndarray, np.ndarray]:
    """The data offsets and lengths of a shard's records, from its DALI index file, checked.

    The file is read only up to the size its records' lines can take, and must hash to the manifest's
    ``index_sha256``; its frames must rise, lie inside the shard, hold at least a frame's 16 bytes each, and number
    the manifest's ``records``.
    """
    fix = "convert the dataset again with --index, or run `tfshard verify` on it"
    shard_bytes, records = info.bytes, info.records
    limit = records * _MAX_INDEX_LINE
    sha256, size = file_sha256(path, max_bytes=limit)
    if size > limit or sha256 != info.index_sha256:
        raise ValueError(f"{path}: index file is not the one the manifest records (got sha256 {sha256[:12]}..., "
                         f"{size} bytes, manifest says {info.index_sha256[:12]}...); {fix}")
    with open_for_reading(path) as f:
        text = f.read(limit + 1)
    try:  # the lines checked, then every number at once (a list per line took ~2.5 us a record)
        if not _lines_of_two_numbers(text):
            raise ValueError("a line that is not two decimal numbers")
        table = np.array(text.split(), np.int64).reshape(-1, 2)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{path}: index file is not lines of 'offset size' ({e}); {fix}") from e
    starts, frames = table[:, 0], table[:, 1]
    problem = ""
    if len(starts) != records:
        problem = f"{len(starts)} records, the manifest counts {records}"
    elif records and (starts[0] < 0 or (frames < _FRAME).any() or (np.diff(starts) < frames[:-1]).any()):
        problem = "offsets that do not rise by at least each record's frame"
    elif records and starts[-1] + frames[-1] > shard_bytes:
        problem = f"a record ending at byte {starts[-1] + frames[-1]}, past the shard's {shard_bytes} bytes"
    if problem:
        raise ValueError(f"{path}: index file does not fit its shard (got {problem}); {fix}")
    return starts + _HEADER, frames - _FRAME


def _lines_of_two_numbers(text: bytes) -> bool:
    """Whether ``text`` is lines of two decimal numbers (spaces or tabs between, each line ending in a newline),
    checked in numpy: ~0.4 s and ~110 MB for the 27 MB of a 1.28M-record index (a regex took 0.7 s and 400 MB)."""
    data = np.frombuffer(text, np.uint8)
    if len(data) == 0:
        return True
    digit, newline = (data >= ord("0")) & (data <= ord("9")), data == ord("\n")
    if data[-1] != ord("\n") or not (digit | newline | np.isin(data, list(b" \t\r"))).all():
        return False
    starts = np.flatnonzero(digit[1:] & ~digit[:-1]) + 1  # where each number starts
    starts = np.concatenate([[0], starts]) if digit[0] else starts
    per_line = np.bincount(np.searchsorted(np.flatnonzero(newline), starts), minlength=int(newline.sum()))
    return bool((per_line == 2).all())


def scan_offsets(path: str, size: int, records: int) -> tuple[np.ndarray, np.ndarray]:
    """The data offsets and lengths of a local shard's records, from its TFRecord framing: 8 bytes read per record.

    Raises:
      ValueError: a length that runs past the file, or a count other than the manifest's ``records``.
    """
    offsets = np.zeros(records, np.int64)
    lengths = np.zeros(records, np.int64)
    position, count = 0, 0
    with open_regular(path) as f:
        fd = f.fileno()
        while position < size:
            header = os.pread(fd, 8, position)
            length = int.from_bytes(header, "little") if len(header) == 8 else -1
            if length < 0 or position + _FRAME + length > size or count >= records:
                what = (f"more than the manifest's {records} records" if count >= records else
                        f"a record at byte {position} running past the file's {size} bytes")
                raise ValueError(f"{path}: shard's TFRecord framing does not fit the manifest (got {what}); run "
                                 "`tfshard verify` on the dataset, then convert it again")
            offsets[count], lengths[count] = position + _HEADER, length
            position += _FRAME + length
            count += 1
    if count != records:
        raise ValueError(f"{path}: shard holds {count} records, the manifest counts {records}; run `tfshard verify` "
                         "on the dataset, then convert it again")
    return offsets, lengths


def read_at(files: tf.Tensor, file_sizes: tf.Tensor, shard: tf.Tensor, offset: tf.Tensor,
            length: tf.Tensor) -> tf.data.Dataset:
    """A dataset of the one record of ``files[shard]`` whose data is ``[offset, offset + length)``."""
    size = tf.gather(file_sizes, shard)
    # buffer_size: the record alone (the default 256 KB read buffer would read far past a small record).
    return tf.data.FixedLengthRecordDataset(tf.gather(files, shard), record_bytes=length, header_bytes=offset,
                                            footer_bytes=size - offset - length,
                                            buffer_size=tf.maximum(length, 1))


def pread_batch(files: tuple[str, ...], identities: tuple[tuple, ...]):
    """A numpy function reading a batch of records of local ``files`` at once: ``(shard, offset, length) ->
    object [n]`` of their bytes, each file opened once per batch. Python per batch, one ``pread`` per record:
    on 20 KB records 8.9k records/s against 1.0k for one ``read_at`` dataset per record (/tmp micro-benchmark, 2
    loaded cores), as creating a dataset per element costs far more than the read. Each file must be the one of
    ``identities`` on the open file, before its records are read and after (else ``ValueError``, naming it)."""

    def unchanged(s: int, fd: int) -> None:
        now, then = copy_identity(os.fstat(fd)), identities[s]
        if now != then:
            what = (f"size {then[0]} -> {now[0]} bytes" if now[0] != then[0] else
                    "modified" if now[1] != then[1] else "another file in its place")
            raise ValueError(changed_shard(files[s], f"was replaced or changed ({what})", "at a read by position"))

    check_crc = check_data_crcs()

    def read(shard, offset, length):
        out = np.empty(len(shard), dtype=object)
        opened = {}
        try:
            for i, (s, o, n) in enumerate(zip(shard.tolist(), offset.tolist(), length.tolist())):
                if s not in opened:
                    try:
                        opened[s] = open_regular(files[s])
                    except FileNotFoundError:
                        raise ValueError(changed_shard(files[s], "is gone", "at a read by position")) from None
                    unchanged(s, opened[s].fileno())
                fd = opened[s].fileno()
                out[i], footer = os.pread(fd, n, o), os.pread(fd, 4, o + n)
                if len(out[i]) != n or len(footer) != 4:
                    raise ValueError(f"{files[s]}: record at byte {o} is cut short (got {len(out[i])} of {n} "
                                     "bytes); build the pipeline again")
                if check_crc and int.from_bytes(footer, "little") != masked_crc([out[i]]):
                    raise ValueError(f"{files[s]}: record at byte {o} is corrupt (its data fails the CRC32C its "
                                     "framing stores); run `tfshard verify` on the dataset, then convert it again")
            for s, f in opened.items():  # rewritten in place while it was read
                unchanged(s, f.fileno())
        finally:
            for f in opened.values():
                f.close()
        return out

    return read
