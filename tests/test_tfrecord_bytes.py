"""The records the workers build and frame without TensorFlow, pinned byte for byte against TensorFlow's own.

``format/tfrecord.py`` writes the protobuf wire format of ``tf.train.Example`` and
the TFRecord framing; the converter's shards must be exactly the files TensorFlow's
``SerializeToString(deterministic=True)`` and ``tf.io.TFRecordWriter`` would write.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import zlib

import numpy as np
import pytest
import tensorflow as tf
from helpers import make_tree, save_episodes, tfrecord_bytes
from tfshard.format.records import IMAGE_FEATURES, serialize
from tfshard.format.tfrecord import (
    CorruptRecordError,
    DeflatePiece,
    GzipMember,
    crc32_combine,
    deflate_piece,
    example_parts,
    frame_records,
    gzip_member,
    read_records,
)
from tfshard.ingest import ConvertOptions, convert_episodes, convert_images
from tfshard.ingest.write import Sha256Thread, ShardWriter


def _tf_example(features) -> bytes:
    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    example = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features}))
    return example.SerializeToString(deterministic=True)


EDGE_INTS = [0, 1, -1, 127, 128, 300, 2**31, -(2**31), 2**63 - 1, -(2**63)]
EDGE_SIZES = [0, 1, 127, 128, 16383, 16384, 2**21 + 3]


@pytest.mark.parametrize("seed", range(4))
def test_examples_match_tensorflow_byte_for_byte(seed):
    rng = random.Random(seed)
    for _ in range(60):
        features = {}
        for _ in range(rng.randint(1, 9)):
            key = rng.choice(["image/encoded", "a", "ab", "", "z/y", "episode/chunk", "episode/chunks", "data/obs",
                              "ключ", f"k{rng.random()}"])
            if rng.random() < 0.5:
                features[key] = rng.choice(EDGE_INTS + [rng.randint(-(2**62), 2**62)])
            else:
                features[key] = rng.randbytes(rng.choice(EDGE_SIZES[:-1] + [rng.randint(0, 5000)]))
        assert b"".join(example_parts(features.items())) == _tf_example(features.items())


def test_a_large_value_and_every_edge_match_tensorflow():
    features = [(f"i{n}", v) for n, v in enumerate(EDGE_INTS)]
    features += [(f"b{n}", b"\x07" * s) for n, s in enumerate(EDGE_SIZES)]
    assert b"".join(example_parts(features)) == _tf_example(features)


def test_framing_matches_tf_record_writer():
    records = [b"", b"x", os.urandom(127), os.urandom(70_000), _tf_example([("a", 1)])]
    data, sizes = frame_records([[r] for r in records])
    assert data == tfrecord_bytes(records)
    assert sizes == tuple(len(r) + 16 for r in records)
    split, _ = frame_records([[r[:3], r[3:]] for r in records])  # a record given in parts frames the same
    assert split == data


def test_gzip_members_read_back_with_tensorflow_and_gzip():
    records = [os.urandom(100), b"a" * 5000, b"", b"tail"]
    members = b"".join(gzip_member(frame_records([[r]])[0]) for r in records)
    # The same gzip header TensorFlow's writer puts first.
    assert members[:10] == tfrecord_bytes(records[:1], "GZIP")[:10]
    assert gzip.decompress(members) == tfrecord_bytes(records)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tfshard-members-{os.getpid()}.tfrecord.gz")
    with open(path, "wb") as f:
        f.write(members)
    try:
        assert list(tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator()) == records
    finally:
        os.remove(path)


@pytest.mark.parametrize("first", [0, 262_145 - 64, 262_152 - 64, 3 * 262_144 + 3 - 64])
def test_a_gzip_shard_is_one_member_tensorflow_reads_whole(tmp_path, first):
    """TensorFlow's GZIP reader stops, with no error and the rest of the file unread, after a gzip member whose last
    inflate call yields no byte once the rest of the file is in its 256 KiB input buffer (an empty member, or a
    trailer straddling that buffer: members ending 1-8 bytes past a multiple of it lost what followed). A shard is
    one member of the items' deflate pieces, so no member ends before the file does: TensorFlow reads every record."""
    records = [np.random.default_rng(first).bytes(first), *(os.urandom(n) for n in (1000, 0, 70_000, 5))]
    with ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord", "gzip") as writer:
        for record in records:
            framed, sizes = frame_records([[record]])
            writer.append(deflate_piece(framed), sizes)
    path = str(tmp_path / "train-00000-of-00001.tfrecord")
    assert list(tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator()) == records
    with open(path, "rb") as f:
        data = f.read()
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert inflater.decompress(data) == tfrecord_bytes(records) and inflater.eof and not inflater.unused_data
    assert data[:10] == tfrecord_bytes(records[:1], "GZIP")[:10]  # the header TensorFlow's writer puts first
    assert writer.info.records == len(records) and writer.info.bytes == len(data)


def test_an_empty_gzip_shard_is_an_empty_gzip_file(tmp_path):
    with ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord", "gzip") as writer:
        pass
    data = (tmp_path / "train-00000-of-00001.tfrecord").read_bytes()
    assert gzip.decompress(data) == b"" and writer.info.records == 0
    assert list(tf.data.TFRecordDataset(str(tmp_path / "train-00000-of-00001.tfrecord"), compression_type="GZIP")) == []


def test_a_gzip_member_refuses_what_is_not_a_deflate_piece():
    member = GzipMember()
    piece = deflate_piece(b"abc")
    for wrong in (gzip_member(b"abc"), zlib.compress(b"abc"), piece.data[:-4]):
        with pytest.raises(ValueError, match="not a piece of raw deflate ending in a sync flush"):
            member.piece(DeflatePiece(wrong, piece.crc32, piece.size))


def test_crc32_combine_is_zlibs_crc_of_the_joined_bytes():
    rng = random.Random(0)
    for _ in range(300):
        a, b = (rng.randbytes(rng.choice([0, 1, 7, 100, 70_000])) for _ in range(2))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_a_shard_whose_gzip_trailer_cannot_be_written_leaves_no_file(tmp_path, monkeypatch):
    """The trailer is written as the shard closes: a full disk there leaves no temporary file behind and ends the
    hashing thread, as a failed close does."""
    writer = ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord", "gzip")
    with pytest.raises(OSError, match="No space left"):
        with writer:
            writer.append(deflate_piece(frame_records([[b"abc"]])[0]), (19,))

            def full(data):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(writer._file, "write", full)
    assert os.listdir(tmp_path) == [] and writer.info is None
    assert not writer._hasher._thread.is_alive()


def test_read_records_reads_what_tensorflow_writes_plain_and_gzip():
    records = [b"", b"x", os.urandom(127), os.urandom(70_000), _tf_example([("a", 1)])]
    assert list(read_records(io.BytesIO(tfrecord_bytes(records)), "mem")) == records
    members = b"".join(gzip_member(frame_records([[r]])[0]) for r in records)  # what the converter writes
    with gzip.GzipFile(fileobj=io.BytesIO(members)) as stream:
        assert list(read_records(stream, "mem")) == records
    with gzip.GzipFile(fileobj=io.BytesIO(tfrecord_bytes(records, "GZIP"))) as stream:  # what TensorFlow writes
        assert list(read_records(stream, "mem")) == records


def _damaged(data: bytes, at: int, value: bytes) -> io.BytesIO:
    return io.BytesIO(data[:at] + value + data[at + len(value):])


@pytest.mark.parametrize("damage, problem", [
    (lambda d, second: _damaged(d, second + 12 + 5, bytes([d[second + 17] ^ 1])), "its data fails its CRC"),
    (lambda d, second: _damaged(d, second + 2, b"\x09"), "its length fails its CRC"),
    (lambda d, second: _damaged(d, len(d) - 2, b"\0\0"), "its data fails its CRC"),
    (lambda d, second: io.BytesIO(d[: second + 7]), r"the file ends inside its header \(7 of 12 bytes\)"),
    (lambda d, second: io.BytesIO(d[: second + 30]), r"the file ends inside its data \(18 of 100 bytes\)"),
    (lambda d, second: io.BytesIO(d[:-3]), "the file ends before its data's CRC"),
])
@pytest.mark.parametrize("sized", [False, True], ids=["stream", "file of known size"])
def test_read_records_refuses_a_damaged_or_cut_frame_naming_its_offset(damage, problem, sized):
    data = tfrecord_bytes([b"a" * 40, os.urandom(100)])
    second = 40 + 16  # the second frame's offset
    damaged = damage(data, second)
    records = read_records(damaged, "shard-7", len(damaged.getvalue()) if sized else None)
    assert next(records) == b"a" * 40
    with pytest.raises(CorruptRecordError, match=f"shard-7: corrupted record at byte {second}: {problem}"):
        next(records)


def test_read_records_believes_no_forged_length_beyond_the_bytes_there():
    """A length of 2**60 with a matching CRC: an error once the data runs out, never a 1 EiB allocation."""
    length = (1 << 60).to_bytes(8, "little")
    forged = length + _masked_crc(length) + b"z" * 1000
    with pytest.raises(CorruptRecordError, match=r"ends inside its data \(1000 of 1152921504606846976 bytes\)"):
        list(read_records(io.BytesIO(forged), "forged"))
    with pytest.raises(CorruptRecordError, match=r"ends inside its data \(1000 of 1152921504606846976 bytes\)"):
        list(read_records(io.BytesIO(forged), "forged", len(forged)))  # refused before any read of the data
    with pytest.raises(CorruptRecordError, match=r"at byte 0: its length says 1152921504606846976 bytes, more than the "
                                                 r"500 a record here can hold"):
        list(read_records(io.BytesIO(forged), "forged", most=500))  # a gzip stream has no size to go by


def test_read_records_of_a_sized_file_stops_at_that_size():
    """Bytes a file gained after its size was taken (a record appended) are not read: the caller's check of the
    file's identity afterwards reports the change."""
    data = tfrecord_bytes([b"a" * 40, b"b" * 7])
    grown = io.BytesIO(data + tfrecord_bytes([b"c" * 100]))
    assert list(read_records(grown, "shard", len(data))) == [b"a" * 40, b"b" * 7]
    with pytest.raises(CorruptRecordError, match=r"shard: corrupted record at byte 56: the file ends there, before the "
                                                 r"\d+ bytes it had"):  # cut at a frame's end: still not its size
        list(read_records(io.BytesIO(data[:56]), "shard", len(data)))


def _masked_crc(data: bytes) -> bytes:
    from tfshard.format.tfrecord import masked_crc

    return masked_crc([data]).to_bytes(4, "little")


def test_out_of_range_and_mistyped_values_are_refused():
    with pytest.raises(OverflowError, match="int64"):
        example_parts([("a", 2**63)])
    with pytest.raises(TypeError, match="image/height: bytes value for a int64 feature"):
        serialize(IMAGE_FEATURES, {**{k: b"" for k in IMAGE_FEATURES}})
    with pytest.raises(KeyError, match="differ from the feature table"):
        serialize(IMAGE_FEATURES, {"image/encoded": b""})


def _rewritten_by_tensorflow(path: str, compression: str = "") -> bytes:
    """The shard as TensorFlow would write it: every record parsed, re-serialized deterministically, re-framed."""
    records = tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator()
    return tfrecord_bytes([tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in records])


@pytest.mark.parametrize("workers", [0, 2])
def test_image_shards_are_what_tensorflow_writes(tmp_path, workers):
    make_tree(tmp_path / "src", per_class=5)
    manifest = convert_images(str(tmp_path / "src"), str(tmp_path / "out"), ConvertOptions(num_shards=2),
                              workers=workers, progress=False)
    for shard in manifest.splits["train"].shards:
        path = tmp_path / "out" / shard.file
        data = path.read_bytes()
        assert data == _rewritten_by_tensorflow(str(path))
        assert (shard.bytes, shard.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_episode_and_gzip_shards_are_what_tensorflow_writes(tmp_path):
    rng = np.random.default_rng(0)
    save_episodes(tmp_path / "src", {f"e{i}.npz": {"obs": rng.normal(size=(20 + 7 * i, 3)).astype(np.float32),
                                                   "act": rng.integers(-5, 5, size=(20 + 7 * i,))} for i in range(5)})
    options = ConvertOptions(num_shards=2, compression="gzip", on_error="fail")
    manifest = convert_episodes(str(tmp_path / "src"), str(tmp_path / "out"), options, workers=0, progress=False)
    for shard in manifest.splits["train"].shards:
        data = (tmp_path / "out" / shard.file).read_bytes()
        assert gzip.decompress(data) == _rewritten_by_tensorflow(str(tmp_path / "out" / shard.file), "GZIP")
        assert (shard.bytes, shard.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_shard_writer_index_offsets_and_hash(tmp_path):
    records = [os.urandom(n) for n in (0, 10, 5000, 3)]
    with ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord", index=True) as writer:
        for r in records:
            writer.append(*frame_records([[r]]))
    data = (tmp_path / "train-00000-of-00001.tfrecord").read_bytes()
    assert data == tfrecord_bytes(records)
    offsets = [0, 16, 42, 5058]
    lines = (tmp_path / "train-00000-of-00001.idx").read_text()
    assert lines == "".join(f"{o} {len(r) + 16}\n" for o, r in zip(offsets, records))
    assert writer.info.sha256 == hashlib.sha256(data).hexdigest() and writer.info.records == 4


def test_a_failed_shard_leaves_no_file_and_stops_its_hashing_thread(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord") as writer:
            writer.append(*frame_records([[b"abc"]]))
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == [] and not writer._hasher._thread.is_alive()


def test_hashing_thread_matches_hashlib_whatever_the_sizes_and_backlog():
    rng = random.Random(1)
    chunks = [rng.randbytes(rng.choice([0, 1, 100, 4096, 70_000])) for _ in range(300)]
    hasher = Sha256Thread(max_pending=10_000)  # smaller than some chunks: update must still go through
    for chunk in chunks:
        hasher.update(chunk)
    assert hasher.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


@pytest.mark.parametrize("plant", [os.symlink, os.link], ids=["symlink", "hard-link"])
def test_a_link_planted_under_the_temporary_name_is_replaced_never_written_through(tmp_path, plant):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    plant(victim, out / ".tmp-train-00000-of-00001.tfrecord")
    with ShardWriter(str(out), "train-00000-of-00001.tfrecord") as writer:
        writer.append(*frame_records([[b"abc"]]))
    assert victim.read_text() == "keep me" and os.stat(victim).st_nlink == 1
    assert sorted(os.listdir(out)) == ["train-00000-of-00001.tfrecord"]
    assert not os.path.islink(out / "train-00000-of-00001.tfrecord")
