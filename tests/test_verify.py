"""``tfshard verify`` / ``ingest.verify``: a clean dataset passes; each kind of damage is named, shard by shard.

Also the round trips a reader relies on: gzip shards, DALI index files sliced
byte for byte, and shards read by stock ``tf.data`` and by the independent
``tfrecord`` package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers import files_under, make_tree, read_manifest, read_records, write_jpeg, write_manifest
from tfshard.ingest import ConvertOptions, VerifyError, convert_images, verify

CLASSES = ("ant", "bee", "cat")
PER_CLASS = 6
NUM_SHARDS = 3


def shard_name(index: int, num_shards: int = NUM_SHARDS, suffix: str = ".tfrecord") -> str:
    return f"train-{index:05d}-of-{num_shards:05d}{suffix}"


def parse(record: bytes) -> dict:
    import tensorflow as tf

    example = tf.train.Example.FromString(record)
    feature = example.features.feature
    return {
        "filename": feature["image/filename"].bytes_list.value[0].decode(),
        "label": feature["image/class/label"].int64_list.value[0],
        "text": feature["image/class/text"].bytes_list.value[0].decode(),
        "encoded": feature["image/encoded"].bytes_list.value[0],
    }


def first_record_data(path: str) -> tuple[int, int]:
    """(start, length) of the first record's payload: after its u64 length and u32 length-CRC."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    return 12, length


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One converted dataset (3 classes x 6 16x16 JPEGs, 3 shards); tests damage copies of it."""
    root = tmp_path_factory.mktemp("verify")
    src = str(root / "src")
    written = make_tree(src, classes=CLASSES, per_class=PER_CLASS)
    out = str(root / "out")
    convert_images(src, out, ConvertOptions(num_shards=NUM_SHARDS), workers=0, progress=False)
    return src, out, written


@pytest.fixture
def dataset(pristine, tmp_path):
    """A fresh copy of the pristine dataset: (out path, {relpath: source bytes})."""
    _, out, written = pristine
    copy = str(tmp_path / "out")
    shutil.copytree(out, copy)
    return copy, written


def test_clean_dataset_verifies(dataset, cli):
    out, written = dataset
    manifest = verify(out)
    assert manifest.total_records == len(written)
    result = cli("verify", out)
    assert result.exit_code == 0, result.output
    assert "OK" in result.stdout
    assert f"{len(written)} records in {NUM_SHARDS} shards" in result.stdout
    assert result.stderr == ""


def record_ends(path: str) -> list[int]:
    """The byte offset just past each record: u64 length, u32 CRC, data, u32 CRC."""
    with open(path, "rb") as f:
        data = f.read()
    ends, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        offset += 12 + length + 4
        ends.append(offset)
    return ends


# Each corruption damages one copy and returns (the path verify must name, regexes its problems must match).
def _truncate_mid_record(out):
    path = os.path.join(out, shard_name(0))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 5)  # cuts into the last record (its data CRC and one data byte)
    return path, [
        rf"truncated shard \({size - 5} bytes, manifest says {size}\)",
        r"unreadable record \(.*truncated record",
    ]


def _truncate_at_record_boundary(out):
    path = os.path.join(out, shard_name(0))
    ends = record_ends(path)
    with open(path, "r+b") as f:
        f.truncate(ends[-2])  # the last record gone whole: every remaining one reads fine
    return path, [
        rf"truncated shard \({ends[-2]} bytes, manifest says {ends[-1]}\)",
        rf"{len(ends) - 1} records, manifest says {len(ends)}",
    ]


def _flip_byte(out):
    path = os.path.join(out, shard_name(1))
    start, length = first_record_data(path)
    with open(path, "r+b") as f:
        f.seek(start + length // 2)
        byte = f.read(1)
        f.seek(start + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path, [
        r"corrupted shard \(sha256 [0-9a-f]{12}… != manifest [0-9a-f]{12}…\)",
        r"unreadable record \(.*(corrupt|crc)",
    ]


def _delete(out):
    path = os.path.join(out, shard_name(2))
    os.remove(path)
    return path, [r"missing shard"]


def _add_unexpected(out):
    path = os.path.join(out, shard_name(9, 10))
    shutil.copyfile(os.path.join(out, shard_name(0)), path)
    return path, [r"unexpected shard \(not in the manifest\)"]


def _edit_manifest(field, change):
    def corrupt(out):
        manifest = read_manifest(out)
        shard = manifest["splits"]["train"]["shards"][1]
        old = shard[field]
        shard[field] = change(old)
        write_manifest(out, manifest)
        if field == "records":
            expected = [rf"{old} records, manifest says {old + 1}"]
        else:
            expected = [rf"corrupted shard \(sha256 {old[:12]}… != manifest {'0' * 12}…\)"]
        return os.path.join(out, shard["file"]), expected

    return corrupt


CORRUPTIONS = {
    "truncated-mid-record": _truncate_mid_record,
    "truncated-at-record-boundary": _truncate_at_record_boundary,
    "flipped-byte": _flip_byte,
    "missing": _delete,
    "unexpected": _add_unexpected,
    "manifest-records": _edit_manifest("records", lambda n: n + 1),
    "manifest-sha256": _edit_manifest("sha256", lambda sha: "0" * len(sha)),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corruption_is_named_with_its_shard(dataset, cli, corrupt):
    out, _ = dataset
    path, expected = corrupt(out)
    with pytest.raises(VerifyError) as caught:
        verify(out)
    problems = caught.value.problems
    # Every problem is about the damaged file (the other shards are fine) and starts with its exact path.
    assert problems and all(p.startswith(f"{path}: ") for p in problems), problems
    for pattern in expected:
        assert any(re.search(pattern, p, re.IGNORECASE) for p in problems), (pattern, problems)
    assert path in str(caught.value)

    result = cli("verify", out)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "OK" not in result.stdout
    for problem in problems:
        assert f"error: {problem}" in result.stderr.splitlines()


@pytest.mark.parametrize("damage", ["truncate", "truncate at a member", "flip"])
def test_damaged_gzip_shard_is_caught(tmp_path, image_tree, damage):
    """A gzip shard is one gzip member per input (compressed by the workers); TensorFlow reads a file cut inside a
    member as a bad record, and one cut between members as fewer records: verify names both."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2, compression="gzip"), workers=0, progress=False)
    path = os.path.join(out, shard_name(0, 2, ".tfrecord.gz"))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    members = [m.start() for m in re.finditer(re.escape(bytes.fromhex("1f8b0800000000000003")), bytes(data))]
    assert len(members) == 6  # one per image
    if damage == "truncate":
        data = data[: (members[2] + members[3]) // 2]
        expected = "truncated shard"
    elif damage == "truncate at a member":
        data = data[: members[3]]
        expected = "truncated shard"
    else:
        data[len(data) // 2] ^= 0xFF  # inside the deflate stream
        expected = "corrupted shard (sha256"
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(VerifyError) as caught:
        verify(out)
    problems = caught.value.problems
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{path}: {expected}"), problems
    second = "3 records, manifest says 6" if damage == "truncate at a member" else "unreadable record"
    assert problems[1].startswith(f"{path}: {second}"), problems


def test_no_manifest_names_the_path(dataset, cli):
    out, _ = dataset
    os.remove(os.path.join(out, "dataset.json"))
    with pytest.raises(FileNotFoundError, match=re.escape(os.path.join(out, "dataset.json") + ": no manifest")):
        verify(out)
    result = cli("verify", out)
    assert result.exit_code == 1
    assert os.path.join(out, "dataset.json") in result.stderr
    assert "Traceback" not in result.output
    # the shards are still there: not "a conversion to finish", a dataset that lost its manifest
    lost = f"it holds {NUM_SHARDS} shard file(s) but no dataset.json: rerun the conversion with --overwrite"
    assert lost in result.stderr


def _unfinished(image_tree, tmp_path) -> str:
    """OUT of a conversion stopped by a bad file in its last shard: shard 0 and the state folder, no manifest."""
    from tfshard.ingest import InputError

    src, _ = image_tree
    with open(os.path.join(src, "dog", "zzz.jpg"), "wb") as f:  # sorts last: stops the run in its last shard
        f.write(b"not a jpeg")
    out = str(tmp_path / "out")
    with pytest.raises(InputError):
        convert_images(src, out, ConvertOptions(num_shards=2, seed=None, on_error="fail"), workers=0, progress=False)
    return out


def _missing(image_tree, tmp_path) -> str:
    return str(tmp_path / "nowhere")


def _empty(image_tree, tmp_path) -> str:
    os.makedirs(tmp_path / "empty")
    return str(tmp_path / "empty")


def _photos(image_tree, tmp_path) -> str:
    return image_tree[0]  # the source folder: class folders of JPEGs


def _manifest_file(image_tree, tmp_path) -> str:
    out = str(tmp_path / "out")
    convert_images(image_tree[0], out, ConvertOptions(num_shards=1), workers=0, progress=False)
    return os.path.join(out, "dataset.json")


# what is at the path: (the message (regex), exception type); none of them is told to "rerun the conversion"
NOT_A_DATASET = {
    "missing": (_missing, r"nowhere: no such folder; pass the OUT folder of a conversion", FileNotFoundError),
    "empty-folder": (_empty, r"empty/dataset.json: no manifest; .*empty is an empty folder, not a tfshard dataset; ",
                     FileNotFoundError),
    "other-folder": (_photos, (r"src/dataset.json: no manifest; .*src is not a tfshard dataset "
                               r"\(got \['cat', 'dog'\]\); pass the OUT"), FileNotFoundError),
    "manifest-file": (_manifest_file, (r"dataset.json: the manifest file, not its dataset folder; pass the folder that "
                                       r"holds it \(.*out\)"), NotADirectoryError),
}


@pytest.mark.parametrize("kind", NOT_A_DATASET)
def test_not_a_dataset_says_what_is_there_instead(image_tree, tmp_path, cli, kind):
    make, message, error = NOT_A_DATASET[kind]
    path = make(image_tree, tmp_path)
    with pytest.raises(error, match=message) as caught:
        verify(path)
    assert "rerun" not in str(caught.value)
    from tfshard import readers

    with pytest.raises(error, match=message):
        readers.info(path)
    for command in ("verify", "info"):
        result = cli(command, path)
        assert result.exit_code == 1, result.output
        assert re.match("error: .*" + message, result.stderr), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_unfinished_conversion_says_rerunning_the_same_command_finishes_it(image_tree, tmp_path, cli):
    out = _unfinished(image_tree, tmp_path)
    expected = (f"{os.path.join(out, 'dataset.json')}: no manifest; a conversion into {out} has not finished (it "
                "holds .tfshard-state/ but no dataset.json); rerun the same `tfshard images|episodes SRC OUT` command "
                "to finish it")
    with pytest.raises(FileNotFoundError) as caught:
        verify(out)
    assert str(caught.value) == expected
    for command in ("verify", "info"):
        result = cli(command, out)
        assert result.exit_code == 1 and result.stderr == f"error: {expected}\n", result.output


def _mixed_tree(src: str) -> None:
    """JPEGs kept as they are (RGB and grey), and images re-encoded at conversion (a PNG, a CMYK JPEG)."""
    from PIL import Image

    make_tree(src, classes=("a", "b"), per_class=3)
    write_jpeg(os.path.join(src, "a", "grey.jpg"), 7, mode="L")
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (12, 20, 3), np.uint8)).save(os.path.join(src, "a", "png.jpg"), "PNG")
    Image.fromarray(rng.integers(0, 256, (9, 9, 4), np.uint8), "CMYK").save(os.path.join(src, "b", "cmyk.jpg"))


@pytest.mark.parametrize("validate", [True, False])
def test_kept_and_reencoded_images_verify_and_sums_they_cannot_give_are_named(tmp_path, validate):
    """Kept JPEGs' sums are recomputed exactly; a re-encoded image's were of pixels no record keeps, so the
    split's sums are weighed as the kept ones' exact sums plus what 8-bit pixels of the re-encoded ones' exact
    count can give. Without validation only the re-encoded images were measured, and so it verifies too."""
    from tfshard.ingest import ImageOptions

    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _mixed_tree(src)
    manifest = convert_images(src, out, ConvertOptions(num_shards=2, image=ImageOptions(validate=validate)),
                              workers=0, progress=False)
    assert manifest.options["converted_images"] == 2 and manifest.splits["train"].pixel_mean is not None
    verify(out)
    inputs = os.path.join(out, "inputs.json")
    with open(inputs) as f:
        raw = json.load(f)
    sums = raw["pixel_sums"]["train"]
    sums["sums"][0] = sums["squares"][0] = 0  # a black red channel: possible pixels, but not beside the kept JPEGs
    with open(inputs, "w") as f:
        json.dump(raw, f)
    with pytest.raises(VerifyError) as caught:
        verify(out)
    if validate:
        expected = (r"inputs\.json: field pixel_sums\['train'\]: .*, which its records cannot give: beside the exact "
                    r"count \d+, .* of its kept JPEGs, that leaves count 321, sums \[-\d+, .* for the 321 pixels of "
                    r"its 2 re-encoded images")
    else:  # no sums of kept JPEGs to weigh them against, but the manifest's statistics must still follow them
        expected = (r"dataset\.json: field splits\['train'\]\.pixel_mean: \[0\.\d+, .*\], inputs\.json's exact "
                    r"pixel sums give \[0\.0, ")
    assert any(re.search(expected, p) for p in caught.value.problems), caught.value.problems


def test_ignored_files_in_the_manifest_are_checked_and_optional(dataset):
    from tfshard.format.manifest import ManifestError
    from tfshard.ingest import load_manifest

    out, _ = dataset
    raw = read_manifest(out)
    assert raw["ignored_files"] == []
    raw["ignored_files"] = ["notes.txt", 7]
    write_manifest(out, raw)
    with pytest.raises(ManifestError, match=r"field ignored_files\[1\]: must be a string \(got 7\)"):
        load_manifest(out)
    del raw["ignored_files"]  # a manifest written before the field existed
    write_manifest(out, raw)
    assert load_manifest(out).ignored_files == []


def test_gzip_round_trip_verifies(image_tree, tmp_path, cli):
    src, written = image_tree
    out = str(tmp_path / "out")
    manifest = convert_images(src, out, ConvertOptions(num_shards=2, compression="gzip"), workers=0, progress=False)
    files = [s.file for s in manifest.splits["train"].shards]
    assert files == [shard_name(0, 2, ".tfrecord.gz"), shard_name(1, 2, ".tfrecord.gz")]
    assert manifest.compression == "gzip"
    records = []
    for name in files:
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(2) == b"\x1f\x8b"  # really gzip
        records += [parse(r) for r in read_records(os.path.join(out, name), "GZIP")]
    assert sorted(r["filename"] for r in records) == sorted(written)
    for r in records:
        assert r["encoded"] == written[r["filename"]]
    assert verify(out).total_records == len(written)
    result = cli("verify", out)
    assert result.exit_code == 0 and "OK" in result.stdout, result.output


def test_index_files_slice_every_record_exactly(image_tree, tmp_path):
    src, written = image_tree
    out = str(tmp_path / "out")
    manifest = convert_images(src, out, ConvertOptions(num_shards=2, index=True), workers=0, progress=False)
    total = 0
    for shard in manifest.splits["train"].shards:
        assert shard.index_file == shard.file.replace(".tfrecord", ".idx")
        with open(os.path.join(out, shard.file), "rb") as f:
            data = f.read()
        with open(os.path.join(out, shard.index_file)) as f:
            lines = f.read().splitlines()
        entries = [tuple(int(v) for v in line.split(" ")) for line in lines]
        assert all(len(e) == 2 for e in entries) and len(entries) == shard.records
        records = read_records(os.path.join(out, shard.file))
        assert len(records) == shard.records
        expected_offset = 0
        for (offset, size), record in zip(entries, records):
            assert offset == expected_offset  # records are back to back from the start
            framed = data[offset : offset + size]
            (length,) = struct.unpack("<Q", framed[:8])
            assert length == len(record) == size - 16
            assert framed[12 : 12 + length] == record
            expected_offset = offset + size
        assert expected_offset == len(data)  # ... to the very end
        total += len(records)
    assert total == len(written)
    verify(out)  # index files are part of the dataset, not unexpected files


def test_missing_index_file_is_caught(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2, index=True), workers=0, progress=False)
    path = os.path.join(out, shard_name(1, 2, ".idx"))
    os.remove(path)
    with pytest.raises(VerifyError) as caught:
        verify(out)
    assert caught.value.problems == [
        f"{path}: missing index file; rerun the conversion with --overwrite to rewrite it"
    ]


# The `tfrecord` package registers its own copy of tensorflow/example.proto, which clashes with TensorFlow's
# ("duplicate symbol 'tensorflow.BytesList'"), so it reads the shards in a process that never imports TensorFlow.
_READ_WITH_TFRECORD_PACKAGE = """
import hashlib, json, sys
from tfrecord.reader import tfrecord_loader
assert "tensorflow" not in sys.modules
description = {"image/encoded": "byte", "image/class/label": "int", "image/filename": "byte"}
rows = [
    [
        bytes(r["image/filename"]).decode(),
        int(r["image/class/label"][0]),
        hashlib.sha256(bytes(r["image/encoded"])).hexdigest(),
    ]
    for r in tfrecord_loader(sys.argv[1], None, description)
]
print(json.dumps(rows))
"""


def read_with_tfrecord_package(path: str) -> list[list]:
    done = subprocess.run(
        [sys.executable, "-c", _READ_WITH_TFRECORD_PACKAGE, path], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_shards_read_by_tf_data_and_by_tfrecord_package(dataset):
    out, written = dataset
    manifest = read_manifest(out)
    class_names = manifest["class_names"]
    assert class_names == list(CLASSES)
    total = 0
    for shard in manifest["splits"]["train"]["shards"]:
        path = os.path.join(out, shard["file"])
        from_tf = [parse(r) for r in read_records(path)]
        from_package = read_with_tfrecord_package(path)
        assert len(from_tf) == len(from_package) == shard["records"]
        for a, (filename, label, sha256) in zip(from_tf, from_package):
            assert (a["filename"], a["label"], hashlib.sha256(a["encoded"]).hexdigest()) == (filename, label, sha256)
            # ... and both agree with the source: the class folder gives the label; JPEGs pass through as they are.
            assert a["label"] == class_names.index(a["filename"].split("/")[0])
            assert a["text"] == a["filename"].split("/")[0]
            assert a["encoded"] == written[a["filename"]]
        total += len(from_tf)
    assert total == len(written) == PER_CLASS * len(CLASSES)


def test_following_verifys_advice_repairs_the_dataset(pristine, dataset, cli):
    # verify says "remove it and rerun the conversion with --overwrite to rewrite it": doing just that must fix the
    # shard (--overwrite alone refuses it: a file whose bytes are not the manifest's may be a user's).
    src = pristine[0]
    out, _ = dataset
    good = files_under(out)
    path = os.path.join(out, shard_name(0))
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(VerifyError, match="remove it and rerun the conversion with --overwrite"):
        verify(out)
    os.remove(path)
    result = cli("images", src, out, "--num-shards", NUM_SHARDS, "--workers", "0", "--quiet", "--overwrite")
    assert result.exit_code == 0, result.output
    verify(out)
    assert files_under(out) == good
