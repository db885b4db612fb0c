"""Attacks on the readers' arguments: numbers TensorFlow would crash on (SIGSEGV) or refuse with its own error are
refused up front, showing the value and the range; and what a reader says of itself (its length, its repr)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import convert_episode_tree, make_tree, random_episodes, save_episodes
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_images


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("photos") / "out"
    make_tree(str(src), per_class=4)
    convert_images(str(src), str(out), ConvertOptions(num_shards=2), workers=0, progress=False)
    return str(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    src, out = tmp_path_factory.mktemp("runs-src"), tmp_path_factory.mktemp("runs") / "out"
    save_episodes(src, {f"e{i}.npy": e for i, e in enumerate(random_episodes([20, 30, 25]))})
    convert_episode_tree(src, out, num_shards=3)
    return str(out)


# (argument, value, the range the message shows)
IMAGE_ARGUMENTS = [
    ("shuffle_buffer", 2**31, "[1, 16,777,216]"),  # SIGSEGV in TensorFlow's shuffle, even on 10 elements
    ("shuffle_buffer", 2**30, "[1, 16,777,216]"),
    ("shuffle_buffer", 0, "[1, 16,777,216]"),
    ("read_buffer_bytes", 2**40, "[1, 1,073,741,824]"),  # SIGSEGV in TFRecordDataset
    ("read_buffer_bytes", 0, "[1, 1,073,741,824]"),
    ("num_parallel_reads", 2**31, "[1, 4,096]"),  # SIGSEGV in interleave
    ("num_parallel_reads", 0, "[1, 4,096]"),
    ("batch_size", 2**40, "[1, 2,147,483,647]"),
    ("batch_size", 2.0, "[1, 2,147,483,647]"),
    ("shuffle_buffer", True, "[1, 16,777,216]"),
]


@pytest.mark.parametrize("name, value, shown", IMAGE_ARGUMENTS)
def test_images_refuses_numbers_out_of_range_showing_value_and_range(photos, name, value, shown):
    arguments = {"batch_size": 2, name: value}
    refusal = f"{photos}: {name} must be a positive integer (got {name}={value!r}), in {shown}"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        readers.images(photos, **arguments)


def test_image_size_beyond_any_real_image_is_refused(photos):
    with pytest.raises(ValueError, match=r"image_size: sides must be in \[1, 16,384\] pixels \(got 1000000\)"):
        readers.images(photos, batch_size=2, image_size=10**6)


@pytest.mark.parametrize("call", [
    lambda runs: readers.windows(runs, length=4, batch_size=2, resident=False, shuffle_buffer=0),  # TF's own error
    lambda runs: readers.windows(runs, length=4, batch_size=2, shuffle_buffer=2**31),
    lambda runs: readers.windows(runs, length=4, batch_size=2, read_buffer_bytes=2**40),
    lambda runs: readers.windows(runs, length=2**40, batch_size=2),
    lambda runs: readers.episodes(runs, num_parallel_reads=2**31, shuffle_files=True),
    lambda runs: readers.episodes(runs, read_buffer_bytes=-1),
    lambda runs: readers.model_windows(runs, length=4, batch_size=2, read_buffer_bytes=2**40),
], ids=["streamed-shuffle-0", "resident-shuffle-2**31", "windows-read-buffer-2**40", "length-2**40",
        "episodes-parallel-reads-2**31", "episodes-read-buffer-negative", "model-windows-read-buffer-2**40"])
def test_window_and_episode_readers_refuse_numbers_out_of_range(runs, call):
    refusal = re.escape(runs) + r": \w+ must be a positive integer \(got \w+=-?\d+\), in \["
    with pytest.raises(ValueError, match=refusal):
        call(runs)


def test_numpy_integers_are_integers(photos, runs):
    ds = readers.images(photos, batch_size=np.int64(2), shuffle_buffer=np.int32(8), read_buffer_bytes=np.int64(2**20),
                        training=False)
    assert len(ds) == 4
    assert len(readers.windows(runs, length=np.int64(4), batch_size=np.int32(2), shuffle_buffer=np.int64(16))) > 0


def test_episodes_know_their_length(runs):
    """Keras ends each epoch on it instead of warning that the input "ran out of data"."""
    ds = readers.episodes(runs)
    assert len(ds) == 3 == sum(1 for _ in ds)
    assert len(readers.episodes(runs, shuffle_files=True, seed=1)) == 3


def test_dataset_info_prints_as_one_short_line(photos, runs):
    assert repr(readers.info(photos)) == f"DatasetInfo({photos!r}: images, 2 classes, train 8 records in 2 shards)"
    assert str(readers.info(runs)) == f"DatasetInfo({runs!r}: episodes, 1 features, train 3 records in 3 shards)"
