"""Attacks on the command line as a new user meets it: usage errors, exit codes, a bench stopped midway."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ignoring_ctrl_c, make_tree, save_episodes
from tfshard import cli as cli_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def tfshard(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfshard", *map(str, args)], cwd=REPO, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


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
                                     2: "a usage error: a bad flag or argument", 130: "interrupted (Ctrl-C)",
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


def _bench_source(tmp_path) -> tuple[str, str]:
    """(a small image dataset, an empty folder for TMPDIR, where the bench makes its temporary cache)."""
    make_tree(str(tmp_path / "src"), per_class=16, size=(64, 64))
    out = tmp_path / "out"
    assert tfshard("images", tmp_path / "src", out, "--workers", "0", "--quiet").returncode == 0
    temp = tmp_path / "tmp"
    temp.mkdir()
    return str(out), str(temp)


BENCH = ["bench", "--epochs", "100000", "--image-size", "32", "--batch-size", "4"]


def _start_bench(command: list[str], temp: str, ignore_ctrl_c: bool = False) -> subprocess.Popen:
    """Starts ``command`` (a bench) and returns once its first epoch has completed its temporary cache."""
    proc = subprocess.Popen(command, cwd=REPO, env={**ENV, "TMPDIR": temp}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=ignoring_ctrl_c if ignore_ctrl_c else None)
    deadline = time.monotonic() + 240
    while not any(f.endswith(".index") for f in glob.glob(os.path.join(temp, "tfshard-bench-cache-*", "*"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the bench never completed its cache: {proc.communicate()}")
        time.sleep(0.05)
    return proc


def _stopped_bench(proc: subprocess.Popen, out: str, code: int, temp: str, signum: int | None = None) -> None:
    """Sends ``signum`` (if given), then checks the bench stops within 60 s with ``code``, says so on its last line
    and leaves no temporary cache behind."""
    try:
        if signum is not None:
            proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the bench was still running 60 s after the stop: {proc.communicate()[1]!r}")
    assert proc.returncode == code, stderr
    word = "terminated (SIGTERM)" if code == 143 else "interrupted"
    assert stderr.strip().endswith(f"{out}: bench: {word}"), stderr
    assert os.listdir(temp) == [], "the bench left its temporary cache behind"


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, ignore_ctrl_c", [(signal.SIGTERM, 143, False), (signal.SIGINT, 130, False),
                                                         (signal.SIGINT, 130, True)],
                         ids=["sigterm", "ctrl-c", "ctrl-c-started-ignoring-it"])
def test_bench_stopped_midway_removes_its_temporary_cache(tmp_path, signum, code, ignore_ctrl_c):
    out, temp = _bench_source(tmp_path)
    proc = _start_bench([sys.executable, "-m", "tfshard", BENCH[0], out, *BENCH[1:]], temp, ignore_ctrl_c)
    _stopped_bench(proc, out, code, temp, signum)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_bench_stopped_inside_a_finalizer_still_stops(tmp_path, signum, code):
    """The stop's handler runs inside a ``__del__`` (tests/finalizer_stop.py), as when it lands in one of
    TensorFlow's iterator finalizers between two epochs: the exception can only be printed there, and the bench
    went on timing its 100000 epochs. It stops after the batch it arrived in."""
    out, temp = _bench_source(tmp_path)
    cache_complete = os.path.join(temp, "tfshard-bench-cache-*", "*.index")
    proc = _start_bench([sys.executable, os.path.join(REPO, "tests", "finalizer_stop.py"), cache_complete,
                         signum.name, BENCH[0], out, *BENCH[1:]], temp)
    _stopped_bench(proc, out, code, temp)  # the child's finalizer raises the signal once the cache is complete
