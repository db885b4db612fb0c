"""The bytes of ``tf.train.Example`` records and of TFRecord files, written without TensorFlow.

The converter's worker processes build and frame every record themselves, so
the parent only appends bytes (TensorFlow is ~500 MB and seconds of start-up per
process). Both formats are small and public:

- ``tf.train.Example`` is a protobuf message (``tensorflow/core/example/example.proto``);
  ``example_parts`` writes the protobuf wire format of an Example whose features
  each hold one int64 or one bytes value, with the map keys in the order
  ``SerializeToString(deterministic=True)`` of TensorFlow's Python protobuf
  (upb) writes them: byte order, a key before its own prefix (``episode/chunks``
  before ``episode/chunk``).
- A TFRecord file is a run of records, each framed as: the data length (uint64,
  little-endian), the masked CRC32C of those 8 bytes, the data, the masked
  CRC32C of the data (``tensorflow/core/lib/io/record_writer.cc``). A GZIP
  TFRecord file is that run gzip-compressed, as one gzip member: each item's
  records are compressed on their own, in parallel, as a piece of raw deflate
  ending on a byte boundary (``deflate_piece``), and the shard writer joins the
  pieces into the member (``GzipMember``, its CRC-32 summed from the pieces'
  with ``crc32_combine``). Not a member per item: TensorFlow's
  reader stops, with no error and the rest of the file unread, after a member
  whose last inflate call yields no byte once the rest of the file is in its
  256 KiB input buffer (an empty member; a trailer that straddles that buffer).

The tests pin every byte against TensorFlow's ``SerializeToString`` and
``tf.io.TFRecordWriter``. ``read_records`` reads the frames back, checking both
CRCs as TensorFlow's reader does: a bulk load (resident episodes) reads its shards
with it, since TensorFlow's one public reader is a tf.data pipeline, whose first
iterator in a process costs ~0.05 s of set-up before its first record.

Example:
  parts = example_parts([("image/class/label", 3), ("image/encoded", jpeg_bytes)])
  data, sizes = frame_records([parts])  # the file bytes of one record, and its framed size
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO, Union

import google_crc32c

Value = Union[int, float, bytes, tuple]  # a tuple: several int64 (or float32) values; () is an empty Int64List
_MASK_DELTA = 0xA282EAD8
_UINT64 = struct.Struct("<Q")
_UINT32 = struct.Struct("<I")
SLOW_CRC32C = google_crc32c.implementation != "c"  # its pure-Python fallback: ~1000x slower
log = logging.getLogger(__name__)
FRAME_OVERHEAD = 16  # length (8), its CRC (4), the data's CRC (4)
# Feature.bytes_list = 1, Feature.float_list = 2, Feature.int64_list = 3 (each length-delimited)
_BYTES_LIST, _FLOAT_LIST, _INT64_LIST = b"\x0a", b"\x12", b"\x1a"
_FLOAT32 = struct.Struct("<f")
_FIELD_1, _FIELD_2 = b"\x0a", b"\x12"  # field 1 / field 2, length-delimited


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint; a negative int64 is its two's complement (10 bytes)."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _feature(value: Value) -> list[bytes]:
    """The parts of one ``Feature`` message holding one value (packed int64, packed float32, or one bytes string),
    or a tuple of values (all floats: packed float32; else packed int64, empty included)."""
    if isinstance(value, tuple):
        if value and all(isinstance(v, float) for v in value):
            packed = b"".join(_FLOAT32.pack(v) for v in value)
            head, kind = _FIELD_1 + _varint(len(packed)), _FLOAT_LIST
        else:
            for v in value:
                if not -(2**63) <= v < 2**63:
                    raise OverflowError(f"{v} does not fit an int64 feature")
            packed = b"".join(_varint(v) for v in value)
            head, kind = (_FIELD_1 + _varint(len(packed))) if value else b"", _INT64_LIST
        return [kind, _varint(len(head) + len(packed)), head, packed]
    if isinstance(value, float):
        values = _FIELD_1 + b"\x04" + _FLOAT32.pack(value)  # FloatList.value, packed: one little-endian float32
        return [_FLOAT_LIST, _varint(len(values)), values]
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise OverflowError(f"{value} does not fit an int64 feature")
        packed = _varint(value)
        values = _FIELD_1 + _varint(len(packed)) + packed  # Int64List.value, packed
        return [_INT64_LIST, _varint(len(values)), values]
    inner = _FIELD_1 + _varint(len(value))  # BytesList.value
    return [_BYTES_LIST, _varint(len(inner) + len(value)), inner, value]


def _map_order(item: tuple[bytes, Value]) -> tuple[int, ...]:
    return (*item[0], 256)  # the end of a key sorts after every byte: "ab" before "a"


def example_parts(features: Iterable[tuple[str, Value]]) -> list[bytes]:
    """The wire bytes of a ``tf.train.Example``, as parts to join (a large value is never copied here).

    Args:
      features: (key, value) pairs; a value is an ``int`` (an Int64List of one), a ``float`` (a FloatList of one
        float32) or ``bytes`` (a BytesList of one).
    """
    entries = []  # Features.feature map entries, in key order: (key = 1, value = 2)
    for name, value in sorted(((key.encode("utf-8"), value) for key, value in features), key=_map_order):
        feature = _feature(value)
        feature_size = sum(map(len, feature))
        head = _FIELD_1 + _varint(len(name)) + name + _FIELD_2 + _varint(feature_size)
        entries.append([_FIELD_1 + _varint(len(head) + feature_size) + head, *feature])
    features_size = sum(len(p) for entry in entries for p in entry)
    return [_FIELD_1 + _varint(features_size), *(p for entry in entries for p in entry)]  # Example.features = 1


def masked_crc(parts: Sequence[bytes]) -> int:
    """The masked CRC32C a TFRecord frame stores of ``parts`` (its length's 8 bytes, or its data)."""
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame_records(records: Iterable[Sequence[bytes]]) -> tuple[bytes, tuple[int, ...]]:
    """Frames records (each given as parts) as TFRecord bytes; returns the bytes and each record's framed size."""
    out, sizes = [], []
    for parts in records:
        size = sum(map(len, parts))
        length = _UINT64.pack(size)
        out += [length, _UINT32.pack(masked_crc([length])), *parts, _UINT32.pack(masked_crc(parts))]
        sizes.append(FRAME_OVERHEAD + size)
    return b"".join(out), tuple(sizes)


def gzip_member(data: bytes, level: int = zlib.Z_DEFAULT_COMPRESSION) -> bytes:
    """``data`` as one gzip member (no name, mtime 0), the same header TensorFlow's GZIP writer puts first."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@dataclasses.dataclass(frozen=True)
class DeflatePiece:
    """Some bytes as a piece of raw deflate that ends on a byte boundary (a sync flush) and refers to nothing before
    it, with the CRC-32 and size of those bytes: pieces compressed apart, joined in order, make one gzip member
    (``GzipMember``) without inflating them again."""

    data: bytes
    crc32: int
    size: int


def deflate_piece(data: bytes, level: int = zlib.Z_DEFAULT_COMPRESSION) -> DeflatePiece:
    """``data`` as a ``DeflatePiece``."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return DeflatePiece(compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH), zlib.crc32(data), len(data))


class GzipMember:
    """One gzip member written from ``DeflatePiece``s in order: ``piece(p)`` gives the bytes to write for each (the
    header first), ``end()`` the bytes that close it (the last block, the CRC-32 and size of all the data, summed
    from the pieces' own; a member of no piece is an empty gzip file).

    Example:
      member = GzipMember()
      data = member.piece(deflate_piece(b"a")) + member.piece(deflate_piece(b"b")) + member.end()
      gzip.decompress(data)  # b"ab"
    """

    HEADER = gzip_member(b"")[:10]  # no name, mtime 0: the header TensorFlow's GZIP writer puts first
    LAST_BLOCK = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # empty, final

    def __init__(self):
        self._started, self._crc, self._size = False, 0, 0

    def piece(self, piece: DeflatePiece) -> bytes:
        if not piece.data.endswith(b"\x00\x00\xff\xff"):
            raise ValueError("not a piece of raw deflate ending in a sync flush (format.tfrecord.deflate_piece)")
        self._crc, self._size = crc32_combine(self._crc, piece.crc32, piece.size), self._size + piece.size
        head, self._started = (b"" if self._started else self.HEADER), True
        return head + piece.data

    def end(self) -> bytes:
        head = b"" if self._started else self.HEADER
        return head + self.LAST_BLOCK + _UINT32.pack(self._crc) + _UINT32.pack(self._size & 0xFFFFFFFF)


# CRC-32 of two runs of bytes joined, from each run's CRC-32: zlib's crc32_combine, which Python's zlib does not
# offer. CRCs are polynomials over GF(2) in zlib's reflected bit order: appending n zero bytes multiplies the first
# run's CRC by x^(8n) mod the CRC polynomial, and x^(8n) is a product of the powers x^(2^k) for the bits of 8n.
_CRC32_POLY = 0xEDB88320  # the CRC-32 polynomial, reflected
_X1 = 1 << 30  # the polynomial x, reflected (bit 31 is x^0)


def _multiply_mod_p(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC-32 polynomial, both reflected."""
    product = 0
    for bit in range(31, -1, -1):
        if a & (1 << bit):
            product ^= b
        b = (b >> 1) ^ _CRC32_POLY if b & 1 else b >> 1
    return product


def _powers_of_x() -> list[int]:
    """x^(2^k) mod the CRC-32 polynomial for k in 0..31: they repeat with period 32 (x^(2^32) = x modulo it, as
    zlib's own table relies on; checked for a 512 MB second run)."""
    powers = [_X1]
    for _ in range(31):
        powers.append(_multiply_mod_p(powers[-1], powers[-1]))
    return powers


_X_TO_2_TO_K = _powers_of_x()


def crc32_combine(crc1: int, crc2: int, size2: int) -> int:
    """The CRC-32 (``zlib.crc32``) of ``a + b`` from ``crc1 = crc32(a)``, ``crc2 = crc32(b)`` and ``size2 = len(b)``."""
    shift, bits, k = 1 << 31, size2 * 8, 0  # shift: x^(8 * size2) mod p, starting from 1 (x^0)
    while bits:
        if bits & 1:
            shift = _multiply_mod_p(_X_TO_2_TO_K[k % 32], shift)
        bits, k = bits >> 1, k + 1
    return _multiply_mod_p(shift, crc1) ^ crc2


@functools.cache
def check_data_crcs() -> bool:
    """Whether reads check each record's data against the CRC32C its frame stores: not where google-crc32c has only
    its pure-Python fallback (~25 ms an 80 KB record), which is logged once. A length's CRC is always checked."""
    if SLOW_CRC32C:
        log.warning("google-crc32c has no C implementation here (its pure-Python one takes ~25 ms an 80 KB record), "
                    "so records read are not checked against their CRC32C; reinstall google-crc32c from a wheel "
                    "for this platform")
    return not SLOW_CRC32C


class CorruptRecordError(ValueError):
    """A TFRecord stream whose frame is cut short or fails its CRC (TensorFlow raises ``DataLossError`` there)."""


READ_PIECE = 1 << 24  # a record's data is read at most this much at a time: memory follows the bytes that arrive


def read_records(f: BinaryIO, where: str, size: int | None = None, most: int | None = None) -> Iterator[bytes]:
    """The records of a TFRecord stream ``f`` (a file, or ``gzip.GzipFile`` of one), each frame's two CRCs checked
    (the data's as ``check_data_crcs`` says).

    A record's length is believed only once its CRC matches, and only as far as the stream goes: with ``size``
    (the file's bytes when its size was taken, for an uncompressed file) the read stops there, a record must fit in
    what is left, and its data is read at once;
    without (a gzip stream) it is read ``READ_PIECE`` at a time, so a forged length takes no more memory than the
    bytes actually there. ``most``: the most bytes a record may hold; a longer length is refused before its data is
    read (a gzip stream's few megabytes can inflate to gigabytes).

    Raises:
      CorruptRecordError: a frame cut short or failing a CRC, naming ``where`` and the frame's byte offset (of the
        uncompressed stream).

    Example:
      with open("train-00000-of-00004.tfrecord", "rb") as f:
          n = sum(1 for _ in read_records(f, "train-00000-of-00004.tfrecord"))
    """
    offset = 0

    def fail(problem: str) -> CorruptRecordError:
        return CorruptRecordError(f"{where}: corrupted record at byte {offset}: {problem}")

    while True:
        if size is not None and offset >= size:  # bytes a file gained since its size was taken are not read
            return
        header = f.read(_UINT64.size + _UINT32.size)
        if not header and size is not None:
            raise fail(f"the file ends there, before the {size} bytes it had")
        if not header:
            return
        if len(header) < _UINT64.size + _UINT32.size:
            raise fail(f"the file ends inside its header ({len(header)} of 12 bytes)")
        length_bytes = header[: _UINT64.size]
        if _UINT32.unpack_from(header, _UINT64.size)[0] != masked_crc([length_bytes]):
            raise fail("its length fails its CRC")
        length = _UINT64.unpack(length_bytes)[0]
        if most is not None and length > most:
            raise fail(f"its length says {length} bytes, more than the {most} a record here can hold")
        there = None if size is None else size - offset - len(header)  # the bytes left after the header
        if there is not None and length > there:
            raise fail(f"the file ends inside its data ({there} of {length} bytes)")
        pieces, missing = [], length
        while missing:
            piece = f.read(missing if size is not None else min(missing, READ_PIECE))
            if not piece:
                raise fail(f"the file ends inside its data ({length - missing} of {length} bytes)")
            pieces.append(piece)
            missing -= len(piece)
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        footer = f.read(_UINT32.size)
        if len(footer) < _UINT32.size:
            raise fail("the file ends before its data's CRC")
        if check_data_crcs() and _UINT32.unpack(footer)[0] != masked_crc([data]):
            raise fail("its data fails its CRC")
        yield data
        offset += FRAME_OVERHEAD + length


def record_frames(f: BinaryIO, most: int) -> Iterator[tuple[int, int]]:
    """``(offset, framed size)`` of each record of an uncompressed TFRecord file, from the length fields alone (each
    record's data is skipped, not read nor checked): what a DALI ``tfrecord2idx`` index lists. Stops at the end of
    the file, at a record the file is too short to hold, or after ``most`` records."""
    offset = 0
    f.seek(0, 2)
    end = f.tell()  # not seek's value: TensorFlow's GFile (gs://) returns None from seek
    for _ in range(most):
        f.seek(offset)
        header = f.read(_UINT64.size)
        if len(header) < _UINT64.size:
            return
        size = FRAME_OVERHEAD + _UINT64.unpack(header)[0]
        if offset + size > end:
            return
        yield offset, size
        offset += size
