"""The write path, attacked: the worker-side record building and framing
(format/tfrecord.py, ingest/examples.py, ingest/write.py), the sums-first NaN check (ingest/episodes.py), the histogram
pixel sums and the end-of-image check (ingest/images.py).

Every conversion here is real: real files in tmp_path, shards read back with TensorFlow (which checks every CRC) and,
in a TensorFlow-free subprocess, with the ``tfrecord`` package.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import read_manifest, read_records, save_episodes, tfrecord_bytes, write_jpeg
from PIL import Image
from tfshard.format.errors import InputError
from tfshard.format.tfrecord import frame_records
from tfshard.ingest import ConvertOptions, EpisodeOptions, convert_episodes, convert_images
from tfshard.ingest.images import PixelSums
from tfshard.ingest.write import ShardWriter

NON_UTF8 = os.fsdecode(b"caf\xe9-\xff")  # a Latin-1 name: not UTF-8, reaches Python as surrogate escapes


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _as_tensorflow_writes(path, compression: str = "") -> bytes:
    """Every record parsed, re-serialized deterministically by TensorFlow, and framed by tf.io.TFRecordWriter."""
    examples = map(tf.train.Example.FromString, read_records(path, compression))
    return tfrecord_bytes([example.SerializeToString(deterministic=True) for example in examples])


def _shards(out) -> list[dict]:
    """The manifest's shard entries, each with its "path"."""
    splits = read_manifest(out)["splits"].values()
    return [{**s, "path": os.path.join(out, s["file"])} for split in splits for s in split["shards"]]


def _paths(out) -> list[str]:
    return [s["path"] for s in _shards(out)]


def _check_shards(out, compression: str = "") -> list[bytes]:
    """Asserts each shard is byte for byte what TensorFlow writes, and its manifest size/hash; returns all records."""
    records = []
    for shard in _shards(out):
        data, found = _read(shard["path"]), read_records(shard["path"], compression)
        assert (gzip.decompress(data) if compression else data) == _as_tensorflow_writes(shard["path"], compression)
        assert (shard["bytes"], shard["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
        assert shard["records"] == len(found)
        records += found
    return records


_READ_WITH_TFRECORD_PACKAGE = """
import hashlib, json, sys
from tfrecord.reader import tfrecord_iterator
assert "tensorflow" not in sys.modules
out = {}
for path, compression in json.loads(sys.argv[1]):
    out[path] = [hashlib.sha256(bytes(r)).hexdigest() for r in tfrecord_iterator(path, compression_type=compression)]
print(json.dumps(out))
"""


def _check_with_tfrecord_package(paths, compression: str | None = None) -> None:
    """The `tfrecord` package (its protos clash with TensorFlow's: another process) reads the same records."""
    args = [sys.executable, "-c", _READ_WITH_TFRECORD_PACKAGE, json.dumps([[p, compression] for p in paths])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    compression_type = "GZIP" if compression else ""
    expected = {p: [hashlib.sha256(r).hexdigest() for r in read_records(p, compression_type)] for p in paths}
    assert json.loads(done.stdout) == expected


def _features(record: bytes) -> dict:
    features = tf.train.Example.FromString(record).features.feature.items()
    return {key: getattr(f, f.WhichOneof("kind")).value[0] for key, f in features}


def _hashing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tfshard-sha256"]


def _image_bytes(mode: str, fmt: str, seed: int, size=(24, 20), **kwargs) -> bytes:
    rng = np.random.default_rng(seed)
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (size[1], size[0], bands), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode if mode != "P" else "L")
    image = image.convert("P") if mode == "P" else image
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def _odd_image_tree(root) -> dict[bytes, bytes]:
    """Classes and files with odd unicode and non-UTF-8 names; grayscale, progressive, CMYK and PNG content."""
    files = {
        ("ключ", "ёж.jpg"): _image_bytes("RGB", "JPEG", 1),
        ("ключ", "gray.jpg"): _image_bytes("L", "JPEG", 2),
        ("e\u0301 😀 space", "prog.jpg"): _image_bytes("RGB", "JPEG", 3, progressive=True),
        ("e\u0301 😀 space", "cmyk.jpg"): _image_bytes("CMYK", "JPEG", 4),
        (NON_UTF8, f"{NON_UTF8}.png"): _image_bytes("RGB", "PNG", 5),
        (NON_UTF8, "palette.png"): _image_bytes("P", "PNG", 6),
        ("\u00e9", "rgba.png"): _image_bytes("RGBA", "PNG", 7),
        ("\u00e9", "a\tb.jpg"): _image_bytes("RGB", "JPEG", 8, size=(300, 7)),
    }
    written = {}
    for (cls, name), data in files.items():
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        with open(os.path.join(root, cls, name), "wb") as f:
            f.write(data)
        written[os.fsencode(f"{cls}/{name}")] = data
    return written


def test_odd_names_and_images_are_what_tensorflow_writes_for_any_worker_count(tmp_path):
    """Attacks byte equality with TF on unicode/combining/emoji/non-UTF-8 class and file names, grayscale,
    progressive, CMYK, palette and RGBA content; workers=0 vs workers=2; the tfrecord package reads the same."""
    written = _odd_image_tree(str(tmp_path / "src"))
    outs = {}
    for workers in (0, 2):
        outs[workers] = str(tmp_path / f"out{workers}")
        convert_images(str(tmp_path / "src"), outs[workers], ConvertOptions(num_shards=3, on_error="fail"),
                       workers=workers, progress=False)
    records = _check_shards(outs[0])
    assert [_read(p) for p in _paths(outs[0])] == [_read(p) for p in _paths(outs[2])]
    seen = {}
    for record in records:
        f = _features(record)
        assert f["image/filename"].split(b"/")[0] == f["image/class/text"]
        seen[f["image/filename"]] = f
        assert tf.io.decode_jpeg(f["image/encoded"]).shape[:2] == (f["image/height"], f["image/width"])
    assert sorted(seen) == sorted(written)
    for rel, data in written.items():
        if rel.endswith(b"jpg") and b"cmyk" not in rel:
            assert seen[rel]["image/encoded"] == data  # passthrough, byte for byte
    assert seen[b"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87/gray.jpg"]["image/channels"] == 1
    _check_with_tfrecord_package(_paths(outs[0]))


def _episode_arrays(t: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "flag": rng.random(t) < 0.5,
        "small": rng.integers(-128, 128, (t, 3)).astype(np.int8),
        "big": (np.uint64(2**64 - 1) - rng.integers(0, 5, (t, 2)).astype(np.uint64)),
        "half": rng.normal(size=(t, 2)).astype(np.float16),
        "cplx": (rng.normal(size=(t, 2)) + 1j * rng.normal(size=(t, 2))).astype(np.complex64),
        "empty": np.zeros((t, 0), np.float32),
        "huge": np.stack([rng.choice([-1.0, 1.0], t) * 1e200, np.full(t, -1.7e308)], 1),  # finite; sums overflow
        "обс": rng.normal(size=(t, 2, 2)).astype(">f8"),  # big-endian source, unicode feature name
    }


def _joined(records: list[bytes]) -> dict[bytes, dict[str, bytes]]:
    """Each episode's data/<name> bytes, chunks joined in order (checking chunk fields on the way)."""
    by_source: dict[bytes, list[dict]] = {}
    for record in records:
        f = _features(record)
        by_source.setdefault(f["episode/source"], []).append(f)
    for chunks in by_source.values():
        chunks.sort(key=lambda c: c["episode/chunk"])
        assert [c["episode/chunk"] for c in chunks] == list(range(chunks[0]["episode/chunks"]))
        assert sum(c["episode/steps"] for c in chunks) == chunks[0]["episode/length"]
    return {source: {k[5:]: b"".join(c[k] for c in chunks) for k in chunks[0] if k.startswith("data/")}
            for source, chunks in by_source.items()}


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_chunked_episodes_of_every_dtype_are_what_tensorflow_writes(tmp_path, compression):
    """Attacks episode records: bool/int8/uint64 max/float16/complex64/zero-width/1e200 float64/big-endian features,
    a unicode feature name, tiny chunks (many records per episode), index=True offsets, gzip members vs plain bytes,
    workers=2 vs workers=0. Finite float64 columns whose squares and sums overflow (1e200, -1.7e308) are finite data:
    on_nan='fail' must write them, bytes unchanged."""
    episodes = {f"ep{i}.npz": _episode_arrays(3 + 4 * i, i) for i in range(5)}
    save_episodes(tmp_path / "src", episodes)
    results = {}
    for workers in (0, 2):
        out = str(tmp_path / f"out{workers}")
        options = ConvertOptions(num_shards=2, on_error="fail", compression=compression, index=compression is None,
                                 episode=EpisodeOptions(on_nan="fail", max_record_bytes=100))
        convert_episodes(str(tmp_path / "src"), out, options, workers=workers, progress=False)
        results[workers] = [_read(p) for p in _paths(out)]
    assert results[0] == results[2]
    records = _check_shards(str(tmp_path / "out0"), "GZIP" if compression else "")
    assert len(records) > len(episodes) * 2  # really chunked
    joined = _joined(records)
    for rel, arrays in episodes.items():
        for name, array in arrays.items():
            little = array.astype(array.dtype.newbyteorder("<"))
            assert joined[rel.encode()][name] == little.tobytes(), (rel, name)
    paths = _paths(str(tmp_path / "out0"))
    if compression is None:
        for path, data in zip(paths, results[0]):  # each index line: a record's offset and framed size, gap-free
            index = [tuple(map(int, line.split())) for line in _read(path[: -len("tfrecord")] + "idx").splitlines()]
            assert [o for o, _ in index] == list(np.cumsum([0] + [n for _, n in index])[:-1])
            assert sum(n for _, n in index) == len(data)
            assert all(int.from_bytes(data[o:o + 8], "little") + 16 == n for o, n in index)
    else:
        out = str(tmp_path / "plain")
        plain = ConvertOptions(num_shards=2, on_error="fail", episode=EpisodeOptions(max_record_bytes=100))
        convert_episodes(str(tmp_path / "src"), out, plain, workers=0, progress=False)
        assert [gzip.decompress(d) for d in results[0]] == [_read(p) for p in _paths(out)]
    _check_with_tfrecord_package(paths, compression)


NAN_CASES = {  # name: (array, index of the first non-finite value)
    "nan": (np.array([[0, 1, 2], [3, np.nan, 5], [6, 7, 8], [9, 10, 11]], np.float32), [1, 1]),
    "+inf": (np.array([[0, 1], [2, 3], [4, np.inf]], np.float64), [2, 1]),
    "-inf": (np.array([[-np.inf, 1], [2, 3]], np.float32), [0, 0]),
    "inf and -inf in one column": (np.array([[0, 1], [np.inf, 3], [4, 5], [-np.inf, 7]], np.float32), [1, 0]),
    "float16 overflow": (np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, np.inf]], np.float16), [4, 1]),
    "complex nan": (np.array([[1 + 1j], [2 + 1j], [3 + 1j * np.nan]], np.complex64), [2, 0]),
    "late chunk": (np.concatenate([np.ones((40, 2)), [[1.0, np.nan]], np.ones((9, 2))]).astype(np.float32), [40, 1]),
    "huge then nan": (np.array([[1e200, -1e200], [1e308, 1e308], [1.0, np.nan]]), [2, 1]),
}


@pytest.mark.parametrize("case", NAN_CASES)
@pytest.mark.parametrize("on_nan", ["fail", "skip", "keep"])
def test_non_finite_values_follow_on_nan_exactly(tmp_path, case, on_nan):
    """Attacks the sums-first NaN/inf check: NaN, +inf, -inf, +inf and -inf in one column (their sum is NaN),
    float16, complex NaN, a NaN in a later chunk, NaN after float64 values whose squares overflow. fail names the file
    and the absolute index; skip leaves the episode out with that reason; keep writes its bytes unchanged."""
    array, index = NAN_CASES[case]
    good = np.ones((3, *array.shape[1:]), array.dtype)
    save_episodes(tmp_path / "src", {"a_good.npy": good, "bad.npy": array, "z_good.npy": good})
    options = ConvertOptions(num_shards=1, on_error="fail", episode=EpisodeOptions(on_nan=on_nan, max_record_bytes=64))
    out = str(tmp_path / "out")
    bad_path = os.path.join(str(tmp_path / "src"), "bad.npy")
    if on_nan == "fail":
        with pytest.raises(InputError) as caught:
            convert_episodes(str(tmp_path / "src"), out, options, workers=0, progress=False)
        message = str(caught.value)
        assert message.startswith(f"{bad_path}: non-finite value") and f"at index {index}" in message, message
        assert "--on-nan skip|keep" in message
        assert not any(n.endswith(".tfrecord") for n in os.listdir(out)) and not _hashing_threads()
        return
    manifest = convert_episodes(str(tmp_path / "src"), out, options, workers=0, progress=False)
    records = _check_shards(out)
    joined = _joined(records)
    if on_nan == "skip":
        assert sorted(joined) == [b"a_good.npy", b"z_good.npy"]
        [rejected] = manifest.rejected
        assert rejected["path"] == "bad.npy" and f"at index {index}" in rejected["reason"]
        assert rejected["reason"].endswith("left out (--on-nan skip)")
    else:
        assert sorted(joined) == [b"a_good.npy", b"bad.npy", b"z_good.npy"] and manifest.rejected == []
        assert joined[b"bad.npy"]["data"] == array.tobytes()


def _jpeg_variants() -> dict[str, bytes]:
    base = _image_bytes("RGB", "JPEG", 11, size=(32, 24))
    prog = _image_bytes("RGB", "JPEG", 12, size=(32, 24), progressive=True)
    assert base.endswith(b"\xff\xd9") and prog.count(b"\xff\xda") > 1
    video = b"\x00\x00\x00\x18ftypmp42" + random.Random(5).randbytes(200_000)  # like a motion photo's MP4
    assert video.rfind(b"\xff\xda") > video.rfind(b"\xff\xd9")  # true of about half of all random trailers
    return {
        "baseline": base,
        "missing EOI": base[:-2],
        "cut in the scan": base[: len(base) * 3 // 4],
        "bytes after EOI": base + b"\x00trailer\xff\xd8",
        "progressive": prog,
        "progressive missing EOI": prog[:-2],
        "FFD9 after EOI": base + b"junk\xff\xd9",
        "FFDA after EOI": base + b"junk\xff\xdajunk",
        "motion-photo-like trailer": base + video,
    }


@pytest.mark.parametrize("variant", [
    *_jpeg_variants(),  # "FFDA after EOI" and the motion photo were rejected as truncated until the marker walk
])
def test_end_of_image_check_agrees_with_tensorflow(tmp_path, variant):
    """Attacks the end-of-image check: a JPEG passes through (byte for byte) exactly when TensorFlow's decode_jpeg
    reads it, and is rejected (as truncated) exactly when it does not."""
    data = _jpeg_variants()[variant]
    os.makedirs(tmp_path / "src" / "c")
    (tmp_path / "src" / "c" / "x.jpg").write_bytes(data)
    write_jpeg(str(tmp_path / "src" / "c" / "good.jpg"), 1)
    out = str(tmp_path / "out")
    manifest = convert_images(str(tmp_path / "src"), out, ConvertOptions(num_shards=1, on_error="skip"), workers=0,
                              progress=False)
    written = {f["image/filename"]: f["image/encoded"] for f in map(_features, _check_shards(out))}
    try:
        tf.io.decode_jpeg(data).numpy()
        decodes = True
    except tf.errors.InvalidArgumentError:
        decodes = False
    if decodes:
        assert manifest.rejected == [] and written[b"c/x.jpg"] == data
    else:
        [rejected] = manifest.rejected
        assert rejected["path"] == "c/x.jpg" and "truncated image data" in rejected["reason"]
        assert sorted(written) == [b"c/good.jpg"]


def _numpy_sums(image: Image.Image) -> PixelSums:
    pixels = np.asarray(image).astype(np.int64).reshape(-1, 3 if image.mode == "RGB" else 1)
    pixels = np.repeat(pixels, 3, axis=1) if pixels.shape[1] == 1 else pixels
    return PixelSums(len(pixels), tuple(map(int, pixels.sum(0))), tuple(map(int, (pixels * pixels).sum(0))))


def test_histogram_pixel_sums_match_numpy():
    """Attacks PixelSums.of (the PIL histogram) against summing the pixels, for RGB and L, odd sizes, extremes."""
    rng = np.random.default_rng(0)
    for mode, shape in [("RGB", (1, 1, 3)), ("RGB", (97, 131, 3)), ("L", (5, 7)), ("L", (300, 211))]:
        for pixels in (rng.integers(0, 256, shape, np.uint8), np.full(shape, 255, np.uint8), np.zeros(shape, np.uint8)):
            image = Image.fromarray(pixels, mode)
            assert PixelSums.of(image) == _numpy_sums(image)


def test_manifest_pixel_statistics_match_a_numpy_computation(tmp_path):
    """Attacks manifest pixel_mean/pixel_std after the histogram change: RGB and grayscale passthrough JPEGs
    (validated at 1/8 scale) and a converted PNG, against numpy sums of the same decoded pixels."""
    src = tmp_path / "src"
    sources = {"a/rgb.jpg": _image_bytes("RGB", "JPEG", 1, size=(64, 40)),
               "a/gray.jpg": _image_bytes("L", "JPEG", 2, size=(33, 65)),
               "b/png.jpg": _image_bytes("RGB", "PNG", 3, size=(20, 9))}
    total = PixelSums()
    for rel, data in sources.items():
        os.makedirs(src / rel.split("/")[0], exist_ok=True)
        (src / rel).write_bytes(data)
        image = Image.open(io.BytesIO(data))
        if image.format == "JPEG":
            image.draft(image.mode, (1, 1))
        image.load()
        total += _numpy_sums(image)
    manifest = convert_images(str(src), str(tmp_path / "out"), ConvertOptions(num_shards=1, on_error="fail"),
                              workers=0, progress=False)
    mean, std = total.mean_std()
    assert (manifest.splits["train"].pixel_mean, manifest.splits["train"].pixel_std) == (mean, std)
    assert mean is not None and std is not None


def test_shard_writer_hash_and_index_with_many_small_and_large_appends(tmp_path):
    """Attacks ShardWriter's batching of small appends (<4 KiB, flushed every 64 or before a large one): the hash
    and the index must follow the file whatever the mix of sizes; the file is what TFRecordWriter writes."""
    rng = random.Random(3)
    items = [[rng.randbytes(rng.choice([0, 1, 50, 4079, 4080, 9000, 300_000])) for _ in range(rng.randint(1, 3))]
             for _ in range(400)]
    with ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord", index=True) as writer:
        for records in items:
            writer.append(*frame_records([[r] for r in records]))
    flat = [r for records in items for r in records]
    data = (tmp_path / "train-00000-of-00001.tfrecord").read_bytes()
    assert data == tfrecord_bytes(flat)
    info = writer.info
    assert (info.sha256, info.bytes, info.records) == (hashlib.sha256(data).hexdigest(), len(data), len(flat))
    offsets = np.cumsum([0] + [len(r) + 16 for r in flat])
    expected = "".join(f"{o} {len(r) + 16}\n" for o, r in zip(offsets, flat))
    assert (tmp_path / "train-00000-of-00001.idx").read_text() == expected
    assert not _hashing_threads()


def test_failure_mid_shard_with_workers_leaves_no_shard_and_no_hashing_thread(tmp_path):
    """Attacks crash safety with a real worker pool: a bad file (on_error='fail') in the middle of the second shard,
    after the first shard was committed and the second partly written. No file may sit under the second shard's
    final name, no temporary file may stay behind, and no hashing thread may live on."""
    src = tmp_path / "src"
    for i in range(12):
        write_jpeg(str(src / ("a" if i % 2 else "b") / f"{i:03d}.jpg"), i, size=(40, 40))
    (src / "b" / "000.jpg").write_bytes(_image_bytes("RGB", "JPEG", 99, size=(40, 40))[:-2])  # no EOI: rejected
    out = str(tmp_path / "out")
    with pytest.raises(InputError, match="000.jpg"):
        convert_images(str(src), out, ConvertOptions(num_shards=3, on_error="fail", seed=None), workers=2,
                       progress=False)
    names = os.listdir(out)
    assert "train-00000-of-00003.tfrecord" in names  # the first shard was committed: the failure is mid-run
    assert not [n for n in names if n.startswith(("train-00001", "train-00002", ".tmp-"))], names
    assert not _hashing_threads()


def test_exception_inside_shard_writer_after_big_appends_cleans_up(tmp_path):
    """Attacks ShardWriter's exit path with a backlog for the hashing thread (appends larger than its budget) and
    a BaseException (KeyboardInterrupt): temp file removed, nothing committed, thread joined."""
    chunk, _ = frame_records([[b"\x01" * 3_000_000]])
    with pytest.raises(KeyboardInterrupt), ShardWriter(str(tmp_path), "train-00000-of-00001.tfrecord") as writer:
        for _ in range(30):
            writer.append(chunk, (len(chunk),))
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == [] and writer.info is None and not _hashing_threads()


@pytest.mark.parametrize("workers", [0, 2])
def test_nan_failure_mid_shard_leaves_no_shard_and_no_hashing_thread(tmp_path, workers):
    """Attacks crash safety for episodes: on_nan='fail' raises (in a worker process with workers=2) for an episode in
    the middle of the second shard; the InputError reaches the caller naming file and index, nothing else is left.
    (With workers the error may surface before the first shard is committed: a worker's batch fails as a whole.)"""
    episodes = {f"e{i:02d}.npy": np.full((8, 2), float(i), np.float32) for i in range(9)}
    episodes["e04.npy"][5, 1] = np.nan
    save_episodes(tmp_path / "src", episodes)
    out = str(tmp_path / "out")
    with pytest.raises(InputError, match=r"e04\.npy: non-finite value nan in feature 'data' at index \[5, 1\]"):
        convert_episodes(str(tmp_path / "src"), out, ConvertOptions(num_shards=3, on_error="fail", seed=None,
                         episode=EpisodeOptions(max_record_bytes=16)), workers=workers, progress=False)
    names = os.listdir(out)
    assert workers or "train-00000-of-00003.tfrecord" in names, names
    assert not [n for n in names if n.startswith(("train-00001", "train-00002", ".tmp-"))], names
    assert not _hashing_threads()


def test_a_gzip_shard_whose_inputs_were_all_rejected_is_dropped_and_the_rest_stays_gzip(tmp_path):
    """Attacks 'a shard is gzip members back to back, which gzip and zcat read' and 'no shard is empty': a planned
    shard with no member at all."""
    size = len(write_jpeg(str(tmp_path / "src" / "b" / "0.jpg"), 0))
    write_jpeg(str(tmp_path / "src" / "b" / "1.jpg"), 1)
    os.makedirs(tmp_path / "src" / "a")
    for i in range(2):  # as large as the good ones, so the planner puts both into the first shard
        (tmp_path / "src" / "a" / f"{i}.jpg").write_bytes(b"\xff\xd8\xff" + b"x" * (size - 3))
    out = str(tmp_path / "out")
    options = ConvertOptions(shard_bytes=3 * size, compression="gzip", seed=None, on_error="skip")  # 2 planned
    manifest = convert_images(str(tmp_path / "src"), out, options, workers=0, progress=False)
    (shard,) = manifest.splits["train"].shards
    assert (shard.file, shard.records, len(manifest.rejected)) == ("train-00000-of-00001.tfrecord.gz", 2, 2)
    assert sorted(os.listdir(out)) == ["dataset.json", "inputs.json", shard.file]
    path = os.path.join(out, shard.file)
    assert len(read_records(path, "GZIP")) == 2
    assert _read(path)[:2] == b"\x1f\x8b"
    if shutil.which("gzip"):
        assert subprocess.run(["gzip", "-t", path], capture_output=True, check=False).returncode == 0
