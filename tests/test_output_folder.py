"""What a conversion does to its output folder, attacked: files it never wrote, planned shards that come out empty,
a read-only OUT, arguments that name no folder at all, two conversions into one OUT at once (the lock), kill -9
mid-``--overwrite``, a full disk, and links planted in OUT. The rows from the untrusted-input table live in the
world of tests/untrusted_world.py and check that nothing outside OUT changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    edit_manifest,
    files_under,
    make_tree,
    require,
    save_episodes,
    snapshot,
    write_jpeg,
)
from stop_point import kill_group, let_go, start_held
from tfshard import readers
from tfshard.ingest import (
    ConvertOptions,
    EpisodeOptions,
    InputError,
    OutputExistsError,
    VerifyError,
    convert_images,
    verify,
)
from untrusted_world import (
    ENV,
    LOCK,
    MANIFEST,
    REPO,
    STATE,
    Ran,
    World,
    assert_cli_error,
    assert_untouched,
    new_world,
    number,
    ok,
    run_cli,
    run_process,
)


@pytest.fixture
def world(tmp_path, cli, request) -> World:
    return new_world(tmp_path, cli, request)

# --- --overwrite into a folder tfshard never wrote ---------------------------------------------------------------


def _another_tools_dataset(out: str, shard: bool = True) -> dict[str, bytes]:
    """What TFDS (or anyone) leaves in a folder: its metadata and (``shard``) a shard named as tfshard names its
    first one."""
    os.makedirs(out)
    files = {"features.json": b'{"type": "tfds features"}', "dataset_info.json": b'{"name": "mnist"}'}
    if shard:
        files["train-00000-of-00001.tfrecord"] = b"another tool's records"
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    return files


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_holding_another_tools_dataset_is_refused_and_nothing_in_it_changes(image_tree, tmp_path, cli,
                                                                                     overwrite):
    src, _ = image_tree
    out = str(tmp_path / "out")
    theirs = _another_tools_dataset(out)
    flags = ["--overwrite"] if overwrite else []
    result = cli("images", src, out, "--num-shards", "1", "--workers", "0", "--quiet", *flags)
    assert result.exit_code == 1, result.output
    assert "train-00000-of-00001.tfrecord" in result.stderr and "tfshard did not write" in result.stderr
    with pytest.raises(OutputExistsError, match="nothing was removed or replaced"):
        convert_images(src, out, ConvertOptions(num_shards=1), workers=0, progress=False, overwrite=True)
    assert files_under(out) == theirs


def test_overwrite_beside_unrelated_files_writes_only_names_that_did_not_exist(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    theirs = _another_tools_dataset(out, shard=False)
    manifest = convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    after = files_under(out)
    assert {name: after[name] for name in theirs} == theirs  # their dataset_info.json, features.json kept as they were
    assert readers.info(out).num_records("train") == len(image_tree[1])
    with pytest.raises(VerifyError, match="dataset_info.json: not TFDS metadata tfshard wrote"):
        verify(out)  # which TFDS would take for this dataset's: verify says so
    # A later --overwrite of our dataset removes our files only: their TFDS metadata does not name our dataset.
    convert_images(src, out, ConvertOptions(num_shards=3), workers=0, progress=False, overwrite=True)
    after = files_under(out)
    assert {name: after[name] for name in theirs} == theirs
    assert manifest.splits["train"].shards[0].file not in after


def test_tfds_beside_another_tools_tfds_metadata_is_refused_up_front_and_replaces_nothing(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    theirs = _another_tools_dataset(out, shard=False)
    with pytest.raises(InputError, match=r"dataset_info.json: TFDS metadata tfshard did not write .*; it is not "
                                         r"replaced: move it out of OUT"):
        convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True, tfds=True)
    assert files_under(out) == theirs


@pytest.mark.parametrize("edit", [lambda raw: raw.update(inputs_sha256="A" * 64),
                                  lambda raw: raw["splits"]["train"]["shards"][0].update(file="../victim")],
                         ids=["a-field-of-the-wrong-shape", "a-shard-path-out-of-out"])
def test_overwrite_over_a_manifest_tfshard_cannot_read_names_it_and_a_fix_that_is_not_overwrite(image_tree, tmp_path,
                                                                                               cli, edit):
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    edit_manifest(out, edit)
    before = files_under(out)
    result = cli("images", src, out, "--num-shards", "3", "--workers", "0", "--quiet", "--overwrite")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert f"{out}: output folder holds a dataset.json tfshard cannot read ({out}/dataset.json: field " in result.stderr
    assert result.stderr.rstrip().endswith("nothing was removed: remove OUT yourself, or choose another folder")
    assert "--overwrite" not in result.stderr and files_under(out) == before


# --- state files that name a user's file: only a file tfshard can prove it wrote is removed or replaced ----------

MINE = b"a user's own records, named as tfshard names a shard"


def _state(out: str, files: dict) -> None:
    """A state folder holding ``files`` ({name: JSON value}), as an edited or copied one would."""
    os.makedirs(os.path.join(out, STATE), exist_ok=True)
    for name, value in files.items():
        with open(os.path.join(out, STATE, name), "w") as f:
            json.dump(value, f)


def _mine(out: str, *names: str) -> dict[str, bytes]:
    os.makedirs(out, exist_ok=True)
    for name in names:
        with open(os.path.join(out, name), "wb") as f:
            f.write(MINE)
    return {name: MINE for name in names}


def _the_real_plan(src: str, tmp_path) -> tuple[str, dict]:
    """The fingerprint of RESUME's conversion of ``src`` and its first shard's manifest entry (a clean run's)."""
    clean = convert_images(src, str(tmp_path / "clean"), RESUME, workers=0, progress=False)
    shard = clean.splits["train"].shards[0]
    return clean.fingerprint, {"file": shard.file, "records": shard.records, "bytes": shard.bytes,
                               "sha256": shard.sha256}


RESUME = ConvertOptions(num_shards=2, seed=None)
PLANNED = "train-00000-of-00002.tfrecord"  # a name RESUME writes
OTHER = "train-00000-of-00001.tfrecord"  # a shard name RESUME does not write


@pytest.mark.parametrize("case", ["overwrite-other-plan", "resume-same-plan", "resume-forged-commit-record"])
def test_a_state_file_naming_a_users_file_never_gets_it_removed_or_replaced(image_tree, tmp_path, case):
    """plan.json names files but proves nothing; a commit record proves only the bytes it records. The user's files
    named like shards stay as they are, and the run is refused naming the one it would have replaced."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    fingerprint, entry = _the_real_plan(src, tmp_path)
    theirs = _mine(out, PLANNED, OTHER)
    plan = {"fingerprint": "0" * 64 if case == "overwrite-other-plan" else fingerprint, "files": [PLANNED, OTHER]}
    _state(out, {"plan.json": plan})
    if case == "resume-forged-commit-record":  # a real record, of the real shard, beside the user's file
        _state(out, {PLANNED + ".json": {"info": entry, "stats": {}, "rejected": []}})
    expected = "does not match its commit record" if case == "resume-forged-commit-record" else "tfshard did not write"
    with pytest.raises(OutputExistsError, match=rf"{re.escape(PLANNED)}.*{expected}|{expected}.*{re.escape(PLANNED)}"):
        convert_images(src, out, RESUME, workers=0, progress=False, overwrite=case.startswith("overwrite"))
    after = files_under(out)
    assert {name: after.get(name) for name in theirs} == theirs


def test_overwrite_of_an_unfinished_conversion_whose_plan_names_a_users_file_writes_beside_it(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    theirs = _mine(out, OTHER)
    _state(out, {"plan.json": {"fingerprint": "0" * 64, "files": [OTHER, "dataset.json"]}})
    convert_images(src, out, RESUME, workers=0, progress=False, overwrite=True)
    assert files_under(out)[OTHER] == theirs[OTHER]
    assert readers.info(out).num_records("train") == len(image_tree[1])


@pytest.mark.parametrize("entry", [OTHER, {"name": OTHER, "bytes": len(MINE), "sha256": "ab" * 32, "limit": None}],
                         ids=["names-only", "other-bytes"])
def test_a_removal_record_naming_a_users_file_never_gets_it_removed(image_tree, tmp_path, cli, entry):
    """removing.json (an --overwrite in progress) is finished by any run, so it names each file's size and sha256,
    and a file that does not match is refused, naming it, before anything is removed."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, RESUME, workers=0, progress=False)
    theirs = _mine(out, OTHER)
    _state(out, {"removing.json": {"files": ["dataset.json", entry] if isinstance(entry, str) else [entry]}})
    before = files_under(out)
    result = cli("images", src, out, "--num-shards", "2", "--no-shuffle", "--workers", "0", "--quiet")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert ("removing.json: entry 0 is not a file tfshard recorded" if isinstance(entry, str)
            else f"{OTHER}: does not match the removal record") in result.stderr
    assert files_under(out) == before and files_under(out)[OTHER] == theirs[OTHER]


def _unreadable_plan(state: str, how: str) -> None:
    os.makedirs(state)
    path = os.path.join(state, "plan.json")
    if how == "fifo":
        os.mkfifo(path)
        return
    text = {"not-json": "{plan", "nested-100000-deep": "[" * 100_000 + "]" * 100_000,
            "a-key-twice": json.dumps({"fingerprint": "0" * 64, "files": []})[:-1] + ', "fingerprint": "1"}'}[how]
    with open(path, "w") as f:
        f.write(text)


@pytest.mark.parametrize("how", ["not-json", "nested-100000-deep", "a-key-twice", "fifo"])
def test_a_state_file_tfshard_cannot_read_is_one_line_whose_fix_works(image_tree, tmp_path, cli, how):
    """The fix named is the one that works: --overwrite reads the state folder too, so it is not the fix; removing
    the state folder is, and the same command then converts."""
    src, _ = image_tree
    out = str(tmp_path / "out")
    _unreadable_plan(os.path.join(out, STATE), how)
    for flags in ([], ["--overwrite"]):
        result = cli("images", src, out, "--workers", "0", "--quiet", *flags)
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
        assert f"{os.path.join(out, STATE, 'plan.json')}: " in result.stderr
        assert f"remove {os.path.join(out, STATE)} (or OUT) and run again" in result.stderr
        assert "--overwrite" not in result.stderr, result.stderr
    shutil.rmtree(os.path.join(out, STATE))
    assert cli("images", src, out, "--workers", "0", "--quiet").exit_code == 0
    assert readers.info(out).num_records("train") == len(image_tree[1])


# --- planned shards whose every input was rejected ----------------------------------------------------------------


def _tree_with_rejects(src: str, good: int = 17, bad: int = 4) -> None:
    """``good`` JPEGs and ``bad`` text files named .jpg (rejected by the workers, not the scan), in one class."""
    for i in range(good):
        write_jpeg(os.path.join(src, "cat", f"good{i:02d}.jpg"), i)
    for i in range(bad):
        with open(os.path.join(src, "cat", f"bad{i}.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff" + b"not a jpeg " * 40)


def test_more_shards_than_good_records_is_refused_counting_the_good_ones(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _tree_with_rejects(src)
    with pytest.raises(InputError, match=r"of its 21 planned shards held only rejected inputs, leaving 17 shards of "
                                         r"17 good img records where --num-shards 21 was asked.*--num-shards 17"):
        convert_images(src, out, ConvertOptions(num_shards=21, seed=None), workers=0, progress=False)
    assert not os.path.exists(os.path.join(out, "dataset.json"))
    # Before validation only the inputs are known: the message says that is what it counts.
    with pytest.raises(InputError, match=r"50 shards asked for .* but only 21 img inputs were found, counted before "
                                         r"validation"):
        convert_images(src, out, ConvertOptions(num_shards=50), workers=0, progress=False, overwrite=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_that_came_out_empty_are_dropped_and_the_rest_renumbered(tmp_path, workers):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _tree_with_rejects(src, good=6, bad=6)
    options = ConvertOptions(shard_bytes=1, seed=None)  # one input per planned shard: 12 planned, 6 empty
    manifest = convert_images(src, out, options, workers=workers, progress=False)
    shards = manifest.splits["train"].shards
    assert [s.file for s in shards] == [f"train-{i:05d}-of-00006.tfrecord" for i in range(6)]
    assert all(s.records == 1 for s in shards) and len(manifest.rejected) == 6
    assert sorted(n for n in os.listdir(out) if n.endswith(".tfrecord")) == [s.file for s in shards]
    verify(out)
    # Every multi-worker share holds records: no pipeline of 6 gets an empty file.
    for pipeline in range(6):
        context = tf.distribute.InputContext(num_input_pipelines=6, input_pipeline_id=pipeline)
        labels = [int(y) for _, y in readers.images(out, batch_size=1, image_size=8, training=False,
                                                    input_context=context).unbatch()]
        assert len(labels) == 1
    # The same command again finds it complete.
    assert convert_images(src, out, options, workers=workers, progress=False) == manifest


def test_min_shards_below_the_shards_that_stay_is_refused(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _tree_with_rejects(src, good=2, bad=2)
    with pytest.raises(InputError, match=r"--min-shards 4"):
        convert_images(src, out, ConvertOptions(min_shards=4, seed=None), workers=0, progress=False)


def test_an_episode_split_of_only_skipped_episodes_is_left_out(tmp_path):
    import numpy as np

    save_episodes(tmp_path / "e", {"train/a.npy": np.ones((4, 2), np.float32),
                                   "train/b.npy": np.ones((5, 2), np.float32),
                                   "val/c.npy": np.full((4, 2), np.nan, np.float32),
                                   "val/d.npy": np.full((3, 2), np.inf, np.float32)})
    manifest = convert_episode_tree(tmp_path / "e", tmp_path / "out", episode=EpisodeOptions(on_nan="skip"),
                                    num_shards=2)
    assert list(manifest.splits) == ["train"] and [r["path"] for r in manifest.rejected] == ["val/c.npy", "val/d.npy"]
    verify(str(tmp_path / "out"))


def test_a_run_killed_while_renumbering_ends_byte_identical_when_rerun(tmp_path, monkeypatch):
    src = str(tmp_path / "src")
    _tree_with_rejects(src, good=6, bad=6)
    options = ConvertOptions(shard_bytes=1, seed=None)
    clean = str(tmp_path / "clean")
    convert_images(src, clean, options, workers=0, progress=False)
    out = str(tmp_path / "out")
    rename, calls = tf.io.gfile.rename, []

    def dies_on_the_third_shard_rename(old, new, overwrite=False):
        if os.path.basename(old).startswith("train-") and not os.path.basename(old).startswith(".tmp-"):
            calls.append(old)
            if len(calls) == 3:
                raise KeyboardInterrupt  # as a Ctrl-C or a kill between two renames
        return rename(old, new, overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", dies_on_the_third_shard_rename)
    with pytest.raises(KeyboardInterrupt):
        convert_images(src, out, options, workers=0, progress=False)
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    assert os.path.exists(os.path.join(out, STATE, "renumber.json")) and not os.path.exists(
        os.path.join(out, "dataset.json"))
    convert_images(src, out, options, workers=0, progress=False)
    assert files_under(out) == files_under(clean)


def test_overwrite_of_a_run_killed_while_renumbering_removes_its_renamed_shards(tmp_path, monkeypatch):
    src = str(tmp_path / "src")
    _tree_with_rejects(src, good=6, bad=6)
    out = str(tmp_path / "out")
    rename = tf.io.gfile.rename

    def dies_after_the_first_shard_rename(old, new, overwrite=False):
        rename(old, new, overwrite)
        if re.match(r"train-\d{5}-of-00006", os.path.basename(new)):
            raise KeyboardInterrupt

    monkeypatch.setattr(tf.io.gfile, "rename", dies_after_the_first_shard_rename)
    with pytest.raises(KeyboardInterrupt):
        convert_images(src, out, ConvertOptions(shard_bytes=1, seed=None), workers=0, progress=False)
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    assert sorted(n for n in os.listdir(out) if ".tfrecord" in n) == [f"train-0000{i}-of-00002.tfrecord"
                                                                     for i in range(2)]
    verify(out)


# --- a finished dataset on a read-only folder ----------------------------------------------------------------------


def _read_only_run(out: str, args: list[str]) -> subprocess.CompletedProcess:
    """``tfshard ARGS`` with OUT bind-mounted read-only in a private mount namespace (root ignores chmod)."""
    require(shutil.which("unshare") is not None, "no unshare(1) here")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", out, sys.executable, "-m", "tfshard", *args],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)


def test_rerun_on_a_read_only_folder_says_complete_or_names_the_folder(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    before = files_under(out)
    done = _read_only_run(out, ["images", src, out, "--num-shards", "2", "--workers", "0"])
    mounted = not ("mount" in done.stderr and done.returncode != 0 and "tfshard" not in done.stderr)
    require(mounted, f"cannot bind-mount read-only here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert f"{out}: already complete for these inputs and options; nothing converted" in done.stdout
    other = _read_only_run(out, ["images", src, out, "--num-shards", "3", "--workers", "0", "--overwrite"])
    assert other.returncode == 1 and other.stderr.strip().splitlines() == [
        f"error: {out}: cannot write into the output folder (Read-only file system); a conversion writes its shards "
        "and its lock there: make the folder writable, or choose another folder"]
    assert files_under(out) == before


# --- arguments that name no folder --------------------------------------------------------------------------------


def test_a_file_as_source_and_an_empty_output_path_are_named_in_one_line(tmp_path, cli):
    photo = str(tmp_path / "photo.jpg")
    write_jpeg(photo, 0)
    for command in ("images", "episodes"):
        result = cli(command, photo, str(tmp_path / "out"), "--workers", "0")
        assert result.exit_code == 1 and result.stderr == (
            f"error: {photo}: a file, not a folder; pass the folder that holds it "
            f"({'class folders (SRC/<class>/<image>)' if command == 'images' else '.npy/.npz episodes'})\n")
    make_tree(str(tmp_path / "src"))
    result = cli("images", str(tmp_path / "src"), "", "--workers", "0")
    assert result.exit_code == 1 and "error: output folder: an empty path (got '')" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["photo.jpg", "src"]


def test_options_take_sizes_as_the_cli_does():
    assert ConvertOptions(shard_bytes="64MiB").shard_bytes == 64 * 2**20
    episode = EpisodeOptions(max_record_bytes="1MB", max_episode_bytes="2GiB")
    assert (episode.max_record_bytes, episode.max_episode_bytes) == (10**6, 2 * 2**30)
    with pytest.raises(ValueError, match=r"shard_size: not a size \(got '64 parsecs'\)"):
        ConvertOptions(shard_bytes="64 parsecs")
    with pytest.raises(TypeError, match=r"max_record_bytes: a byte count or a size"):
        EpisodeOptions(max_record_bytes=1.5)
    assert json.loads(json.dumps(ConvertOptions(shard_bytes="1KiB").identity("images")))["shard_bytes"] == 1024


# --- two conversions into one OUT at once; a stale lock ------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_source(tmp_path_factory) -> str:
    """6 classes x 10 48x48 JPEGs, in 4 shards. Two runs started together spend seconds starting TensorFlow side by
    side before they reach the lock, so they still nearly always overlap."""
    src = str(tmp_path_factory.mktemp("busy") / "src")
    make_tree(src, classes=[f"class{i}" for i in range(6)], per_class=10, size=(48, 48))
    return src


def _busy_command(src: str, out: str) -> list[str]:
    return [sys.executable, "-m", "tfshard", "images", src, out, "--num-shards", "4", "--workers", "1", "--quiet"]


def _assert_refused_by_lock(ran: Ran, out: str, holder_pid: int) -> None:
    assert_cli_error(ran, ["lock", os.path.join(out, LOCK), number(holder_pid)])


def _lock_owned(out: str) -> bool:
    """The lock file exists and holds its owner record (a run frozen between creating and filling it names no pid)."""
    try:
        return os.path.getsize(os.path.join(out, LOCK)) > 0
    except OSError:
        return False


def _assert_finished(cli, out: str) -> None:
    ok(cli("verify", out))
    assert not os.path.lexists(os.path.join(out, LOCK)), "the lock outlived its conversion"


@pytest.mark.slow
def test_two_conversions_started_together_never_both_write(world, busy_source):
    # Started together they nearly always overlap, and then one must be refused; if one happens to finish before
    # the other reaches the lock, the other finds the finished dataset and exits 0 (the next test forces overlap).
    # One pair a run: the race is the point, and the next test holds the overlap deterministically.
    before = snapshot(world.root, skip=("out",))
    out = world.out
    procs = [subprocess.Popen(_busy_command(busy_source, out), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    assert 0 in codes and set(codes) <= {0, 1}, (codes, [r[1] for r in results])
    for i, code in enumerate(codes):
        if code == 1:
            _assert_refused_by_lock(Ran(1, *results[i], in_process=False), out, procs[1 - i].pid)
    _assert_finished(world.cli, out)
    assert_untouched(before, snapshot(world.root, skip=("out",)))


@pytest.mark.slow
def test_a_second_conversion_while_one_is_writing_is_refused_by_the_lock(world, busy_source):
    # Deterministic overlap: the first run is held (tests/stop_point.py) as it starts its second shard, its lock
    # taken and a shard committed; the second runs to its end meanwhile, then the first is let go.
    out = world.out
    before = snapshot(world.root, skip=("out",))
    ready = world.path("held")
    first = start_held(_busy_command(busy_source, out)[3:], "write_shard#2", ready, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    try:
        assert _lock_owned(out), "the first run holds no lock while it writes"

        second = run_process(*_busy_command(busy_source, out)[3:], timeout=120, cap=False)

        let_go(ready)
        first_out, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            kill_group(first)
    _assert_refused_by_lock(second, out, first.pid)
    assert first.returncode == 0, first_err
    _assert_finished(world.cli, out)
    assert_untouched(before, snapshot(world.root, skip=("out", "held", "held.go")))


def test_a_stale_lock_of_a_dead_process_does_not_block(world):
    w = world.images(convert=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    os.makedirs(w.out)
    with open(os.path.join(w.out, LOCK), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": gone.pid, "start": "1"}, f)
    before = snapshot(w.root, skip=("out",))

    ok(w.cli("images", w.src, w.out, "--workers", "0", "--quiet"))

    ok(w.cli("verify", w.out))
    assert not os.path.lexists(os.path.join(w.out, LOCK))
    assert_untouched(before, snapshot(w.root, skip=("out",)))


# --- kill -9 during --overwrite, just after the old manifest is removed --------------------------------------------


OLD_SHARDS = 8


@pytest.mark.slow
def test_kill_during_overwrite_then_rerun_leaves_only_the_new_dataset(world):
    # The overwrite runs as the real command, held (tests/stop_point.py) at its first call after the old manifest is
    # removed, so the kill lands during the removal of the old shards; the rerun is in-process.
    w = world
    make_tree(w.src, classes=("a", "b"), per_class=OLD_SHARDS // 2)
    ok(w.cli("images", w.src, w.out, "--num-shards", str(OLD_SHARDS), "--workers", "0", "--quiet"))
    manifest = os.path.join(w.out, MANIFEST)
    new_src = w.path("new")
    make_tree(new_src, classes=[f"class{i}" for i in range(3)], per_class=4, seed=50)
    before = snapshot(w.root, skip=("out",))
    args = ["images", new_src, w.out, "--overwrite", "--num-shards", "3", "--workers", "1", "--quiet"]

    proc = start_held(args, f"missing={manifest}", w.out + "-held", stdout=subprocess.DEVNULL,
                      stderr=subprocess.PIPE)
    old_left = [n for n in os.listdir(w.out) if n.endswith(f"-of-{OLD_SHARDS:05d}.tfrecord")]
    assert old_left, "held after every old shard was removed: the kill would not land during the removal"
    kill_group(proc)  # its own session: the decode worker dies with it
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    ok(w.cli(*args))

    ok(w.cli("verify", w.out))
    assert sorted(os.listdir(w.out)) == [MANIFEST, "inputs.json"] + [f"train-0000{i}-of-00003.tfrecord"
                                                                       for i in range(3)]
    assert_untouched(before, snapshot(w.root, skip=("out", "out-held")))


# --- disk full -----------------------------------------------------------------------------------------------------


def test_disk_full_is_one_line_naming_the_path(world):
    require(shutil.which("unshare") is not None, "no unshare(1) here")
    mount = world.path("mnt")
    os.makedirs(mount)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=200k tmpfs "$1"', "sh", mount],
                           capture_output=True, text=True)
    require(probe.returncode == 0, f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}")
    make_tree(world.src, classes=[f"class{i}" for i in range(4)], per_class=20, size=(96, 96))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(world.src) for f in fs)
    assert total > 400 * 1024, "the source must not fit in the 200 kB tmpfs"
    out = os.path.join(mount, "out")
    script = 'mount -t tmpfs -o size=200k tmpfs "$1" && exec "$2" -m tfshard images "$3" "$4" --workers 0 --quiet'
    before = snapshot(world.root, skip=("out", "mnt"))

    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", mount, sys.executable, world.src, out],
                              cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a conversion into a full disk hangs")

    assert_cli_error(Ran(done.returncode, done.stdout, done.stderr, in_process=False),
                     [re.compile("no space left", re.IGNORECASE), out])
    assert_untouched(before, snapshot(world.root, skip=("out", "mnt")))


# --- a second attack, on what the fixes added (the lock, commit records, the removal journal, bench) ---------------


@pytest.mark.parametrize("plant", ["hard-link", "fifo", "folder"])
def test_lock_file_planted_by_someone_else_is_refused_and_never_written_through(world, plant):
    world.images(convert=False)
    os.makedirs(world.out)
    lock = os.path.join(world.out, LOCK)
    victim = os.path.join(world.victim, "precious.txt")
    plants = {"hard-link": lambda: os.link(victim, lock), "fifo": lambda: os.mkfifo(lock),
              "folder": lambda: os.mkdir(lock)}
    plants[plant]()
    before = snapshot(world.root, skip=("out",))
    ran = run_cli(world.cli, ["images", world.src, world.out, "--workers", "0", "--quiet"])
    assert_cli_error(ran, [lock, "remove it"])
    assert_untouched(before, snapshot(world.root, skip=("out",)))


# --- a third attack: links planted in the state folder and at temporary names (removal on proof only) ---------------


def _plant(world: World, plant: str) -> list[str]:
    """Plants a link to the victim in OUT's state folder or at a temporary name; returns the command to run."""
    state = os.path.join(world.out, STATE)
    precious = os.path.join(world.victim, "precious.txt")
    os.makedirs(state, exist_ok=True)
    if plant == "symlink-to-a-folder-inside-the-state-folder":
        os.symlink(world.victim, os.path.join(state, "sub"))  # the state folder's removal must not follow it
    elif plant == "hard-link-at-a-state-files-temporary-name":  # beside no dataset: the state folder is reused
        shutil.rmtree(world.out)
        os.makedirs(state)
        os.link(precious, os.path.join(state, ".tmp-plan.json"))  # written in place, it would overwrite the victim
        return ["images", world.src, world.out, "--num-shards", "3", "--workers", "0", "--quiet"]
    elif plant == "hard-link-at-a-shards-temporary-name":
        os.link(precious, os.path.join(world.out, ".tmp-train-00000-of-00003.tfrecord"))
    else:  # a removal record naming a hard link to the victim, with the victim's real size and sha256
        link = os.path.join(world.out, "train-00000-of-00009.tfrecord")
        os.link(precious, link)
        sha256, size = hashlib.sha256(open(precious, "rb").read()).hexdigest(), os.path.getsize(precious)
        with open(os.path.join(state, "removing.json"), "w") as f:
            json.dump({"files": [{"name": os.path.basename(link), "bytes": size, "sha256": sha256, "limit": None}]}, f)
    return ["images", world.src, world.out, "--num-shards", "3", "--workers", "0", "--quiet", "--overwrite"]


@pytest.mark.parametrize("plant", ["symlink-to-a-folder-inside-the-state-folder",
                                   "hard-link-at-a-state-files-temporary-name", "hard-link-at-a-shards-temporary-name",
                                   "removal-record-of-a-hard-link-to-a-users-file"])
def test_a_link_planted_in_out_is_never_followed_or_written_through(world, plant):
    world.images()
    args = _plant(world, plant)
    before = snapshot(world.root, skip=("out",))
    ok(world.cli(*args))
    ok(world.cli("verify", world.out))
    assert not os.path.lexists(os.path.join(world.out, STATE))
    assert_untouched(before, snapshot(world.root, skip=("out",)))
