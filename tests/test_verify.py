"""``tfshard verify`` / ``ingest.verify``: a clean dataset passes; each kind of damage is named, shard by shard.

Also the round trips a reader relies on: gzip shards, DALI index files sliced
byte for byte, and shards read by stock ``tf.data`` and by the independent
``tfrecord`` package.

Then the attacks: a `dataset.json` that lies about what readers rely on (class names, split totals, class counts,
episode dtypes and sources), still valid JSON, must fail verify with a problem naming the field and the evidence;
readers refuse the totals that contradict the shards. And TFDS label names: `tfshard tfds` refuses a class name
TFDS's labels file cannot hold, and verify names a labels file that differs from `class_names`. Each test damages a
copy of a dataset converted once for the module.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
    convert_episode_tree,
    edit_manifest,
    files_under,
    make_tree,
    read_manifest,
    read_records,
    save_episodes,
    write_jpeg,
    write_manifest,
)
from tfshard import readers
from tfshard.format.manifest import ManifestError
from tfshard.ingest import ConvertOptions, EpisodeOptions, VerifyError, convert_images, load_manifest, verify

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


@pytest.mark.parametrize("damage", ["truncate", "truncate at a piece", "flip"])
def test_damaged_gzip_shard_is_caught(tmp_path, image_tree, damage):
    """A gzip shard is one gzip member of a deflate piece per input (compressed by the workers, each ending in a sync
    flush); TensorFlow reads a file cut inside a piece as a bad record, and one cut between pieces as fewer records:
    verify names both."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2, compression="gzip"), workers=0, progress=False)
    path = os.path.join(out, shard_name(0, 2, ".tfrecord.gz"))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    assert len(re.findall(re.escape(bytes.fromhex("1f8b08")), bytes(data))) == 1  # one member
    pieces = [m.end() for m in re.finditer(re.escape(b"\x00\x00\xff\xff"), bytes(data))]
    assert len(pieces) == 6  # a sync flush ends each image's piece
    if damage == "truncate":
        data = data[: (pieces[2] + pieces[3]) // 2]
        expected = "truncated shard"
    elif damage == "truncate at a piece":
        data = data[: pieces[2]]
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
    second = "3 records, manifest says 6" if damage == "truncate at a piece" else "unreadable record"
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


INDEX_LIES = {  # the index file's lines, given their sha256 in the manifest too; (line named, what it holds)
    "offset-past-the-end": (lambda lines: [lines[0], "99999999 40", *lines[2:]], 2),
    "negative-offset": (lambda lines: [lines[0], "-5 " + lines[1].split()[1], *lines[2:]], 2),
    "size-overlapping-the-next": (lambda lines: [lines[0].split()[0] + " 99999", *lines[1:]], 1),
    "unsorted": (lambda lines: [lines[1], lines[0], *lines[2:]], 1),
    "a-record-left-out": (lambda lines: lines[:-1], -1),  # -1: the last line, now missing
}


@pytest.mark.parametrize("lie", INDEX_LIES, ids=INDEX_LIES.keys())
def test_an_index_file_whose_lies_the_manifest_repeats_is_caught(image_tree, tmp_path, lie):
    """verify weighed an index file only against the manifest's sha256: one that lies, with a manifest that gives
    it that sha256, passed, and DALI would read records at its offsets."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2, index=True), workers=0, progress=False)
    path = os.path.join(out, shard_name(1, 2, ".idx"))
    with open(path) as f:
        lines = f.read().splitlines()
    edit, line = INDEX_LIES[lie]
    data = "".join(f"{entry}\n" for entry in edit(lines)).encode()
    with open(path, "wb") as f:
        f.write(data)
    manifest_path = os.path.join(out, "dataset.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["splits"]["train"]["shards"][1]["index_sha256"] = hashlib.sha256(data).hexdigest()
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(VerifyError) as caught:
        verify(out)
    line = len(lines) if line == -1 else line
    assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(
        f"{path}: line {line} of the index file does not list the shard's records"), caught.value.problems


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


# --- attacks: manifests and inputs files that lie --------------------------------------------------------------------


def problems_of(out: str) -> list[str]:
    with pytest.raises(VerifyError) as caught:
        verify(out)
    return caught.value.problems


def assert_cli_names(cli, out: str, problems: list[str]) -> None:
    result = cli("verify", out)
    assert result.exit_code == 1 and "Traceback" not in result.output and "OK" not in result.stdout, result.output
    for problem in problems:
        assert f"error: {problem}" in result.stderr.splitlines()


def assert_readers_take(cli, out: str, readers_error: str | None) -> None:
    """Readers load the manifest (``readers_error`` None: a lie consistent on its face, which only the records
    show), or refuse it matching ``readers_error``, and `tfshard info` in one line."""
    if readers_error is None:
        readers.info(out)
        return
    with pytest.raises(ManifestError, match=readers_error):
        readers.info(out)
    result = cli("info", out)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output


@pytest.fixture(scope="module")
def pristine_images(pristine):
    """``pristine`` as (src, out): 3 classes x 6 16x16 JPEGs in 3 shards."""
    return pristine[0], pristine[1]


@pytest.fixture
def images(pristine_images, tmp_path):
    copy = str(tmp_path / "out")
    shutil.copytree(pristine_images[1], copy)
    return copy


def _reverse_class_names(raw):
    raw["class_names"].reverse()


def _one_class_name(raw):
    raw["class_names"] = raw["class_names"][:1]


def _split_records(raw):
    raw["splits"]["train"]["records"] = 999


def _split_bytes(raw):
    raw["splits"]["train"]["bytes"] += 1


def _class_counts_moved(raw):  # still summing to the split's records: only the labels in the records tell
    counts = raw["splits"]["train"]["class_counts"]
    counts["ant"], counts["bee"] = counts["ant"] + 1, counts["bee"] - 1


def _class_counts_sum(raw):
    raw["splits"]["train"]["class_counts"]["cat"] = 99


def _class_counts_names(raw):
    counts = raw["splits"]["train"]["class_counts"]
    counts["dog"] = counts.pop("cat")


def _class_name_twice(raw):
    raw["class_names"][1] = "ant"


def _pixel(field, channel, value):
    def edit(raw):
        raw["splits"]["train"][field][channel] = value
    return edit


def _grey_to_1e36(raw):  # what made readers.normalization map mid-grey to ~1e36
    _pixel("pixel_mean", 0, -1e30)(raw)
    _pixel("pixel_std", 0, 0.0)(raw)


# the pristine dataset's statistics, which the records give: a lie is named beside them
_RECOMPUTED = (r"dataset.json: field splits\['train'\]\.pixel_mean: \[{mean}, 0\.497658, 0\.501362\] with pixel_std "
               r"\[{std}, [-\d.]+, 0\.034248\], its records' pixels give \[0\.494771, 0\.497658, 0\.501362\] and "
               r"\[0\.034548, 0\.038707, 0\.034248\]; rerun the conversion")

# edit -> (regexes verify's problems must match, the error readers give when they load the manifest, or None)
IMAGE_LIES = {
    "pixel_mean-0.9": (_pixel("pixel_mean", 0, 0.9), [_RECOMPUTED.format(mean=r"0\.9", std=r"0\.034548")], None),
    "pixel_mean-one-unit-off": (_pixel("pixel_mean", 0, 0.494772), [_RECOMPUTED.format(mean=r"0\.494772",
                                                                                       std=r"0\.034548")], None),
    "pixel_std-doubled": (_pixel("pixel_std", 0, 0.069096), [_RECOMPUTED.format(mean=r"0\.494771",
                                                                                 std=r"0\.069096")], None),
    "pixel_mean-minus-1e30-std-0": (_grey_to_1e36, [_RECOMPUTED.format(mean=r"-1e\+30", std=r"0\.0")],
                                    r"field splits\['train'\]\.pixel_mean\[0\]: must be in \[0, 1\] \(8-bit pixels "
                                    r"over 255\) \(got -1e\+30\); rewrite the dataset"),
    "pixel_std-0-off-a-whole-value": (_pixel("pixel_std", 0, 0.0), [_RECOMPUTED.format(mean=r"0\.494771",
                                                                                      std=r"0\.0")],
                                      r"field splits\['train'\]\.pixel_std\[0\]: must not be 0 with pixel_mean "
                                      r"0\.494771: a constant channel's mean is a whole pixel value over 255"),
    "pixel_std-wider-than-the-range": (_pixel("pixel_std", 0, 0.6), [_RECOMPUTED.format(mean=r"0\.494771",
                                                                                       std=r"0\.6")],
                                       r"field splits\['train'\]\.pixel_std\[0\]: must be at most 0\.49\d+, the "
                                       r"widest spread pixels in \[0, 1\] have around their mean 0\.494771"),
    "pixel_std-negative": (_pixel("pixel_std", 1, -0.01), [r"pixel_std \[0\.034548, -0\.01, "],
                           r"field splits\['train'\]\.pixel_std\[1\]: must be at least 0 \(got -0\.01\)"),
    "pixel_std-null-alone": (lambda raw: raw["splits"]["train"].update(pixel_std=None),
                             [r"pixel_mean: \[0\.494771, .*\] with pixel_std None, its records' pixels give"],
                             r"field splits\['train'\]\.pixel_mean: must be null exactly when pixel_std is"),
    "pixel_mean-two-channels": (lambda raw: raw["splits"]["train"]["pixel_mean"].pop(), None,
                                r"field splits\['train'\]\.pixel_mean: must be null or 3 finite numbers \(R, G, B\)"),
    "class_names-reversed": (_reverse_class_names, [
        r"train-0000\d-of-00003\.tfrecord: \d of 6 records hold an image/class/text that is not class_names\[label\] "
        r"\(first: record \d, label \d says '(ant|cat)', class_names\[\d\] is '(cat|ant)'\)"], None),
    "class_names-one": (_one_class_name, [
        r"dataset.json: field splits\['train'\]\.class_counts: names \['ant', 'bee', 'cat'\], "
        r"class_names are \['ant'\]",
        r"train-0000\d-of-00003\.tfrecord: \d of 6 records have an image/class/label past the manifest's 1 "
        r"class_names \(first: record \d, label [12], class text '(bee|cat)'\)"],
        r"field splits\['train'\]\.class_counts: must name exactly the class_names "
        r"\(lacks \[\], names \['bee', 'cat'\]"),
    "split-records": (_split_records, [
        r"dataset.json: field splits\['train'\]\.records: 999, but its 3 shard\(s\) hold 18; rerun the conversion"],
        r"field splits\['train'\]\.records: must equal the sum of its 3 shards' records, 18 \(got 999\)"),
    "split-bytes": (_split_bytes, [r"dataset.json: field splits\['train'\]\.bytes: (\d+), but its 3 shard\(s\) hold "],
                    r"field splits\['train'\]\.bytes: must equal the sum of its 3 shards' bytes"),
    "class_counts-moved": (_class_counts_moved, [
        r"dataset.json: field splits\['train'\]\.class_counts: say \{'ant': 7, 'bee': 5\}, the records' labels hold "
        r"\{'ant': 6, 'bee': 6\}"], None),
    "class_counts-sum": (_class_counts_sum, [
        r"field splits\['train'\]\.class_counts: say \{'cat': 99\}, the records' labels hold \{'cat': 6\}"],
        r"field splits\['train'\]\.class_counts: must sum to the split's 18 records \(got 111\)"),
    "class_counts-names": (_class_counts_names, [
        r"field splits\['train'\]\.class_counts: names \['ant', 'bee', 'dog'\], "
        r"class_names are \['ant', 'bee', 'cat'\]"],
        r"class_counts: must name exactly the class_names \(lacks \['cat'\], names \['dog'\] that are not classes\)"),
    "class_name-twice": (_class_name_twice, [
        r"records hold an image/class/text that is not class_names\[label\] \(first: record \d, label 1 says 'bee', "
        r"class_names\[1\] is 'ant'\)"], r"field class_names\[1\]: names a class a second time \(got 'ant'\)"),
}


@pytest.mark.parametrize("lie", IMAGE_LIES, ids=IMAGE_LIES.keys())
def test_a_manifest_that_lies_about_images_fails_verify_naming_field_and_evidence(images, cli, lie):
    edit, expected, readers_error = IMAGE_LIES[lie]
    edit_manifest(images, edit)
    if expected is None:  # not even the shape of a statistic: verify refuses the manifest as readers do
        with pytest.raises(ManifestError, match=readers_error):
            verify(images)
        expected, problems = [], []
    else:
        problems = problems_of(images)
    for pattern in expected:
        assert any(re.search(pattern, p) for p in problems), (pattern, problems)
    assert all(p.endswith("--overwrite") or "--overwrite to rewrite it" in p for p in problems), problems
    assert_cli_names(cli, images, problems)
    assert_readers_take(cli, images, readers_error)


def test_a_shard_entry_that_lies_is_named_at_the_shard_not_the_split(images):
    """The shard's own entry is the liar (its file holds one record fewer): the split total, which matches the
    files, is not blamed, though readers refuse the manifest (the entries no longer add up)."""
    edit_manifest(images, lambda raw: raw["splits"]["train"]["shards"][1].update(records=7))
    assert problems_of(images) == [f"{images}/train-00001-of-00003.tfrecord: 6 records, manifest says 7; rerun the "
                                   "conversion with --overwrite to rewrite it"]
    with pytest.raises(ManifestError, match=r"splits\['train'\]\.records: must equal the sum of its 3 shards' records"):
        load_manifest(images)


def test_following_verifys_advice_repairs_a_manifest_that_lies(pristine_images, images, cli):
    src = pristine_images[0]
    with open(os.path.join(images, "dataset.json"), "rb") as f:
        good = f.read()
    edit_manifest(images, _split_records)
    with pytest.raises(VerifyError, match="rerun the conversion with --overwrite"):
        verify(images)
    result = cli("images", src, images, "--num-shards", 3, "--workers", 0, "--quiet", "--overwrite")
    assert result.exit_code == 0, result.output
    verify(images)
    with open(os.path.join(images, "dataset.json"), "rb") as f:
        assert f.read() == good


def test_a_record_that_is_not_an_image_example_is_named(images):
    """A valid TFRecord holding something else, with the manifest's sha256, size and counts made to match."""
    import hashlib

    import tensorflow as tf

    path = os.path.join(images, "train-00000-of-00003.tfrecord")
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    with tf.io.TFRecordWriter(path) as writer:
        for record in [*records, b"\x08\x01 not an Example"]:
            writer.write(record)
    with open(path, "rb") as f:
        data = f.read()

    def change(raw):
        shard = raw["splits"]["train"]["shards"][0]
        grown = len(data) - shard["bytes"]
        shard.update(records=shard["records"] + 1, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        raw["splits"]["train"].update(records=raw["splits"]["train"]["records"] + 1,
                                      bytes=raw["splits"]["train"]["bytes"] + grown)
        raw["splits"]["train"]["class_counts"]["ant"] += 1

    edit_manifest(images, change)
    problems = problems_of(images)
    assert problems[0].startswith(f"{path}: record {len(records)} is not a tfshard images record ("), problems
    assert problems[1:] == [f"{images}/inputs.json: field inputs: must list the 19 written inputs of split 'train' "
                            "(got 18); rerun the conversion with --overwrite to rewrite it"]  # the input it lacks


# inputs.json: untrusted like the manifest, loaded through its validator and weighed against the records.
def _edit_inputs(change):
    def edit(out, other):
        path = os.path.join(out, "inputs.json")
        with open(path) as f:
            raw = json.load(f)
        change(raw)
        with open(path, "w") as f:
            json.dump(raw, f)
    return edit


def _entry(raw, path):
    return next(e for e in raw["inputs"] if e["path"] == path)


def _sums_off_by_one(raw):
    raw["pixel_sums"]["train"]["sums"][0] += 1


def _sums_and_manifest_edited_together(out, other):
    """A lie told consistently: the exact sums moved, and the manifest's statistics made from them."""
    from tfshard.ingest.images import PixelSums

    def one_less(raw):
        raw["pixel_sums"]["train"]["sums"][0] -= 1

    _edit_inputs(one_less)(out, other)
    with open(os.path.join(out, "inputs.json")) as f:
        sums = json.load(f)["pixel_sums"]["train"]
    mean, std = PixelSums(sums["count"], tuple(sums["sums"]), tuple(sums["squares"])).mean_std()
    edit_manifest(out, lambda raw: raw["splits"]["train"].update(pixel_mean=mean, pixel_std=std))


def _swap(key, a="ant/000.jpg", b="bee/000.jpg"):
    def change(raw):
        first, second = _entry(raw, a), _entry(raw, b)
        first[key], second[key] = second[key], first[key]
    return change


def _swap_entries(raw):  # every field but the path: ant/000's entry says what bee/000's said, and back
    first, second = _entry(raw, "ant/000.jpg"), _entry(raw, "bee/000.jpg")
    for key in set(first) - {"path"}:
        first[key], second[key] = second[key], first[key]


def _dropped_stray(raw):
    raw["inputs"].append({**_entry(raw, "ant/000.jpg"), "path": "ant/zzz.jpg", "state": "dropped", "sha256": "0" * 64})


def _other_dataset(out, other):
    shutil.copy(os.path.join(other, "inputs.json"), os.path.join(out, "inputs.json"))


def _other_dataset_with_our_fingerprint(out, other):
    _other_dataset(out, other)
    _edit_inputs(lambda raw: raw.update(fingerprint=load_manifest(out).fingerprint))(out, other)


def _huge(out, other):
    with open(os.path.join(out, "inputs.json"), "r+b") as f:
        f.truncate((1 << 30) + 1)  # sparse: nothing is written, and nothing may be read


def _fifo(out, other):
    os.remove(os.path.join(out, "inputs.json"))
    os.mkfifo(os.path.join(out, "inputs.json"))


def _png_under_a_kept_hash(out, other):
    """Record 0's bytes swapped for a 4000x4000 PNG, with the shard's sha256 and sizes, and its input's sha256 and
    size, all made to match: verify must name it without decoding 16 megapixels."""
    import hashlib
    import io

    import tensorflow as tf
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (4000, 4000), 7).save(buffer, "PNG")
    png = buffer.getvalue()
    path = os.path.join(out, "train-00000-of-00003.tfrecord")
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[0])
    example.features.feature["image/encoded"].bytes_list.value[0] = png
    with tf.io.TFRecordWriter(path) as writer:
        for record in [example.SerializeToString(), *records[1:]]:
            writer.write(record)
    with open(path, "rb") as f:
        data = f.read()

    def change(raw):
        shard = raw["splits"]["train"]["shards"][0]
        raw["splits"]["train"]["bytes"] += len(data) - shard["bytes"]
        shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())

    edit_manifest(out, change)
    name = example.features.feature["image/filename"].bytes_list.value[0].decode()
    _edit_inputs(lambda raw: _entry(raw, name).update(sha256=hashlib.sha256(png).hexdigest(), size=len(png)))(
        out, other)


def _deleted_and_mean_edited(out, other):
    os.remove(os.path.join(out, "inputs.json"))
    edit_manifest(out, _pixel("pixel_mean", 0, 0.9))


_INPUTS = r"/out/inputs\.json"
_REWRITE = "; rerun the conversion with --overwrite to rewrite it"
# edit(out, another dataset) -> regexes verify's problems must match
INPUTS_LIES = {
    "pixel_sums-off-by-one": (_edit_inputs(_sums_off_by_one), [
        _INPUTS + r": field pixel_sums\['train'\]: count 72, sums \[(\d+), \d+, \d+\], squares \[\d+, \d+, \d+\], its "
        r"records' pixels give count 72, sums \[(\d+), \d+, \d+\]"]),
    "pixel_sums-and-manifest-edited-together": (_sums_and_manifest_edited_together, [
        _INPUTS + r": field pixel_sums\['train'\]: count 72, .*, its records' pixels give count 72",
        r"field splits\['train'\]\.pixel_mean: \[0\.494717, .*\], its records' pixels give \[0\.494771, "]),
    "squares-impossible-beside-sums": (_edit_inputs(lambda raw: raw["pixel_sums"]["train"].update(
        squares=raw["pixel_sums"]["train"]["sums"])), [
        _INPUTS + r": field pixel_sums\['train'\]\.squares: must be possible beside its sums \(channel 0: a sum of "
        r"\d+ and squares of \d+ are not those of 72 pixels in \[0, 255\]\)"]),
    "sha256-swapped-between-two-images": (_edit_inputs(_swap("sha256")), [
        _INPUTS + r": 2 written input\(s\) have a sha256 other than their records' bytes \(first: '(ant|bee)/000\.jpg'"
        r"\), but dataset\.json's options\.converted_images says 0 image\(s\) were re-encoded",
        _INPUTS + r": field pixel_sums\['train'\]: count 72, .*, which its records cannot give: beside the exact count "
        r"64, .* of its kept JPEGs, that leaves count 8, .* for the 512 pixels of its 2 re-encoded images"]),
    "entries-swapped-between-two-images": (_edit_inputs(_swap_entries), [
        r"train-0000\d-of-00003\.tfrecord: 1 of 6 records hold another label than .*inputs\.json lists \(first: "
        r"record \d, '(ant|bee)/000\.jpg', listed '(bee|ant)', held '(ant|bee)'\)",
        _INPUTS + r": 2 written input\(s\) have a sha256 other than their records' bytes"]),
    "size-edited": (_edit_inputs(lambda raw: _entry(raw, "cat/003.jpg").update(size=1)), [
        r"train-0000\d-of-00003\.tfrecord: 1 of 6 records are their input's bytes but not its size in .*inputs\.json "
        r"\(first: record \d, 'cat/003\.jpg', listed 1, held \d+\)"]),
    "label-edited": (_edit_inputs(lambda raw: _entry(raw, "cat/003.jpg").update(label="ant")), [
        r"records hold another label than .*inputs\.json lists \(first: record \d, 'cat/003\.jpg', listed 'ant', "
        r"held 'cat'\)"]),
    "path-renamed": (_edit_inputs(lambda raw: _entry(raw, "cat/003.jpg").update(path="cat/033.jpg")), [
        r"records hold an input .*inputs\.json does not list as written \(first: record \d, 'cat/003\.jpg'\)",
        _INPUTS + r": lists 1 written input\(s\) no record holds \(first: 'cat/033\.jpg', split 'train'\)"]),
    "dropped-copy-of-nothing": (_edit_inputs(_dropped_stray), [
        _INPUTS + r": lists 1 input\(s\) as dropped copies whose sha256 is no written input's \(first: "
        r"'ant/zzz\.jpg'\)"]),
    "another-datasets": (_other_dataset, [
        _INPUTS + r": field fingerprint: must be the fingerprint of the inputs\.json's dataset\.json \([0-9a-f]{12}"
        r"\.\.\.\): this file belongs to another dataset \(got '[0-9a-f]+'\)"]),
    "another-datasets-with-our-fingerprint": (_other_dataset_with_our_fingerprint, [
        _INPUTS + r": field pixel_sums\['train'\]: count 72, .*, which its records cannot give",
        _INPUTS + r": 18 written input\(s\) have a sha256 other than their records' bytes"]),
    "1-gib-sparse": (_huge, [_INPUTS + r": inputs file of 1,073,741,825 bytes, over the 1,073,741,824-byte limit"]),
    "a-fifo": (_fifo, [_INPUTS + r": a FIFO, not a regular file"]),
    "a-png-under-a-kept-inputs-hash": (_png_under_a_kept_hash, [
        r"train-00000-of-00003\.tfrecord: 1 of 6 records are their input's bytes, so JPEGs kept as they are, yet do "
        r"not decode as one \(first: record 0, '\w+/\d+\.jpg': ValueError: not an RGB or grey JPEG \(got PNG L\)\)"]),
    "mtime-moved": (_edit_inputs(lambda raw: _entry(raw, "cat/003.jpg").update(
        mtime_ns=_entry(raw, "cat/003.jpg")["mtime_ns"] + 1)), [  # no record holds a time: the recorded bytes tell
        _INPUTS + r": not the inputs file dataset\.json was written with \(got sha256 [0-9a-f]{12}\.\.\., its "
        r"inputs_sha256 is [0-9a-f]{12}\.\.\.\): edited or replaced since"]),
    "deleted-and-the-manifest-edited": (_deleted_and_mean_edited, [
        r"field splits\['train'\]\.pixel_mean: \[0\.9, .*\], its records' pixels give \[0\.494771, "]),
}


@pytest.fixture(scope="module")
def other_images(tmp_path_factory):
    """Another dataset of the same shape (other pixels): its inputs.json is the wrong one for ``images``."""
    root = tmp_path_factory.mktemp("other")
    make_tree(str(root / "src"), classes=CLASSES, per_class=PER_CLASS, seed=500)
    convert_images(str(root / "src"), str(root / "out"), ConvertOptions(num_shards=3), workers=0, progress=False)
    return str(root / "out")


@pytest.mark.parametrize("lie", INPUTS_LIES, ids=INPUTS_LIES.keys())
def test_an_inputs_file_that_lies_fails_verify_naming_field_and_evidence(images, other_images, cli, lie):
    edit, expected = INPUTS_LIES[lie]
    edit(images, other_images)
    problems = problems_of(images)
    for pattern in expected:
        assert any(re.search(pattern, p) for p in problems), (pattern, problems)
    assert all(p.endswith(_REWRITE) for p in problems), problems
    assert_cli_names(cli, images, problems)


# Episodes: every numeric kind the converter keeps statistics of, a complex feature it keeps none of, NaNs kept,
# values far from zero (the std comes from a difference of squares), and episodes cut into several records.
@pytest.fixture(scope="module")
def pristine_episodes(tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes")
    rng = np.random.default_rng(3)
    files = {}
    for i, length in enumerate([40, 25, 60, 7]):
        obs = rng.normal(size=(length, 3)).astype(np.float32)
        obs[length // 2, 1] = np.nan if i == 0 else obs[length // 2, 1]
        files[f"e{i}.npz"] = {
            "obs": obs,
            "count": rng.integers(-50, 50, size=(length, 2)).astype(np.int32),
            "offset": (1e6 + rng.normal(size=length)).astype(np.float64),
            "done": np.arange(length) == length - 1,
            "big": np.full(length, 2**64 - 1 - length, np.uint64),
            "z": (obs[:, :2] + 1j).astype(np.complex64),
        }
    save_episodes(root / "src", files)
    out = root / "out"
    # 8 steps a record (53 bytes a step): every episode but the 7-step one is several records
    convert_episode_tree(root / "src", out, num_shards=2,
                         episode=EpisodeOptions(on_nan="keep", max_record_bytes=8 * 53))
    return str(out)


@pytest.fixture
def episodes(pristine_episodes, tmp_path):
    copy = str(tmp_path / "out")
    shutil.copytree(pristine_episodes, copy)
    return copy


def test_clean_episodes_with_nans_offsets_and_chunks_verify(episodes):
    manifest = verify(episodes)
    split = manifest.splits["train"]
    assert split.records > len(split.episodes) and split.feature_mean["obs"][1] is None  # chunked; a NaN kept
    assert "z" not in split.feature_mean and split.feature_std["offset"][0] < 2  # sd 1 around 1e6


def _feature(name, **change):
    def edit(raw):
        raw["features"][f"data/{name}"].update(change)
    return edit


def _statistic(field, name, value):
    def edit(raw):
        raw["splits"]["train"][field][name][0] = value
    return edit


def _source(raw):
    raw["splits"]["train"]["episodes"][1]["source"] = "e9.npz"


EPISODE_LIES = {
    # element 1 holds a NaN: null in the manifest, yet finite read as '<i4'
    "f4-as-i4": (_feature("obs", dtype="<i4"), r"field splits\['train'\]\.feature_mean\['obs'\]: the records of "
                 r"features\['data/obs'\], read as its dtype '<i4', have mean .* and std .* at element 0, the manifest "
                 r"says .* \(3 of 3 element\(s\) differ\); the dtype or the statistics are wrong"),
    "i4-as-f4": (_feature("count", dtype="<f4"), r"feature_mean\['count'\]: the records of features\['data/count'\], "
                 r"read as its dtype '<f4', have mean .* \(2 of 2 element\(s\) differ\)"),
    "i4-as-u4": (_feature("count", dtype="<u4"), r"feature_mean\['count'\]: .* read as its dtype '<u4'"),
    "f8-as-i8": (_feature("offset", dtype="<i8"), r"feature_mean\['offset'\]: .* read as its dtype '<i8'"),
    "u8-as-f8": (_feature("big", dtype="<f8"), r"feature_mean\['big'\]: .* read as its dtype '<f8'"),
    "i4x2-as-i8": (_feature("count", dtype="<i8", shape=[1]),
                   r"feature_mean\['count'\]: must list 1 element\(s\) for features\['data/count'\] of shape \[1\] "
                   r"\(got 2\)"),
    "c8-as-f8": (_feature("z", dtype="<f8"), r"feature_mean\['z'\]: must list 2 element\(s\) for features\['data/z'\] "
                 r"of shape \[2\] \(got None\)"),
    "f8-as-c8": (_feature("offset", dtype="<c8"), r"feature_mean\['offset'\]: lists statistics of "
                 r"features\['data/offset'\], whose dtype '<c8' tfshard keeps none of"),
    "mean-moved": (_statistic("feature_mean", "offset", 1e6 + 100), r"feature_mean\['offset'\]: .* at element 0, "
                   r"the manifest says 1000100.0 and"),
    "std-moved": (_statistic("feature_std", "obs", 2.0), r"feature_mean\['obs'\]: .* the manifest says .* and 2.0"),
    "source": (_source, r"train-0000\d-of-00002\.tfrecord: episode (\d) \(e9\.npz\) comes from 'e\1\.npz' in its "
               r"records, the manifest says 'e9\.npz'"),
}


@pytest.mark.parametrize("lie", EPISODE_LIES, ids=EPISODE_LIES.keys())
def test_a_manifest_that_lies_about_episodes_fails_verify_naming_field_and_evidence(episodes, cli, lie):
    edit, expected = EPISODE_LIES[lie]
    edit_manifest(episodes, edit)
    problems = problems_of(episodes)
    assert len(problems) == 1 and re.search(expected, problems[0]), (expected, problems)  # one per lie, not per chunk
    assert_cli_names(cli, episodes, problems)


def _statistics(field, value):
    def edit(raw):
        raw["splits"]["train"][field] = value
    return edit


def _listed(name, mean, std):
    def edit(raw):
        raw["splits"]["train"]["feature_mean"][name] = mean
        raw["splits"]["train"]["feature_std"][name] = std
    return edit


_NAMED = r"splits\['train'\]\.feature_mean\['{name}'\]: the records of features\['data/{name}'\], read as its dtype "
# edit -> (the regex one of verify's problems must match, the error readers give when they load the manifest, or None)
EPISODE_STATISTICS_LIES = {
    "std-negative": (_statistic("feature_std", "obs", -0.5), _NAMED.format(name="obs") + r".* and -0\.5 ",
                     r"field splits\['train'\]\.feature_std\['obs'\]\[0\]: must be at least 0 \(got -0\.5\)"),
    "mean-beyond-int32": (_statistic("feature_mean", "count", 3e9), _NAMED.format(name="count") + r".* says 3000000000",
                          r"feature_mean\['count'\]\[0\]: must be in \[-2\.14748e\+09, 2\.14748e\+09\], the values of "
                          r"dtype '<i4' \(got 3000000000\.0\)"),
    "std-wider-than-int32": (_statistic("feature_std", "count", 5e9), _NAMED.format(name="count"),
                             r"feature_std\['count'\]\[0\]: must be at most 2\.147484e\+09, the widest spread values "
                             r"of dtype '<i4' have around their mean"),
    "std-0-at-a-fraction-of-ints": (_statistic("feature_std", "count", 0.0), _NAMED.format(name="count"),
                                    r"feature_std\['count'\]\[0\]: must not be 0 with mean -?\d+\.\d+: a constant of "
                                    r"dtype '<i4' is a whole number"),
    "bool-mean-1.5": (_statistic("feature_mean", "done", 1.5), _NAMED.format(name="done"),
                      r"feature_mean\['done'\]\[0\]: must be in \[0, 1\], the values of dtype '\|b1' \(got 1\.5\)"),
    "a-feature-not-in-the-table": (_listed("ghost", [0.0], [1.0]),
                                   r"field splits\['train'\]\.feature_mean: lists statistics of \['ghost'\], which the "
                                   r"features table does not declare",
                                   r"field splits\['train'\]\.feature_mean: must name only features of the table"),
    "std-of-a-complex-feature": (lambda raw: raw["splits"]["train"]["feature_std"].update(z=[1.0, 1.0]),
                                 r"feature_mean\['z'\]: lists statistics of features\['data/z'\], whose dtype '<c8' "
                                 r"tfshard keeps none of",
                                 r"field splits\['train'\]\.feature_std: must name the features feature_mean names"),
    "one-element-for-two": (_listed("count", [1.0], [1.0]),
                            r"feature_mean\['count'\]: must list 2 element\(s\) for features\['data/count'\] of shape "
                            r"\[2\] \(got 1\)",
                            r"feature_mean\['count'\]: must list 2 element\(s\), one per element of shape \[2\] "
                            r"\(got 1\)"),
    "null-where-the-records-are-finite": (_listed("offset", [None], [None]),
                                          _NAMED.format(name="offset") + r".* the manifest says None and None", None),
    "no-statistics-at-all": (_statistics("feature_mean", None),
                             r"feature_mean\['obs'\]: must list 3 element\(s\) for features\['data/obs'\] of shape "
                             r"\[3\] \(got None\)",
                             r"splits\[.train.\]\.feature_std: must name the features feature_mean names \(\[\]\)"),
}


@pytest.mark.parametrize("lie", EPISODE_STATISTICS_LIES, ids=EPISODE_STATISTICS_LIES.keys())
def test_episode_statistics_no_records_give_are_named_by_verify_and_the_impossible_refused(episodes, cli, lie):
    edit, expected, readers_error = EPISODE_STATISTICS_LIES[lie]
    edit_manifest(episodes, edit)
    problems = problems_of(episodes)
    assert any(re.search(expected, p) for p in problems), (expected, problems)
    assert_cli_names(cli, episodes, problems)
    assert_readers_take(cli, episodes, readers_error)


def test_statistics_rounded_the_other_way_still_verify(episodes):
    """The tolerance absorbs the manifest's rounding: every mean and std one unit off in its 7th significant digit
    (as sums added in another order could round), yet a unit in the 6th is caught."""
    def nudge(digit):
        def edit(raw):
            for field in ("feature_mean", "feature_std"):
                for values in raw["splits"]["train"][field].values():
                    values[:] = [v if not v else float(f"{v + 10 ** (math.floor(math.log10(abs(v))) - digit):.7g}")
                                 for v in values]
        return edit

    edit_manifest(episodes, nudge(6))
    verify(episodes)
    edit_manifest(episodes, nudge(5))
    assert len(problems_of(episodes)) == 5  # every feature with statistics


# TFDS: names its one-name-a-line, stripped labels file cannot hold are refused; the rest come back exactly.
def _images_named(tmp_path, classes) -> str:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    make_tree(src, classes=classes, per_class=2)
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    return out


UNLABELLABLE = {  # classes -> (the name refused, what TFDS reads at its label)
    "newline-space-blank": (("alpha", "be\nta", "gamma", " padded ", "   "), r"'\x20\x20\x20'",
                            "label 0 back as 'padded'"),
    "newline": (("alpha", "be\nta", "gamma"), r"'be\nta'", "label 1 back as 'be'"),
    "trailing-tab": (("a", "b\t"), r"'b\t'", "label 1 back as 'b'"),
    "no-break-space": (("a", "\xa0b"), r"'\xa0b'", "label 1 back as 'b'"),
    "blank-last": (("a", "b", "\u3000"), r"'\u3000'", "label 2 back as no name"),
    "not-utf8": (("a", "b\udcff"), r"'b\udcff'", "is UTF-8 text and this folder name is not valid UTF-8"),
}


@pytest.mark.parametrize("case", UNLABELLABLE, ids=UNLABELLABLE.keys())
def test_tfds_refuses_a_class_name_its_labels_file_cannot_hold(tmp_path, cli, case):
    from tfshard.tools.tfds import write_tfds_metadata

    classes, name, why = UNLABELLABLE[case]
    out = _images_named(tmp_path, classes)
    before = sorted(os.listdir(out))
    with pytest.raises(ValueError) as caught:
        write_tfds_metadata(out)
    message = str(caught.value)
    assert message.startswith(f"{out}: TFDS cannot hold class name {name}: "), message
    assert why in message and "image.class.label.labels.txt" in message and "rename the class folder" in message
    result = cli("tfds", out)
    assert result.exit_code == 1 and result.stderr == f"error: {message}\n", result.output  # one line, as it is
    assert sorted(os.listdir(out)) == before  # nothing written into OUT
    verify(out)


def test_tfds_reads_back_exactly_the_class_names_it_can_hold(tmp_path):
    import tensorflow_datasets as tfds
    from tfshard.tools.tfds import write_tfds_metadata

    classes = ("a b", "émeu", "x\u2028y", "#1", "日本")
    out = _images_named(tmp_path, classes)
    write_tfds_metadata(out)
    names = load_manifest(out).class_names
    assert tfds.builder_from_directory(out).info.features["image/class/label"].names == names == sorted(classes)
    verify(out)


def test_tfds_label_names_read_labels_files_as_tensorflow_datasets_does(tmp_path):
    """verify's reading of the labels file (no tensorflow-datasets needed) against tensorflow-datasets' own."""
    import tensorflow_datasets as tfds
    from tfshard.format.tfds import tfds_label_names

    texts = ["a\nb\n", "   \n padded \nalpha\nbe\nta\n", "a\r\nb\r\n", "\n\na\n\n", "x\u2028y\n\xa0z\u3000\n", "a"]
    for i, text in enumerate(texts):
        with open(tmp_path / f"f{i}.labels.txt", "w", encoding="utf-8", newline="") as f:
            f.write(text)
        feature = tfds.features.ClassLabel()
        feature.load_metadata(str(tmp_path), f"f{i}")
        assert tfds_label_names(text) == feature.names, text


@pytest.fixture
def images_with_tfds(images):
    from tfshard.tools.tfds import write_tfds_metadata

    write_tfds_metadata(images)
    verify(images)
    return images, os.path.join(images, "image.class.label.labels.txt")


def test_verify_names_tfds_label_names_that_differ_from_class_names(images_with_tfds, cli):
    out, labels = images_with_tfds
    with open(labels, "w") as f:
        f.write(" ant \n\nbee\ncat\n")  # what TFDS reads as ['ant', 'bee', 'cat']: the same names
    verify(out)
    with open(labels, "w") as f:
        f.write("cat\nbee\nant\n")
    fix = f"run `tfshard tfds {out}` again (or remove the TFDS files)"
    problems = problems_of(out)
    assert problems == [f"{labels}: TFDS reads label 0 as 'cat' (3 names), dataset.json's class_names[0] is 'ant' "
                        f"(3 names); {fix}"]
    assert_cli_names(cli, out, problems)
    with open(labels, "w") as f:
        f.write("ant\nbe\ne\ncat\n")
    assert problems_of(out) == [f"{labels}: TFDS reads label 1 as 'be' (4 names), dataset.json's class_names[1] is "
                                f"'bee' (3 names); {fix}"]
    os.remove(labels)
    assert problems_of(out) == [f"{labels}: missing, so TFDS has no names for image/class/label; {fix}"]
