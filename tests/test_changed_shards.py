"""Shards that change under a pipeline (its dataset converted again while it reads): it must never mix the two
datasets in one epoch, nor save such an epoch as a complete cache (``readers/guard.py``)."""

from __future__ import annotations

import glob
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, make_tree, random_episodes, save_episodes, tfrecord_bytes, within
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_images
from tfshard.readers import guard as guard_lib


@pytest.fixture
def two_trees(tmp_path):
    """Two image trees with the same layout and other pixels (A's and B's labels alike), and OUT converted from A."""
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out")
    make_tree(a, classes=("x", "y"), per_class=40, seed=0)
    make_tree(b, classes=("x", "y"), per_class=40, seed=1000)
    convert_images(a, out, ConvertOptions(num_shards=8), workers=0, progress=False)
    return a, b, out


def _reconvert(src: str, out: str) -> None:
    convert_images(src, out, ConvertOptions(num_shards=8), workers=0, progress=False, overwrite=True)


def _filenames(out: str) -> set[bytes]:
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string),
            "image/encoded": tf.io.FixedLenFeature([], tf.string)}
    found = set()
    for path in readers.info(out).shard_paths("train"):
        for record in tf.data.TFRecordDataset(path):
            found.add(tf.io.parse_single_example(record, spec)["image/encoded"].numpy())
    return found


@pytest.mark.parametrize("cache", [None, "memory", "folder"])
def test_a_reconversion_mid_epoch_fails_the_epoch_naming_a_shard_and_no_cache_is_completed(two_trees, tmp_path, cache):
    a, b, out = two_trees
    cache_dir = str(tmp_path / "cache") if cache == "folder" else cache
    ds = readers.images(out, training=False, batch_size=4, image_size=16, cache=cache_dir, num_parallel_reads=2)
    iterator = iter(ds)
    for _ in range(5):
        next(iterator)
    _reconvert(b, out)
    # The guard names the shard (gone: seen mid-rewrite); a shard deleted between its check and its open is
    # TensorFlow's NotFoundError, which names it too.
    shard = (r"out/train-\d{5}-of-00008\.tfrecord(: shard (is gone|was replaced or changed) .*build the pipeline "
             r"again|; No such file)")
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.NotFoundError), match=shard):
        for _ in iterator:
            pass
    if cache == "folder":
        assert glob.glob(os.path.join(cache_dir, "*.index")) == [], "an epoch that failed was saved as a cache"
    # A new pipeline reads B alone, and B's records.
    assert sum(int(tf.shape(x)[0]) for x, _ in readers.images(out, training=False, batch_size=4, image_size=16)) == 80


def test_training_pipelines_fail_too_and_never_yield_a_record_of_the_new_dataset(two_trees):
    a, b, out = two_trees
    old = _filenames(out)
    ds = readers.images(out, batch_size=2, image_size=16, seed=0, num_parallel_reads=2, dtype="uint8",
                        augment=None, shuffle_buffer=1)
    iterator = iter(ds)
    next(iterator)
    _reconvert(b, out)
    new = _filenames(out)
    assert not old & new
    with pytest.raises(tf.errors.InvalidArgumentError, match="shard (is gone|was replaced or changed)"):
        for _ in iterator:
            pass


@pytest.mark.parametrize("change", ["a reconversion", "a same-size file swapped in"])
def test_a_stream_read_by_position_fails_on_a_changed_shard_and_never_reads_the_new_file(tmp_path, change):
    """Records read by position (``shuffle="global"``: offsets found at build, read by ``pread``, no CRC) must not be
    read from a file put in a shard's place since: at the old offsets they are other bytes, silently so when its
    layout is the old one's (here one byte of an image's quantisation table changed: it decodes, to other
    pixels)."""
    a, out = str(tmp_path / "a"), str(tmp_path / "out")
    make_tree(a, classes=("x", "y"), per_class=200, seed=0)
    convert_images(a, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    ds = readers.images(out, batch_size=2, image_size=16, seed=0, shuffle="global", dtype="uint8", augment=None)
    iterator = iter(ds)
    next(iterator)  # the reads run ~3 batches of 64 records ahead: most of the 400 are read after the change
    if change == "a reconversion":
        make_tree(str(tmp_path / "b"), classes=("x", "y"), per_class=200, seed=1000)
        _reconvert(str(tmp_path / "b"), out)
    else:
        for shard in readers.info(out).shard_paths("train"):
            data = bytearray(open(shard, "rb").read())
            data[data.index(b"\xff\xd8", len(data) // 2) + 60] ^= 1  # in a JPEG's quantisation table: it decodes
            with open(shard + ".new", "wb") as f:
                f.write(data)
            os.replace(shard + ".new", shard)
    # "is gone": read ahead in the background while the conversion had removed it
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"out/train-\d{5}-of-00002\.tfrecord: shard (is gone|"
                       r"was replaced or changed) .*build the pipeline again"):
        for _ in iterator:
            pass


def test_ignore_errors_skips_a_replaced_shard_with_a_warning(two_trees, caplog):
    a, b, out = two_trees
    ds = readers.images(out, training=False, batch_size=1, image_size=16, ignore_errors=True, num_parallel_reads=1)
    iterator = iter(ds)
    next(iterator)
    _reconvert(b, out)
    with caplog.at_level("WARNING", logger="tfshard.readers.guard"):
        rest = sum(1 for _ in iterator)
    assert rest < 79  # the shards opened after the reconversion were skipped, not read
    assert ("shard was replaced or changed" in caplog.text or "shard is gone" in caplog.text)
    assert "ignore_errors=True" in caplog.text


@pytest.mark.parametrize("cache", [None, "folder"])
def test_a_shard_replaced_between_the_check_and_the_open_fails_the_epoch_by_the_end_of_its_read(two_trees, tmp_path,
                                                                                                monkeypatch, cache):
    """The instant the check before the open cannot close (the open itself): the check after the shard's last record
    fails the epoch, so it never completes and no cache is finalised from it."""
    a, b, out = two_trees
    other = os.path.join(os.path.dirname(out), "other")
    convert_images(b, other, ConvertOptions(num_shards=8), workers=0, progress=False)
    original = guard_lib.ShardGuard.problem
    swapped = []

    def swap_right_after_the_first_check(self, index, when):
        problem = original(self, index, when)
        if when == "before it was opened" and index == 0 and not swapped:
            name = os.path.basename(self.shards[0].path)
            os.replace(os.path.join(other, name), self.shards[0].path)  # what --overwrite does, at the worst moment
            swapped.append(name)
        return problem

    monkeypatch.setattr(guard_lib.ShardGuard, "problem", swap_right_after_the_first_check)
    cache_dir = str(tmp_path / "cache") if cache else None
    ds = readers.images(out, training=False, batch_size=1, image_size=16, num_parallel_reads=1, cache=cache_dir)
    changed = r"train-00000-of-00008\.tfrecord: shard was replaced or changed .*seen by the end of its read"
    with pytest.raises(tf.errors.InvalidArgumentError, match=changed):
        for _ in ds:
            pass
    assert swapped
    if cache:
        assert glob.glob(os.path.join(cache_dir, "*.index")) == [], "an epoch that failed was saved as a cache"


@pytest.mark.parametrize("when", ["before it was opened", "at its open"])
def test_an_epoch_failed_by_its_last_shard_is_never_cached(two_trees, tmp_path, monkeypatch, when):
    """The last shard changed before its open, or swapped at it: the read fails, the parallel map after it pulls
    again, and the reads reach their end at once. The cache took that end as a complete epoch (without the shard, or
    with its new records); the check after the reads fails every pull of the epoch instead."""
    a, b, out = two_trees
    other = os.path.join(os.path.dirname(out), "other")
    convert_images(b, other, ConvertOptions(num_shards=8), workers=0, progress=False)
    original = guard_lib.ShardGuard.problem
    swapped = []

    def swap(self, index, seen):  # "at its open": right after the check passed; else just before it
        checked_first = original(self, index, seen) if when == "at its open" else None
        last = self.shards[-1].path
        if seen == "before it was opened" and index == len(self.shards) - 1 and not swapped:
            os.replace(os.path.join(other, os.path.basename(last)), last)  # what --overwrite does
            swapped.append(last)
        return original(self, index, seen) if checked_first is None else checked_first

    monkeypatch.setattr(guard_lib.ShardGuard, "problem", swap)
    cache_dir = str(tmp_path / "cache")
    ds = readers.images(out, training=False, batch_size=1, image_size=16, num_parallel_reads=1, cache=cache_dir)
    seen = "before it was opened" if when == "before it was opened" else "by the end of its read"
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"train-00007-of-00008\.tfrecord: shard was replaced or "
                                                             r"changed .*seen " + seen):
        for _ in ds:
            pass
    assert swapped
    assert glob.glob(os.path.join(cache_dir, "*.index")) == [], "an epoch that failed was saved as a cache"
    with pytest.raises(tf.errors.InvalidArgumentError, match="changed|was replaced"):
        for _ in ds:  # the next epoch fails too: its check, ahead of the (incomplete) cache, sees the swapped shard
            pass


def test_ignore_errors_skips_a_shard_replaced_between_the_check_and_the_open_with_none_of_its_records(
        two_trees, monkeypatch, caplog):
    """An ignore_errors epoch does not fail, so the check after the last record would only log a shard swapped at its
    open, its records mixed into the epoch: the check once it is open skips all of them."""
    a, b, out = two_trees
    other = os.path.join(os.path.dirname(out), "other")
    convert_images(b, other, ConvertOptions(num_shards=8), workers=0, progress=False)
    name = os.path.basename(readers.info(out).shard_paths("train")[0])
    new_records = sum(1 for _ in tf.data.TFRecordDataset(os.path.join(other, name)))
    ds = readers.images(out, training=False, batch_size=1, image_size=16, num_parallel_reads=2, ignore_errors=True)
    everything = sum(1 for _ in ds)
    original = guard_lib.ShardGuard.problem
    swapped = []

    def swap_right_after_the_first_check(self, index, when):
        problem = original(self, index, when)
        if when == "before it was opened" and index == 0 and not swapped:
            os.replace(os.path.join(other, name), self.shards[0].path)
            swapped.append(name)
        return problem

    monkeypatch.setattr(guard_lib.ShardGuard, "problem", swap_right_after_the_first_check)
    with caplog.at_level("WARNING", logger="tfshard.readers.guard"):
        read = sum(1 for _ in ds)
    assert swapped and new_records > 0
    assert read == everything - new_records, "a shard swapped at its open was read into an ignore_errors epoch"
    assert re.search(rf"{name}: shard was replaced or changed .*seen once it was opened.*ignore_errors=True",
                     caplog.text)


def test_a_shard_rewritten_in_place_is_caught_by_the_end_of_its_read(two_trees):
    a, b, out = two_trees
    ds = readers.images(out, training=False, batch_size=1, image_size=16, num_parallel_reads=1)
    iterator = iter(ds)
    next(iterator)
    first = readers.info(out).shard_paths("train")[0]
    with open(first, "r+b") as f:  # same inode, same size: only its mtime and ctime change
        f.seek(0)
        f.write(f.read(1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"seen by the end of its read"):
        for _ in iterator:
            pass


def test_windows_streamed_and_episodes_fail_the_same_way(tmp_path):
    # Eight episodes a shard: a pipeline that has handed on one episode cannot have read ahead into the last shards
    # (four episodes, one a shard, were all read ahead at times: the epoch then held only A's, correctly, and no
    # error came).
    for name, lengths in (("a", list(range(30, 62))), ("b", list(range(31, 63)))):
        save_episodes(tmp_path / name, {f"e{i}.npy": e for i, e in enumerate(random_episodes(lengths, seed=len(name)))})
    out = tmp_path / "out"
    convert_episode_tree(tmp_path / "a", out, num_shards=4)
    for make in (lambda: readers.episodes(str(out)),
                 lambda: readers.windows(str(out), length=8, batch_size=1, resident=False, shuffle=False)):
        iterator = iter(make())
        next(iterator)
        convert_episode_tree(tmp_path / "b", out, num_shards=4, overwrite=True)
        # The guard names the shard; a shard deleted between its check and its open is TensorFlow's NotFoundError,
        # which names it too (the re-conversion runs while the pipeline reads ahead).
        with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.NotFoundError),
                           match="shard (is gone|was replaced or changed)|tfrecord; No such file"):
            for _ in iterator:
                pass
        convert_episode_tree(tmp_path / "a", out, num_shards=4, overwrite=True)


def test_a_guarded_pipeline_still_checkpoints_and_costs_no_epoch(two_trees, tmp_path):
    a, b, out = two_trees
    ds = readers.images(out, training=False, batch_size=4, image_size=16)
    iterator = iter(ds)
    first = next(iterator)[1].numpy()
    saved = tf.train.Checkpoint(input=iterator).save(str(tmp_path / "ckpt" / "c"))
    second = next(iterator)[1].numpy()
    restored = iter(ds)
    tf.train.Checkpoint(input=restored).restore(saved)
    np.testing.assert_array_equal(next(restored)[1].numpy(), second)
    assert len(first) == 4
    assert sum(1 for _ in ds) == sum(1 for _ in ds) == 20  # every epoch whole: the checks pass on an unchanged OUT


@pytest.mark.parametrize("when", ["before the read", "during the read"])
def test_a_bulk_load_of_a_shard_replaced_before_or_while_it_is_read_fails_naming_it(two_trees, when):
    """``bulk_read.read_now`` (resident episodes' one read): a shard swapped after ``check_shards`` saw it, whether
    before its open or mid-read, fails the load once the read ends, instead of loading two datasets into one."""
    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    other = os.path.join(os.path.dirname(out), "other")
    convert_images(b, other, ConvertOptions(num_shards=8), workers=0, progress=False)
    dataset = readers.info(out)
    shards = files.check_shards(dataset, "train", [0, 1])
    swapped = shards[1].path
    seen = []

    def swap():  # what --overwrite does
        os.replace(os.path.join(other, os.path.basename(swapped)), swapped)

    def each(record, path):
        if not seen and when == "during the read":
            swap()
        seen.append(path)

    if when == "before the read":
        swap()
    # Mid-read, the other reader has either opened the old file (its end's check sees the swap) or opens the new one,
    # whose frames then run out at the old size (the read fails, and is reported as the change it is).
    seen_when = "before it was opened" if when == "before the read" else "(by the end of its read|while it was read)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(swapped) + r": shard was replaced or changed "
                                                             r".*seen " + seen_when):
        bulk_read.read_now(shards, each, compression=None, fix="")
    # Unchanged shards load whole, with no error.
    again = files.check_shards(readers.info(other), "train", [0, 2])  # its shard 1 went to OUT
    records = []
    bulk_read.read_now(again, lambda record, path: records.append((record, path)), compression=None, fix="")
    assert sorted(records) == sorted((r, s.path) for s in again for r in tf.data.TFRecordDataset(s.path)
                                     .as_numpy_iterator())


def test_a_bulk_load_whose_later_shard_became_a_fifo_fails_naming_it_instead_of_hanging(two_trees):
    """``bulk_read.read_now`` opens ``at_once`` shards at a time: a later group is checked again just before its
    open, which a FIFO would block for ever."""
    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    shards = files.check_shards(readers.info(out), "train", [0, 1, 2, 3])

    def each(record, path):
        if os.path.exists(shards[3].path) and not os.path.isfile(shards[3].path):
            return
        os.remove(shards[3].path)
        os.mkfifo(shards[3].path)

    def load():
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=re.escape(shards[3].path) + r": shard cannot be read as it was .*seen before it was "
                                                             r"opened"):
            bulk_read.read_now(shards, each, compression=None, fix="", at_once=2)

    within(60, load)


def test_a_bulk_load_of_a_corrupt_record_names_its_shard_offset_and_the_fix(two_trees):
    """A flipped byte the shard's size cannot show: ``DataLossError`` naming the shard and where, as TensorFlow's
    reader would fail, and no record of that shard after it is handed on."""
    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    shards = files.check_shards(readers.info(out), "train", [0, 1])
    with open(shards[1].path, "r+b") as f:
        f.seek(shards[1].size - 10)
        byte = f.read(1)
        f.seek(shards[1].size - 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    shards = files.check_shards(readers.info(out), "train", [0, 1])  # the same size: only its CRC can tell
    last = shards[1].info.records - 1
    seen = []
    with pytest.raises(tf.errors.DataLossError, match=re.escape(shards[1].path) + r": corrupted record at byte \d+: "
                                                      r"its data fails its CRC; run the repair"):
        bulk_read.read_now(shards, lambda record, path: seen.append(path), compression=None, fix="run the repair")
    assert seen.count(shards[1].path) == last


def test_a_bulk_load_whose_callback_fails_raises_its_error_and_leaves_no_reader_running(two_trees):
    """``bulk_read.read_now`` with 4 readers: the error of ``each`` is raised as it is, once every reader stopped."""
    import threading

    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    shards = files.check_shards(readers.info(out), "train", [0, 1, 2, 3])
    before = set(threading.enumerate())
    calls = []

    def each(record, path):
        calls.append(path)
        if len(calls) == 3:
            raise KeyError("the third record")

    with pytest.raises(KeyError, match="the third record"):
        bulk_read.read_now(shards, each, compression=None, fix="", at_once=4)
    assert [t for t in threading.enumerate() if t not in before] == []  # every reader joined
    assert len(calls) == 3  # no record is handed on after the failure


def test_a_bulk_load_of_a_shard_that_grows_while_it_is_read_fails_as_changed_not_as_corrupt(two_trees):
    """A record appended to a shard mid-load: the read stops at the size ``check_shards`` took, and the end-of-read
    check names the shard as changed (as the pipelines' guard does)."""
    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    shards = files.check_shards(readers.info(out), "train", [0])
    grown = []

    def each(record, path):
        if not grown:
            with open(path, "ab") as f:
                f.write(tfrecord_bytes([b"x" * 100]))
            grown.append(path)

    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(shards[0].path) + r": shard was replaced or "
                                                             r"changed .*seen by the end of its read"):
        bulk_read.read_now(shards, each, compression=None, fix="")


def test_a_bulk_load_of_a_shard_cut_short_while_it_is_read_reports_the_change_not_damage(two_trees):
    """A shard truncated mid-read fails its next frame; the load names the shard as changed (build the pipeline again),
    not as corrupt (rewrite the dataset), since it is no longer the file that was checked."""
    from tfshard.readers import bulk_read, files

    a, b, out = two_trees
    shards = files.check_shards(readers.info(out), "train", [0])

    def each(record, path):
        if os.path.getsize(path) == shards[0].size:
            os.truncate(path, shards[0].size // 2)

    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(shards[0].path) + r": shard was replaced or "
                                                             r"changed .*seen while it was read"):
        bulk_read.read_now(shards, each, compression=None, fix="")
