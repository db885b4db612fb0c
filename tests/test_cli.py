"""The typer layer as a new user meets it: one-line errors and usage errors with their exit codes, info from the
manifest alone, the demo end to end, a bench stopped midway and a command stopped by
SIGTERM (a real signal to a real ``tfshard``)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import convert_image_tree, ignoring_ctrl_c, make_tree, save_episodes
from PIL import Image
from stop_point import kill_group, start_held
from tfshard import cli as cli_module
from tfshard.ingest import ConvertOptions, convert_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def tfshard(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfshard", *map(str, args)], cwd=REPO, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def test_images_then_info_and_json(image_tree, tmp_path, cli):
    src, written = image_tree
    out = tmp_path / "out"
    result = cli("images", src, out, "--num-shards", "2", "--workers", "0", "--quiet")
    assert result.exit_code == 0, result.output
    assert result.output == ""  # --quiet
    info = cli("info", out)
    assert info.exit_code == 0, info.output
    assert "cat 6, dog 6" in info.output and "12 records" in info.output
    as_json = json.loads(cli("info", out, "--json").output)
    assert as_json["splits"]["train"]["records"] == len(written)
    assert [s["file"] for s in as_json["splits"]["train"]["shards"]] == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]


def test_info_reads_no_data(image_tree, tmp_path, cli):
    src, _ = image_tree
    out = tmp_path / "out"
    convert_images(src, str(out), ConvertOptions(num_shards=1), workers=0, progress=False)
    os.remove(out / "train-00000-of-00001.tfrecord")
    assert cli("info", out).exit_code == 0  # the manifest alone answers info


def test_info_names_the_first_twenty_classes_of_many_and_json_all(tmp_path, cli):
    classes = [f"c{i:02d}" for i in range(23)]
    make_tree(tmp_path / "src", classes=classes, per_class=1, size=(8, 8))
    out = tmp_path / "out"
    convert_images(str(tmp_path / "src"), str(out), ConvertOptions(num_shards=1), workers=0, progress=False)
    info = cli("info", out)
    assert info.exit_code == 0, info.output
    assert "  classes (23): c00, c01," in info.output
    assert ", c19, ... 3 more classes (all of them: --json)\n" in info.output
    assert "c20" not in info.output  # nor in the split's counts, a line too
    assert ": c00 1, c01 1," in info.output and "c19 1, ... 3 more classes" in info.output
    assert json.loads(cli("info", out, "--json").output)["class_names"] == classes


def test_info_names_one_class_more_and_an_appends_many_new_classes_bounded_too(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, classes=[f"c{i:02d}" for i in range(21)], per_class=1, size=(8, 8))
    convert_images(str(src), str(out), ConvertOptions(num_shards=1), workers=0, progress=False)
    assert ", c19, ... 1 more class (all of them: --json)\n" in cli("info", out).output
    new = [f"n{i:02d}" for i in range(22)]  # an append's new classes: their line named 20 and hid the rest
    make_tree(src, classes=new, per_class=1, size=(8, 8), seed=50)
    convert_images(str(src), str(out), ConvertOptions(num_shards=1), workers=0, progress=False, append=True)
    info = cli("info", out)
    assert info.exit_code == 0, info.output
    assert "append 1: +22 records, new classes n00, n01," in info.output
    assert ", n19, ... 2 more classes (all of them: --json); 0 changed" in info.output
    assert "n21" not in info.output


def test_info_counts_windows_and_the_episodes_too_short_for_one(image_tree, tmp_path, cli):
    import numpy as np

    os.makedirs(tmp_path / "runs")
    for i, steps in enumerate([5, 40, 100]):
        np.save(tmp_path / "runs" / f"e{i}.npy", np.zeros((steps, 2), np.float32))
    assert cli("episodes", tmp_path / "runs", tmp_path / "out", "--quiet").exit_code == 0
    result = cli("info", tmp_path / "out", "--length", "30", "--shift", "5", "--horizon", "4")
    assert result.exit_code == 0, result.output
    # (40 - 34) // 5 + 1 + (100 - 34) // 5 + 1 windows; the 5-step episode gives none, and info says so
    # The 5-step episode cannot end a 34-step span even padded: no hint that padding would help.
    assert "train: 16 windows; 1 of 3 episodes too short for one\n" in result.output
    padded = cli("info", tmp_path / "out", "--length", "30", "--shift", "5")  # a padded window fits in 5 steps
    assert "1 of 3 episodes too short for one; padding='start' serves 1 of them" in padded.output
    alone = cli("info", tmp_path / "out", "--horizon", "3")
    assert alone.exit_code == 1 and "pass --length too" in alone.output
    src, _ = image_tree
    convert_images(src, str(tmp_path / "images"), ConvertOptions(num_shards=1), workers=0, progress=False)
    refused = cli("info", tmp_path / "images", "--length", "4")
    assert refused.exit_code == 1 and "windows are for episode datasets" in refused.output


def test_bad_option_is_one_line_naming_the_value(image_tree, tmp_path, cli):
    src, _ = image_tree
    result = cli("images", src, tmp_path / "out", "--shard-size", "12 parsecs")
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0
    assert "'12 parsecs'" in result.output and "Traceback" not in result.output


def test_missing_source_names_the_path(tmp_path, cli):
    result = cli("images", tmp_path / "nowhere", tmp_path / "out")
    assert result.exit_code == 1 and "nowhere: source folder not found" in result.output


def test_debug_shows_the_exception(tmp_path, cli):
    result = cli("--debug", "images", tmp_path / "nowhere", tmp_path / "out")
    assert result.exit_code != 0 and isinstance(result.exception, FileNotFoundError)


def test_demo_converts_verifies_and_reports_rejections(tmp_path, cli):
    result = cli("demo", tmp_path / "demo", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "verified" in result.output
    assert "images (16, 64, 64, 3) float32" in result.output
    assert "truncated.jpg: truncated image data" in result.output
    assert "notes.jpg: not an image" in result.output
    manifest = json.loads((tmp_path / "demo" / "images-tfrecord" / "dataset.json").read_text())
    assert manifest["splits"]["train"]["records"] == 3 * 24 + 4  # 4 odd-but-good files converted or passed
    assert manifest["options"]["converted_images"] == 3  # PNG content, CMYK, EXIF rotation
    for name in ("images-preview.png", "episodes-preview.png"):  # both previews, and where they are
        path = tmp_path / "demo" / name
        assert f"preview: {path} (tfshard preview" in result.output
        with Image.open(path) as picture:
            assert picture.format == "PNG" and len(picture.getcolors(2**24)) > 50
    again = cli("demo", tmp_path / "demo", "--workers", "0")  # rerun: same inputs, nothing to redo
    assert again.exit_code == 0, again.output


def test_bench_times_first_and_cached_epochs(image_tree, tmp_path, cli):
    src, written = image_tree
    out = tmp_path / "out"
    convert_images(src, str(out), ConvertOptions(num_shards=2), workers=0, progress=False)
    result = cli("bench", out, "--batch-size", "4", "--image-size", "16", "--epochs", "2")
    assert result.exit_code == 0, result.output
    assert f"epoch 1 (fills the cache): {len(written)} images" in result.output
    assert f"epoch 2 (cached): {len(written)} images" in result.output
    assert "skipped" not in result.output


def test_bench_compare_gives_every_row_and_every_image_ratio(image_tree, tmp_path, cli):
    """`tfshard bench --compare` reports the rows and ratios of benchmarks/images.py (one shared module)."""
    from tfshard.tools import bench

    src, _ = image_tree
    out = tmp_path / "out"
    convert_images(src, str(out), ConvertOptions(num_shards=2), workers=0, progress=False)
    result = cli("bench", out, "--compare", "--src", src, "--batch-size", "4", "--image-size", "16")
    assert result.exit_code == 0, result.output
    for name in (bench.FLOOR_CROP, bench.FLOOR_DECODE, bench.FLOOR_EVAL, bench.FLOOR_EVAL_AUTOTUNE,
                 bench.FLOOR_EVAL_READ, bench.KERAS,
                 bench.EVAL, bench.NO_AUGMENT, bench.DEFAULT, bench.UINT8, bench.COLOR,
                 bench.CACHE_FIRST, bench.CACHE_AGAIN):
        assert name in result.output and "img/s" in result.output
    for label, *_ in bench.IMAGE_RATIOS + bench.IMAGE_SHARES:
        assert label in result.output
    without_keras = cli("bench", out, "--compare", "--batch-size", "4", "--image-size", "16", "--limit", "8")
    assert without_keras.exit_code == 0, without_keras.output
    assert bench.KERAS not in without_keras.output and "floors over 8 JPEGs" in without_keras.output


def test_summary_names_the_ignored_files(image_tree, tmp_path, cli):
    src, _ = image_tree
    for i in range(12):
        with open(os.path.join(src, "cat", f"label-{i:02d}.txt"), "w") as f:
            f.write("x")
    with open(os.path.join(src, "README.md"), "w") as f:
        f.write("about")

    result = cli("images", src, tmp_path / "out", "--workers", "0")

    assert result.exit_code == 0, result.output
    listed = ["README.md"] + [f"cat/label-{i:02d}.txt" for i in range(9)]
    assert ("  ignored: 0 hidden, 13 non-image files:\n" + "".join(f"    {p}\n" for p in listed)
            + "    ... and 3 more (dataset.json names the first 13)\n") in result.stdout
    manifest = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert manifest["ignored_files"] == ["README.md"] + [f"cat/label-{i:02d}.txt" for i in range(12)]


@pytest.mark.parametrize("args, message", [
    (["images"], "error: Missing argument 'src'.; see `tfshard images --help`"),
    (["images", "a", "b", "--num-shards", "x"], "error: Invalid value for '--num-shards': "),
    (["nope"], "error: No such command 'nope'.; see `tfshard --help`"),
    (["info", "--no-such-flag", "x"], "error: No such option: --no-such-flag"),
])
def test_usage_errors_are_one_line_with_exit_2(args, message):
    done = tfshard(*args)
    assert done.returncode == 2, done
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(message), done.stderr
    assert "╭" not in done.stderr and done.stdout == ""


def test_exit_codes_are_the_documented_ones(tmp_path):
    assert cli_module.EXIT_CODES == {0: "success", 1: "an error (one line on stderr)",
                                     2: "a usage error: a bad flag or argument",
                                     129: "hung up (SIGHUP: the terminal was closed)", 130: "interrupted (Ctrl-C)",
                                     143: "terminated (SIGTERM)"}
    assert tfshard("--version").returncode == 0
    assert tfshard("info", tmp_path / "missing").returncode == 1
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    for code in cli_module.EXIT_CODES:
        assert f"`{code}`" in readme, f"the README does not say what exit code {code} means"


def test_bench_refuses_zero_epochs(tmp_path, cli):
    result = cli("bench", tmp_path, "--epochs", "0")
    assert result.exit_code == 1 and result.stderr == (
        "error: --epochs: must be at least 1 (got 0); pass the number of epochs to time\n")


def test_episodes_flag_is_named_as_info_names_it(tmp_path, cli):
    import numpy as np

    save_episodes(tmp_path / "src", {"a.npy": np.ones((40, 2), np.float32)})
    for flag in ("--max-record-bytes", "--max-record-size"):  # the second: the name it had before
        out = tmp_path / flag
        result = cli("episodes", tmp_path / "src", out, flag, "100", "--workers", "0", "--quiet")
        assert result.exit_code == 0, result.output
        assert '"max_record_bytes": 100' in cli("info", out).stdout


@pytest.fixture(scope="module")
def bench_dataset(tmp_path_factory) -> str:
    """A small image dataset, converted once for the module: the benches only read it (their cache is in TMPDIR)."""
    root = tmp_path_factory.mktemp("bench")
    make_tree(str(root / "src"), per_class=16, size=(64, 64))
    convert_image_tree(root / "src", root / "out")
    return str(root / "out")


def _bench_source(bench_dataset, tmp_path) -> tuple[str, str]:
    """(the small image dataset, an empty folder for TMPDIR, where the bench makes its temporary cache)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    return bench_dataset, str(temp)


BENCH = ["bench", "--epochs", "100000", "--image-size", "32", "--batch-size", "4"]


def _start_bench(command: list[str], temp: str, ignore_ctrl_c: bool = False) -> subprocess.Popen:
    """Starts ``command`` (a bench) and returns once its first epoch has completed its temporary cache."""
    def as_a_terminal_job() -> None:  # SIGHUP as a terminal's job gets it, even under a `nohup` test run
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        if ignore_ctrl_c:
            ignoring_ctrl_c()

    proc = subprocess.Popen(command, cwd=REPO, env={**ENV, "TMPDIR": temp}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_a_terminal_job)
    deadline = time.monotonic() + 240
    while not any(f.endswith(".index") for f in glob.glob(os.path.join(temp, "tfshard-bench-cache-*", "*"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the bench never completed its cache: {proc.communicate()}")
        time.sleep(0.05)
    return proc


def _stopped_bench(proc: subprocess.Popen, out: str, code: int, temp: str, signum: int | None = None,
                   timeout_s: float = 60) -> None:
    """Sends ``signum`` (if given), then checks the bench stops within ``timeout_s`` with ``code``, says so on its
    last line and leaves no temporary cache behind."""
    try:
        if signum is not None:
            proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the bench was still running {timeout_s} s after the stop: {proc.communicate()[1]!r}")
    assert proc.returncode == code, stderr
    word = {143: "terminated (SIGTERM)", 129: "hung up (SIGHUP)"}.get(code, "interrupted")
    assert stderr.strip().endswith(f"{out}: bench: {word}"), stderr
    assert os.listdir(temp) == [], "the bench left its temporary cache behind"


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, ignore_ctrl_c", [(signal.SIGTERM, 143, False), (signal.SIGINT, 130, False),
                                                         (signal.SIGINT, 130, True), (signal.SIGHUP, 129, False)],
                         ids=["sigterm", "ctrl-c", "ctrl-c-started-ignoring-it", "terminal-closed"])
def test_bench_stopped_midway_removes_its_temporary_cache(bench_dataset, tmp_path, signum, code, ignore_ctrl_c):
    """A closed terminal (SIGHUP) killed the bench outright, leaving its temporary cache, a decoded copy of the
    split, in TMPDIR."""
    out, temp = _bench_source(bench_dataset, tmp_path)
    proc = _start_bench([sys.executable, "-m", "tfshard", BENCH[0], out, *BENCH[1:]], temp, ignore_ctrl_c)
    _stopped_bench(proc, out, code, temp, signum)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_bench_stopped_inside_a_finalizer_still_stops(bench_dataset, tmp_path, signum, code):
    """The stop's handler runs inside a ``__del__`` (tests/finalizer_stop.py), as when it lands in one of
    TensorFlow's iterator finalizers between two epochs: the exception can only be printed there, and the bench
    went on timing its 100000 epochs. It stops after the batch it arrived in. (The child raises the signal only once
    its cache is complete, and may be done before this process sees the cache: no waiting for it here.)"""
    out, temp = _bench_source(bench_dataset, tmp_path)
    cache_complete = os.path.join(temp, "tfshard-bench-cache-*", "*.index")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "finalizer_stop.py"), cache_complete,
                             signum.name, BENCH[0], out, *BENCH[1:]], cwd=REPO, env={**ENV, "TMPDIR": temp},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _stopped_bench(proc, out, code, temp, timeout_s=300)  # start, first epoch, then the finalizer's stop


def test_sigterm_stops_a_command_without_a_stop_line_of_its_own_with_143(converted_images, tmp_path):
    """``tfshard verify`` says nothing of its own on a stop: ``run`` says it, with the code of the signal. Held as it
    reads the first shard (tests/stop_point.py), SIGTERM exited 130 with nothing said: typer 0.2x's main turned the
    stop into a bare exit 130 before ``run`` could see it."""
    proc = start_held(["verify", converted_images.out], "read_shard", str(tmp_path / "held"), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    try:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert (proc.returncode, stderr, stdout) == (143, "tfshard: terminated (SIGTERM)\n", "")


@pytest.mark.parametrize("when, missing, signum, code, line", [
    ("import=typer", False, signal.SIGINT, 130, "tfshard: interrupted"),
    ("import=typer", False, signal.SIGTERM, 143, "tfshard: terminated (SIGTERM)"),
    ("exiting", False, signal.SIGTERM, 0, None),
    ("exiting", True, signal.SIGINT, 1, "error: "),
], ids=["ctrl-c-while-it-loads", "sigterm-while-it-loads", "sigterm-after-its-last-line", "ctrl-c-after-its-error"])
def test_a_stop_at_either_end_of_a_command(converted_images, tmp_path, when, missing, signum, code, line):
    """Held cold, as a shell starts it, while its entry point still imports typer (tests/stop_point.py), Ctrl-C
    printed a 20-line KeyboardInterrupt traceback and SIGTERM killed it with nothing said (no handler was in yet).
    Held once its last line is printed, a stop raised into the exit: a traceback, and exit 1 or by the signal (what a
    second Ctrl-C after a stop's line did). It now ends the process with the code its last line told."""
    out = tmp_path / "missing" if missing else converted_images.out
    proc = start_held(["info", out], when, str(tmp_path / "held"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True)
    try:
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == code, stderr
    if line is None:
        assert stderr == "" and "records" in stdout, (stdout, stderr)
    else:
        assert len(stderr.splitlines()) == 1 and stderr.startswith(line), stderr


def test_the_command_freezes_the_collector_before_the_interpreter_shuts_down():
    """Shutting down with TensorFlow loaded, the interpreter's last collections walked all of its objects: 6-9 s after
    the last line on a busy 2-core machine (a stopped command lingered that long after its stop's line, where a
    second Ctrl-C killed it mid-shutdown), 0.3-0.6 s with the collector frozen first. Seen from an atexit hook, which
    runs after ``main`` and before that shutdown."""
    script = ("import atexit, gc\nfrom tfshard import cli\n"
              "atexit.register(lambda: print('frozen:', gc.get_freeze_count() > 0))\ncli.main(['--version'])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.splitlines()[1:]) == (0, ["frozen: True"]), done
