"""The shard cache on local paths, through the real readers: the same data as without it, copies named by sha256, a
second epoch that downloads nothing, a folder that never holds more than its limit, and LRU eviction that never
takes a copy a live pipeline holds (``readers/shard_cache``)."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, convert_image_tree, convert_obs_episodes, make_tree
from shard_cache_helpers import (
    LIMIT,
    assert_same_epochs,
    copies,
    epochs,
    fetched,
    images,
    manifest_shards,
    photo_dataset,
    remote_shards,
)
from tfshard import readers
from tfshard.readers.shard_cache import pipeline
from tfshard.readers.shard_cache.store import ShardStore
from tfshard.tools.cache import fill_shard_cache

WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_dataset(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def photo_epochs(photos):
    """Two epochs of the uncached reader of ``photos``."""
    return epochs(images(photos))


@pytest.fixture(scope="module")
def gzipped(tmp_path_factory):
    root = tmp_path_factory.mktemp("gzipped")
    make_tree(str(root / "src"), per_class=12, seed=100)
    convert_image_tree(root / "src", root / "out", num_shards=4, compression="gzip")
    return str(root / "out")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """16 episodes ``obs`` float32 [T, 2] (every value distinct) in 4 shards."""
    return convert_obs_episodes(tmp_path_factory.mktemp("runs"), [6, 9, 13, 7, 11, 6, 8, 10] * 2, seed=3,
                                num_shards=4)


def _shas(path) -> list[str]:
    return [s.sha256 for s in manifest_shards(path)]


def _sizes(path) -> list[int]:
    return [s.size for s in manifest_shards(path)]


def _store(directory, limit=LIMIT) -> ShardStore:
    """The store the readers of this process use for ``directory`` and ``limit``."""
    return pipeline.store_for(str(directory), limit)


# --- the same data ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["photos", "gzipped"])
def test_images_are_the_same_batches_and_a_second_epoch_downloads_nothing(request, dataset, tmp_path):
    path = request.getfixturevalue(dataset)
    expected = request.getfixturevalue("photo_epochs") if dataset == "photos" else epochs(images(path))
    directory = str(tmp_path / "cache")
    ds = images(path, shard_cache=directory, shard_cache_limit=LIMIT)
    store = _store(directory)
    first = epochs(ds, 1)
    assert copies(directory) == set(_shas(path))
    assert store.downloaded_bytes == sum(_sizes(path))
    mtimes = {name: os.stat(os.path.join(directory, "shards", name)).st_mtime_ns
              for name in os.listdir(os.path.join(directory, "shards"))}
    second = epochs(ds, 1)
    assert_same_epochs(first + second, expected)
    assert store.downloaded_bytes == sum(_sizes(path))
    assert {name: os.stat(os.path.join(directory, "shards", name)).st_mtime_ns for name in mtimes} == mtimes
    assert os.listdir(os.path.join(directory, "parts")) == []


def _sorted(all_epochs: list[list]) -> list[list]:
    """Each epoch's elements in a fixed order: for readers whose shuffled order is not deterministic (their decode
    map is not), cache or no cache."""
    return [sorted(epoch, key=lambda element: b"".join(x.tobytes() for x in element)) for epoch in all_epochs]


def test_episodes_are_the_same_stream(runs, tmp_path):
    directory = str(tmp_path / "c")
    expected = epochs(readers.episodes(runs))
    assert_same_epochs(epochs(readers.episodes(runs, shard_cache=directory, shard_cache_limit=LIMIT)), expected)
    assert copies(directory) == set(_shas(runs))
    shuffled = readers.episodes(runs, shuffle_files=True, seed=0, shard_cache=directory, shard_cache_limit=LIMIT)
    assert_same_epochs(_sorted(epochs(shuffled, 1)), _sorted(expected[:1]))


@pytest.mark.parametrize("resident", [True, False])
def test_windows_are_the_same_batches(runs, tmp_path, resident):
    # Streamed windows are deterministic unshuffled (their shuffle buffer follows the decode map's order).
    options = {"batch_size": 8, "seed": 0, "shuffle": resident, "resident": resident, "with_keys": True, **WINDOWS}
    expected = epochs(readers.windows(runs, **options))
    directory = str(tmp_path / "c")
    ds = readers.windows(runs, shard_cache=directory, shard_cache_limit=LIMIT, **options)
    assert_same_epochs(epochs(ds), expected)
    assert copies(directory) == set(_shas(runs))
    assert _store(directory).downloaded_bytes == sum(_sizes(runs))  # once, not once per epoch


def test_each_input_pipeline_caches_only_its_own_shards(photos, tmp_path):
    shas = _shas(photos)
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id)
        directory = str(tmp_path / f"c{pipeline_id}")
        expected = epochs(images(photos, input_context=context))
        assert_same_epochs(epochs(images(photos, input_context=context, shard_cache=directory)), expected)
        assert copies(directory) == set(shas[pipeline_id::2])


def test_a_resumed_stream_is_the_uncached_stream(photos, tmp_path):
    def batches(ds, count=5):
        iterator = iter(ds)
        return [[np.asarray(x) for x in next(iterator)] for _ in range(count)]

    expected = batches(images(photos, repeat=True, start_step=4))
    got = batches(images(photos, repeat=True, start_step=4, shard_cache=str(tmp_path / "c")))
    assert_same_epochs([got], [expected])
    assert_same_epochs([batches(images(photos, repeat=True, shard_cache=str(tmp_path / "c")), 9)[4:]], [expected])


def test_a_tf_data_service_reads_every_record_through_the_cache(photos, tmp_path):
    from tfshard.readers import service as service_lib

    dispatcher = service_lib.start_dispatcher(0)
    worker = service_lib.start_worker(dispatcher.target, 0, "localhost:%port%")
    try:
        def keys(**kwargs):
            ds = readers.images(photos, batch_size=5, image_size=(16, 16), training=False, drop_remainder=False,
                                **kwargs)
            return sorted((int(label), image.tobytes()) for pixels, labels in ds
                          for image, label in zip(pixels.numpy(), labels.numpy()))

        expected = keys()
        directory = str(tmp_path / "c")
        for _ in range(2):
            assert keys(service=dispatcher.target, shard_cache=directory, shard_cache_limit=LIMIT) == expected
        assert copies(directory) == set(_shas(photos))
        assert _store(directory).downloaded_bytes == sum(_sizes(photos))
    finally:
        worker.stop()
        dispatcher.stop()


# --- bounded ---------------------------------------------------------------------------------------------------------


def test_a_limit_of_half_the_dataset_is_never_exceeded_and_the_rest_is_read_remotely(photos, photo_epochs, tmp_path):
    directory = str(tmp_path / "c")
    limit = sum(_sizes(photos)) // 2
    ds = images(photos, shard_cache=directory, shard_cache_limit=limit)
    store = _store(directory, limit)
    highest, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            highest[0] = max(highest[0], _bytes_under(directory))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        got = epochs(ds)
    finally:
        done.set()
        sampler.join()
    assert_same_epochs(got, photo_epochs)
    assert 0 < highest[0] <= limit and store.usage() <= limit
    assert 0 < len(copies(directory)) < len(_shas(photos))  # some local, the rest read remotely
    assert copies(directory) <= set(_shas(photos))


def _bytes_under(directory) -> int:
    """The size of every file under ``directory``. Copies first: a download renamed into shards/ while we look is
    then missed rather than counted twice, so a sum above the limit is one the folder really held (a pipeline's
    own copies are pinned, so nothing is evicted meanwhile)."""
    total = 0
    for folder in ("shards", "parts", "locks", "pins", "."):
        for entry in os.scandir(os.path.join(directory, folder)):
            try:
                total += entry.stat(follow_symlinks=False).st_size if not entry.is_dir(follow_symlinks=False) else 0
            except FileNotFoundError:  # renamed or removed while we looked
                pass
    return total


def test_a_limit_below_the_largest_shard_is_refused_up_front(photos, tmp_path):
    largest = max(_sizes(photos))
    name = os.path.basename(manifest_shards(photos)[_sizes(photos).index(largest)].remote)
    with pytest.raises(ValueError, match=rf"{name} \({largest} bytes\).*raise the limit to at least {largest}"):
        images(photos, shard_cache=str(tmp_path / "c"), shard_cache_limit=largest - 1)
    with pytest.raises(ValueError, match=rf"{name} \({largest} bytes\).*at least {largest}"):
        fill_shard_cache(photos, str(tmp_path / "c"), largest - 1, progress=False)
    assert copies(tmp_path / "c") == set()


@pytest.mark.parametrize("reader", ["images", "episodes", "windows"])
def test_a_limit_without_a_cache_is_refused(photos, runs, reader):
    call = {"images": lambda: images(photos, shard_cache_limit="1GB"),
            "episodes": lambda: readers.episodes(runs, shard_cache_limit="1GB"),
            "windows": lambda: readers.windows(runs, batch_size=2, shard_cache_limit="1GB", **WINDOWS)}[reader]
    with pytest.raises(ValueError, match="shard_cache_limit='1GB' without shard_cache; pass shard_cache=DIR"):
        call()


def test_the_cli_fills_the_cache_and_a_reader_then_downloads_nothing(photos, photo_epochs, tmp_path, cli):
    directory = str(tmp_path / "c")
    result = cli("cache", photos, directory, "--limit", str(LIMIT))
    assert result.exit_code == 0, result.output
    total = sum(_sizes(photos))
    assert f"6 shards ({total / 1e6:,.1f} MB) cached and verified" in result.output
    assert copies(directory) == set(_shas(photos))
    again = cli("cache", photos, directory, "--limit", str(LIMIT))
    assert "0.0 MB downloaded" in again.output, again.output
    before = _store(directory).downloaded_bytes  # the CLI ran in this process, through the same store
    cached = epochs(images(photos, shard_cache=directory, shard_cache_limit=LIMIT), 1)
    assert_same_epochs(cached, photo_epochs[:1])
    assert _store(directory).downloaded_bytes == before
    fresh = ShardStore(directory, LIMIT, open_remote=_refuse)  # a new process's view: verified copies, no download
    assert all(fresh.fetch(shard) for shard in manifest_shards(photos))


def _refuse(path):
    raise AssertionError(f"{path}: downloaded, though a verified copy was there")


def test_a_fill_under_a_small_limit_reports_what_it_left_to_remote_reads(photos, tmp_path):
    limit = 3 * max(_sizes(photos))
    report = fill_shard_cache(photos, str(tmp_path / "c"), limit, progress=False)
    assert report.cached == len(copies(tmp_path / "c")) == 3
    assert len(report.not_cached) == 3 and "3 shards not cached" in report.lines()[1]
    assert _store(tmp_path / "c", limit).usage() <= limit


# --- LRU and pins ----------------------------------------------------------------------------------------------------


@pytest.fixture
def remote(tmp_path):
    return remote_shards(tmp_path / "remote")


def test_unpinned_copies_are_evicted_least_recently_used_first(remote, tmp_path):
    store = ShardStore(str(tmp_path / "c"), 3000)
    a, b, c, d, e = remote[:5]
    for shard in (a, b, c):
        fetched(store, shard)
    fetched(store, a)  # a is now the most recent
    fetched(store, d)
    assert copies(store.directory) == {a.sha256, c.sha256, d.sha256}
    fetched(store, e)
    assert copies(store.directory) == {a.sha256, d.sha256, e.sha256}
    assert store.usage() == 3000


def test_a_live_pipeline_keeps_its_copies(photos, remote, tmp_path):
    directory = str(tmp_path / "c")
    limit = sum(_sizes(photos)) + 3000  # room for three of the other shards beside the pipeline's
    ds = images(photos, shard_cache=directory, shard_cache_limit=limit)
    epochs(ds, 1)
    other = ShardStore(directory, limit)  # another reader of the folder, as another process would be
    assert [other.fetch(shard) is not None for shard in remote] == [True] * 3 + [False] * 5
    assert set(_shas(photos)) <= copies(directory)  # the pipeline's copies stayed; the others are read remotely
    for shard in remote[:3]:
        other.unpin(shard.sha256)
    del ds
    gc.collect()
    for shard in reversed(remote):  # the pipeline is gone: its copies are the least recently used now
        fetched(other, shard)
    assert {s.sha256 for s in remote} <= copies(directory)
    assert set(_shas(photos)) - copies(directory)


def test_two_stores_of_one_folder_in_one_process_keep_each_others_pins(remote, tmp_path):
    """A reader's limit None is 90% of the free disk, so two readers of one folder have stores of two limits."""
    directory = str(tmp_path / "c")
    first, second = ShardStore(directory, 2000), ShardStore(directory, 2001)
    kept = remote[0]
    assert first.fetch(kept) and second.fetch(kept)
    second.unpin(kept.sha256)  # the second reader is done; the first still reads it
    third = ShardStore(directory, 2000)
    third.fetch(remote[1])
    third.fetch(remote[2])
    assert kept.sha256 in copies(directory)


# --- the dataset replaced under a pipeline reading through the cache ----------------------------------------------


def _image_readers(out, directory):
    return {"images": images(out, shard_cache=directory, shard_cache_limit=LIMIT)}


def _episode_readers(out, directory):
    cache = {"shard_cache": directory, "shard_cache_limit": LIMIT}
    return {"episodes": readers.episodes(out, **cache),
            "streamed windows": readers.windows(out, resident=False, batch_size=4, **WINDOWS, **cache),
            "resident windows": readers.windows(out, batch_size=4, **WINDOWS, **cache)}


@pytest.mark.parametrize("kind", ["images", "episodes"])
def test_the_epoch_after_an_overwrite_fails_naming_the_dataset_instead_of_reading_the_old_copies(tmp_path, kind):
    """The copies are named by the sha256 the pipeline's manifest gave, so they stay the old dataset's: each epoch
    must check OUT still lists them (they were read silently before the epoch check)."""
    directory = str(tmp_path / "c")
    if kind == "images":
        out = photo_dataset(tmp_path)
        make_tree(str(tmp_path / "other"), per_class=12, seed=77)  # same names, other pixels
        rewrite = lambda: convert_image_tree(tmp_path / "other", out, num_shards=6, overwrite=True)  # noqa: E731
        pipelines = _image_readers(out, directory)
    else:
        out = convert_obs_episodes(tmp_path, [6, 9, 13, 7, 11, 6, 8, 10], seed=3, num_shards=4)
        other = convert_obs_episodes(tmp_path / "other", [6, 9, 13, 7, 11, 6, 8, 10], seed=4, num_shards=4)
        rewrite = lambda: convert_episode_tree(os.path.join(os.path.dirname(other), "src"), out,  # noqa: E731
                                               num_shards=4, overwrite=True)
        pipelines = _episode_readers(out, directory)
    for ds in pipelines.values():
        epochs(ds)
    old = copies(directory)
    rewrite()
    assert not set(_shas(out)) & old
    for ds in pipelines.values():
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{out}: the dataset changed since the pipeline"):
            epochs(ds, 1)
    assert copies(directory) == old  # nothing was fetched for the failed epochs
