"""Attacks on the shard cache's tf.data side: iterators abandoned mid-epoch, pipelines built and dropped by the
dozen, checkpoints restored into fresh readers, a cache folder that breaks or fills up mid-epoch, strategies, and two
pipelines sharing one folder (``readers/shard_cache/pipeline.py``, ``ahead.py``)."""

from __future__ import annotations

import gc
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import shard_cache_helpers as shared
import tensorflow as tf
from tfshard import readers
from tfshard.readers.shard_cache import pipeline

TIMEOUT_S = 60  # a guard against a hung pipeline, far above the second each step takes
DEADLOCK_S = 20  # a collection takes well under a second
HERE = os.path.dirname(os.path.abspath(__file__))
WINDOWS = {"length": 4, "shift": 1, "features": "obs", "targets": 1, "batch_size": 8, "seed": 0, "with_keys": True}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return shared.photo_dataset(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from helpers import convert_obs_episodes

    return convert_obs_episodes(tmp_path_factory.mktemp("runs"), [6, 9, 13, 7, 11, 6, 8, 10] * 2, seed=3,
                                num_shards=4)


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
    assert key not in pipeline._pools and key not in pipeline._sessions
    assert _pins(directory) == []  # the dataset is gone: nothing of it is pinned
    assert _fetch_threads_left() <= _live_pools_threads()


def test_pipelines_built_and_dropped_by_the_dozen_leave_no_threads_sessions_or_pins(photos, tmp_path):
    directory = str(tmp_path / "c")
    for _ in range(12):
        next(iter(_in_order(photos, directory)))
    gc.collect()
    assert not [s for s in list(pipeline._sessions.values()) if s.cache.directory == directory]
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
    shutil.rmtree(os.path.join(directory, "shards"))
    open(os.path.join(directory, "shards"), "w").close()
    error = _drain(iterator)
    assert isinstance(error, tf.errors.OpError), f"read {error} records from a cache folder with no shards/"
    named = os.path.join(directory, "shards") if when == "between epochs" else directory
    assert re.search(re.escape(named), error.message), error.message


@pytest.fixture
def full_disk(tmp_path):
    """A 12 KiB tmpfs (room for about two of the ~4 KB shards), unmounted after the test."""
    mount = str(tmp_path / "tiny")
    os.makedirs(mount)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", mount], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e})")
    yield mount
    subprocess.run(["umount", mount], check=True)


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
    options = {**WINDOWS, "shuffle": resident, "resident": resident, "strategy": strategy}
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
