"""TFDS opens a tfshard dataset: metadata written by `tfshard tfds OUT`, read by the real tensorflow-datasets."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import convert_episode_tree, make_tree, random_episodes, save_episodes, write_jpeg
from tfshard import readers
from tfshard.format.names import is_output_name
from tfshard.ingest import ConvertOptions, EpisodeOptions, VerifyError, convert_images, verify
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
