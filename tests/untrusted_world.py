"""The world the rows of the untrusted-input tables live in (tests/test_manifest_validation.py and
tests/test_output_folder.py), and what those rows check.

Every row builds its attack in ``tmp_path``, beside a ``victim`` folder, and checks, besides its own expectation,
the one all rows share: no file outside OUT is deleted or changed (names and bytes; links and FIFOs by kind, never
read). Rows that could hang, blow up memory or need a second process run the real CLI as a subprocess with a
timeout and a 6 GiB address-space cap, so a regression fails instead of hanging the suite or the host; the others
run the CLI in-process through the ``cli`` fixture, or call the library. A world's in-process conversion takes a
tenth of a second, so each row makes its own from fresh inputs (a conversion's identity holds its inputs' ctimes,
which no copy keeps).
"""


from __future__ import annotations

import dataclasses
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    Tripwire,
    edit_manifest,
    image_features,
    jpeg_bytes,
    make_tree,
    read_manifest,
)
from tfshard import readers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
MANIFEST = "dataset.json"
STATE = ".tfshard-state"
LOCK = ".tfshard-lock"
# All different (the swapped-lengths rows swap two); length 9 gives exactly 2 windows (the fewer-than-a-batch row).
EPISODE_LENGTHS = (3, 5, 8, 10)
MEMORY_CAP = 6 * 2**30  # a conversion reading /dev/zero into memory dies here, not in the host's OOM killer



# --- the world every row lives in --------------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    """``tmp_path`` with ``src/``, ``out/`` and a ``victim/`` folder no run may touch; ``cli`` runs in-process."""

    root: str
    cli: Callable
    request: Any  # pytest's, for fixtures only some rows need

    @property
    def src(self) -> str:
        return os.path.join(self.root, "src")

    @property
    def out(self) -> str:
        return os.path.join(self.root, "out")

    @property
    def victim(self) -> str:
        return os.path.join(self.root, "victim")

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def images(self, convert: bool = True) -> World:
        """``src``: 2 classes x 6 seeded 16x16 JPEGs; ``out``: its dataset in 3 shards (converted by the CLI)."""
        make_tree(self.src)
        if convert:
            ok(self.cli("images", self.src, self.out, "--num-shards", "3", "--workers", "0", "--quiet"))
        return self

    def episodes(self) -> World:
        """``src``: one float32 [T, 2] .npy episode per ``EPISODE_LENGTHS``; ``out``: its dataset in 2 shards."""
        good_episodes(self.src, lengths=EPISODE_LENGTHS, dtype=np.float32, width=2)
        ok(self.cli("episodes", self.src, self.out, "--num-shards", "2", "--workers", "0", "--quiet"))
        return self

    def manifest(self) -> dict:
        return read_manifest(self.out)

    def edit_manifest(self, edit: Callable[[dict], Any]) -> None:
        edit_manifest(self.out, edit)

    def write_manifest(self, data: bytes) -> None:
        with open(os.path.join(self.out, MANIFEST), "wb") as f:
            f.write(data)

    def first_shard(self) -> str:
        return self.manifest()["splits"]["train"]["shards"][0]["file"]


def new_world(tmp_path, cli, request) -> World:
    """A fresh world in ``tmp_path`` (the test files' ``world`` fixture): its victim folder holds one file."""
    w = World(str(tmp_path), cli, request)
    os.makedirs(w.victim)
    with open(os.path.join(w.victim, "precious.txt"), "wb") as f:
        f.write(b"a file of the user's, outside every dataset\n")
    return w


def ok(result) -> None:
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)


# --- what the rows check ------------------------------------------------------------------------------------------


def assert_untouched(before: dict, after: dict) -> None:
    assert sorted(after) == sorted(before), "files outside OUT were added or deleted"
    for name, value in before.items():
        assert after[name] == value, f"{name}: outside OUT, changed"


@dataclasses.dataclass
class Ran:
    """A CLI run, in-process or as a subprocess."""

    code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None  # in-process: what the runner caught (SystemExit for a handled error)
    in_process: bool = True


# Sets the cap, then execs the real command (same pid): no preexec_fn, which may deadlock in a threaded parent.
_CAPPED = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2); "
           "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


def python(*args, cap: bool = True) -> list[str]:
    """``python ARGS``, under ``MEMORY_CAP`` unless told."""
    prefix = [sys.executable, "-c", _CAPPED, str(MEMORY_CAP)] if cap else [sys.executable]
    return prefix + [str(a) for a in args]


def run_process(*args, timeout: float = 60, cap: bool = True) -> Ran:
    """``python -m tfshard ARGS`` from the repo; a run past ``timeout`` is killed and fails the test (a hang)."""
    try:
        done = subprocess.run(python("-m", "tfshard", *args, cap=cap), cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tfshard {' '.join(map(str, args))}` still ran after {timeout} s: it hangs")
    return Ran(done.returncode, done.stdout, done.stderr, in_process=False)


def run_cli(cli, args, process: bool = False, timeout: float = 60) -> Ran:
    if process:
        return run_process(*args, timeout=timeout)
    result = cli(*args)
    return Ran(result.exit_code, result.stdout, result.stderr, result.exception)


def mentions(text: str, name) -> bool:
    """``name``: a string that must appear, a compiled regex that must match, or a tuple of which one must."""
    if isinstance(name, tuple):
        return any(mentions(text, n) for n in name)
    if isinstance(name, re.Pattern):
        return name.search(text) is not None
    return name in text


def number(n: int) -> re.Pattern:
    """``n`` as a number of its own in a message, not a piece of a path such as ``/tmp/pytest-31/``."""
    return re.compile(rf"(?<![-/\w]){n}(?![/\w])")


def assert_cli_error(ran: Ran, names, one_line: bool = True) -> None:
    """Exit 1 by the CLI's own error path; ``error: ...`` lines on stderr (one unless told) naming each of ``names``."""
    assert ran.code == 1, f"exit {ran.code}, expected 1: stdout {ran.stdout!r} stderr {ran.stderr!r}"
    if ran.in_process:
        assert isinstance(ran.exception, SystemExit), f"an uncaught {type(ran.exception).__name__}: {ran.exception!r}"
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert lines, "no error message on stderr"
    if one_line:
        assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {ran.stderr!r}"
    assert all(line.startswith("error:") for line in lines), ran.stderr
    for name in names:
        assert mentions(ran.stderr, name), f"the error does not name {name!r}: {ran.stderr!r}"


def assert_raises_naming(call: Callable, names, kinds=(ValueError, OSError)) -> BaseException:
    """``call()`` raises one of ``kinds`` (not a UnicodeDecodeError passing as a ValueError), naming ``names``."""
    with pytest.raises(kinds) as caught:
        call()
    error = caught.value
    assert not isinstance(error, UnicodeError), f"a bare {type(error).__name__}: {error}"
    for name in names:
        assert mentions(str(error), name), f"{type(error).__name__} does not name {name!r}: {error}"
    return error


# --- small inputs -------------------------------------------------------------------------------------------------


def good_episodes(src: str, lengths=(6, 9, 11), dtype=np.float64, width: int | None = None, npz: str | None = None,
                  seed: int = 0) -> int:
    """Seeded episodes ``ep{i}.npy`` (or ``.npz`` with one array named ``npz``); returns how many."""
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, t in enumerate(lengths):
        array = rng.normal(size=(t,) if width is None else (t, width)).astype(dtype)
        path = os.path.join(src, f"ep{i}")
        if npz:
            np.savez(path, **{npz: array})
        else:
            np.save(path, array)
    return len(lengths)


def write_declaring_npy(path: str, shape=(10**12,)) -> None:
    """A .npy whose header declares ``shape`` float64 (8 TB for the default) followed by 8 bytes of data."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
        f.write(b"\0" * 8)
    assert os.path.getsize(path) < 200


def pickle_array(marker: str) -> np.ndarray:
    array = np.empty(4, dtype=object)
    array[:] = [Tripwire(marker)] * 4
    return array


def jpeg_of_length(length: int, seed: int) -> bytes:
    """Other pixels, exactly ``length`` bytes: a lower-quality JPEG padded by a comment (COM) segment."""
    for quality in (50, 30, 10):
        data = jpeg_bytes(seed, quality=quality)
        if len(data) + 4 <= length:
            pad = length - len(data)
            comment = b"\xff\xfe" + struct.pack(">H", pad - 2) + b"\0" * (pad - 4)
            return data[:2] + comment + data[2:]
    raise AssertionError(f"no JPEG of seed {seed} fits in {length} bytes")


def records(out: str) -> dict[str, bytes]:
    """``{image/filename: image/encoded}`` of every record of an image dataset, read as documented."""
    features = image_features()
    manifest = read_manifest(out)
    files = [os.path.join(out, s["file"]) for split in manifest["splits"].values() for s in split["shards"]]
    found = {}
    for raw in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(raw, features)
        found[example["image/filename"].numpy().decode()] = example["image/encoded"].numpy()
    return found


def pixels(out: str, cache: str | None = None, **kwargs) -> np.ndarray:
    """Every image of the train split, eval path (file order, centre crop), as one [N, 16, 16, 3] array."""
    ds = readers.images(out, batch_size=1, image_size=(16, 16), training=False, cache=cache, drop_remainder=False,
                        **kwargs)
    return np.concatenate([x.numpy() for x, _ in ds])


