"""Attacks on the shard cache: an untrusted cache folder, remotes that do not match the manifest, and processes that
share the folder, die mid-download or hold pins (``readers/shard_cache/store.py``)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import shard_cache_helpers as shared
from helpers import edit_manifest, snapshot
from tfshard.readers.shard_cache.store import ShardStore
from tfshard.readers.shard_cache.store import _host_tag as host_tag
from tfshard.tools.cache import fill_shard_cache

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shard_cache_child.py")
STORE_LOG = "tfshard.readers.shard_cache.store"
TIMEOUT_S = 60  # a guard against a hung read, far above the second each takes


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return shared.photo_dataset(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def expected(photos):
    """Two shared.epochs of the uncached reader."""
    return shared.epochs(shared.images(photos))


@pytest.fixture
def remote(tmp_path):
    return shared.remote_shards(tmp_path / "remote")


def _within(timeout_s, function, *args):
    """``function(*args)`` in a thread; fails the test, instead of hanging it, if it takes over ``timeout_s``."""
    result, errors = [], []

    def run():
        try:
            result.append(function(*args))
        except BaseException as e:  # noqa: BLE001 (raised again in the test's thread)
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{function.__name__} did not return within {timeout_s} s"
    if errors:
        raise errors[0]
    return result[0]


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
        found = _within(TIMEOUT_S, store.fetch, shard)
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
    got = _within(TIMEOUT_S, shared.epochs, ds)
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
        _within(TIMEOUT_S, store.fetch, shard)
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
        _within(TIMEOUT_S, store.fetch, shard)
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
    fetch takes the usage must not let a fourth in (every copy stays pinned, so none can be evicted)."""
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


def _liar(photos, root, shard_index: int = 0) -> str:
    """A copy of the dataset ``photos`` whose manifest gives shard ``shard_index``'s sha256 another size."""
    liar = str(root / "liar")
    shutil.copytree(photos, liar)

    def change(raw):
        raw["splits"]["train"]["shards"][shard_index]["bytes"] += 7
        raw["splits"]["train"]["bytes"] += 7  # consistent in itself: only the shard's file says otherwise

    edit_manifest(liar, change)
    return liar


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
            _within(TIMEOUT_S, store.fetch, remote[0])
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
        _within(TIMEOUT_S, lambda: fill_shard_cache(photos, directory, shared.LIMIT, fetches=1, progress=False))
    assert os.listdir(os.path.join(directory, "pins")) == []


def _foreign_pin(directory, sha256: str, age_s: float) -> str:
    """A pin file of a process on another host, last renewed ``age_s`` seconds ago."""
    path = os.path.join(directory, "pins", f"{sha256}.4242.123456.{host_tag('another-host.example')}")
    open(path, "w").close()
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def test_a_pin_of_another_host_counts_until_its_lease_runs_out(remote, tmp_path):
    """This host cannot see whether another host's process runs: its pin holds while it was renewed within the
    lease (an hour), and one not renewed for three hours is a dead process's."""
    directory = str(tmp_path / "c")
    store = ShardStore(directory, 2000)
    shared.fetched(store, remote[0])
    shared.fetched(store, remote[1])
    dead, live = _foreign_pin(directory, remote[0].sha256, 3 * 3600), _foreign_pin(directory, remote[1].sha256, 60)
    shared.fetched(store, remote[2])
    shared.fetched(store, remote[3])
    assert shared.copies(directory) == {remote[1].sha256, remote[3].sha256}
    assert not os.path.exists(dead) and os.path.exists(live)


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
