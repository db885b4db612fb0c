"""Atomic, resumable conversion: kill -9 anywhere, rerun, and get the bytes of an uninterrupted run.

The kill and signal tests run the real CLI in a subprocess held at a chosen point of the conversion
(tests/stop_point.py), SIGKILL or signal it there, and run the same command again in-process (the rerun's process
is not the point); the rest interrupt a conversion in-process (a bad file with ``on_error="fail"``) and check what a
rerun keeps, rewrites, refuses and never deletes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import assert_same_tree, ignoring_ctrl_c, make_tree, snapshot, write_jpeg
from stop_point import kill_group, start_held
from tfshard.ingest import ConvertOptions, InputError, OutputExistsError, convert_images, verify

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
STATE = ".tfshard-state"
MANIFEST = "dataset.json"
FINAL_SHARD = re.compile(r"^train-\d{5}-of-\d{5}\.tfrecord$")
KILL_SHARDS = 6
PER_SHARD = 8


def stats(folder: str) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every file under ``folder``: a rewrite (temp file + rename) changes both."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(root, name))
            found[os.path.relpath(os.path.join(root, name), folder)] = (st.st_ino, st.st_mtime_ns)
    return found


def final_shards(out: str) -> list[str]:
    return sorted(n for n in os.listdir(out) if FINAL_SHARD.match(n)) if os.path.isdir(out) else []


def count_records(path: str) -> int:
    """Reads every record; TensorFlow checks both CRCs of each and raises DataLossError on a partial file."""
    import tensorflow as tf

    try:
        return int(tf.data.TFRecordDataset(path).reduce(0, lambda n, _: n + 1))
    except tf.errors.DataLossError as e:
        pytest.fail(f"{path}: a file under a final shard name is partial or damaged: {e.message}")


def flip_middle_byte(path: str) -> None:
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


# --- kill -9 a real conversion, rerun the same command -------------------------------------------


def convert_args(src: str, out: str) -> list[str]:
    """``tfshard images SRC OUT ...`` with a decode worker: the command killed, stopped and rerun here."""
    return ["images", src, out, "--num-shards", str(KILL_SHARDS), "--quiet", "--workers", "1"]


def run_tfshard(*args):
    """The ``tfshard`` command in-process (as the ``cli`` fixture, usable from a module fixture)."""
    from tfshard import cli as cli_module
    from typer.testing import CliRunner

    return CliRunner().invoke(cli_module.app, cli_module.global_flags_first([str(a) for a in args]))


@pytest.fixture(scope="module")
def kill_source(tmp_path_factory):
    """6 classes x 8 32x32 JPEGs (8 records a shard) and an uninterrupted run's files. The runs are held at their
    kill points (tests/stop_point.py), so the size of the inputs does not decide where a kill lands."""
    root = tmp_path_factory.mktemp("resume")
    src = str(root / "src")
    make_tree(src, classes=[f"class{i}" for i in range(6)], per_class=PER_SHARD, size=(32, 32))
    clean = str(root / "clean")
    done = run_tfshard(*convert_args(src, clean))
    assert done.exit_code == 0, done.output
    files = snapshot(clean)
    assert len([n for n in files if FINAL_SHARD.match(n)]) == KILL_SHARDS and MANIFEST in files
    return src, files


# name: (where the run is held and killed, the final shards there then, tamper with a committed shard before the
# rerun). Killed while writing any shard after the first, a run leaves the same things (committed shards, a partial
# temporary file): one row covers them, and tampers with one of its committed shards as well.
KILL_POINTS = {
    "state-folder-before-any-shard": ("exists={out}/.tfshard-state", 0, False),
    "mid-shard-after-2-committed-then-one-changed": (f"ShardWriter.append#{2 * PER_SHARD + PER_SHARD // 2}", 2, True),
    "after-manifest": ("exists={out}/dataset.json", KILL_SHARDS, False),
}


@pytest.mark.parametrize("point", KILL_POINTS.keys())
def test_kill_then_rerun_ends_byte_identical_to_an_uninterrupted_run(kill_source, tmp_path, point):
    src, clean = kill_source
    when, shards_then, tamper = KILL_POINTS[point]
    out = str(tmp_path / "out")
    args = convert_args(src, out)
    proc = start_held(args, when.format(out=out), str(tmp_path / "held"), stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    kill_group(proc)  # its own session: the decode workers and forkserver die with it
    assert proc.returncode == -signal.SIGKILL

    # What the kill left: no partial file under a final name, and nothing that differs from the clean run.
    at_kill = final_shards(out)
    assert len(at_kill) == shards_then, (point, sorted(os.listdir(out)))
    for name in at_kill:
        assert count_records(os.path.join(out, name)) > 0
        with open(os.path.join(out, name), "rb") as f:
            assert f.read() == clean[name], f"{name}: committed shard differs from the uninterrupted run's"
    if os.path.exists(os.path.join(out, MANIFEST)):
        with open(os.path.join(out, MANIFEST), "rb") as f:
            assert f.read() == clean[MANIFEST]
    else:
        assert point != "after-manifest"
    state = os.path.join(out, STATE)
    recorded = {n[: -len(".json")] for n in os.listdir(state)} if os.path.isdir(state) else set()
    # The commit record is written before the rename: every shard under its final name has one (after the manifest,
    # the state folder may be half removed, and the manifest proves them).
    keep = list(at_kill)
    assert point == "after-manifest" or set(keep) <= recorded, f"shards without a commit record: {keep}, {recorded}"
    if tamper:
        assert keep, "no committed shard with a record to tamper with"
        tampered = os.path.join(out, keep.pop(0))
        flip_middle_byte(tampered)
        refused = run_tfshard(*args)
        assert refused.exit_code == 1 and f"{tampered}: does not match its commit record" in refused.stderr
        os.remove(tampered)  # what the message says to do with a damaged shard
    before = stats(out)

    rerun = run_tfshard(*args)
    assert rerun.exit_code == 0, rerun.output

    assert_same_tree(snapshot(out), clean)
    after = stats(out)
    for name in keep:
        assert after[name] == before[name], f"{name}: committed shard was rewritten instead of kept"


def _session_processes(sid: int) -> list[str]:
    """The processes still in session ``sid`` (the conversion's workers, forkserver, resource tracker)."""
    listed = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in listed.splitlines() if line.split() and line.split()[0] == str(sid)]


STOPS = {  # (signal, sent to, exit code, message)
    "ctrl-c-main-process": (signal.SIGINT, os.kill, 130, "interrupted"),  # kill -INT <pid>
    # a terminal's Ctrl-C: the decode workers get it too, and leave it to the parent
    "ctrl-c-process-group": (signal.SIGINT, os.killpg, 130, "interrupted"),
    "sigterm-main-process": (signal.SIGTERM, os.kill, 143, "terminated (SIGTERM)"),  # Kubernetes, kill <pid>
    "sigterm-process-group": (signal.SIGTERM, os.killpg, 143, "terminated (SIGTERM)"),  # Slurm's scancel
}
STARTED_IGNORING_CTRL_C = "ctrl-c-process-group-started-ignoring-it"  # `tfshard images ... &` in a script
# Sent to the process group, a signal reaches the parent as kill <pid> does, and the workers too: the group rows
# cover the main-process ones (the finalizer test below sends to the main process).
STOPPED = ["ctrl-c-process-group", "sigterm-process-group", STARTED_IGNORING_CTRL_C]
HELD_AT_THE_THIRD_SHARD = "write_shard#3"  # two shards committed, four to go, however fast the machine


@pytest.mark.parametrize("stop", STOPPED)
def test_ctrl_c_or_sigterm_says_so_and_the_same_command_resumes(kill_source, tmp_path, stop):
    """The conversion is held where it starts its third shard and stays there until the signal arrives, so the signal
    lands mid-conversion whatever the machine's speed or load (it once finished all 360 records first, on a fast
    machine, and the row failed)."""
    src, clean = kill_source
    signum, send, code, said = STOPS["ctrl-c-process-group" if stop == STARTED_IGNORING_CTRL_C else stop]
    out = str(tmp_path / "out")
    args = convert_args(src, out)
    proc = start_held(args, HELD_AT_THE_THIRD_SHARD, str(tmp_path / "held"), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True,
                      preexec_fn=ignoring_ctrl_c if stop == STARTED_IGNORING_CTRL_C else None)
    try:
        send(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert proc.returncode == code, stderr
    assert stderr == f"{out}: {said}; run the same command again to resume (committed shards are kept)\n"
    assert stdout == ""  # --quiet
    assert not os.path.exists(os.path.join(out, MANIFEST))
    assert len(final_shards(out)) == 2, "a shard was committed after the stop"

    again = run_tfshard(*[a for a in args if a != "--quiet"])
    assert again.exit_code == 0, again.output
    kept = re.search(rf"^{re.escape(out)}: resumed: kept (\d+) of {KILL_SHARDS} shards already committed$",
                     again.stdout, re.MULTILINE)
    assert kept and int(kept[1]) == 2, again.stdout
    assert_same_tree(snapshot(out), clean)


@pytest.mark.parametrize("stop", ["ctrl-c-main-process", "sigterm-main-process"])
def test_a_stop_raised_inside_a_finalizer_still_stops_the_conversion(kill_source, tmp_path, stop):
    """Ctrl-C or SIGTERM whose handler runs inside a ``__del__`` on the main thread (tests/finalizer_stop.py), where
    Python can only print the exception and goes on: the conversion still stops, before its next commit, with the
    same exit code and line. It went on to exit 0 with a complete dataset."""
    src, _ = kill_source
    signum, _, code, said = STOPS[stop]
    out = str(tmp_path / "out")
    first_commit = os.path.join(out, STATE, "train-*.tfrecord.json") + "@record_commit"  # as it returns
    command = [sys.executable, os.path.join(REPO, "tests", "finalizer_stop.py"), first_commit, signum.name,
               *convert_args(src, out)]
    done = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == code, done.stderr
    assert done.stderr == f"{out}: {said}; run the same command again to resume (committed shards are kept)\n"
    assert not os.path.exists(os.path.join(out, MANIFEST))
    assert len(final_shards(out)) == 1, "a shard was committed after the stop"


def test_kill_9_of_the_parent_alone_leaves_no_process_behind(kill_source, tmp_path):
    """kill -9 of the conversion only (not its group): the forkserver, the decode workers and the resource tracker
    exit within seconds, so whoever captures the output (``subprocess.run(capture_output=True)``, ``| tee``) gets
    EOF."""
    src, _ = kill_source
    out = str(tmp_path / "out")
    args = convert_args(src, out)[:-2] + ["--workers", "2"]
    proc = start_held(args, HELD_AT_THE_THIRD_SHARD, str(tmp_path / "held"), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)
    assert len(_session_processes(proc.pid)) >= 4, "expected the parent, a forkserver and 2 workers"
    os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=30)  # EOF on stdout and stderr: every holder of them has exited
    except subprocess.TimeoutExpired:
        left = _session_processes(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"30 s after kill -9 of the parent, its children still hold its output open: {left}")
    deadline = time.monotonic() + 10
    while _session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_processes(proc.pid) == []


# --- interrupted in-process: a bad file with on_error="fail" stops the run in its last shard -----

# on_error is not part of the output's identity, so a rerun with "skip" resumes the run that "fail" stopped.
RESUME = ConvertOptions(num_shards=2, seed=None)


@pytest.fixture
def interrupted(tmp_path):
    """(src, out, the files of a clean run): ``out`` holds shard 0 committed and the state folder, no manifest."""
    src = str(tmp_path / "src")
    make_tree(src)
    with open(os.path.join(src, "dog", "zzz.jpg"), "wb") as f:  # sorts last: lands in the last shard
        f.write(b"not a jpeg")
    out = str(tmp_path / "out")
    stopping = ConvertOptions(num_shards=2, seed=None, on_error="fail")
    with pytest.raises(InputError, match="zzz.jpg"):
        convert_images(src, out, stopping, workers=0, progress=False)
    assert sorted(os.listdir(out)) == [STATE, "train-00000-of-00002.tfrecord"]
    assert sorted(os.listdir(os.path.join(out, STATE))) == ["plan.json", "train-00000-of-00002.tfrecord.json"]
    clean = str(tmp_path / "clean")
    convert_images(src, clean, RESUME, workers=0, progress=False)
    return src, out, snapshot(clean)


def test_rerun_resumes_and_keeps_committed_shards(interrupted):
    src, out, clean = interrupted
    before = stats(out)
    manifest = convert_images(src, out, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(out), clean)
    assert stats(out)["train-00000-of-00002.tfrecord"] == before["train-00000-of-00002.tfrecord"]
    assert manifest.rejected == [{"path": "dog/zzz.jpg", "reason": manifest.rejected[0]["reason"]}]


def test_leftover_temp_files_are_removed_on_next_run(interrupted):
    src, out, clean = interrupted
    for name in (".tmp-train-00000-of-00002.tfrecord", ".tmp-train-00001-of-00002.tfrecord", ".tmp-dataset.json"):
        with open(os.path.join(out, name), "wb") as f:  # what kill -9 mid-write leaves
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00partial")
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(out), clean)  # no .tmp-* left, and nothing else changed


@pytest.mark.parametrize("change", ["flip-byte", "truncate", "append", "swap-for-other-shard"])
def test_changed_committed_shard_is_refused_naming_it_then_rewritten_once_removed(interrupted, change):
    """A committed shard that no longer matches its commit record may be a damaged shard or a user's file put there:
    tfshard cannot tell them apart, so it replaces neither; removed, it is written again."""
    src, out, clean = interrupted
    path = os.path.join(out, "train-00000-of-00002.tfrecord")
    if change == "flip-byte":
        flip_middle_byte(path)
    elif change == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 1)
    elif change == "append":
        with open(path, "ab") as f:
            f.write(b"\0")
    else:  # valid records, wrong ones: only the hash tells
        with open(path, "wb") as f:
            f.write(clean["train-00001-of-00002.tfrecord"])
    files = snapshot(out)
    with pytest.raises(OutputExistsError, match=re.escape(path) + r": does not match its commit record .*\(got .*\); "
                                                               r".*move that file out of OUT, or remove it") as caught:
        convert_images(src, out, RESUME, workers=0, progress=False)
    assert "\n" not in str(caught.value)
    assert_same_tree(snapshot(out), files)  # replaced by nothing, removed by nothing
    os.remove(path)
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(out), clean)


def test_a_run_stopped_just_after_a_shard_got_its_final_name_left_its_record_and_the_rerun_keeps_it(
        image_tree, tmp_path, monkeypatch):
    """The commit record is written before the rename: a kill right after it (simulated by an interrupt there)
    leaves no file under a final name that the rerun could not prove, so the rerun keeps the shard as it is."""
    from tfshard.ingest import write as write_lib

    src, _ = image_tree
    out = str(tmp_path / "out")
    real_exit = write_lib.ShardWriter.__exit__

    def renamed_then_killed(self, *exc):
        real_exit(self, *exc)
        raise KeyboardInterrupt

    monkeypatch.setattr(write_lib.ShardWriter, "__exit__", renamed_then_killed)
    with pytest.raises(KeyboardInterrupt):
        convert_images(src, out, RESUME, workers=0, progress=False)
    monkeypatch.undo()
    shard = "train-00000-of-00002.tfrecord"
    assert final_shards(out) == [shard] and os.path.exists(os.path.join(out, STATE, shard + ".json"))
    before = stats(out)
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert stats(out)[shard] == before[shard], "the committed shard was written again"
    verify(out)


def test_a_run_stopped_between_a_commit_record_and_its_rename_writes_that_shard_again(image_tree, tmp_path,
                                                                                       monkeypatch):
    import tensorflow as tf

    src, _ = image_tree
    out, clean = str(tmp_path / "out"), str(tmp_path / "clean")
    convert_images(src, clean, RESUME, workers=0, progress=False)
    rename = tf.io.gfile.rename

    def killed_at_the_rename(old, new, overwrite=False):
        raise KeyboardInterrupt  # the record is written, the shard still under its temporary name

    monkeypatch.setattr(tf.io.gfile, "rename", killed_at_the_rename)
    with pytest.raises(KeyboardInterrupt):
        convert_images(src, out, RESUME, workers=0, progress=False)
    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    assert final_shards(out) == [] and sorted(os.listdir(os.path.join(out, STATE))) == ["plan.json",
                                                                                "train-00000-of-00002.tfrecord.json"]
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(out), snapshot(clean))


def test_finished_dataset_with_leftover_state_folder_is_finished_without_rewrites(interrupted, tmp_path):
    # kill -9 between writing dataset.json and removing the state folder
    src, out, clean = interrupted
    done = str(tmp_path / "done")
    convert_images(src, done, RESUME, workers=0, progress=False)
    shutil.copytree(os.path.join(out, STATE), os.path.join(done, STATE))
    before = stats(done)
    convert_images(src, done, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(done), clean)
    after = stats(done)
    assert {k: v for k, v in before.items() if not k.startswith(STATE)} == after


def test_on_status_tells_a_resumed_run_from_a_complete_one(interrupted, tmp_path):
    from tfshard.ingest.resume import RunStatus

    src, out, _ = interrupted
    seen = []
    first = convert_images(src, out, RESUME, workers=0, progress=False, on_status=seen.append)
    shard0 = first.splits["train"].shards[0]
    assert seen == [RunStatus(complete=False, kept_shards=1, total_shards=2, kept_records=shard0.records,
                              kept_bytes=shard0.bytes)]
    assert seen[0].resumed
    assert convert_images(src, out, RESUME, workers=0, progress=False, on_status=seen.append) == first
    assert seen[1] == RunStatus(complete=True, kept_shards=2, total_shards=2, kept_records=first.total_records,
                                kept_bytes=first.total_bytes)
    assert not seen[1].resumed
    fresh = []
    convert_images(src, str(tmp_path / "fresh"), RESUME, workers=0, progress=False, on_status=fresh.append)
    assert fresh == [RunStatus(complete=False, kept_shards=0, total_shards=2)] and not fresh[0].resumed


# the CLI spelling of RESUME
RESUME_ARGS = ("--num-shards", "2", "--no-shuffle", "--workers", "0")


def test_cli_resumed_run_says_how_many_shards_it_kept(interrupted, cli):
    src, out, clean = interrupted
    result = cli("images", src, out, *RESUME_ARGS)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{out}: resumed: kept 1 of 2 shards already committed"
    manifest = json.loads(clean[MANIFEST])
    written = manifest["splits"]["train"]["shards"][1]["records"]
    total = manifest["splits"]["train"]["records"]
    summary = rf"^{re.escape(out)}: {total} records, .* in [\d.]+ s \({written} records written: [\d,]+ img/s\)$"
    assert re.search(summary, result.stdout, re.MULTILINE), result.stdout
    assert_same_tree(snapshot(out), clean)


def test_cli_rerun_of_a_finished_conversion_says_it_is_already_complete(image_tree, tmp_path, cli):
    src, written = image_tree
    out = str(tmp_path / "out")
    first = cli("images", src, out, *RESUME_ARGS)
    assert first.exit_code == 0, first.output
    assert "img/s" in first.stdout and "resumed" not in first.stdout and "already complete" not in first.stdout
    again = cli("images", src, out, *RESUME_ARGS)
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines()[0] == f"{out}: already complete for these inputs and options; nothing converted"
    assert f"{out}: {len(written)} records, " in again.stdout
    assert "img/s" not in again.stdout and " in " not in again.stdout.splitlines()[-1]  # no rate: nothing was done


def test_cli_interrupt_is_one_line_and_exit_130_then_the_same_command_resumes(image_tree, tmp_path, cli, monkeypatch):
    from tfshard.ingest import engine as convert_lib

    src, _ = image_tree
    out = str(tmp_path / "out")
    commit = convert_lib.record_commit
    commits = []

    def ctrl_c_at_the_second_commit(*args):
        if commits:
            raise KeyboardInterrupt  # what Ctrl-C raises, once the first shard is committed
        commits.append(commit(*args))

    monkeypatch.setattr(convert_lib, "record_commit", ctrl_c_at_the_second_commit)
    result = cli("images", src, out, *RESUME_ARGS, "--quiet")  # no progress bar on stderr
    assert result.exit_code == 130, result.output
    assert result.stderr == f"{out}: interrupted; run the same command again to resume (committed shards are kept)\n"
    assert not os.path.exists(os.path.join(out, MANIFEST))
    monkeypatch.undo()
    again = cli("images", src, out, *RESUME_ARGS)
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith(f"{out}: resumed: kept 1 of 2 shards already committed\n")
    verify(out)


def test_unfinished_conversion_of_other_options_is_refused_then_overwritten(interrupted, tmp_path):
    src, out, _ = interrupted
    other = ConvertOptions(num_shards=3, seed=None)
    before = snapshot(out)
    with pytest.raises(OutputExistsError, match=r"unfinished conversion.*--overwrite"):
        convert_images(src, out, other, workers=0, progress=False)
    assert_same_tree(snapshot(out), before)
    convert_images(src, out, other, workers=0, overwrite=True, progress=False)
    clean = str(tmp_path / "clean3")
    convert_images(src, clean, other, workers=0, progress=False)
    assert_same_tree(snapshot(out), snapshot(clean))


# --- finished datasets: no-op, refuse, overwrite ---------------------------------------------------


def test_rerun_with_same_inputs_and_options_is_a_no_op(image_tree, tmp_path, cli):
    src, _ = image_tree
    out = str(tmp_path / "out")
    first = convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    files, before = snapshot(out), stats(out)
    # on_error and workers do not change the bytes, so they do not make it a different dataset
    for options, workers in [(ConvertOptions(num_shards=2), 0), (ConvertOptions(num_shards=2, on_error="fail"), 1)]:
        assert convert_images(src, out, options, workers=workers, progress=False) == first
    result = cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet")  # the CLI's defaults agree
    assert result.exit_code == 0, result.output
    assert_same_tree(snapshot(out), files)
    assert stats(out) == before


def _add_image(src):
    write_jpeg(os.path.join(src, "cat", "new.jpg"), seed=999)


REFUSED = {
    "num-shards": (ConvertOptions(num_shards=3), None),
    "seed": (ConvertOptions(num_shards=2, seed=1), None),
    "compression": (ConvertOptions(num_shards=2, compression="gzip"), None),
    "index": (ConvertOptions(num_shards=2, index=True), None),
    "new-input-file": (ConvertOptions(num_shards=2), _add_image),
}


@pytest.mark.parametrize("change", REFUSED.keys())
def test_other_inputs_or_options_are_refused_without_overwrite(image_tree, tmp_path, change):
    src, _ = image_tree
    out = str(tmp_path / "out")
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    files, before = snapshot(out), stats(out)
    options, edit_source = REFUSED[change]
    if edit_source is not None:
        edit_source(src)
    problem = r": .*other inputs or options.*--overwrite" if change != "new-input-file" else \
        r": .*other inputs; SRC has 1 it has not read: pass append=True .*, overwrite=True to rebuild"  # grown
    with pytest.raises(OutputExistsError, match=re.escape(out) + problem):
        convert_images(src, out, options, workers=0, progress=False)
    assert_same_tree(snapshot(out), files)
    assert stats(out) == before


def test_cli_refuses_other_options_in_one_line(image_tree, tmp_path, cli):
    src, _ = image_tree
    out = str(tmp_path / "out")
    assert cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet").exit_code == 0
    files = snapshot(out)
    result = cli("images", src, out, "--num-shards", "3", "--workers", "0", "--quiet")
    assert result.exit_code == 1
    assert "--overwrite" in result.stderr and result.stderr.startswith(f"error: {out}: ")
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.output
    assert_same_tree(snapshot(out), files)


OVERWRITES = {
    "fewer-shards": (ConvertOptions(num_shards=3), ConvertOptions(num_shards=2)),
    "more-shards": (ConvertOptions(num_shards=2), ConvertOptions(num_shards=4)),
    "index-dropped": (ConvertOptions(num_shards=3, index=True), ConvertOptions(num_shards=3)),
    "gzip-to-plain": (ConvertOptions(num_shards=3, compression="gzip"), ConvertOptions(num_shards=2)),
}


@pytest.mark.parametrize("old, new", OVERWRITES.values(), ids=OVERWRITES.keys())
def test_overwrite_replaces_the_dataset_and_removes_old_shards(image_tree, tmp_path, old, new):
    src, _ = image_tree
    out, clean = str(tmp_path / "out"), str(tmp_path / "clean")
    convert_images(src, out, old, workers=0, progress=False)
    convert_images(src, out, new, workers=0, overwrite=True, progress=False)
    convert_images(src, clean, new, workers=0, progress=False)
    assert_same_tree(snapshot(out), snapshot(clean))  # not one file of the old dataset left
    verify(out)


def test_cli_overwrite_replaces_the_dataset(image_tree, tmp_path, cli):
    src, _ = image_tree
    out, clean = str(tmp_path / "out"), str(tmp_path / "clean")
    assert cli("images", src, out, "--num-shards", "3", "--workers", "0", "--quiet").exit_code == 0
    result = cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet", "--overwrite")
    assert result.exit_code == 0, result.output
    assert cli("images", src, clean, "--num-shards", "2", "--workers", "0", "--quiet").exit_code == 0
    assert_same_tree(snapshot(out), snapshot(clean))


def _user_files(out: str) -> dict[str, bytes]:
    files = {"notes.txt": b"my notes", "photos/a.jpg": b"\xff\xd8 not tfshard's", ".hidden": b"x"}
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
        with open(os.path.join(out, rel), "wb") as f:
            f.write(data)
    return files


def test_unrelated_folder_is_refused_and_its_files_are_never_deleted(image_tree, tmp_path, cli):
    src, _ = image_tree
    out = str(tmp_path / "out")
    mine = _user_files(out)
    before = snapshot(out)
    with pytest.raises(OutputExistsError, match=r"files that tfshard did not write.*--overwrite"):
        convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    result = cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet")
    assert result.exit_code == 1 and "--overwrite" in result.stderr
    assert_same_tree(snapshot(out), before)  # not even a state folder

    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, overwrite=True, progress=False)
    convert_images(src, out, ConvertOptions(num_shards=3), workers=0, overwrite=True, progress=False)
    after = snapshot(out)
    for rel, data in mine.items():
        assert after[rel] == data, f"{rel}: a file tfshard did not write was changed or deleted"
    assert final_shards(out) == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    verify(out)


def test_overwrite_keeps_user_files_that_look_like_temp_files(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    os.makedirs(out)
    with open(os.path.join(out, ".tmp-notes.txt"), "w") as f:
        f.write("mine, not tfshard's")
    convert_images(src, out, ConvertOptions(num_shards=2), workers=0, overwrite=True, progress=False)
    assert os.path.exists(os.path.join(out, ".tmp-notes.txt")), "--overwrite deleted a file tfshard did not write"


# --- output inside the source --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["src", "src/out", "src/cat/out", "link-to-src/out"])
def test_output_inside_the_source_is_refused(image_tree, tmp_path, cli, where):
    src, _ = image_tree
    os.symlink(src, tmp_path / "link-to-src")
    out = str(tmp_path / where)
    before = snapshot(src)
    with pytest.raises(InputError, match=re.escape(out) + r": output folder is inside the source folder"):
        convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    result = cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet")
    assert result.exit_code == 1 and "inside the source folder" in result.stderr
    assert_same_tree(snapshot(src), before)


def test_output_next_to_the_source_with_the_same_prefix_is_fine(image_tree, tmp_path):
    src, written = image_tree
    out = src + "-tfrecord"  # starts with the source's path, but is not inside it
    assert convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False).total_records == len(
        written
    )


def test_folder_with_another_tools_dataset_json_is_refused_and_kept(image_tree, tmp_path):
    src, _ = image_tree
    out = str(tmp_path / "out")
    os.makedirs(out)
    foreign = os.path.join(out, MANIFEST)
    with open(foreign, "w") as f:
        f.write('{"name": "labels from another tool"}')
    # "holds something else and overwrite is False" is documented as OutputExistsError
    with pytest.raises(OutputExistsError, match=re.escape(out)):
        convert_images(src, out, ConvertOptions(num_shards=2), workers=0, progress=False)
    with pytest.raises(ValueError):  # not tfshard's file: even --overwrite must not replace it
        convert_images(src, out, ConvertOptions(num_shards=2), workers=0, overwrite=True, progress=False)
    with open(foreign) as f:
        assert f.read() == '{"name": "labels from another tool"}'
