"""The shard cache on local paths, through the real readers: the same data as without it, copies named by sha256, a
second epoch that downloads nothing, a folder that never holds more than its limit, and LRU eviction that never
takes a copy a live pipeline holds (``readers/shard_cache``)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, convert_image_tree, make_tree, read_manifest, save_episodes
from tfshard import readers
from tfshard.readers.shard_cache import pipeline
from tfshard.readers.shard_cache.store import Shard, ShardStore
from tfshard.readers.shard_cache.store import _host_tag as host_tag
from tfshard.tools.cache import fill_shard_cache

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_cache_child.py")
LIMIT = 10**6  # far above the ~26 KB of each dataset here: nothing is evicted unless a test says so
WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 seeded 16x16 JPEGs in two classes, in 6 shards of ~4 KB."""
    root = tmp_path_factory.mktemp("photos")
    make_tree(str(root / "src"), per_class=12)
    convert_image_tree(root / "src", root / "out", num_shards=6)
    return str(root / "out")


@pytest.fixture(scope="module")
def gzipped(tmp_path_factory):
    root = tmp_path_factory.mktemp("gzipped")
    make_tree(str(root / "src"), per_class=12, seed=100)
    convert_image_tree(root / "src", root / "out", num_shards=4, compression="gzip")
    return str(root / "out")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """16 episodes ``obs`` float32 [T, 2] (every value distinct) in 4 shards."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(3)
    save_episodes(root / "src", {f"runs/ep{i:02d}.npz": {"obs": rng.normal(size=(t, 2)).astype(np.float32)}
                                 for i, t in enumerate([6, 9, 13, 7, 11, 6, 8, 10] * 2)})
    convert_episode_tree(root / "src", root / "out", num_shards=4)
    return str(root / "out")


def _images(path, **kwargs):
    return readers.images(path, batch_size=4, image_size=(16, 16), seed=0, **kwargs)


def _epochs(ds, count=2) -> list[list]:
    """Every element of ``count`` epochs, as numpy (nested structures flattened), epoch by epoch."""
    return [[[np.asarray(x) for x in tf.nest.flatten(element)] for element in ds.as_numpy_iterator()]
            for _ in range(count)]


def _assert_same(actual: list, expected: list) -> None:
    assert len(actual) == len(expected) and len(expected[0]) > 0
    for epoch, (got, want) in enumerate(zip(actual, expected)):
        assert len(got) == len(want), f"epoch {epoch + 1}: {len(got)} elements, not {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"epoch {epoch + 1}, element {i} differs"


def _shas(path, split="train") -> list[str]:
    return [s["sha256"] for s in read_manifest(path)["splits"][split]["shards"]]


def _sizes(path, split="train") -> list[int]:
    return [s["bytes"] for s in read_manifest(path)["splits"][split]["shards"]]


def _copies(directory) -> set[str]:
    """The sha256s of the copies under ``DIR/shards``."""
    folder = os.path.join(directory, "shards")
    return {name.removesuffix(".tfrecord") for name in os.listdir(folder)} if os.path.isdir(folder) else set()


def _store(directory, limit=LIMIT) -> ShardStore:
    """The store the readers of this process use for ``directory`` and ``limit``."""
    return pipeline.store_for(str(directory), limit)


def _shards_of(path, split="train") -> list[Shard]:
    raw = read_manifest(path)["splits"][split]["shards"]
    return [Shard(s["sha256"], s["bytes"], os.path.join(path, s["file"])) for s in raw]


# --- the same data ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["photos", "gzipped"])
def test_images_are_the_same_batches_and_a_second_epoch_downloads_nothing(request, dataset, tmp_path):
    path = request.getfixturevalue(dataset)
    expected = _epochs(_images(path))
    directory = str(tmp_path / "cache")
    ds = _images(path, shard_cache=directory, shard_cache_limit=LIMIT)
    store = _store(directory)
    first = _epochs(ds, 1)
    assert _copies(directory) == set(_shas(path))
    assert store.downloaded_bytes == sum(_sizes(path))
    mtimes = {name: os.stat(os.path.join(directory, "shards", name)).st_mtime_ns
              for name in os.listdir(os.path.join(directory, "shards"))}
    second = _epochs(ds, 1)
    _assert_same(first + second, expected)
    assert store.downloaded_bytes == sum(_sizes(path))
    assert {name: os.stat(os.path.join(directory, "shards", name)).st_mtime_ns for name in mtimes} == mtimes
    assert os.listdir(os.path.join(directory, "parts")) == []


def _sorted_epochs(epochs: list[list]) -> list[list]:
    """Each epoch's elements in a fixed order: for readers whose shuffled order is not deterministic (their decode
    map is not), cache or no cache."""
    return [sorted(epoch, key=lambda element: b"".join(x.tobytes() for x in element)) for epoch in epochs]


def test_episodes_are_the_same_stream(runs, tmp_path):
    directory = str(tmp_path / "c")
    expected = _epochs(readers.episodes(runs))
    _assert_same(_epochs(readers.episodes(runs, shard_cache=directory, shard_cache_limit=LIMIT)), expected)
    assert _copies(directory) == set(_shas(runs))
    shuffled = readers.episodes(runs, shuffle_files=True, seed=0, shard_cache=directory, shard_cache_limit=LIMIT)
    _assert_same(_sorted_epochs(_epochs(shuffled)), _sorted_epochs(expected))


@pytest.mark.parametrize("resident", [True, False])
def test_windows_are_the_same_batches(runs, tmp_path, resident):
    # Streamed windows are deterministic unshuffled (their shuffle buffer follows the decode map's order).
    options = {"batch_size": 8, "seed": 0, "shuffle": resident, "resident": resident, "with_keys": True, **WINDOWS}
    expected = _epochs(readers.windows(runs, **options))
    directory = str(tmp_path / "c")
    ds = readers.windows(runs, shard_cache=directory, shard_cache_limit=LIMIT, **options)
    _assert_same(_epochs(ds), expected)
    assert _copies(directory) == set(_shas(runs))
    assert _store(directory).downloaded_bytes == sum(_sizes(runs))  # once, not once per epoch


def test_each_input_pipeline_caches_only_its_own_shards(photos, tmp_path):
    shas = _shas(photos)
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id)
        directory = str(tmp_path / f"c{pipeline_id}")
        expected = _epochs(_images(photos, input_context=context))
        _assert_same(_epochs(_images(photos, input_context=context, shard_cache=directory)), expected)
        assert _copies(directory) == set(shas[pipeline_id::2])


def test_a_resumed_stream_is_the_uncached_stream(photos, tmp_path):
    def batches(ds, count=5):
        iterator = iter(ds)
        return [[np.asarray(x) for x in next(iterator)] for _ in range(count)]

    expected = batches(_images(photos, repeat=True, start_step=4))
    got = batches(_images(photos, repeat=True, start_step=4, shard_cache=str(tmp_path / "c")))
    _assert_same([got], [expected])
    _assert_same([batches(_images(photos, repeat=True, shard_cache=str(tmp_path / "c")), 9)[4:]], [expected])


def test_a_tf_data_service_reads_every_record_through_the_cache(photos, tmp_path):
    from tfshard.readers import service as service_lib

    dispatcher = service_lib.start_dispatcher(0)
    worker = service_lib.start_worker(dispatcher.target, 0, "localhost:%port%")
    try:
        def keys(**kwargs):
            ds = readers.images(photos, batch_size=5, image_size=(16, 16), training=False, drop_remainder=False,
                                **kwargs)
            return sorted((int(label), image.tobytes()) for images, labels in ds
                          for image, label in zip(images.numpy(), labels.numpy()))

        expected = keys()
        directory = str(tmp_path / "c")
        for _ in range(2):
            assert keys(service=dispatcher.target, shard_cache=directory, shard_cache_limit=LIMIT) == expected
        assert _copies(directory) == set(_shas(photos))
        assert _store(directory).downloaded_bytes == sum(_sizes(photos))
    finally:
        worker.stop()
        dispatcher.stop()


# --- bounded ---------------------------------------------------------------------------------------------------------


def test_a_limit_of_half_the_dataset_is_never_exceeded_and_the_rest_is_read_remotely(photos, tmp_path):
    directory = str(tmp_path / "c")
    limit = sum(_sizes(photos)) // 2
    expected = _epochs(_images(photos))
    ds = _images(photos, shard_cache=directory, shard_cache_limit=limit)
    store = _store(directory, limit)
    highest, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            highest[0] = max(highest[0], store.usage(), _bytes_under(directory))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        got = _epochs(ds)
    finally:
        done.set()
        sampler.join()
    _assert_same(got, expected)
    assert 0 < highest[0] <= limit
    assert 0 < len(_copies(directory)) < len(_shas(photos))  # some local, the rest read remotely
    assert _copies(directory) <= set(_shas(photos))


def _bytes_under(directory) -> int:
    total = 0
    for folder, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # renamed or removed while we looked
                pass
    return total


def test_a_limit_below_the_largest_shard_is_refused_up_front(photos, tmp_path):
    largest = max(_sizes(photos))
    name = read_manifest(photos)["splits"]["train"]["shards"][_sizes(photos).index(largest)]["file"]
    with pytest.raises(ValueError, match=rf"{name} \({largest} bytes\).*raise the limit to at least {largest}"):
        _images(photos, shard_cache=str(tmp_path / "c"), shard_cache_limit=largest - 1)
    with pytest.raises(ValueError, match=rf"{name} \({largest} bytes\).*at least {largest}"):
        fill_shard_cache(photos, str(tmp_path / "c"), largest - 1, progress=False)
    assert _copies(tmp_path / "c") == set()


@pytest.mark.parametrize("reader", ["images", "episodes", "windows"])
def test_a_limit_without_a_cache_is_refused(photos, runs, reader):
    call = {"images": lambda: _images(photos, shard_cache_limit="1GB"),
            "episodes": lambda: readers.episodes(runs, shard_cache_limit="1GB"),
            "windows": lambda: readers.windows(runs, batch_size=2, shard_cache_limit="1GB", **WINDOWS)}[reader]
    with pytest.raises(ValueError, match="shard_cache_limit='1GB' without shard_cache; pass shard_cache=DIR"):
        call()


def test_the_cli_fills_the_cache_and_a_reader_then_downloads_nothing(photos, tmp_path, cli):
    directory = str(tmp_path / "c")
    result = cli("cache", photos, directory, "--limit", str(LIMIT))
    assert result.exit_code == 0, result.output
    total = sum(_sizes(photos))
    assert f"6 shards ({total / 1e6:,.1f} MB) cached and verified" in result.output
    assert _copies(directory) == set(_shas(photos))
    again = cli("cache", photos, directory, "--limit", str(LIMIT))
    assert "0.0 MB downloaded" in again.output, again.output
    before = _store(directory).downloaded_bytes  # the CLI ran in this process, through the same store
    cached = _epochs(_images(photos, shard_cache=directory, shard_cache_limit=LIMIT), 1)
    _assert_same(cached, _epochs(_images(photos), 1))
    assert _store(directory).downloaded_bytes == before
    fresh = ShardStore(directory, LIMIT, open_remote=_refuse)  # a new process's view: verified copies, no download
    assert all(fresh.fetch(shard) for shard in _shards_of(photos))


def _refuse(path):
    raise AssertionError(f"{path}: downloaded, though a verified copy was there")


def test_a_fill_under_a_small_limit_reports_what_it_left_to_remote_reads(photos, tmp_path):
    limit = 3 * max(_sizes(photos))
    report = fill_shard_cache(photos, str(tmp_path / "c"), limit, progress=False)
    assert report.cached == len(_copies(tmp_path / "c")) == 3
    assert len(report.not_cached) == 3 and "3 shards not cached" in report.lines()[1]
    assert _store(tmp_path / "c", limit).usage() <= limit


# --- LRU and pins ----------------------------------------------------------------------------------------------------


@pytest.fixture
def remote(tmp_path):
    """Eight 1000-byte "shards" on local disk, as ``Shard``s."""
    import hashlib

    shards = []
    for i in range(8):
        data = bytes([i]) * 1000
        path = tmp_path / "remote" / f"s{i}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        shards.append(Shard(hashlib.sha256(data).hexdigest(), 1000, str(path)))
    return shards


def _fetched(store, shard) -> str:
    found = store.fetch(shard)
    assert found is not None, f"{shard.remote} was not cached"
    store.unpin(shard.sha256)
    return found


def test_unpinned_copies_are_evicted_least_recently_used_first(remote, tmp_path):
    store = ShardStore(str(tmp_path / "c"), 3000)
    a, b, c, d, e = remote[:5]
    for shard in (a, b, c):
        _fetched(store, shard)
    _fetched(store, a)  # a is now the most recent
    _fetched(store, d)
    assert _copies(store.directory) == {a.sha256, c.sha256, d.sha256}
    _fetched(store, e)
    assert _copies(store.directory) == {a.sha256, d.sha256, e.sha256}
    assert store.usage() == 3000


def test_a_live_pipeline_keeps_its_copies(photos, remote, tmp_path):
    directory = str(tmp_path / "c")
    limit = sum(_sizes(photos)) + 3000  # room for three of the other shards beside the pipeline's
    ds = _images(photos, shard_cache=directory, shard_cache_limit=limit)
    _epochs(ds, 1)
    other = ShardStore(directory, limit)  # another reader of the folder, as another process would be
    assert [other.fetch(shard) is not None for shard in remote] == [True] * 3 + [False] * 5
    assert set(_shas(photos)) <= _copies(directory)  # the pipeline's copies stayed; the others are read remotely
    for shard in remote[:3]:
        other.unpin(shard.sha256)
    del ds
    gc.collect()
    for shard in reversed(remote):  # the pipeline is gone: its copies are the least recently used now
        _fetched(other, shard)
    assert {s.sha256 for s in remote} <= _copies(directory)
    assert set(_shas(photos)) - _copies(directory)


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
    assert kept.sha256 in _copies(directory)


def _pinning_child(directory, limit, shas) -> subprocess.Popen:
    """A live process that pins the copies of ``shas`` in ``directory`` until it is killed."""
    child = subprocess.Popen([sys.executable, CHILD, "pin", str(directory), str(limit), *shas],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_copy_another_live_process_pins_is_never_evicted_and_a_killed_ones_pins_do_not_count(remote, tmp_path):
    directory = str(tmp_path / "c")
    store = ShardStore(directory, 2000)
    kept = remote[0]
    _fetched(store, kept)
    child = _pinning_child(directory, 2000, [kept.sha256])
    try:
        assert os.listdir(os.path.join(directory, "pins")) == [f"{kept.sha256}.{child.pid}."
                                                              f"{_start(child.pid)}.{host_tag()}"]
        for shard in remote[1:5]:
            _fetched(store, shard)
        assert kept.sha256 in _copies(directory)
    finally:
        child.kill()
        child.wait()
    _fetched(store, remote[5])
    _fetched(store, remote[6])
    assert kept.sha256 not in _copies(directory)  # the dead process's pin was dropped, then its copy evicted
    assert os.listdir(os.path.join(directory, "pins")) == []


def _start(pid: int) -> str:
    from tfshard.format.owners import process_start

    return process_start(pid)
