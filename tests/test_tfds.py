"""TFDS opens a tfshard dataset: metadata written by `tfshard tfds OUT` (or by a conversion's `--tfds`, the same
bytes), read by the real tensorflow-datasets.

Then the attacks: real conversions, the real tensorflow-datasets, real processes. Found bugs, since fixed: a symlink
planted at OUT/.tmp-tfds, a deeply nested dataset_info.json, an empty split, and a user's *.labels.txt file."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import (
    assert_same_tree,
    convert_episode_tree,
    convert_image_tree,
    files_under,
    image_features,
    make_tree,
    random_episodes,
    save_episodes,
    write_jpeg,
)
from tfshard import readers
from tfshard.format.names import TFDS_FILES, is_output_name
from tfshard.ingest import (
    ConvertOptions,
    EpisodeOptions,
    InputError,
    VerifyError,
    convert_episodes,
    convert_images,
    verify,
)
from tfshard.ingest.beam_runner import BeamRunner
from tfshard.tools.tfds import write_tfds_metadata


@pytest.fixture
def images_out(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), classes=("cat", "dog", "émeu"), per_class=4, size=(24, 16))
    write_jpeg(str(src / "dog" / "gray.jpg"), 99, size=(20, 30), mode="L")  # one grayscale JPEG: 3 channels in TFDS too
    out = str(tmp_path / "out")
    convert_images(str(src), out, ConvertOptions(num_shards=3), workers=0, progress=False)
    return out


def _records_in_order(out: str):
    """(RGB pixels, label, filename) of every record, read the way readers.images decodes (3 channels), in
    manifest order, before any resize."""
    manifest = readers.info(out).manifest
    paths = [os.path.join(out, s.file) for s in manifest.splits["train"].shards]
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/filename": tf.io.FixedLenFeature([], tf.string)}
    for record in tf.data.TFRecordDataset(paths):
        parsed = tf.io.parse_single_example(record, spec)
        yield (tf.io.decode_jpeg(parsed["image/encoded"], channels=3).numpy(), int(parsed["image/class/label"]),
               parsed["image/filename"].numpy())


def test_tfds_yields_the_readers_images_labels_and_names(images_out, cli):
    result = cli("tfds", images_out)
    assert result.exit_code == 0, result.output
    assert "wrote dataset_info.json, features.json, image.class.label.labels.txt" in result.output
    builder = tfds.builder_from_directory(images_out)
    manifest = readers.info(images_out).manifest
    assert builder.info.features["image/class/label"].names == manifest.class_names
    assert {s: builder.info.splits[s].num_examples for s in manifest.splits} == {
        s: split.records for s, split in manifest.splits.items()}
    theirs = list(builder.as_dataset(split="train").as_numpy_iterator())
    ours = list(_records_in_order(images_out))
    assert len(theirs) == len(ours) == manifest.splits["train"].records == 13
    for element, (pixels, label, filename) in zip(theirs, ours):
        assert np.array_equal(element["image/encoded"], pixels) and element["image/encoded"].shape[-1] == 3
        assert element["image/class/label"] == label and element["image/filename"] == filename
    image, label = next(iter(builder.as_dataset(split="train", as_supervised=True)))
    assert np.array_equal(image.numpy(), ours[0][0]) and int(label) == ours[0][1]
    assert not [n for n in os.listdir(images_out) if n.startswith(".tmp")]  # written via a temporary folder


def test_episodes_from_tfds_equal_readers_episodes_and_chunks_stay_chunks(tmp_path):
    episodes = random_episodes([40, 25, 60], width=3)
    save_episodes(tmp_path / "src", {f"e{i}.npz": {"obs": e, "step": np.arange(len(e), dtype=np.int16),
                                                   "done": np.arange(len(e)) == len(e) - 1,
                                                   "z": (e[:, :2] + 1j * e[:, 1:]).astype(np.complex64),
                                                   "big": np.full(len(e), 2**64 - 1 - len(e), np.uint64)}
                                     for i, e in enumerate(episodes)})
    out = tmp_path / "out"
    convert_episode_tree(tmp_path / "src", out, episode=EpisodeOptions(max_record_bytes=30 * 39))  # 30 steps a record
    write_tfds_metadata(str(out))
    builder = tfds.builder_from_directory(str(out))
    chunks = list(builder.as_dataset(split="train").as_numpy_iterator())
    assert len(chunks) == 2 + 1 + 2  # 40, 25 and 60 steps in records of 30
    joined = {}
    for chunk in chunks:
        parts = joined.setdefault(int(chunk["episode/id"]), [])
        assert int(chunk["episode/chunk"]) == len(parts) and chunk["data/obs"].shape == (chunk["episode/steps"], 3)
        parts.append(chunk)
    for keys, episode in readers.episodes(str(out), with_keys=True).as_numpy_iterator():
        parts = joined[int(keys["episode"])]
        for name in ("obs", "step", "done", "z", "big"):
            assert np.array_equal(np.concatenate([p[f"data/{name}"] for p in parts]), episode[name])


def test_what_tfds_cannot_read_is_refused_with_the_reason(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), per_class=2)
    gz = str(tmp_path / "gz")
    convert_images(str(src), gz, ConvertOptions(compression="gzip"), workers=0, progress=False)
    result = cli("tfds", gz)
    assert result.exit_code == 1
    assert f"error: {gz}: gzip shards; TFDS opens TFRecord files uncompressed only" in result.output
    save_episodes(tmp_path / "u32", {"e.npz": {"count": np.zeros(5, np.uint32), "x": np.ones((5, 2), np.float32)}})
    convert_episode_tree(tmp_path / "u32", tmp_path / "u32-out")
    with pytest.raises(ValueError, match=r"u32-out: feature 'count': TFDS cannot decode raw bytes of uint32 values "
                                         r"\(tf.io.decode_raw does not read uint32\)"):
        write_tfds_metadata(str(tmp_path / "u32-out"))
    save_episodes(tmp_path / "empty", {"e.npz": {"none": np.zeros((5, 0), np.float32), "x": np.ones(5, np.int8)}})
    convert_episode_tree(tmp_path / "empty", tmp_path / "empty-out")
    with pytest.raises(ValueError, match=r"feature 'none': TFDS cannot decode raw bytes of no elements per step"):
        write_tfds_metadata(str(tmp_path / "empty-out"))
    assert not {"dataset_info.json", "features.json"} & set(os.listdir(gz))  # nothing written when refused


def test_a_new_dataset_in_out_takes_the_tfds_metadata_with_it(images_out, tmp_path):
    write_tfds_metadata(images_out)
    names = {"dataset_info.json", "features.json", "image.class.label.labels.txt"}
    assert names <= set(os.listdir(images_out)) and all(is_output_name(n) for n in names)
    src = str(tmp_path / "src")
    convert_images(src, images_out, ConvertOptions(num_shards=3), workers=0, progress=False)  # same: nothing to do
    assert names <= set(os.listdir(images_out))
    convert_images(src, images_out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    assert not names & set(os.listdir(images_out))  # they described the old shards
    verify(images_out)


def test_verify_names_tfds_metadata_of_another_dataset(images_out):
    write_tfds_metadata(images_out)
    verify(images_out)
    path = os.path.join(images_out, "dataset_info.json")
    info = json.loads(open(path).read())
    info["splits"][0]["shardLengths"] = ["1", "2", "3"]
    with open(path, "w") as f:
        json.dump(info, f)
    with pytest.raises(VerifyError) as caught:
        verify(images_out)
    assert caught.value.problems == [f"{path}: TFDS metadata of another dataset (its splits or fingerprint differ from "
                                     f"dataset.json); run `tfshard tfds {images_out}` again (or remove the TFDS files)"]
    write_tfds_metadata(images_out)  # written again: consistent again
    verify(images_out)


# --- --tfds: the same metadata at the end of a conversion -------------------------------------------------------------


def _tfds_files(out) -> dict[str, bytes]:
    return {name: data for name, data in files_under(out).items() if name in TFDS_FILES}


def _rewritten_by_the_command(out) -> dict[str, bytes]:
    """What `tfshard tfds OUT` writes over the flag's files: a test that they are the same bytes."""
    write_tfds_metadata(str(out))
    return _tfds_files(out)


def test_images_with_tfds_open_in_tfds_and_a_rerun_on_a_complete_out_adds_it(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), classes=("cat", "dog", "émeu"), per_class=3)
    flagged = str(tmp_path / "flagged")
    convert_images(str(src), flagged, ConvertOptions(num_shards=2), workers=0, progress=False, tfds=True)
    builder = tfds.builder_from_directory(flagged)
    assert builder.info.features["image/class/label"].names == ["cat", "dog", "émeu"]
    theirs = list(builder.as_dataset(split="train").as_numpy_iterator())
    ours = list(_records_in_order(flagged))
    assert len(theirs) == len(ours) == 9
    for element, (pixels, label, filename) in zip(theirs, ours):
        assert np.array_equal(element["image/encoded"], pixels)
        assert (element["image/class/label"], element["image/filename"]) == (label, filename)
    written = _tfds_files(flagged)
    assert sorted(written) == sorted(TFDS_FILES[:3]) and not [n for n in os.listdir(flagged) if n.startswith(".")]
    assert _rewritten_by_the_command(flagged) == written
    verify(flagged)

    plain = str(tmp_path / "plain")
    args = ("images", src, plain, "--num-shards", "2", "--workers", "0")
    assert cli(*args, "-q").exit_code == 0 and not _tfds_files(plain)
    dataset = files_under(plain)
    result = cli(*args, "--tfds")
    assert result.exit_code == 0, result.output
    assert "already complete" in result.output and f"{plain}: wrote TFDS metadata" in result.output
    assert_same_tree(files_under(plain), {**dataset, **written}, "a --tfds rerun on a complete OUT")  # only added

    result = cli("images", src, plain, "--num-shards", "3", "--workers", "0", "-q", "--overwrite", "--tfds")
    assert result.exit_code == 0, result.output
    assert [len(s["shardLengths"]) for s in json.loads(_tfds_files(plain)["dataset_info.json"])["splits"]] == [3]
    verify(plain)  # the new shards' metadata, not the old


def test_episodes_with_tfds_open_in_tfds_on_both_runners(tmp_path, cli):
    episodes = random_episodes([7, 4, 9], width=3)
    save_episodes(tmp_path / "src", {f"e{i}.npz": {"obs": e, "step": np.arange(len(e), dtype=np.int16)}
                                     for i, e in enumerate(episodes)})
    out = tmp_path / "out"
    result = cli("episodes", tmp_path / "src", out, "--workers", "0", "-q", "--tfds")
    assert result.exit_code == 0, result.output
    by_source = {os.path.basename(e.source): e.id for e in readers.info(str(out)).manifest.splits["train"].episodes}
    records = {int(r["episode/id"]): r for r in tfds.builder_from_directory(str(out)).as_dataset(
        split="train").as_numpy_iterator()}
    for i, episode in enumerate(episodes):
        record = records[by_source[f"e{i}.npz"]]
        assert np.array_equal(record["data/obs"], episode)
        assert np.array_equal(record["data/step"], np.arange(len(episode)))
    written = _tfds_files(out)
    assert sorted(written) == ["dataset_info.json", "features.json"]
    assert _rewritten_by_the_command(out) == written

    beam = tmp_path / "beam"
    convert_episodes(str(tmp_path / "src"), str(beam), ConvertOptions(on_error="fail"), progress=False,
                     runner=BeamRunner(["--runner=DirectRunner"]), tfds=True)
    assert _tfds_files(beam) == written  # the Beam runner's manifest is the engine's: the same metadata follows it


def test_tfds_that_tfds_could_not_open_is_refused_before_any_shard_is_written(tmp_path, cli):
    """A dtype TFDS cannot decode, a class name its labels file cannot hold: refused up front, naming why, and OUT
    is as it was (here: not there at all); never found once the dataset is written."""
    save_episodes(tmp_path / "u32", {"e.npz": {"count": np.zeros(5, np.uint32), "x": np.ones((5, 2), np.float32)}})
    out = tmp_path / "out"
    where = re.escape(str(out))
    with pytest.raises(InputError, match=rf"{where}: --tfds refused before anything was written: feature 'count': "
                                         r".* uint32.*; or drop --tfds"):
        convert_episodes(str(tmp_path / "u32"), str(out), workers=0, progress=False, tfds=True)
    assert not os.path.exists(out)
    make_tree(str(tmp_path / "padded"), classes=("cat", "dog "), per_class=2)
    result = cli("images", tmp_path / "padded", out, "--workers", "0", "--tfds")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "TFDS cannot hold class name 'dog\\x20'" in result.stderr and "or drop --tfds" in result.stderr
    assert not os.path.exists(out)
    os.makedirs(out)
    (out / "notes.txt").write_text("mine")
    assert cli("images", tmp_path / "padded", out, "--workers", "0", "--tfds", "--overwrite").exit_code == 1
    assert sorted(os.listdir(out)) == ["notes.txt"]  # no lock, state, temporary folder or shard left

    src = tmp_path / "images"
    make_tree(str(src), per_class=2)
    result = cli("images", src, tmp_path / "gz", "--compression", "gzip", "--tfds")
    assert result.exit_code == 1
    assert "error: --tfds: TFDS opens TFRecord files uncompressed only (got --compression='gzip')" in result.output
    assert not os.path.exists(tmp_path / "gz")  # refused before any work


# --- attacks: odd datasets, planted files, locks and other processes --------------------------------------------------

TFDS_NAMES = {"dataset_info.json", "features.json", "image.class.label.labels.txt"}


def _records(out: str, split: str = "train") -> list[dict]:
    """Every record of a split in manifest order, parsed with the manifest's own feature table."""
    paths = readers.info(out).shard_paths(split)
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, image_features()).items()}
            for r in tf.data.TFRecordDataset(paths)]


def _write(path, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def _snapshot(root, skip) -> dict:
    found = {}
    for folder, dirs, files in os.walk(root):
        if os.path.abspath(folder).startswith(os.path.abspath(skip)):
            continue
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.abspath(path) != os.path.abspath(skip):
                found[path] = (os.lstat(path).st_size, os.lstat(path).st_mtime_ns)
    return found


def test_tfds_train_val_index_and_an_empty_class_match_every_record(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), classes=("a", "b", "c"), per_class=3, splits=["train"], size=(20, 12))
    write_jpeg(str(src / "val" / "a" / "v0.jpg"), 70, size=(10, 14), mode="L")
    write_jpeg(str(src / "val" / "c" / "v1.jpg"), 71)
    out = str(tmp_path / "out")
    convert_image_tree(src, out, index=True, num_shards=2)
    before = _snapshot(tmp_path, out)
    first = cli("tfds", out)
    assert first.exit_code == 0, first.output
    contents = {n: open(os.path.join(out, n), "rb").read() for n in TFDS_NAMES}
    assert cli("tfds", out).exit_code == 0  # twice: the same files again
    assert {n: open(os.path.join(out, n), "rb").read() for n in TFDS_NAMES} == contents
    builder = tfds.builder_from_directory(out)
    assert builder.info.features["image/class/label"].names == ["a", "b", "c"]
    for split, count in (("train", 9), ("val", 2)):
        theirs = list(builder.as_dataset(split=split).as_numpy_iterator())
        ours = _records(out, split)
        assert len(theirs) == len(ours) == count == builder.info.splits[split].num_examples
        for element, record in zip(theirs, ours):
            assert np.array_equal(element["image/encoded"],
                                  tf.io.decode_jpeg(record["image/encoded"], channels=3).numpy())
            for key in ("image/class/label", "image/filename", "image/class/text", "image/height", "image/width",
                        "image/channels", "image/format"):
                assert element[key] == record[key], key
    verify(out)
    assert _snapshot(tmp_path, out) == before  # nothing outside OUT changed
    assert not [n for n in os.listdir(out) if n.startswith(".tmp")]


def test_episode_dtypes_are_refused_with_a_reason_or_read_back_exactly(tmp_path):
    for dtype in ("float16", "uint64", "uint32", "complex64", "int8", "bool", "uint16"):
        values = (np.arange(14).reshape(7, 2) * 37 % 11).astype(dtype)
        if dtype == "uint64":
            values[3, 1] = 2**64 - 3
        save_episodes(tmp_path / dtype, {"e.npz": {"x": values}})
        out = str(tmp_path / f"{dtype}-out")
        convert_episode_tree(tmp_path / dtype, out)
        try:
            write_tfds_metadata(out)
        except ValueError as e:
            assert f"{out}: feature 'x': TFDS cannot decode" in str(e) and dtype in str(e)
            assert not TFDS_NAMES & set(os.listdir(out)), dtype
            continue
        (element,) = tfds.builder_from_directory(out).as_dataset(split="train").as_numpy_iterator()
        assert element["data/x"].dtype == values.dtype and np.array_equal(element["data/x"], values), dtype


def test_episode_metadata_never_reads_the_deprecated_feature_dtype(tmp_path, monkeypatch):
    """Writing an episodes dataset's TFDS metadata checks each feature's decode without TFDS's ``decode_example``,
    which reads ``FeatureConnector.dtype`` and so logged "`FeatureConnector.dtype` is deprecated" during ``--tfds``.
    Its logging is once per process, so the reads themselves are counted here, not the log lines."""
    save_episodes(tmp_path / "src", {"e.npz": {"x": np.ones((4, 2), np.float32), "n": np.arange(4, dtype=np.uint64)}})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "src", out)
    reads = []
    deprecated = tfds.features.FeatureConnector.dtype

    def counted(feature):
        reads.append(type(feature).__name__)
        return deprecated.fget(feature)

    monkeypatch.setattr(tfds.features.FeatureConnector, "dtype", property(counted))
    written = write_tfds_metadata(out)
    assert "features.json" in written and reads == []


def test_tfds_metadata_with_an_empty_split_opens_in_tfds(tmp_path):
    save_episodes(tmp_path / "e", {"train/a.npy": np.ones((4, 2), np.float32),
                                   "val/b.npy": np.full((4, 2), np.nan, np.float32)})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "e", out, episode=EpisodeOptions(on_nan="skip"))
    try:
        write_tfds_metadata(out)
    except ValueError as e:  # refusing, naming the split, is fine too
        assert "val" in str(e)
        return
    datasets = tfds.builder_from_directory(out).as_dataset()
    assert {s: len(list(d)) for s, d in datasets.items()} in ({"train": 1}, {"train": 1, "val": 0})


def test_tfds_while_another_process_holds_the_lock_fails_and_writes_nothing(image_tree, tmp_path, cli):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, sys, time\n"
        f"fd = os.open({os.path.join(out, '.tfshard-lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.pwrite(fd, json.dumps({'pid': os.getpid(), 'host': 'elsewhere'}).encode(), 0)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"{out}: locked by pid {holder.pid}"):
            write_tfds_metadata(out)
        result = cli("tfds", out)
        assert result.exit_code == 1 and "locked by" in result.output
        assert not TFDS_NAMES & set(os.listdir(out)) and ".tmp-tfds" not in os.listdir(out)
    finally:
        holder.kill()
        holder.wait()
    assert set(write_tfds_metadata(out)) == TFDS_NAMES


def test_a_file_or_fifo_planted_at_the_temporary_folder_is_replaced(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    temp = os.path.join(out, ".tmp-tfds")
    with open(temp, "w") as f:
        f.write("planted")
    assert set(write_tfds_metadata(out)) == TFDS_NAMES and not os.path.lexists(temp)
    os.mkfifo(temp)
    assert set(write_tfds_metadata(out)) == TFDS_NAMES and not os.path.lexists(temp)
    verify(out)


def test_a_symlink_planted_at_the_temporary_folder_deletes_nothing_outside_out(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    outside = tmp_path / "precious"
    os.makedirs(outside)
    (outside / "keep.txt").write_text("mine")
    os.symlink(outside, os.path.join(out, ".tmp-tfds"))
    try:
        write_tfds_metadata(out)
    except (ValueError, OSError, tf.errors.OpError):
        pass  # refusing is fine; deleting someone else's files is not
    assert (outside / "keep.txt").read_text() == "mine"


def test_verify_reports_unreadable_dataset_info_without_hanging(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    path = os.path.join(out, "dataset_info.json")

    def plant(make):
        if os.path.lexists(path):
            os.remove(path)
        make()
        with pytest.raises(VerifyError) as caught:
            verify(out)
        assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(f"{path}: not TFDS metadata")

    plant(lambda: os.mkfifo(path))  # would block an open()
    plant(lambda: os.symlink("/dev/zero", path))  # never ends
    for content in (b"\xff\x00 not json", json.dumps({"splits": {"train": 1}}).encode(), b"[1, 2]",
                    json.dumps({"splits": [{"name": "train", "shardLengths": ["x"]}]}).encode(), b"",
                    b'{"splits": [{"name": "train", "shardLengths": [1e309]}]}'):  # int(inf): OverflowError
        plant(functools.partial(_write, path, content))
    plant(lambda: (_write(path, b""), os.truncate(path, (1 << 30) + 1)))  # sparse: over the size limit


def test_verify_reports_deeply_nested_dataset_info(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    with open(os.path.join(out, "dataset_info.json"), "w") as f:
        f.write("[" * 100_000)
    with pytest.raises(VerifyError, match="dataset_info.json: not TFDS metadata"):
        verify(out)


def test_conversions_after_tfds_leave_metadata_consistent_or_gone(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), per_class=4)
    out = str(tmp_path / "out")
    assert cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2").exit_code == 0
    assert cli("tfds", out).exit_code == 0
    shard = readers.info(out).shard_paths("train")[0]
    os.remove(shard)  # damaged: a same-inputs rerun writes the same bytes again and keeps the metadata
    assert cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2").exit_code == 0
    assert TFDS_NAMES <= set(os.listdir(out))
    verify(out)
    assert len(list(tfds.builder_from_directory(out).as_dataset(split="train"))) == 8
    result = cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2", "--overwrite")  # same inputs
    assert result.exit_code == 0, result.output
    verify(out)  # the metadata went with the old shards, or still describes the new ones
    if TFDS_NAMES & set(os.listdir(out)):
        assert len(list(tfds.builder_from_directory(out).as_dataset(split="train"))) == 8


def test_tfds_on_a_missing_or_non_dataset_folder_fails_and_creates_nothing(tmp_path, cli):
    from tfshard.format.names import is_output_name, is_tfds_name

    for name in ("../dataset_info.json", "a/features.json", "x.labels.txt/", "labels.txt", "dataset_info.json.tmp"):
        assert not is_tfds_name(name) and not is_output_name(name), name
    os.makedirs(tmp_path / "empty")
    for out in (tmp_path / "missing", tmp_path / "empty"):
        result = cli("tfds", out)
        assert result.exit_code == 1 and f"error: {out}" in result.output, result.output
    assert sorted(os.listdir(tmp_path)) == ["empty"] and os.listdir(tmp_path / "empty") == []


def test_overwrite_removes_only_the_tfds_files_tfshard_wrote(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    write_tfds_metadata(out)
    for name in ("notes.txt", "my.labels.txt"):
        _write(os.path.join(out, name), b"user data")
    convert_images(image_tree[0], out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    left = set(os.listdir(out))
    assert not TFDS_NAMES & left and "notes.txt" in left
    assert "my.labels.txt" in left
