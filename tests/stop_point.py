"""The ``tfshard`` command, held at a point of the test's choosing until the test lets it go, signals or kills it.

    python stop_point.py READY WHEN [tfshard arguments...]

WHEN is a comma-separated list of conditions that must all hold at a call of a Python function on the main thread:
``NAME`` or ``NAME#N`` (the N-th call of a function whose name or qualified name is NAME; the first without ``#N``),
``exists=PATH`` and ``missing=PATH`` (a file is there, or is not), ``import=MODULE`` (MODULE's import starts; the
command then starts cold, as a shell starts it: through its entry point, nothing loaded first). At the first call
where they hold, READY is created and the main thread waits right there, between two calls of the command, until
the file ``READY.go`` exists (the command goes on) or a signal arrives: Ctrl-C and SIGTERM raise in the call about
to be made, as they would anywhere in the command (or are noted, where the command holds them back until it can
stop cleanly), and SIGKILL ends it there. So a test signals or kills a conversion at a known point
however fast the machine and however busy its cores, instead of racing it (tests/test_resume.py,
tests/test_output_folder.py, tests/test_append.py, tests/test_duplicates.py). A command that ends without
reaching the point exits as it would have, and READY never appears.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(when: str) -> tuple[dict[str, int], list[str], list[str], str | None]:
    calls, present, absent, module = {}, [], [], None
    for condition in when.split(","):
        if condition.startswith("import="):
            module = condition[len("import="):]
        elif condition.startswith("exists="):
            present.append(condition[len("exists="):])
        elif condition.startswith("missing="):
            absent.append(condition[len("missing="):])
        else:
            name, _, nth = condition.partition("#")
            calls[name] = int(nth or 1)
    return calls, present, absent, module


def load_quietly() -> None:
    """TensorFlow and the converter, imported before the hook is set (watched, their import takes twice as long),
    quietly, as the command itself loads them (``tools/console.py``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfshard.tools.console import load_tensorflow

    load_tensorflow(debug=False)
    import tfshard.ingest  # noqa: F401


def _stop_noted() -> bool:
    """Whether the command noted a stop it holds back (``format/stops.py``), once it has loaded that module."""
    stops = sys.modules.get("tfshard.format.stops")
    return stops is not None and stops.requested() is not None


def main(ready: str, when: str, args: list[str]) -> None:
    wanted, present, absent, module = parse(when)
    if module is None:
        load_quietly()
        from tfshard.cli import main as command
    else:  # the entry point's own imports are watched (``tfshard`` = ``tfshard.__main__:main``)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        sys.argv[1:] = args
        args = None
    seen = dict.fromkeys(wanted, 0)

    def holding(frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        for name in {code.co_name, getattr(code, "co_qualname", code.co_name)} & seen.keys():
            seen[name] += 1
        if any(seen[name] < nth for name, nth in wanted.items()):
            return
        if module is not None and (code.co_name != "<module>" or frame.f_globals.get("__name__") != module):
            return
        if not all(os.path.exists(p) for p in present) or any(os.path.exists(p) for p in absent):
            return
        sys.setprofile(None)
        with open(ready, "w"):
            pass
        while not os.path.exists(ready + ".go") and not _stop_noted():
            time.sleep(0.005)  # a Ctrl-C or SIGTERM raises here, into the call about to be made

    sys.setprofile(holding)
    if module is not None:
        from tfshard.__main__ import main as command
    command(args)


def start_held(args: list[str], when: str, ready: str, *, timeout: float = 240, **popen) -> subprocess.Popen:
    """Starts ``tfshard ARGS`` in its own session under this script (``popen``: more ``subprocess.Popen`` arguments)
    and returns once it is held at WHEN; fails the test if the command ends (or is not held within ``timeout``)
    first, with its stderr."""
    import pytest

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **popen.pop("env", {})}
    command = [sys.executable, os.path.join(HERE, "stop_point.py"), ready, when, *map(str, args)]
    proc = subprocess.Popen(command, cwd=os.path.dirname(HERE), env=env, start_new_session=True, **popen)
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None:
            err = proc.communicate()[1] if popen.get("stderr") == subprocess.PIPE else ""
            pytest.fail(f"`tfshard {' '.join(map(str, args))}` ended (exit {proc.returncode}) before {when}: {err}")
        if time.monotonic() > deadline:
            kill_group(proc)
            pytest.fail(f"`tfshard {' '.join(map(str, args))}` never reached {when}")
        time.sleep(0.005)
    return proc


def let_go(ready: str) -> None:
    """The held command goes on."""
    with open(ready + ".go", "w"):
        pass


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the command and everything in its session (decode workers, forkserver); waits for it."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
