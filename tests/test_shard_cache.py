"""The shard cache (``readers/shard_cache``): on local paths, through the real readers, the same data as without it,
copies named by sha256, a second epoch that downloads nothing, a folder that never holds more than its limit, and LRU
eviction that never takes a copy a live pipeline holds. Then its attacks: an untrusted cache folder, remotes that do
not match the manifest, processes that share the folder, die mid-download or hold pins (``store.py``); and on the
tf.data side, iterators abandoned mid-epoch, pipelines built and dropped by the dozen, checkpoints restored into fresh
readers, a cache folder that breaks or fills up mid-epoch, strategies, and two pipelines sharing one folder
(``pipeline.py``, ``ahead.py``). Each dataset is converted once for the module; tests only read it."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import shard_cache_helpers as shared
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    convert_image_tree,
    convert_obs_episodes,
    edit_manifest,
    make_tree,
    skip_unless_ci,
    snapshot,
    within,
)
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
from tfshard.readers.shard_cache.store import _host_tag as host_tag
from tfshard.tools.cache import fill_shard_cache

WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1}
KEYED_WINDOWS = {**WINDOWS, "batch_size": 8, "seed": 0, "with_keys": True}
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "shard_cache_child.py")
STORE_LOG = "tfshard.readers.shard_cache.store"
TIMEOUT_S = 60  # a guard against a hung read or pipeline, far above the second each takes
DEADLOCK_S = 20  # a collection takes well under a second


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_dataset(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def photo_epochs(photos):
    """Two epochs of the uncached reader of ``photos``."""
    return epochs(images(photos))


@pytest.fixture(scope="module")
def expected(photo_epochs):
    """The same two epochs, under the name the attacks use."""
    return photo_epochs


@pytest.fixture
def remote(tmp_path):
    return remote_shards(tmp_path / "remote")


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
    downloaded = _store(directory).downloaded_bytes
    rewrite()
    assert not set(_shas(out)) & old
    for ds in pipelines.values():
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{out}: the dataset changed since the pipeline"):
            epochs(ds, 1)
    assert copies(directory) == old and _store(directory).downloaded_bytes == downloaded  # nothing fetched


def test_a_pipeline_whose_dataset_is_overwritten_before_its_first_epoch_fetches_nothing(tmp_path):
    """A parallel stage pulling again after the failed epoch check went on into the reads: each shard was
    downloaded three times and discarded (its bytes were not the old manifest's) before the epoch's error."""
    out = photo_dataset(tmp_path)
    directory = str(tmp_path / "c")
    ds = images(out, shard_cache=directory, shard_cache_limit=LIMIT)
    make_tree(str(tmp_path / "other"), per_class=12, seed=77)
    convert_image_tree(tmp_path / "other", out, num_shards=6, overwrite=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{out}: the dataset changed since the pipeline"):
        epochs(ds, 1)
    assert _store(directory).downloaded_bytes == 0 and copies(directory) == set()


# --- attacks on the store: the folder, remotes, processes ----------------------------------------------------------


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _spec(shard) -> str:
    return f"{shard.sha256}:{shard.size}:{shard.remote}"


# --- the folder itself ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [shared.LIMIT, None])
def test_a_symlinked_folder_is_refused(photos, tmp_path, limit):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ValueError, match=r"shard_cache: .*link: a symlink, not a folder.*pass another shard_cache"):
        shared.images(photos, shard_cache=str(tmp_path / "link"), shard_cache_limit=limit)
    with pytest.raises(ValueError, match=r"link: a symlink, not a folder"):
        fill_shard_cache(photos, str(tmp_path / "link"), limit, progress=False)
    os.makedirs(tmp_path / "other" / "shards-target")
    os.makedirs(tmp_path / "inner")
    os.symlink(tmp_path / "other" / "shards-target", tmp_path / "inner" / "shards")  # one of its folders, too
    with pytest.raises(ValueError, match=r"inner/shards: a symlink, not a folder"):
        shared.images(photos, shard_cache=str(tmp_path / "inner"), shard_cache_limit=limit)
    assert os.listdir(tmp_path / "real") == [] and os.listdir(tmp_path / "other" / "shards-target") == []


@pytest.mark.parametrize("limit", [shared.LIMIT, None])
def test_a_url_or_a_file_is_refused_and_nothing_is_made(photos, tmp_path, monkeypatch, limit):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"shard_cache: gs://x: the shard cache is a local folder \(got a URL\)"):
        shared.images(photos, shard_cache="gs://x", shard_cache_limit=limit)
    with pytest.raises(ValueError, match=r"gs://x: the shard cache is a local folder \(got a URL\)"):
        fill_shard_cache(photos, "gs://x", limit, progress=False)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"file: a regular file, not a folder"):
        shared.images(photos, shard_cache=str(tmp_path / "file"), shard_cache_limit=limit)
    with pytest.raises(ValueError, match=r"file: a regular file, not a folder"):
        fill_shard_cache(photos, str(tmp_path / "file"), limit, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["file"]  # no local folder named like the URL


@contextlib.contextmanager
def _tmpfs(mount: str, size: str):
    """A tmpfs of ``size`` mounted at ``mount`` (made) while the block runs; the test skips where mounts are refused
    (fails under TFSHARD_CI=1)."""
    os.makedirs(mount)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        skip_unless_ci(f"cannot mount a tmpfs here ({e})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", mount], check=True)


@pytest.fixture
def read_only_disk(tmp_path):
    """A tmpfs remounted read-only, holding ``layout`` (a cache folder with its four folders) and ``empty``."""
    with _tmpfs(str(tmp_path / "ro"), "64k") as mount:
        for folder in ("shards", "parts", "locks", "pins"):
            os.makedirs(os.path.join(mount, "layout", folder))
        os.makedirs(os.path.join(mount, "empty"))
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True, capture_output=True)
        yield mount


@pytest.mark.parametrize("folder, problem", [("layout", "not writable"), ("empty", "not writable"),
                                             ("missing", r"cannot be made \(Read-only file system\)")])
@pytest.mark.parametrize("limit", [shared.LIMIT, None])
def test_a_folder_on_a_read_only_disk_is_refused_up_front_naming_it(photos, read_only_disk, folder, problem, limit):
    """Each read failed mid-epoch with a traceback (its pin could not be written) where the layout existed."""
    directory = os.path.join(read_only_disk, folder)
    said = rf"{directory}: {problem}.*pass a shard_cache folder on a writable local disk"
    with pytest.raises(ValueError, match=rf"shard_cache: {said}"):
        shared.images(photos, shard_cache=directory, shard_cache_limit=limit)
    with pytest.raises(ValueError, match=said):
        fill_shard_cache(photos, directory, limit, progress=False)


# --- what is planted under the shards' names ---------------------------------------------------------------------


def _plant(kind: str, path: str, shard, outside: str) -> None:
    """Puts something that is not a verified copy of ``shard`` at ``path`` (its name in ``shards/``)."""
    if kind == "symlink":  # to a file outside DIR that even has the shard's bytes
        with open(shard.remote, "rb") as source, open(outside, "wb") as f:
            f.write(source.read())
        os.symlink(outside, path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        os.makedirs(os.path.join(path, "inside"))
        with open(os.path.join(path, "inside", "note"), "w") as f:
            f.write("planted")
    elif kind == "wrong size":
        with open(path, "wb") as f:
            f.write(b"x" * (shard.size + 7))
    elif kind == "same size, other bytes":
        with open(shard.remote, "rb") as source:
            data = bytearray(source.read())
        data[len(data) // 2] ^= 0xFF
        with open(path, "wb") as f:
            f.write(bytes(data))
    else:
        raise AssertionError(kind)


KINDS = ["symlink", "fifo", "folder", "wrong size", "same size, other bytes"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_copy_is_never_read_and_is_replaced(remote, tmp_path, kind, caplog):
    store = ShardStore(str(tmp_path / "c"), shared.LIMIT)
    shard, outside = remote[0], str(tmp_path / "outside")
    _plant(kind, store.path(shard.sha256), shard, outside)
    before = snapshot(tmp_path, skip=("c",))
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        found = within(TIMEOUT_S, store.fetch, shard)
    assert found == store.path(shard.sha256)
    assert os.path.isfile(found) and not os.path.islink(found) and _sha(found) == shard.sha256
    assert store.downloaded_bytes == shard.size  # the planted thing was not taken for the copy
    assert f"{found}: the cached copy " in caplog.text and "; replacing it" in caplog.text
    assert snapshot(tmp_path, skip=("c",)) == before  # nothing outside DIR changed
    assert os.listdir(tmp_path / "c" / "parts") == []


def test_a_reader_reads_past_every_kind_of_planted_copy(photos, expected, tmp_path):
    directory = str(tmp_path / "c")
    shards = shared.manifest_shards(photos)
    store = ShardStore(directory, shared.LIMIT)
    for i, (kind, shard) in enumerate(zip(KINDS, shards)):
        _plant(kind, store.path(shard.sha256), shard, str(tmp_path / f"outside-{i}"))
    before = snapshot(tmp_path, skip=("c",))
    ds = shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT)
    got = within(TIMEOUT_S, shared.epochs, ds)
    shared.assert_same_epochs(got, expected)
    assert snapshot(tmp_path, skip=("c",)) == before
    for shard in shards:
        assert _sha(store.path(shard.sha256)) == shard.sha256 and not os.path.islink(store.path(shard.sha256))


def test_files_under_unknown_names_are_left_alone_and_evicted_symlinks_leave_their_targets(remote, tmp_path):
    store = ShardStore(str(tmp_path / "c"), 3000)
    shards_folder = tmp_path / "c" / "shards"
    (shards_folder / "notes.txt").write_bytes(b"n" * 5000)  # larger than the limit: not ours, not counted
    (shards_folder / f"{remote[0].sha256}.tfrecord.bak").write_bytes(b"b")
    (tmp_path / "c" / "mine").write_bytes(b"m")
    target = tmp_path / "precious"
    target.write_bytes(b"p" * 1000)
    os.symlink(target, shards_folder / f"{'0' * 64}.tfrecord")  # a symlink under a copy's name: an LRU victim
    os.symlink(target, tmp_path / "c" / "parts" / f"{remote[1].sha256}.part")  # and under a download's
    for shard in remote[:6]:
        shared.fetched(store, shard)
    assert shared.copies(store.directory) - {"notes.txt", f"{remote[0].sha256}.tfrecord.bak"} == {
        s.sha256 for s in remote[3:6]}
    assert (shards_folder / "notes.txt").read_bytes() == b"n" * 5000
    assert (shards_folder / f"{remote[0].sha256}.tfrecord.bak").read_bytes() == b"b"
    assert (tmp_path / "c" / "mine").read_bytes() == b"m"
    assert target.read_bytes() == b"p" * 1000


@pytest.mark.parametrize("lock", ["shard", "folder"])
@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_planted_lock_is_named_and_its_target_left_alone(remote, tmp_path, lock, kind):
    """A lock other processes may hold cannot be replaced safely, so a planted one is an error that names it."""
    store = ShardStore(str(tmp_path / "c"), shared.LIMIT)
    shard, target = remote[0], tmp_path / "outside"
    target.write_bytes(b"precious")
    path = os.path.join(store.directory, "locks", f"{shard.sha256 if lock == 'shard' else 'folder'}.lock")
    {"symlink": lambda: os.symlink(target, path), "fifo": lambda: os.mkfifo(path), "folder": lambda: os.mkdir(path)}[
        kind]()
    with pytest.raises(ValueError, match=rf"{path}: a {'FIFO' if kind == 'fifo' else kind}, not a lock file; remove"):
        within(TIMEOUT_S, store.fetch, shard)
    assert target.read_bytes() == b"precious"
    assert os.listdir(tmp_path / "c" / "pins") == []  # the failed fetch let its pin go


def test_a_part_file_swapped_for_a_hard_link_mid_download_is_never_written(remote, tmp_path):
    """Someone who can write in DIR swaps a download's part file for a hard link to their file outside it while the
    first attempt reads: the retry must not write through the name into that file, nor take it for the copy."""
    shard, outside, directory = remote[0], tmp_path / "precious", tmp_path / "c"
    outside.write_bytes(b"p" * shard.size)
    opens = []

    def open_remote(path):
        opens.append(path)
        if len(opens) == 1:
            part = directory / "parts" / f"{shard.sha256}.part"
            os.unlink(part)
            os.link(outside, part)
            raise ConnectionResetError("the first attempt fails")
        return open(path, "rb")

    store = ShardStore(str(directory), shared.LIMIT, open_remote=open_remote)
    assert store.fetch(shard) is None  # read remotely: the folder is not trustworthy just now
    assert outside.read_bytes() == b"p" * shard.size and os.stat(outside).st_nlink == 1
    assert shared.copies(directory) == set() and os.listdir(directory / "parts") == []


def test_a_pin_that_failed_does_not_count(remote, tmp_path):
    store = ShardStore(str(tmp_path / "c"), shared.LIMIT)
    shard, lock = remote[0], tmp_path / "c" / "locks" / "folder.lock"
    os.mkfifo(lock)
    with pytest.raises(ValueError, match="not a lock file; remove it"):
        within(TIMEOUT_S, store.fetch, shard)
    os.unlink(lock)  # the folder's owner removes it, as the error says
    assert store.fetch(shard) == store.path(shard.sha256)
    assert [name.split(".")[0] for name in os.listdir(tmp_path / "c" / "pins")] == [shard.sha256]  # held on disk
    store.unpin(shard.sha256)
    assert os.listdir(tmp_path / "c" / "pins") == []  # released: the failed pin left no count behind


# --- remotes that do not match the manifest ------------------------------------------------------------------------


class _Counting:
    """An ``open_remote`` that serves ``data`` for every path and counts the opens."""

    def __init__(self, data: bytes):
        self.data, self.opens = data, 0

    def __call__(self, path):
        import io

        self.opens += 1
        return io.BytesIO(self.data)


@pytest.mark.parametrize("served", ["other bytes", "short", "longer"])
def test_a_remote_that_does_not_match_is_retried_then_read_remotely_and_nothing_is_kept(remote, tmp_path, caplog,
                                                                                     served):
    shard = remote[0]
    data = {"other bytes": b"z" * shard.size, "short": b"\0" * (shard.size - 1),
            "longer": b"\0" * shard.size + b"tail"}[served]
    opener = _Counting(data)
    store = ShardStore(str(tmp_path / "c"), shared.LIMIT, attempts=3, open_remote=opener)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        assert store.fetch(shard) is None
    assert opener.opens == 3
    assert "could not cache it after 3 attempts" in caplog.text and "reading it remotely" in caplog.text
    assert shared.copies(store.directory) == set() and os.listdir(tmp_path / "c" / "parts") == []
    assert os.listdir(tmp_path / "c" / "pins") == []


def test_a_reader_on_a_shard_that_no_longer_matches_its_manifest_reads_it_remotely(tmp_path, caplog):
    path = shared.photo_dataset(tmp_path)
    expected_ = shared.epochs(shared.images(path), 1)
    wrong = "f" * 64

    def change(raw):
        raw["splits"]["train"]["shards"][0]["sha256"] = wrong

    edit_manifest(path, change)
    directory = str(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        got = shared.epochs(shared.images(path, shard_cache=directory, shard_cache_limit=shared.LIMIT), 1)
    shared.assert_same_epochs(got, expected_)
    assert "train-00000-of-00006.tfrecord: could not cache it after 3 attempts" in caplog.text
    assert shared.copies(directory) == {s.sha256 for s in shared.manifest_shards(path)[1:]}
    assert os.listdir(os.path.join(directory, "parts")) == []


def test_a_cache_folder_removed_between_epochs_is_made_again_and_its_copies_pinned(photos, expected, tmp_path):
    """Someone frees the disk (``rm -rf DIR``) while a job runs: the next epoch is the same, fetched again."""
    import shutil

    directory = str(tmp_path / "c")
    ds = shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT)
    first = shared.epochs(ds, 1)
    shutil.rmtree(directory)
    shared.assert_same_epochs(first + shared.epochs(ds, 1), expected)
    assert shared.copies(directory) == {s.sha256 for s in shared.manifest_shards(photos)}
    pinned = {name.split(".")[0] for name in os.listdir(os.path.join(directory, "pins"))}
    assert pinned == shared.copies(directory)  # the live pipeline's pins are on disk again, for other processes


# --- concurrent fetches and processes -----------------------------------------------------------------------------


def test_concurrent_fetches_never_cache_more_than_the_limit(tmp_path):
    """Eight threads fetch sixteen shards into room for three, many times over: a download finishing while another
    fetch takes the usage must not let a fourth in (every copy stays pinned, so none can be evicted). 200 trials (each
    a fresh folder and 128 racing fetches)."""
    shards = shared.remote_shards(tmp_path / "remote", 16)
    for trial in range(200):
        store = ShardStore(str(tmp_path / f"c{trial}"), 3000)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            found = list(pool.map(store.fetch, shards))
        cached = shared.copies(store.directory)
        assert sum(path is not None for path in found) == 3, f"trial {trial}: {len(cached)} copies"
        assert store.usage() == 3000


def test_two_processes_fetching_the_same_shards_download_each_once(remote, tmp_path):
    directory = str(tmp_path / "c")
    specs = [_spec(s) for s in remote[:4]]
    children = [subprocess.Popen([sys.executable, CHILD, "fetch", directory, str(shared.LIMIT), *order],
                                 stdout=subprocess.PIPE, text=True) for order in (specs, specs[::-1])]
    outputs = [child.communicate(timeout=TIMEOUT_S)[0].split() for child in children]
    assert [child.returncode for child in children] == [0, 0]
    assert sum(int(downloaded) for downloaded, _ in outputs) == 4 * 1000  # each shard once, by one of them
    assert [int(got) for _, got in outputs] == [4, 4]  # and both have every copy
    assert shared.copies(directory) == {s.sha256 for s in remote[:4]}
    assert os.listdir(os.path.join(directory, "parts")) == []


def _slow_downloader(directory, shard, limit=shared.LIMIT) -> subprocess.Popen:
    """A child downloading ``shard`` slowly into ``directory``, once its part file is there."""
    child = subprocess.Popen([sys.executable, CHILD, "slow", directory, str(limit), _spec(shard)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        part = os.path.join(directory, "parts", f"{shard.sha256}.part")
        deadline = time.monotonic() + TIMEOUT_S
        while not os.path.exists(part):
            assert time.monotonic() < deadline and child.poll() is None, "the child never started its download"
            time.sleep(0.01)
    except BaseException:
        _kill(child)
        raise
    return child


def _kill(child: subprocess.Popen) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def _killed_mid_download(directory, shard, limit=shared.LIMIT) -> None:
    """Starts a child downloading ``shard`` slowly and SIGKILLs it while it writes the part file."""
    child = _slow_downloader(directory, shard, limit)
    time.sleep(0.2)  # a few chunks in
    _kill(child)
    assert os.path.getsize(os.path.join(directory, "parts", f"{shard.sha256}.part")) == shard.size  # reserved
    assert shard.sha256 not in shared.copies(directory)


def test_a_download_killed_mid_file_leaves_no_copy_and_the_next_reader_recovers(photos, expected, tmp_path, caplog):
    directory = str(tmp_path / "c")
    shard = shared.manifest_shards(photos)[0]
    _killed_mid_download(directory, shard)
    with caplog.at_level(logging.INFO, logger=STORE_LOG):
        got = shared.epochs(shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT))
    shared.assert_same_epochs(got, expected)
    assert "removing a partial download left by a process that is gone" in caplog.text
    assert os.listdir(os.path.join(directory, "parts")) == []
    assert shared.copies(directory) == {s.sha256 for s in shared.manifest_shards(photos)}
    assert _sha(ShardStore(directory, shared.LIMIT).path(shard.sha256)) == shard.sha256


def test_a_killed_downloads_part_does_not_take_the_room_its_shard_needs(remote, tmp_path):
    directory, shard = str(tmp_path / "c"), remote[0]
    _killed_mid_download(directory, shard, limit=shard.size)
    store = ShardStore(directory, shard.size)  # room for exactly this one shard
    assert shared.fetched(store, shard) == store.path(shard.sha256)
    assert os.listdir(os.path.join(directory, "parts")) == []


def test_a_fetch_waiting_on_another_processs_download_reads_remotely_or_takes_over_when_it_dies(tmp_path, caplog):
    directory = str(tmp_path / "c")
    shard = shared.remote_shards(tmp_path / "remote", 1, 4000)[0]  # 63 chunks, 3 s at the child's pace
    child = _slow_downloader(directory, shard)
    try:
        impatient = ShardStore(directory, shared.LIMIT, wait_s=0.1)
        with caplog.at_level(logging.WARNING, logger=STORE_LOG):
            assert impatient.fetch(shard) is None
        assert "another process has been downloading it for over 0 s; reading it remotely" in caplog.text
        waiting = ShardStore(directory, shared.LIMIT)
        result = []
        waiter = threading.Thread(target=lambda: result.append(waiting.fetch(shard)), daemon=True)
        waiter.start()
    finally:
        _kill(child)
    waiter.join(TIMEOUT_S)
    assert result == [waiting.path(shard.sha256)] and _sha(result[0]) == shard.sha256
    assert waiting.downloaded_bytes == shard.size and os.listdir(os.path.join(directory, "parts")) == []


def _pinning_child(directory, limit, shas) -> subprocess.Popen:
    """A live process that pins the shared.copies of ``shas`` in ``directory`` until it is killed."""
    child = subprocess.Popen([sys.executable, CHILD, "pin", str(directory), str(limit), *shas],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_copy_another_live_process_pins_is_never_evicted_and_a_killed_ones_pins_do_not_count(remote, tmp_path):
    from tfshard.format.owners import process_start

    directory = str(tmp_path / "c")
    store = ShardStore(directory, 2000)
    kept = remote[0]
    shared.fetched(store, kept)
    child = _pinning_child(directory, 2000, [kept.sha256])
    try:
        assert os.listdir(os.path.join(directory, "pins")) == [
            f"{kept.sha256}.{child.pid}.{process_start(child.pid)}.{host_tag()}"]
        for shard in remote[1:5]:
            shared.fetched(store, shard)
        assert kept.sha256 in shared.copies(directory)
    finally:
        child.kill()
        child.wait()
    shared.fetched(store, remote[5])
    shared.fetched(store, remote[6])
    assert kept.sha256 not in shared.copies(directory)  # the dead process's pin was dropped, then its copy evicted
    assert os.listdir(os.path.join(directory, "pins")) == []


# --- lying neighbours, stops and leaks (issue 30) -----------------------------------------------------------------


def _liar(photos, root, shard_index: int = 0, by: int = 7) -> str:
    """A copy of the dataset ``photos`` whose manifest gives shard ``shard_index``'s sha256 ``by`` bytes more."""
    liar = str(root / "liar")
    shutil.copytree(photos, liar)

    def change(raw):
        raw["splits"]["train"]["shards"][shard_index]["bytes"] += by
        raw["splits"]["train"]["bytes"] += by  # consistent in itself: only the shard's file says otherwise

    edit_manifest(liar, change)
    return liar


def test_a_fill_whose_manifest_gives_a_shard_a_petabyte_names_the_lie_not_the_limit(photos, tmp_path, cli):
    """The limit was weighed against the manifest's size alone: "raise the limit to at least 10**15 bytes"."""
    liar = _liar(photos, tmp_path, by=10**15)
    result = cli("cache", liar, str(tmp_path / "c"), "--limit", str(shared.LIMIT))
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert "train-00000-of-00006.tfrecord: shard of split 'train' is not the size the manifest says" in result.stderr
    assert "raise the limit" not in result.stderr and not copies(tmp_path / "c")


@pytest.mark.parametrize("reader", ["a live reader", "none"])
def test_a_manifest_giving_a_copys_sha256_another_size_never_removes_it(photos, expected, tmp_path, reader, caplog):
    """``tfshard cache`` of a second dataset whose manifest gives a cached shard's sha256 with another size: the
    verified copy stays, pinned by a live reader of the first dataset or not, and that reader's epochs go on."""
    directory = str(tmp_path / "c")
    first = shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT)
    got = shared.epochs(first, 1)
    if reader == "none":
        del first
    shard = shared.manifest_shards(photos)[0]
    copy = ShardStore(directory, shared.LIMIT).path(shard.sha256)
    inode = os.stat(copy).st_ino
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        report = fill_shard_cache(_liar(photos, tmp_path), directory, shared.LIMIT, progress=False)
    assert os.stat(copy).st_ino == inode and _sha(copy) == shard.sha256  # the same verified copy, never removed
    assert report.cached == 5 and report.not_cached[0].endswith("train-00000-of-00006.tfrecord")
    assert "the manifest is wrong (the copy is kept" in caplog.text
    if reader != "none":
        store = ShardStore(directory, shared.LIMIT)
        downloaded = store.downloaded_bytes
        got += shared.epochs(first, 1)
        shared.assert_same_epochs(got, expected)
        assert store.downloaded_bytes == downloaded  # its second epoch read its copies: nothing downloaded again


def test_a_folder_lock_held_too_long_is_an_error_naming_it_never_a_hang(remote, tmp_path):
    directory = str(tmp_path / "c")
    child = _holding_child(directory, ["folder"])
    try:
        store = ShardStore(directory, shared.LIMIT, wait_s=0.5)
        lock = os.path.join(store.directory, "locks", "folder.lock")
        with pytest.raises(TimeoutError, match=rf"{lock}: another process has held the shard cache's folder lock for "
                                               r"over 0 s .*; find it with `fuser"):
            within(TIMEOUT_S, store.fetch, remote[0])
    finally:
        _kill(child)
    assert os.listdir(os.path.join(directory, "pins")) == []
    assert shared.fetched(store, remote[0]) == store.path(remote[0].sha256)  # free again: it goes on


def _holding_child(directory, names) -> subprocess.Popen:
    """A live process holding the locks ``names`` (sha256s, or "folder") of ``directory``, as a downloader does."""
    child = subprocess.Popen([sys.executable, CHILD, "hold", str(directory), str(shared.LIMIT), *names],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_lock_files_are_removed_and_never_let_two_fetches_download_one_shard(remote, tmp_path):
    """Each fetch is a store of its own (its own lock descriptors, as another process has), eight at once on one
    shard, many times: exactly one downloads it, and no shard's lock file is left (nor one an older version left)."""
    directory = str(tmp_path / "c")
    stale = os.path.join(ShardStore(directory, shared.LIMIT).directory, "locks", f"{remote[-1].sha256}.lock")
    open(stale, "w").close()
    for trial, shard in enumerate(remote[:6]):
        stores = [ShardStore(directory, shared.LIMIT) for _ in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            found = list(pool.map(ShardStore.fetch, stores, [shard] * len(stores)))
        assert found == [stores[0].path(shard.sha256)] * 8, f"trial {trial}"
        assert sum(store.downloaded_bytes for store in stores) == shard.size, f"trial {trial}: downloaded twice"
        for store in stores:
            store.unpin(shard.sha256)
    assert os.listdir(os.path.join(directory, "locks")) == ["folder.lock"]


def test_a_fill_that_fails_lets_go_of_every_copy_it_pinned(photos, tmp_path):
    """A fetch fails (a planted lock) while the others have pinned their copies: the fill's error is raised, and no
    pin of this process is left behind (a long-lived process calling fill_shard_cache again would keep them)."""
    directory = str(tmp_path / "c")
    shards = shared.manifest_shards(photos)
    store = ShardStore(directory, shared.LIMIT)
    os.symlink(tmp_path / "outside", os.path.join(store.directory, "locks", f"{shards[0].sha256}.lock"))
    with pytest.raises(ValueError, match="a symlink, not a lock file; remove it"):
        within(TIMEOUT_S, lambda: fill_shard_cache(photos, directory, shared.LIMIT, fetches=1, progress=False))
    assert os.listdir(os.path.join(directory, "pins")) == []


def _foreign_pin(directory, sha256: str, age_s: float) -> str:
    """A pin file of a process on another host, last renewed ``age_s`` seconds ago."""
    path = os.path.join(directory, "pins", f"{sha256}.4242.123456.{host_tag('another-host.example')}")
    open(path, "w").close()
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


@pytest.mark.parametrize("dead_age_s", [3 * 3600, -3 * 3600], ids=["not renewed for 3 hours", "3 hours ahead"])
def test_a_pin_of_another_host_counts_until_its_lease_runs_out(remote, tmp_path, dead_age_s):
    """This host cannot see whether another host's process runs: its pin holds while it was renewed within the
    lease (an hour), and one not renewed for three hours is a dead process's. So is one dated three hours ahead:
    no host's clock is that far off (it is planted), and counted live it kept its copy forever."""
    directory = str(tmp_path / "c")
    store = ShardStore(directory, 2000)
    shared.fetched(store, remote[0])
    shared.fetched(store, remote[1])
    dead = _foreign_pin(directory, remote[0].sha256, dead_age_s)
    live = _foreign_pin(directory, remote[1].sha256, 60)
    shared.fetched(store, remote[2])
    shared.fetched(store, remote[3])
    assert shared.copies(directory) == {remote[1].sha256, remote[3].sha256}
    assert not os.path.exists(dead) and os.path.exists(live)


@pytest.mark.parametrize("kind", ["folder", "folder with a file", "symlink", "fifo"])
@pytest.mark.parametrize("whose", ["a dead pid of this host", "another host, not renewed"])
def test_a_dead_pin_planted_as_a_folder_or_link_is_removed_and_its_copy_evicted(remote, tmp_path, kind, whose):
    """A dead pin is removed whatever is under its name (a folder made the eviction fail with IsADirectoryError);
    a symlink goes, never its target."""
    directory = str(tmp_path / "c")
    store = ShardStore(directory, 2000)
    shared.fetched(store, remote[0])
    shared.fetched(store, remote[1])
    host = host_tag() if whose.startswith("a dead pid") else host_tag("another-host.example")
    pin = os.path.join(directory, "pins", f"{remote[0].sha256}.999999999.1.{host}")
    target = tmp_path / "target"
    target.write_text("kept")
    {"folder": os.mkdir, "folder with a file": os.mkdir, "symlink": lambda p: os.symlink(target, p),
     "fifo": os.mkfifo}[kind](pin)
    if kind == "folder with a file":
        open(os.path.join(pin, "inside"), "w").close()
    os.utime(pin, (0, 0), follow_symlinks=False)
    assert within(TIMEOUT_S, store.fetch, remote[2]) == store.path(remote[2].sha256)  # remote[0] evicted for it
    assert shared.copies(directory) == {remote[1].sha256, remote[2].sha256}
    assert not os.path.lexists(pin) and target.read_text() == "kept"


def test_a_live_process_renews_its_pins(remote, tmp_path):
    """Each quarter lease, a process sets its pins' mtimes to now, so other hosts never take them for dead."""
    directory = str(tmp_path / "c")
    store = ShardStore(directory, shared.LIMIT, pin_lease_s=0.4)
    assert store.fetch(remote[0]) is not None
    (pin,) = [os.path.join(directory, "pins", name) for name in os.listdir(os.path.join(directory, "pins"))]
    os.utime(pin, (0, 0))
    deadline = time.monotonic() + TIMEOUT_S
    while os.stat(pin).st_mtime < time.time() - 3600:
        assert time.monotonic() < deadline, "the pin was never renewed"
        time.sleep(0.05)
    store.unpin(remote[0].sha256)
    assert os.listdir(os.path.join(directory, "pins")) == []


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_tfshard_cache_stops_at_once_while_another_process_holds_the_shard_locks(photos, tmp_path, signum, code, said):
    """Another live process holds every shard's lock (downloading them, as far as anyone can tell): ``tfshard cache``
    waits for it, then SIGTERM or Ctrl-C stops it at once (not after its fetches' 10-minute waits), its one line
    said, nothing of it left in the folder."""
    directory = str(tmp_path / "c")
    holder = _holding_child(directory, [s.sha256 for s in shared.manifest_shards(photos)])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    cache = subprocess.Popen([sys.executable, "-m", "tfshard", "cache", photos, directory, "--limit", "1MB"],
                             cwd=os.path.dirname(os.path.dirname(CHILD)), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        pins = os.path.join(directory, "pins")
        deadline = time.monotonic() + 120
        while not [name for name in os.listdir(pins) if f".{cache.pid}." in name]:  # it waits on the locks now
            assert cache.poll() is None, cache.communicate()
            assert time.monotonic() < deadline, "tfshard cache never started its fetches"
            time.sleep(0.05)
        cache.send_signal(signum)
        _, stderr = cache.communicate(timeout=TIMEOUT_S)
    finally:
        if cache.poll() is None:
            cache.kill()
            cache.wait()
        _kill(holder)
    assert cache.returncode == code, stderr
    assert stderr.strip().splitlines() == [f"{photos}: cache: {said}"]
    assert os.listdir(pins) == [] and os.listdir(os.path.join(directory, "parts")) == []


def test_a_worker_reads_hold_runs_out_when_its_read_never_starts(remote, tmp_path):
    """A service worker's fetch whose read never has a first record (its iterator dropped first): its pin goes when
    its hold runs out; a wait after that fetches the copy again, pinned anew (``holds.py``)."""
    from tfshard.readers.shard_cache.holds import ReadHolds

    store, holds = ShardStore(str(tmp_path / "c"), shared.LIMIT), ReadHolds(hold_s=0.2)
    shard = remote[0]
    found = holds.fetch(store, "job", shard)
    assert found == store.path(shard.sha256) and len(os.listdir(tmp_path / "c" / "pins")) == 1
    deadline = time.monotonic() + TIMEOUT_S
    while holds.held() or os.listdir(tmp_path / "c" / "pins"):
        assert time.monotonic() < deadline, "the hold never ran out"
        time.sleep(0.05)
    assert holds.waited(store, "job", shard, found) == found and holds.held() == 1  # pinned again for its read
    holds.release("job", shard.sha256)
    holds.release("job", shard.sha256)  # a second release of one read lets go of nothing more
    assert holds.held() == 0 and os.listdir(tmp_path / "c" / "pins") == []


# --- attacks on the pipeline side -----------------------------------------------------------------------------------


def _in_order(path, directory):
    """One record a batch, in manifest order, one file at a time: an iterator stopped after its first batch leaves
    the fetch-ahead buffer's tickets untaken (a training reader's shuffle buffer reads the tiny dataset whole)."""
    return readers.images(path, batch_size=1, image_size=(16, 16), training=False, num_parallel_reads=1,
                          shard_cache=directory, shard_cache_limit=shared.LIMIT)


def _session(directory):
    found = [s for s in list(pipeline._sessions.values()) if s.cache.directory == os.path.abspath(directory)]
    assert len(found) == 1, f"expected one live pipeline of {directory}, got {len(found)}"
    return found[0]


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tfshard-fetch-")]


def _live_pools_threads() -> int:
    """The most fetch threads the pools of live pipelines may run."""
    return sum(pool.threads for pool in list(pipeline._pools.values()))


def _fetch_threads_left() -> int:
    """Fetch threads running once those of closed pools have had ``TIMEOUT_S`` to end (they end on their own)."""
    deadline = time.monotonic() + TIMEOUT_S
    while len(_fetch_threads()) > _live_pools_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(_fetch_threads())


def _pins(directory) -> list[str]:
    return os.listdir(os.path.join(str(directory), "pins"))


def _batches(iterator, count: int) -> list[list[np.ndarray]]:
    return [[np.asarray(x) for x in next(iterator)] for _ in range(count)]


# --- iterators and pipelines dropped ------------------------------------------------------------------------------


@pytest.mark.slow
def test_abandoned_epochs_leave_a_bounded_number_of_tickets_threads_and_pins(photos, tmp_path):
    directory = str(tmp_path / "c")
    ds = _in_order(photos, directory)
    abandoned = 16
    for _ in range(abandoned):
        iterator = iter(ds)
        next(iterator)
        del iterator
        gc.collect()
    session = _session(directory)
    pool = pipeline._pools[session.id]
    # Each abandoned epoch leaves its fetch-ahead tickets untaken: kept, they grew by ~3 an epoch while ds lived.
    assert len(pool._pending) < abandoned
    assert len(_fetch_threads()) <= _live_pools_threads()
    assert len(_pins(directory)) <= len(shared.manifest_shards(photos))
    key = session.id
    del ds, session, pool
    gc.collect()
    # A fetch thread finishing the ticket it had taken holds the pool until that fetch ends: wait for it (bounded).
    deadline = time.monotonic() + 60
    while (key in pipeline._pools or key in pipeline._sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert key not in pipeline._pools and key not in pipeline._sessions
    assert _pins(directory) == []  # the dataset is gone: nothing of it is pinned
    assert _fetch_threads_left() <= _live_pools_threads()


def test_pipelines_built_and_dropped_by_the_dozen_leave_no_threads_sessions_or_pins(photos, tmp_path):
    directory = str(tmp_path / "c")
    for _ in range(12):
        next(iter(_in_order(photos, directory)))

    def sessions_left() -> list:
        return [s for s in list(pipeline._sessions.values()) if s.cache.directory == directory]

    # A dropped iterator's last references go with tf.data's own threads, which may still be ending: the sessions
    # must all go within TIMEOUT_S (one stayed a moment past a single collection under load).
    deadline = time.monotonic() + TIMEOUT_S
    gc.collect()
    while sessions_left() and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert not sessions_left()
    assert set(pipeline._pools) <= set(pipeline._sessions.keys())  # every pool left is a live pipeline's
    assert _pins(directory) == []
    assert _fetch_threads_left() <= _live_pools_threads()


@pytest.mark.parametrize("held", ["registry", "pins"])
def test_a_pipeline_collected_while_its_thread_holds_a_cache_lock_does_not_deadlock(photos, tmp_path, held):
    """The GC runs a dropped pipeline's finalizer (which unpins its copies and closes its fetch threads) on whatever
    allocation triggers it: inside the cache's own locks too, such as a fetch thread counting downloaded bytes or
    another pipeline registering its threads."""
    directory = str(tmp_path / "c")
    ds = shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT)
    next(iter(ds))
    key = _session(directory).id
    lock = pipeline._registry_lock if held == "registry" else pipeline.store_for(directory, shared.LIMIT)._lock
    collected = threading.Event()

    def collect():
        with lock:
            gc.collect()
        collected.set()

    gc.disable()  # the pipeline is freed only by the collection below, inside the lock
    try:
        garbage = [ds]
        garbage.append(garbage)
        del ds, garbage
        assert key in pipeline._sessions
        threading.Thread(target=collect, daemon=True).start()
        if not collected.wait(DEADLOCK_S):
            lock.release()  # lets the finalizer stuck on it go on, so the rest of the run is not blocked
            pytest.fail(f"the finalizer of a pipeline collected inside the {held} lock deadlocked")
    finally:
        gc.enable()
    assert key not in pipeline._sessions and _pins(directory) == []


# --- checkpoints ----------------------------------------------------------------------------------------------------


def _resumable(path, directory):
    return shared.images(path, repeat=True, shard_cache=directory, shard_cache_limit=shared.LIMIT)


def test_a_checkpoint_restored_into_a_fresh_reader_is_the_uninterrupted_stream(photos, tmp_path):
    want = _batches(iter(shared.images(photos, repeat=True)), 14)  # 6 a pass: the restored run crosses two epochs
    iterator = iter(_resumable(photos, str(tmp_path / "c")))
    assert_same = shared.assert_same_epochs
    assert_same([_batches(iterator, 5)], [want[:5]])
    saved = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    assert_same([_batches(iterator, 9)], [want[5:]])
    for directory in ("c", "empty"):  # the folder the checkpoint's tickets were fetched into, and a new one
        restored = iter(_resumable(photos, str(tmp_path / directory)))
        tf.train.Checkpoint(iterator=restored).read(saved).assert_consumed()
        assert_same([_batches(restored, 9)], [want[5:]])


def test_a_checkpoint_restored_after_an_overwrite_is_refused_instead_of_reading_the_old_copies(tmp_path):
    """The checkpoint holds the files in flight with their local copies: restored into a pipeline built on the
    rewritten dataset it read the old copies to the end of the epoch (20 of the 36 images of the test that found
    it were the old dataset's)."""
    out = photo_dataset(tmp_path)
    directory = str(tmp_path / "c")
    iterator = iter(_resumable(out, directory))
    _batches(iterator, 5)
    saved = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    make_tree(str(tmp_path / "other"), per_class=12, seed=77)  # same names, other pixels
    convert_image_tree(tmp_path / "other", out, num_shards=6, overwrite=True)
    restored = iter(_resumable(out, directory))
    refused = re.escape(out) + r": this iterator checkpoint was saved by a pipeline of other data"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        tf.train.Checkpoint(iterator=restored).read(saved)


_SAVE_MID_EPOCH = """
import sys
sys.path.insert(0, {here!r})
import conftest  # noqa: F401 (TF's log level, as in the tests)
import shard_cache_helpers as shared
import tensorflow as tf
iterator = iter(shared.images({path!r}, repeat=True, shard_cache={directory!r}, shard_cache_limit=shared.LIMIT))
for _ in range(5):
    next(iterator)
tf.train.Checkpoint(iterator=iterator).write({checkpoint!r})
"""


@pytest.mark.slow
def test_a_checkpoint_of_another_process_restores_without_waiting_on_its_tickets(photos, tmp_path):
    want = _batches(iter(shared.images(photos, repeat=True)), 14)
    directory, checkpoint = str(tmp_path / "c"), str(tmp_path / "ckpt")
    script = _SAVE_MID_EPOCH.format(here=HERE, path=photos, directory=directory, checkpoint=checkpoint)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=TIMEOUT_S * 2)
    restored = iter(_resumable(photos, directory))
    tf.train.Checkpoint(iterator=restored).read(checkpoint).assert_consumed()
    shared.assert_same_epochs([_batches(restored, 9)], [want[5:]])


# --- a cache folder that breaks or fills up -------------------------------------------------------------------------


def _drain(ds):
    result = []

    def run():
        try:
            result.append(sum(1 for _ in ds))
        except Exception as e:  # noqa: BLE001 (checked by the test)
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), f"the pipeline hung for {TIMEOUT_S} s"
    return result[0]


@pytest.mark.parametrize("when", ["between epochs", "mid-epoch"])
def test_a_shards_folder_replaced_by_a_file_is_an_error_naming_it_never_a_hang(photos, tmp_path, when):
    directory = str(tmp_path / "c")
    ds = _in_order(photos, directory)
    iterator = iter(ds)
    if when == "between epochs":
        assert _drain(iterator) == 24
        iterator = iter(ds)
    else:
        next(iterator)
    _plant_a_file_for_the_shards_folder(directory)
    error = _drain(iterator)
    assert isinstance(error, tf.errors.OpError), f"read {error} records from a cache folder with no shards/"
    named = os.path.join(directory, "shards") if when == "between epochs" else directory
    assert re.search(re.escape(named), error.message), error.message


def _plant_a_file_for_the_shards_folder(directory: str) -> None:
    """``shards/`` replaced by a regular file. Mid-epoch a fetch thread may make the folder again between the removal
    and the file's creation (a cache folder removed while a job runs is made again): remove it again, at most 50
    times, until the file is in place."""
    shards, planted = os.path.join(directory, "shards"), os.path.join(directory, "planted")
    for _ in range(50):
        shutil.rmtree(shards, ignore_errors=True)
        open(planted, "w").close()
        try:
            os.rename(planted, shards)  # fails on a folder made again meanwhile: never a file inside it
            return
        except OSError:
            continue
    pytest.fail(f"{shards}: made again as a folder 50 times in a row; no file could be planted there")


@pytest.fixture
def full_disk(tmp_path):
    """A 12 KiB tmpfs (room for about two of the ~4 KB shards), unmounted after the test."""
    with _tmpfs(str(tmp_path / "tiny"), "12k") as mount:
        yield mount


def test_a_disk_that_fills_up_falls_back_to_remote_reads_with_a_warning(photos, full_disk, caplog):
    expected = shared.epochs(shared.images(photos))
    directory = os.path.join(full_disk, "c")  # a limit far above the disk: the disk fills first
    with caplog.at_level(logging.WARNING, logger="tfshard.readers.shard_cache.store"):
        got = shared.epochs(shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT))
    shared.assert_same_epochs(got, expected)
    assert "No space left on device" in caplog.text and "reading it remotely" in caplog.text
    # A full disk is not a bad connection: each shard that did not fit was downloaded once an epoch, not once per
    # retry (3 attempts, each downloading until the write failed, then the remote read).
    sizes = sum(s.size for s in shared.manifest_shards(photos))
    assert pipeline.store_for(directory, shared.LIMIT).downloaded_bytes <= len(got) * sizes
    assert os.listdir(os.path.join(directory, "parts")) == []  # no failed download keeps its reservation


# --- strategies and pipelines side by side --------------------------------------------------------------------------


def _replica_batches(strategy, ds) -> list[list[np.ndarray]]:
    """One epoch of a distributed dataset, each element's per-replica parts joined."""
    return [[np.concatenate([np.asarray(p) for p in strategy.experimental_local_results(x)])
             for x in tf.nest.flatten(element)] for element in ds]


@pytest.mark.parametrize("resident", [True, False])
def test_windows_under_a_strategy_are_the_uncached_batches(runs, strategies, tmp_path, resident):
    strategy = strategies[2]
    options = {**KEYED_WINDOWS, "shuffle": resident, "resident": resident, "strategy": strategy}
    want = _replica_batches(strategy, readers.windows(runs, **options))
    directory = str(tmp_path / "c")
    for _ in range(2):  # from an empty cache, then from its copies
        got = _replica_batches(strategy, readers.windows(runs, shard_cache=directory, shard_cache_limit=shared.LIMIT,
                                                         **options))
        shared.assert_same_epochs([got], [want])
    assert shared.copies(directory) == {s.sha256 for s in shared.manifest_shards(runs)}


def test_two_pipelines_zipped_over_one_folder_read_the_uncached_stream_and_download_each_shard_once(photos, tmp_path):
    expected = shared.epochs(shared.images(photos), 1)
    directory = str(tmp_path / "c")
    first, second = (shared.images(photos, shard_cache=directory, shard_cache_limit=shared.LIMIT) for _ in range(2))
    zipped = tf.data.Dataset.zip((first, second))
    got = [[[np.asarray(x) for x in tf.nest.flatten(pair)] for pair in zipped.as_numpy_iterator()]]
    want = [[a + a for a in expected[0]]]
    shared.assert_same_epochs(got, want)
    sizes = sum(s.size for s in shared.manifest_shards(photos))
    assert pipeline.store_for(directory, shared.LIMIT).downloaded_bytes == sizes


# --- a tf.data service worker's reads -------------------------------------------------------------------------------


def _worker_process(dispatcher_target: str) -> subprocess.Popen:
    """``tfshard service worker`` in a process of its own (a graph shipped to it runs the cache's ops there, with no
    pipeline object of its own), serving once it says so."""
    address = dispatcher_target.removeprefix("grpc://")
    worker = subprocess.Popen([sys.executable, "-m", "tfshard", "service", "worker", "--dispatcher", address, "--port",
                               "0", "--worker-address", "localhost:%port%"], cwd=os.path.dirname(HERE),
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.PIPE, text=True)
    line = worker.stdout.readline()
    assert line.startswith("worker: serving at"), line
    return worker


def test_reads_a_service_worker_abandons_mid_shard_leave_no_pin(tmp_path):
    """The client stops after one batch: the worker's reads end mid-shard (its task is dropped), with no last record
    to let their pins go by; each was let go at its first record."""
    from helpers import convert_image_tree, make_tree
    from tfshard.readers import service as service_lib

    make_tree(str(tmp_path / "src"), per_class=400, size=(64, 64))
    convert_image_tree(tmp_path / "src", tmp_path / "out", num_shards=6)
    directory = str(tmp_path / "c")
    dispatcher = service_lib.start_dispatcher(0)
    worker = _worker_process(dispatcher.target)
    try:
        ds = readers.images(str(tmp_path / "out"), batch_size=1, image_size=(64, 64), training=False,
                            service=dispatcher.target, shard_cache=directory, shard_cache_limit=10**8)
        iterator = iter(ds)
        next(iterator)
        del iterator, ds
        deadline = time.monotonic() + TIMEOUT_S
        while [name for name in _pins(directory) if f".{worker.pid}." in name]:
            assert time.monotonic() < deadline, f"the worker's pins were never let go: {_pins(directory)}"
            time.sleep(0.1)
    finally:
        worker.kill()
        worker.wait()
        dispatcher.stop()
