"""``readers.images(cache="<dir>")``: never stale, never partial, never stuck on a dead writer's lock.

The process tests run real readers in child processes (``sys.executable -c``)
and SIGKILL, ``os._exit`` or pause them mid-epoch, at the point where the
cache's lockfile and partial data exist; the rest forge an owner file or
interrupt an epoch in-process. "Reads the cache" is proved by zeroing the
shards' bytes in place first (``_scramble_shards``): only a complete cache can
still yield every record.
"""

from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import tensorflow as tf
from helpers import edit_manifest, labels_of, make_tree, within, write_jpeg
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
NUM_CLASSES = 24
CLASSES = [f"c{i:02d}" for i in range(NUM_CLASSES)]
ALL = list(range(NUM_CLASSES))
# What the children and the test process share, so both land on the same cache prefix. A shuffle buffer of 2 keeps
# the first training epoch from draining the whole dataset through the cache before the first batch comes out.
TRAIN = {"batch_size": 1, "image_size": (16, 16), "training": True, "seed": 0, "shuffle_buffer": 2}
EVAL = {"batch_size": 1, "image_size": (16, 16), "training": False}
HANG_S = 60  # a guard against a read that hangs (on a FIFO), far above the second a read takes

# Iterates the cached training pipeline; at batch `pause_at` prints "ready" and then sleeps (to be killed), exits
# without any cleanup (os._exit, like a crash), or waits for a line on stdin and finishes the epoch.
_CHILD = r"""
import json, os, sys, time
import tensorflow as tf
from tfshard import readers

args = json.loads(sys.argv[1])
ds = readers.images(args["data"], cache=args["cache"], **args["kwargs"])
options = tf.data.Options()
options.threading.private_threadpool_size = 2  # bounds read-ahead past the cache, so the pause finds it partial
ds = ds.with_options(options)
labels = []
for i, (_, batch) in enumerate(ds):
    labels += batch.numpy().tolist()
    if i == args["pause_at"]:
        print("ready", flush=True)
        if args["then"] == "sleep":
            time.sleep(600)
        elif args["then"] == "exit":
            os._exit(0)
        else:
            sys.stdin.readline()
print("done", json.dumps(sorted(labels)), flush=True)
"""


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """24 classes of one 40x32 JPEG each in 4 shards (labels identify records), converted once: (src, out)."""
    root = tmp_path_factory.mktemp("golden")
    src, out = str(root / "src"), str(root / "out")
    make_tree(src, classes=CLASSES, per_class=1, size=(40, 32))
    convert_images(src, out, ConvertOptions(num_shards=4), workers=0, progress=False)
    return src, out


@pytest.fixture
def dataset(golden, tmp_path):
    """A fresh copy of ``golden`` (files written now, as a conversion would): (src, out). Tests change both."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    shutil.copytree(golden[0], src, copy_function=shutil.copy)
    shutil.copytree(golden[1], out, copy_function=shutil.copy)
    return src, out


@pytest.fixture
def converted(tmp_path):
    """The same dataset converted here, for tests that convert SRC again into OUT: the fingerprint of a conversion
    names its source, so a copy's reconversion would never give the copied fingerprint back: (src, out)."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    make_tree(src, classes=CLASSES, per_class=1, size=(40, 32))
    convert_images(src, out, ConvertOptions(num_shards=4), workers=0, progress=False)
    return src, out


@pytest.fixture
def children():
    """Starts reader children; kills (by pid) and reaps any still running when the test ends."""
    started = []

    def start(tmp_path, name, out, cache, then, pause_at=5, kwargs=TRAIN):
        args = {"data": out, "cache": cache, "kwargs": kwargs, "pause_at": pause_at, "then": then}
        stdout, stderr = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(args)], cwd=REPO, env=ENV,
                stdin=subprocess.PIPE, stdout=out_file, stderr=err_file, text=True,
            )
        proc.stdout_path, proc.stderr_path = stdout, stderr
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if not proc.stdin.closed:
            proc.stdin.close()


def _read(path) -> str:
    with open(path) as f:
        return f.read()


def _output(proc) -> str:
    return _read(proc.stdout_path)


def _wait_for(proc, cache: str, timeout: float = 180.0) -> None:
    """Waits until the child printed "ready" and its cache lockfile exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "ready" in _output(proc) and glob.glob(os.path.join(cache, "tfshard-*_0.lockfile")):
            return
        if proc.poll() is not None and "ready" not in _output(proc):
            break
        time.sleep(0.05)
    pytest.fail(f"child never got ready (rc={proc.poll()}):\n{_output(proc)}\n{_read(proc.stderr_path)[-3000:]}")


def _by_label(ds) -> dict[int, np.ndarray]:
    return {int(label): image for images, labels in ds for image, label in zip(images.numpy(), labels.numpy())}


def _cache_files(cache: str, pattern: str) -> list[str]:
    return sorted(tf.io.gfile.glob(f"{cache}/{pattern}"))


def _only_prefix(cache: str) -> str:
    owners = _cache_files(cache, "tfshard-*.owner")
    assert len(owners) == 1, owners
    return owners[0][: -len(".owner")]


def _assert_partial(cache: str) -> str:
    """The cache holds a writer's lock and partial data but no index: returns its prefix."""
    prefix = _only_prefix(cache)
    assert tf.io.gfile.exists(prefix + "_0.lockfile")
    assert _cache_files(cache, "tfshard-*_0.data-*"), "no partial data was written"
    assert not _cache_files(cache, "tfshard-*.index"), "the cache was complete before the writer stopped"
    return prefix


def _assert_complete(cache: str, prefix: str) -> None:
    assert tf.io.gfile.exists(prefix + ".index")
    assert tf.io.gfile.exists(prefix + ".complete"), "the completed cache was not recorded"
    assert _cache_files(cache, "tfshard-*.index") == [prefix + ".index"]
    assert not _cache_files(cache, "tfshard-*_*"), "a lockfile or partial data was left behind"


def _remove_shards(out: str) -> None:
    """Leaves dataset.json only: from now on an already built pipeline yields records only from a complete cache."""
    for shard in readers.info(out).shard_paths("train"):
        tf.io.gfile.remove(shard)


def _scramble_shards(out: str) -> None:
    """Zeroes every shard's bytes in place and puts its mtime back: a new pipeline then yields records only if it
    reads a complete cache (reading the zeros fails at the first record).

    A new pipeline refuses missing shards, and the cache key follows each shard's size and mtime at build time and
    its sha256 in the manifest, not a re-hash of its bytes (that would read every shard at every build), so this
    is the one change to the shards that still finds the same cache.
    """
    for shard in readers.info(out).shard_paths("train"):
        st = os.stat(shard)
        with open(shard, "r+b") as f:
            f.write(b"\0" * st.st_size)
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def _write_owner(prefix: str, owner: dict | str) -> None:
    # Remove first: TensorFlow's ram:// filesystem appends to an existing file opened with "w" instead of truncating.
    tf.io.gfile.remove(prefix + ".owner")
    with tf.io.gfile.GFile(prefix + ".owner", "w") as f:
        f.write(owner if isinstance(owner, str) else json.dumps(owner))


def _forge_partial(out: str, cache: str, owner: dict | str | None) -> str:
    """A cache left as a killed writer leaves it (lock, partial data), owned by ``owner``.

    ``owner`` is the owner record, the raw text of the owner file, or None for no owner file.
    """
    readers.images(out, cache=cache, **TRAIN)  # builds only: records this process as owner of the prefix
    prefix = _only_prefix(cache)
    if owner is None:
        tf.io.gfile.remove(prefix + ".owner")
    else:
        _write_owner(prefix, owner)
    for name in ("_0.lockfile", "_0.data-00000-of-00001.tempstate123"):
        with tf.io.gfile.GFile(prefix + name, "w") as f:
            f.write("partial")
    return prefix


def _start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat: the process start time, as the owner file records it."""
    return _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[19]


# ---------------------------------------------------------------- a writer that is gone


@pytest.mark.slow
def test_cache_left_by_a_killed_writer_is_recovered_and_completed(dataset, tmp_path, children, caplog):
    _, out = dataset
    cache = str(tmp_path / "cache")
    child = children(tmp_path, "killed", out, cache, then="sleep")
    _wait_for(child, cache)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    prefix = _assert_partial(cache)
    assert json.loads(_read(prefix + ".owner"))["pid"] == child.pid

    caplog.set_level(logging.INFO, logger="tfshard.readers.cache")
    ds = readers.images(out, cache=cache, **TRAIN)
    assert sorted(labels_of(ds)) == ALL  # no AlreadyExistsError, and every record exactly once
    _assert_complete(cache, prefix)
    assert any("_0.lockfile" in r.getMessage() for r in caplog.records if r.name == "tfshard.readers.cache")

    _scramble_shards(out)
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL


@pytest.mark.slow
def test_cache_left_by_a_writer_that_exited_without_cleanup_is_recovered(dataset, tmp_path, children):
    _, out = dataset
    cache = str(tmp_path / "cache")
    child = children(tmp_path, "exited", out, cache, then="exit")
    assert child.wait(timeout=180) == 0, _read(child.stderr_path)[-3000:]
    assert "ready" in _output(child)
    prefix = _assert_partial(cache)
    owner = json.loads(_read(prefix + ".owner"))
    assert owner["pid"] == child.pid and not os.path.exists(f"/proc/{child.pid}")

    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
    _assert_complete(cache, prefix)
    _scramble_shards(out)
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL


@pytest.mark.parametrize(
    "owner",
    [
        pytest.param(lambda: None, id="no-owner-file"),
        # A live pid whose start time is not the recorded one: the writer is gone and its pid was reused.
        pytest.param(lambda: {"host": socket.gethostname(), "pid": os.getpid(), "start": "0"}, id="reused-pid"),
    ],
)
def test_forged_stale_lock_is_cleared(dataset, tmp_path, owner):
    _, out = dataset
    cache = str(tmp_path / "cache")
    prefix = _forge_partial(out, cache, owner())
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
    _assert_complete(cache, prefix)


@pytest.mark.parametrize("text", ["", '{"host": "vm", "pi', "[1]", '"vm"'], ids=["empty", "truncated", "list", "text"])
def test_unreadable_owner_file_is_not_silently_ignored(dataset, tmp_path, caplog, text):
    """An owner file a writer died while writing: recover it, or at least say that the cache is not used.

    Fails on readers/cache.py: ``claim`` reads such a file as "no owner", cannot
    create it exclusively (it exists), loops twice and returns False without a
    log line, so every later run reads without the cache and nobody is told.
    """
    _, out = dataset
    cache = str(tmp_path / "cache")
    prefix = _forge_partial(out, cache, text)
    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
    recovered = tf.io.gfile.exists(prefix + ".index")
    warned = [r for r in caplog.records if r.name == "tfshard.readers.cache" and r.levelno >= logging.WARNING]
    assert recovered or warned, "the cache was silently not used"


def test_an_unreadable_owner_file_dated_ahead_is_recovered(dataset, tmp_path):
    """One dated a day ahead counted as "being written right now" for a day: every pipeline read without the cache."""
    _, out = dataset
    cache = str(tmp_path / "cache")
    prefix = _forge_partial(out, cache, '{"host": "vm", "pi')
    ahead = time.time() + 86400
    os.utime(prefix + ".owner", (ahead, ahead))
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
    _assert_complete(cache, prefix)


@pytest.mark.slow
def test_owner_killed_but_not_yet_reaped_is_gone(dataset, tmp_path):
    """A zombie (killed, its parent has not called wait yet) writes nothing: its lock is stale.

    Fails on readers/cache.py: ``_alive`` treats any pid with a /proc/PID/stat
    entry as alive, and a zombie keeps that entry (state "Z") until reaped.
    """
    _, out = dataset
    cache = str(tmp_path / "cache")
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=ENV)
    try:
        owner = {"host": socket.gethostname(), "pid": zombie.pid, "start": _start_time(zombie.pid)}
        zombie.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _read(f"/proc/{zombie.pid}/stat").rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "child did not die"
            time.sleep(0.02)
        prefix = _forge_partial(out, cache, owner)
        assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
        _assert_complete(cache, prefix)
    finally:
        zombie.kill()
        zombie.wait()


# ---------------------------------------------------------------- a writer that is alive


@pytest.mark.slow
def test_second_process_reads_without_the_cache_a_live_process_is_writing(dataset, tmp_path, children, caplog):
    _, out = dataset
    cache = str(tmp_path / "cache")
    writer = children(tmp_path, "writer", out, cache, then="stdin")
    _wait_for(writer, cache)
    prefix = _assert_partial(cache)

    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL  # no AlreadyExistsError
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "tfshard.readers.cache" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "reads without the cache" in warnings[0] and str(writer.pid) in warnings[0]
    _assert_partial(cache)  # the writer's lock and data are untouched

    writer.stdin.write("go\n")
    writer.stdin.close()
    assert writer.wait(timeout=120) == 0, _read(writer.stderr_path)[-3000:]
    assert f"done {json.dumps(ALL)}" in _output(writer)
    _assert_complete(cache, prefix)

    _scramble_shards(out)
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL


def test_owner_on_another_host_is_assumed_alive(dataset, tmp_path, caplog):
    _, out = dataset
    cache = str(tmp_path / "cache")
    prefix = _forge_partial(out, cache, {"host": "not-" + socket.gethostname(), "pid": 1, "start": "1"})
    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL
    assert any("reads without the cache" in r.getMessage() for r in caplog.records if r.name == "tfshard.readers.cache")
    assert tf.io.gfile.exists(prefix + "_0.lockfile") and not _cache_files(cache, "tfshard-*.index")


# ---------------------------------------------------------------- never stale, never partial


def test_changed_image_size_or_data_never_reads_a_stale_cache(converted, tmp_path):
    src, out = converted
    cache = str(tmp_path / "cache")

    def read(size, cache_dir):
        return _by_label(readers.images(out, batch_size=1, image_size=size, training=False, cache=cache_dir))

    first = read((16, 16), cache)
    assert sorted(first) == ALL and {v.shape for v in first.values()} == {(16, 16, 3)}
    assert len(_cache_files(cache, "tfshard-*.index")) == 1
    resized = read((12, 20), cache)
    assert sorted(resized) == ALL and {v.shape for v in resized.values()} == {(12, 20, 3)}
    assert len(_cache_files(cache, "tfshard-*.index")) == 2
    again = read((16, 16), cache)  # the first cache again, not a third
    assert len(_cache_files(cache, "tfshard-*.index")) == 2
    assert all(np.array_equal(again[k], first[k]) for k in ALL)

    changed = os.path.join(src, "c03", "000.jpg")
    write_jpeg(changed, seed=1000, size=(40, 32))
    os.utime(changed, ns=(2_000_000_000 * 10**9, 2_000_000_000 * 10**9))
    convert_images(src, out, ConvertOptions(num_shards=4), workers=0, progress=False, overwrite=True)
    fresh = read((16, 16), None)
    assert not np.array_equal(fresh[3], first[3])  # the data did change
    cached = read((16, 16), cache)
    assert len(_cache_files(cache, "tfshard-*.index")) == 3
    for label in ALL:
        np.testing.assert_array_equal(cached[label], fresh[label], err_msg=f"label {label}")


@pytest.mark.parametrize("kwargs", [EVAL, TRAIN], ids=["eval", "train"])
def test_unfinished_epoch_leaves_no_cache_and_the_next_epoch_is_whole(dataset, tmp_path, kwargs):
    _, out = dataset
    cache = str(tmp_path / "cache")
    ds = readers.images(out, cache=cache, **kwargs)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 2  # bounds read-ahead, so take(2) really stops the cache early
    ds = ds.with_options(options)
    assert len(labels_of(ds.take(2))) == 2
    assert not _cache_files(cache, "tfshard-*.index")
    assert not _cache_files(cache, "tfshard-*_*")  # TensorFlow discarded the partial data and its lock
    assert sorted(labels_of(ds)) == ALL
    _assert_complete(cache, _only_prefix(cache))
    _scramble_shards(out)
    with pytest.raises(tf.errors.DataLossError):  # the shards are unreadable now: records can only come from the cache
        labels_of(readers.images(out, **kwargs))
    assert sorted(labels_of(readers.images(out, cache=cache, **kwargs))) == ALL



class _ShardOpens:
    """Counts the opens of a dataset's shard files (Linux inotify, IN_OPEN): only watches, never touches them (any
    change, even of their times, would fail the epoch guard)."""

    _IN_OPEN, _IN_NONBLOCK = 0x20, 0o4000

    def __init__(self, out: str):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(self._IN_NONBLOCK)
        assert self._fd >= 0, os.strerror(ctypes.get_errno())
        for shard in readers.info(out).shard_paths("train"):
            assert self._libc.inotify_add_watch(self._fd, shard.encode(), self._IN_OPEN) >= 0, shard

    def since_last(self) -> int:
        """The opens since the last call (or since the watch began)."""
        count = 0
        while True:
            try:
                events = os.read(self._fd, 65536)
            except BlockingIOError:
                return count
            at = 0
            while at < len(events):  # struct inotify_event: wd, mask, cookie, len, then len bytes of name
                at += 16 + struct.unpack_from("iIII", events, at)[3]
                count += 1

    def close(self) -> None:
        os.close(self._fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts shard opens with Linux inotify")
def test_one_model_fit_epoch_completes_the_cache_and_the_next_reads_no_shard(dataset, tmp_path):
    """Keras ends each epoch after ``len(ds)`` batches and drops the iterator without asking for the end, and
    ``drop_remainder`` leaves the last partial batch unread (24 images, batches of 5): the cache is complete only if
    the pipeline read its last record first: it reads ahead (the shuffle buffer after the cache refills before each
    image it yields, the prefetch at the end asks for the next batch). TensorFlow up to 2.21 still logs "The calling
    iterator did not fully read the dataset being cached" when the first epoch's cache iterator ends: a false
    positive (its check looks for a file its own completion just merged away), as the files here show."""
    _, out = dataset
    cache = str(tmp_path / "cache")
    ds = readers.images(out, cache=cache, batch_size=5, image_size=(16, 16), seed=0)
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(NUM_CLASSES)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    opens, seen = _ShardOpens(out), []

    class AtEpochEnd(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((opens.since_last(), _cache_files(cache, "*")))

    try:
        model.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=[AtEpochEnd()])  # the reader shuffles
    finally:
        opens.close()
    (first_opens, after_first), (second_opens, after_second) = seen
    prefix = _only_prefix(cache)
    assert after_first == after_second == [prefix + ext for ext in (".complete", ".data-00000-of-00001", ".index",
                                                                   ".owner")], "no complete cache after one epoch"
    _assert_complete(cache, prefix)
    assert first_opens >= len(readers.info(out).shard_paths("train"))  # the watch sees the first epoch's reads
    assert second_opens == 0, "the second epoch read the shards again instead of the cache"

# ---------------------------------------------------------------- URL paths through tf.io.gfile


@pytest.fixture
def ram_bucket():
    """A fresh ``ram://`` bucket (TensorFlow's in-memory filesystem, standing in for gs://), deleted afterwards."""
    bucket = f"ram://bucket-{uuid.uuid4().hex}"
    yield bucket
    if tf.io.gfile.exists(bucket):
        tf.io.gfile.rmtree(bucket)


def _copy_to(out: str, folder: str) -> None:
    tf.io.gfile.makedirs(folder)
    for name in os.listdir(out):
        if os.path.isfile(os.path.join(out, name)):
            tf.io.gfile.copy(os.path.join(out, name), f"{folder}/{name}")


def test_ram_filesystem_dataset_and_cache(dataset, ram_bucket):
    _, out = dataset
    data, cache = f"{ram_bucket}/ds", f"{ram_bucket}/cache"
    _copy_to(out, data)
    info = readers.info(data)
    assert info.class_names == CLASSES and info.num_records("train") == NUM_CLASSES
    assert sorted(labels_of(readers.images(data, **EVAL))) == ALL

    ds = readers.images(data, cache=cache, **TRAIN)
    assert sorted(labels_of(ds)) == ALL
    _assert_complete(cache, _only_prefix(cache))
    for shard in readers.info(data).shard_paths("train"):  # zeroed in place: ram:// keeps size and mtime (0) alike
        size = tf.io.gfile.stat(shard).length
        tf.io.gfile.remove(shard)  # ram://'s "wb" appends to a file that exists
        with tf.io.gfile.GFile(shard, "wb") as f:
            f.write(b"\0" * size)
    assert sorted(labels_of(ds)) == ALL  # the second epoch comes from the cache
    _remove_shards(data)  # the dataset is no longer the one the pipeline was built on: the next epoch says so
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{data}: the dataset changed .* is gone"):
        labels_of(ds)


def test_ram_filesystem_stale_lock_is_cleared(dataset, ram_bucket):
    _, out = dataset
    data, cache = f"{ram_bucket}/ds", f"{ram_bucket}/cache"
    _copy_to(out, data)
    prefix = _forge_partial(data, cache, {"host": socket.gethostname(), "pid": os.getpid(), "start": "0"})
    assert sorted(labels_of(readers.images(data, cache=cache, **TRAIN))) == ALL
    _assert_complete(cache, prefix)


# ---------------------------------------------------------------- the cache follows the shards' content


def _set_fingerprint(out: str, fingerprint: str) -> None:
    edit_manifest(out, lambda raw: raw.update(fingerprint=fingerprint))


def test_dataset_rewritten_from_other_pixels_under_the_same_fingerprint_gets_a_new_cache(converted, tmp_path):
    """The fingerprint covers the sources' names, sizes and times, which can stay the same while the
    pixels change (an object store keeps no ctime; a copy keeps the times). Here the rewritten dataset's manifest is
    given back the old fingerprint to stand for that: the cache must still follow the shards."""
    _, out = converted
    cache = str(tmp_path / "cache")
    old = _by_label(readers.images(out, cache=cache, **EVAL))
    fingerprint = readers.info(out).manifest.fingerprint

    other = str(tmp_path / "other")
    make_tree(other, classes=CLASSES, per_class=1, size=(40, 32), seed=100)  # same names, other pixels
    convert_images(other, out, ConvertOptions(num_shards=4), workers=0, progress=False, overwrite=True)
    _set_fingerprint(out, fingerprint)

    fresh = _by_label(readers.images(out, **EVAL))
    assert not np.array_equal(fresh[0], old[0])  # the pixels did change
    cached = _by_label(readers.images(out, cache=cache, **EVAL))
    for label in ALL:
        np.testing.assert_array_equal(cached[label], fresh[label], err_msg=f"label {label}")
    assert len(_cache_files(cache, "tfshard-*.index")) == 2


def test_shard_repaired_byte_identically_after_a_cached_read_with_ignore_errors_gets_a_new_cache(converted, tmp_path):
    """A cache filled with ignore_errors while a shard was corrupt must not outlive the repair, even though
    ``--overwrite`` writes byte-identical shards (same manifest, same sha256)."""
    src, out = converted
    cache = str(tmp_path / "cache")
    manifest = readers.info(out).manifest
    shard = readers.info(out).shard_paths("train")[1]
    with open(shard, "r+b") as f:  # one flipped byte inside the first record: its CRC fails, the size stays
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    damaged = labels_of(readers.images(out, cache=cache, ignore_errors=True, **EVAL))
    assert len(damaged) < NUM_CLASSES and _cache_files(cache, "tfshard-*.index")

    os.remove(shard)  # what verify advises: --overwrite never removes a shard whose bytes it cannot prove
    convert_images(src, out, ConvertOptions(num_shards=4), workers=0, progress=False, overwrite=True)
    assert readers.info(out).manifest == manifest  # the repair changed nothing the manifest records

    assert sorted(labels_of(readers.images(out, ignore_errors=True, **EVAL))) == ALL
    assert sorted(labels_of(readers.images(out, cache=cache, ignore_errors=True, **EVAL))) == ALL


def _damage_last_image(shard: str, damage: str) -> None:
    """The shard's last record made unreadable in place, its size kept: a flipped byte of its data (its CRC fails), or
    a JPEG of as many zero bytes (the record intact, the decode fails)."""
    if damage == "a corrupt record":
        with open(shard, "r+b") as f:
            f.seek(-8, os.SEEK_END)  # inside the last record's data, before its 4-byte CRC
            byte = f.read(1)
            f.seek(-8, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
        return
    records = [r.numpy() for r in tf.data.TFRecordDataset(shard)]
    example = tf.train.Example.FromString(records[-1])
    encoded = example.features.feature["image/encoded"].bytes_list.value
    encoded[0] = bytes(len(encoded[0]))
    records[-1] = example.SerializeToString()
    with tf.io.TFRecordWriter(shard) as writer:
        for record in records:
            writer.write(record)


@pytest.mark.parametrize("damage", ["a corrupt record", "a JPEG that does not decode"])
def test_an_epoch_that_lost_an_image_never_completes_the_cache(dataset, tmp_path, damage):
    """The last image of the split unreadable: its error fails one pull, the stages after it pull again and read on
    to the end, and TensorFlow completed the cache there, one image short, served as whole from then on. The epoch
    that fills a cache must yield every record it reads (readers/images.py, ``_cached_and_shuffled``)."""
    _, out = dataset
    shard = readers.info(out).shard_paths("train")[-1]
    size = os.path.getsize(shard)
    _damage_last_image(shard, damage)
    assert os.path.getsize(shard) == size  # the pipeline's build-time checks pass: only the read can tell
    cache = str(tmp_path / "cache")
    for _ in range(2):  # neither the epoch that meets the error nor a later pipeline completes a cache
        iterator = iter(readers.images(out, cache=cache, **EVAL))
        errors = []
        for _ in range(NUM_CLASSES + 3):  # pulls on after the error, as the stages after a failed read do
            try:
                next(iterator)
            except StopIteration:
                break
            except tf.errors.OpError as error:
                errors.append(error)
        assert errors and re.search(r"expected to contain \d+ elements? but contained only", str(errors[-1]))
        assert _cache_files(cache, "tfshard-*.index") == [], "an epoch one image short was saved as a whole cache"


def test_ignore_errors_gets_a_cache_of_its_own(dataset, tmp_path):
    _, out = dataset
    cache = str(tmp_path / "cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **EVAL))) == ALL
    assert sorted(labels_of(readers.images(out, cache=cache, ignore_errors=True, **EVAL))) == ALL
    assert len(_cache_files(cache, "tfshard-*.index")) == 2


# ---------------------------------------------------------------- two pipelines of one process


@pytest.mark.parametrize("kwargs", [EVAL, TRAIN], ids=["eval", "train"])
def test_two_pipelines_of_one_process_on_one_cache_iterated_together_both_read_everything(
    dataset, tmp_path, caplog, kwargs
):
    """The second pipeline reads without the cache (TensorFlow's lockfile would refuse a second writer)."""
    _, out = dataset
    cache = str(tmp_path / "cache")
    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    first = readers.images(out, cache=cache, **kwargs)
    second = readers.images(out, cache=cache, **kwargs)
    got_first, got_second = [], []
    for (_, a), (_, b) in zip(first, second):  # lockstep: both iterators are open at once
        got_first += a.numpy().tolist()
        got_second += b.numpy().tolist()
    assert sorted(got_first) == sorted(got_second) == ALL
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "tfshard.readers.cache" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "another pipeline of this process" in warnings[0]
    _assert_complete(cache, _only_prefix(cache))
    _scramble_shards(out)
    assert sorted(labels_of(readers.images(out, cache=cache, **kwargs))) == ALL  # the first one's cache is whole


def test_a_pipeline_dropped_mid_epoch_leaves_the_cache_to_the_next_pipeline_of_the_process(converted, tmp_path, caplog):
    _, out = converted
    cache = str(tmp_path / "cache")
    options = tf.data.Options()
    options.threading.private_threadpool_size = 2  # bounds read-ahead, so take(2) really stops the cache early
    dropped = readers.images(out, cache=cache, **EVAL).with_options(options)
    assert len(labels_of(dropped.take(2))) == 2
    del dropped

    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **EVAL))) == ALL
    assert not [r for r in caplog.records if r.name == "tfshard.readers.cache"]
    _assert_complete(cache, _only_prefix(cache))


# ---------------------------------------------------------------- a cache folder that lies


def _planted_owner(out: str, cache: str, kind: str) -> str:
    """The owner record of an unfinished cache of ``out`` replaced by what ``kind`` names: its path."""
    readers.images(out, cache=cache, **TRAIN)  # builds only: records this process as owner of the prefix
    owner = _only_prefix(cache) + ".owner"
    os.remove(owner)
    if kind == "fifo":
        os.mkfifo(owner)
    elif kind == "folder":
        os.mkdir(owner)
    elif kind == "link to /dev/zero":
        os.symlink("/dev/zero", owner)
    else:
        with open(owner, "w") as f:
            f.write(json.dumps({"host": "vm", "pid": 1, "pad": "x" * 4 * 2**20}))
    return owner


@pytest.mark.parametrize("kind", ["fifo", "folder", "link to /dev/zero", "4 MB"])
def test_an_owner_record_that_is_no_small_file_is_refused_naming_it(dataset, tmp_path, kind):
    """A FIFO hung the reader's build (its read blocked), a folder was TensorFlow's error, and /dev/zero or a huge
    file were read whole into memory."""
    _, out = dataset
    cache = str(tmp_path / "cache")
    owner = _planted_owner(out, cache, kind)
    with pytest.raises(ValueError, match=rf"{re.escape(owner)}: .*; remove it, or pass another cache folder"):
        within(HANG_S, lambda: readers.images(out, cache=cache, **TRAIN))
    os.rmdir(owner) if kind == "folder" else os.remove(owner)
    assert sorted(labels_of(readers.images(out, cache=cache, **TRAIN))) == ALL  # removed: the cache is written


def _data_file(prefix: str) -> str:
    (path,) = glob.glob(prefix + ".data-*")
    return path


def _truncate(path: str, keep: float) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))


def _fifo_for(path: str) -> None:
    os.remove(path)
    os.mkfifo(path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _other_options_cache_renamed(out: str, cache: str, prefix: str) -> None:
    """The complete cache of another pipeline (other image size) under ``prefix``'s names, its record too."""
    for path in glob.glob(prefix + ".*"):
        os.remove(path)
    assert len(labels_of(readers.images(out, cache=cache, **{**EVAL, "image_size": (12, 20)}))) == NUM_CLASSES
    (other,) = _cache_files(cache, "tfshard-*.index")
    for path in glob.glob(other.removesuffix(".index") + ".*"):
        os.rename(path, prefix + path[len(other) - len(".index"):])


LIES = {
    "data truncated": lambda out, cache, prefix: _truncate(_data_file(prefix), 0.5),
    "index emptied": lambda out, cache, prefix: _truncate(prefix + ".index", 0),
    "data removed": lambda out, cache, prefix: os.remove(_data_file(prefix)),
    "data a FIFO": lambda out, cache, prefix: _fifo_for(_data_file(prefix)),
    "record a FIFO": lambda out, cache, prefix: _fifo_for(prefix + ".complete"),
    "record nested 100000 deep": lambda out, cache, prefix: _write(prefix + ".complete", "[" * 10**5 + "]" * 10**5),
    "no record (an older tfshard's cache)": lambda out, cache, prefix: os.remove(prefix + ".complete"),
    "another pipeline's cache renamed to this one": _other_options_cache_renamed,
}


@pytest.mark.parametrize("lie", LIES)
def test_a_complete_cache_that_lies_is_removed_and_written_again(dataset, tmp_path, lie, caplog):
    """TensorFlow trusts a complete cache's files: a FIFO hung the read, a truncated file or index failed it with
    an internal error, and another pipeline's files renamed to this prefix were served as this one's images."""
    _, out = dataset
    cache = str(tmp_path / "cache")
    assert sorted(labels_of(readers.images(out, cache=cache, **EVAL))) == ALL
    prefix = _only_prefix(cache)
    _assert_complete(cache, prefix)
    LIES[lie](out, cache, prefix)
    caplog.set_level(logging.WARNING, logger="tfshard.readers.cache")
    got = within(HANG_S, lambda: _by_label(readers.images(out, cache=cache, **EVAL)))
    assert sorted(got) == ALL and {image.shape for image in got.values()} == {(16, 16, 3)}
    assert [r.getMessage() for r in caplog.records if "removing it and writing the cache again" in r.getMessage()
            and r.getMessage().startswith(prefix)], caplog.text
    _assert_complete(cache, prefix)
    _scramble_shards(out)  # from now on only the cache, written again, holds the images
    assert sorted(labels_of(readers.images(out, cache=cache, **EVAL))) == ALL


@pytest.mark.parametrize("lie", ["data truncated", "data a FIFO", "another pipeline's cache renamed to this one"])
def test_a_cache_changed_under_a_running_pipeline_fails_its_next_epoch_naming_it(dataset, tmp_path, lie):
    _, out = dataset
    cache = str(tmp_path / "cache")
    ds = readers.images(out, cache=cache, **EVAL)
    assert sorted(labels_of(ds)) == ALL  # the first epoch completed and recorded the cache
    prefix = _only_prefix(cache)
    LIES[lie](out, cache, prefix)
    changed = rf"{re.escape(prefix)}: the cache changed since this pipeline was built .*build the pipeline again"
    with pytest.raises(tf.errors.InvalidArgumentError, match=changed):
        within(HANG_S, labels_of, ds)
    assert sorted(labels_of(readers.images(out, cache=cache, **EVAL))) == ALL  # built again: written anew


# ---------------------------------------------------------------- the dataset replaced under a cached pipeline


def _rewrite_from_other_pixels(out: str, tmp_path) -> None:
    """``--overwrite`` of OUT from a tree of the same names and labels but other pixels: every shard replaced."""
    other = str(tmp_path / "other")
    make_tree(other, classes=CLASSES, per_class=1, size=(40, 32), seed=100)
    convert_images(other, out, ConvertOptions(num_shards=4), workers=0, progress=False, overwrite=True)


@pytest.mark.parametrize("cache", ["memory", "folder"])
@pytest.mark.parametrize("kwargs", [EVAL, TRAIN], ids=["eval", "train"])
def test_the_epoch_after_an_overwrite_fails_naming_the_dataset_instead_of_serving_the_cache(dataset, tmp_path,
                                                                                            cache, kwargs):
    """A cache means the shards are not read again: without the epoch check it served the old images silently."""
    _, out = dataset
    cache = str(tmp_path / "cache") if cache == "folder" else cache
    ds = readers.images(out, cache=cache, **kwargs)
    assert sorted(labels_of(ds)) == sorted(labels_of(ds)) == ALL  # the cache filled, then read
    _rewrite_from_other_pixels(out, tmp_path)
    changed = re.escape(out) + r": the dataset changed since the pipeline reading it was built .*build the pipeline"
    with pytest.raises(tf.errors.InvalidArgumentError, match=changed):
        labels_of(ds)
    assert sorted(labels_of(readers.images(out, cache=cache, **kwargs))) == ALL  # built again: the new dataset


@pytest.mark.parametrize("cache", ["memory", "folder"])
def test_a_checkpoint_restored_after_an_overwrite_is_refused_instead_of_serving_the_cache(converted, tmp_path, cache):
    """A memory cache's images are in the checkpoint: restored into a pipeline built on the rewritten dataset they
    were served for good; a file cache's restore crashed TensorFlow (SIGSEGV) on a prefix with no complete cache."""
    _, out = converted
    cache = str(tmp_path / "cache") if cache == "folder" else cache
    iterator = iter(readers.images(out, cache=cache, repeat=True, **EVAL))
    for _ in range(NUM_CLASSES + 2):  # into the second epoch: the cache is complete
        next(iterator)
    saved = tf.train.Checkpoint(input=iterator).write(str(tmp_path / "ckpt"))
    again = iter(readers.images(out, cache=cache, repeat=True, **EVAL))  # the same data: it resumes
    tf.train.Checkpoint(input=again).read(saved).assert_consumed()
    assert next(again)[1].numpy().tolist() == next(iterator)[1].numpy().tolist()
    _rewrite_from_other_pixels(out, tmp_path)
    rebuilt = iter(readers.images(out, cache=cache, repeat=True, **EVAL))
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(out) + r": this iterator checkpoint was "
                                                             r"saved by a pipeline of other data .*start this input"):
        tf.train.Checkpoint(input=rebuilt).read(saved)


def test_a_repeated_cached_pipeline_checks_every_epoch(dataset, tmp_path):
    _, out = dataset
    ds = readers.images(out, cache=str(tmp_path / "cache"), repeat=True, **TRAIN)
    iterator = iter(ds)
    for _ in range(NUM_CLASSES + 1):  # into the second epoch: the cache is complete
        next(iterator)
    _rewrite_from_other_pixels(out, tmp_path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the dataset changed since the pipeline"):
        for _ in range(2 * NUM_CLASSES):
            next(iterator)


def test_an_append_keeps_a_cached_pipeline_reading_and_a_later_overwrite_fails_it(converted, tmp_path):
    src, out = converted
    ds = readers.images(out, cache="memory", **EVAL)
    assert sorted(labels_of(ds)) == ALL
    write_jpeg(os.path.join(src, CLASSES[0], "new.jpg"), seed=500, size=(40, 32))
    convert_images(src, out, ConvertOptions(num_shards=4), workers=0, progress=False, append=True)
    assert readers.info(out).num_records("train") == NUM_CLASSES + 1
    assert sorted(labels_of(ds)) == ALL  # the shards it was built on are still listed and unchanged: no error
    _rewrite_from_other_pixels(out, tmp_path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="its manifest no longer lists shard|another shard"):
        labels_of(ds)


_QUIET_CHILD = r"""
import sys
from tfshard import readers

for drop_remainder, cache in ((True, sys.argv[2]), (False, sys.argv[3])):
    ds = readers.images(sys.argv[1], cache=cache, batch_size=5, image_size=8, seed=0, drop_remainder=drop_remainder)
    print("epochs", drop_remainder, [sum(1 for _ in ds) for _ in range(2)], flush=True)
"""


def test_a_cached_training_reader_logs_no_tensorflow_cost_model_errors(converted_images, tmp_path):
    """The random crop after a cache gives ``crop_and_resize`` a static count of boxes, the batch size: with boxes
    of an unknown count, grappler's cost model logged "Error in PredictCost() for the op ... CropAndResize" (~2 KB)
    each time an iterator was made, every epoch. With ``drop_remainder=False`` the batches' shape has no static size
    (the last is partial), so the crop pads its boxes to the batch size. TensorFlow reads its log level once per
    process and this suite runs at TF_CPP_MIN_LOG_LEVEL=2, which hides warnings: hence a child at level 0, its C++
    stderr captured. 12 images in batches of 5: 2 full batches, and a partial third one without drop_remainder."""
    caches = [str(tmp_path / "dropped"), str(tmp_path / "kept")]
    done = subprocess.run([sys.executable, "-c", _QUIET_CHILD, converted_images.out, *caches],
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}, capture_output=True, text=True,
                          timeout=300, check=True)
    # two epochs each, the first writing the cache, the second reading it
    assert "epochs True [2, 2]" in done.stdout and "epochs False [3, 3]" in done.stdout, done.stdout
    for cache in caches:
        assert glob.glob(os.path.join(cache, "tfshard-*.index")), f"the cache {cache} was not written"
    assert "Error in PredictCost()" not in done.stderr, done.stderr[-3000:]
