"""TFDS opens a tfshard dataset: metadata written by `tfshard tfds OUT` (or by a conversion's `--tfds`, the same
bytes), read by the real tensorflow-datasets."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import (
    assert_same_tree,
    convert_episode_tree,
    files_under,
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
from tfshard.ingest.tfds import write_tfds_metadata


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
    assert "error: tfds: TFDS opens TFRecord files uncompressed only (got compression='gzip')" in result.output
    assert not os.path.exists(tmp_path / "gz")  # refused before any work
