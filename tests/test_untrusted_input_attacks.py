"""The table of attacks with untrusted inputs: each row is one attack on tfshard, its setup, the action, and what
must hold.

Every row builds its attack in ``tmp_path``, beside a ``victim`` folder, and checks, besides its own expectation,
the one all rows share: no file outside OUT is deleted or changed (names and bytes; links and FIFOs by kind, never
read). Rows that could hang, blow up memory or need a second process run the real CLI as a subprocess with a
timeout and a 6 GiB address-space cap, so a regression fails instead of hanging the suite or the host; the others
run the CLI in-process through the ``cli`` fixture, or call the library.

The rows are grouped by the shape of their expectation:

* ``REFUSALS``: the CLI exits 1 through its own error path (never an uncaught exception), with one stderr line
  ``error: ...`` naming the offending path or manifest field, and no traceback;
* ``LIBRARY_REFUSALS``: the library raises ValueError or OSError (``InputError`` subclasses ValueError) naming it,
  never a bare KeyError/TypeError/MemoryError/RecursionError/UnicodeDecodeError;
* ``SKIPS``: a conversion finishes; the bad input is in ``rejected`` with its reason, every good one is converted;
* the scenarios after them: stale inputs and caches, two writers at once, kill -9 mid-``--overwrite``, a full disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    Tripwire,
    convert_episode_tree,
    edit_manifest,
    image_features,
    jpeg_bytes,
    make_tree,
    npy_bytes,
    read_manifest,
    require,
    snapshot,
)
from stop_point import kill_group, let_go, start_held
from tfshard import readers
from tfshard.ingest import EpisodeOptions

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


@pytest.fixture
def world(tmp_path, cli, request) -> World:
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


# --- the CLI refuses in one line and touches nothing outside OUT ---------------------------------------------------


def _bad_entry(kind: str) -> Callable[[World], str]:
    """A shard entry outside OUT. The real shard is moved to where the entry points, so a run that follows the entry
    finds the very shard the manifest describes (and verify passes) instead of failing for a lucky reason."""

    def make(w: World) -> str:
        w.images()
        if kind == "dev-zero":
            entry = "/dev/zero"
        else:
            shutil.move(os.path.join(w.out, w.first_shard()), os.path.join(w.victim, "stolen.tfrecord"))
            entry = "../victim/stolen.tfrecord" if kind == "dotdot" else os.path.join(w.victim, "stolen.tfrecord")
        w.edit_manifest(_shard_file(entry))
        return entry

    return make


BAD_ENTRIES = {kind: _bad_entry(kind) for kind in ("dotdot", "absolute", "dev-zero")}


def _entry(value: str):
    """How an error names the bad entry: its value, or where it is (a long value may be shortened in the message)."""
    return value, "shards[0]"


def _verify_bad_entry(kind):
    def setup(w):
        entry = BAD_ENTRIES[kind](w)
        return ["verify", w.out], [MANIFEST, _entry(entry)]

    return setup


def _overwrite_bad_entry(kind):
    def setup(w):
        entry = BAD_ENTRIES[kind](w)
        return ["images", w.src, w.out, "--overwrite", "--workers", "0", "--quiet"], [MANIFEST, _entry(entry)]

    return setup


def _overwrite_bad_index_entry(w):
    w.images()

    def edit(raw):
        raw["splits"]["train"]["shards"][0]["index_file"] = "../victim/precious.txt"

    w.edit_manifest(edit)
    return ["images", w.src, w.out, "--overwrite", "--workers", "0", "--quiet"], [MANIFEST, "../victim/precious.txt"]


def _overwrite_bad_plan(w):
    w.images(convert=False)
    with open(w.path("v2"), "wb") as f:
        f.write(b"victim two\n")
    os.makedirs(w.path("d", "inner"))
    with open(w.path("d", "inner", "file.txt"), "wb") as f:
        f.write(b"in a folder beside OUT\n")
    os.makedirs(os.path.join(w.out, STATE))
    with open(os.path.join(w.out, STATE, "plan.json"), "w") as f:
        json.dump({"fingerprint": "x", "files": ["../v2", "../d"]}, f)
    return ["images", w.src, w.out, "--overwrite", "--workers", "0", "--quiet"], ["plan.json"]


def _state_link(where: str, overwrite: bool = False):
    """OUT/.tfshard-state is a symlink to another folder that holds files: fresh OUT, or beside a finished dataset."""

    def setup(w):
        w.images(convert=where == "finished")
        other = w.path("other")
        os.makedirs(os.path.join(other, "sub"))
        for rel in ("notes.txt", "plan.json", "sub/keep.bin"):
            with open(os.path.join(other, rel), "wb") as f:
                f.write(f"{rel}: not tfshard's\n".encode())
        os.makedirs(w.out, exist_ok=True)
        os.symlink(other, os.path.join(w.out, STATE))
        args = ["images", w.src, w.out, "--num-shards", "3", "--workers", "0", "--quiet"]
        return args + (["--overwrite"] if overwrite else []), [STATE]

    return setup


def _shard_links_to_dev_zero(w):
    w.images()
    shard = os.path.join(w.out, w.first_shard())
    os.remove(shard)
    os.symlink("/dev/zero", shard)
    return ["verify", w.out], [w.first_shard(), "not a regular file"]


def _swapped_lengths(w: World) -> tuple[str, str]:
    """Swaps the manifest lengths of the first two episodes in record order (their lengths differ); their sources."""
    w.episodes()
    episodes = w.manifest()["splits"]["train"]["episodes"]
    first, second = episodes[0], episodes[1]
    assert first["length"] != second["length"]

    def edit(raw):
        listed = raw["splits"]["train"]["episodes"]
        listed[0]["length"], listed[1]["length"] = listed[1]["length"], listed[0]["length"]

    w.edit_manifest(edit)
    return first["source"], second["source"]


def _verify_swapped_lengths(w):
    sources = _swapped_lengths(w)
    return ["verify", w.out], [sources]  # either episode may be the one named


def _ambiguous_npz(w) -> str:
    good_episodes(w.src, width=2, npz="obs", dtype=np.float32)
    path = os.path.join(w.src, "bad.npz")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("obs.npy", npy_bytes(np.zeros((5, 2), np.float32)))
        archive.writestr("obs", npy_bytes(np.ones((7, 3), np.float32)))
    return path


def _ambiguous_npz_fail(w):
    path = _ambiguous_npz(w)
    return ["episodes", w.src, w.out, "--on-error", "fail", "--workers", "0", "--quiet"], [path, "ambiguous"]


def _declaring_npy_fail(w):
    good_episodes(w.src)
    path = os.path.join(w.src, "huge.npy")
    write_declaring_npy(path)
    return ["episodes", w.src, w.out, "--on-error", "fail", "--workers", "0", "--quiet"], [path]


# Each bad manifest: (setup, what the error must name).
def _out_is_a_file(w):
    with open(w.out, "wb") as f:
        f.write(b"not a folder\n")


def _manifest_is_a_folder(w):
    w.images()
    os.remove(os.path.join(w.out, MANIFEST))
    os.makedirs(os.path.join(w.out, MANIFEST))


def _edit_images(edit):
    def setup(w):
        w.images()
        w.edit_manifest(edit)

    return setup


def _edit_episodes(edit):
    def setup(w):
        w.episodes()
        w.edit_manifest(edit)

    return setup


def _shard_file(value):
    def edit(raw):
        raw["splits"]["train"]["shards"][0]["file"] = value

    return edit


def _episodes(value):
    def edit(raw):
        raw["splits"]["train"]["episodes"] = value

    return edit


def _first_episode_length(raw):
    raw["splits"]["train"]["episodes"][0]["length"] = "x"


def _raw_manifest(data: bytes):
    def setup(w):
        w.images()
        w.write_manifest(data)

    return setup


def _names(field: str | None):
    """What the error about a bad manifest names: dataset.json, and the field where there is one."""
    return lambda w: [MANIFEST] + ([field] if field else [])


# OUT itself is the offending path when it is a file (NotADirectoryError naming OUT, not its dataset.json).
BAD_MANIFESTS = {
    "out-is-a-file": (_out_is_a_file, lambda w: [w.out]),
    "manifest-is-a-folder": (_manifest_is_a_folder, _names(None)),
    "shard-file-null": (_edit_images(_shard_file(None)), _names("file")),
    "shard-file-int": (_edit_images(_shard_file(3)), _names("file")),
    "shard-file-dot": (_edit_images(_shard_file(".")), _names("file")),
    "nested-100000-deep": (_raw_manifest(b"[" * 100_000 + b"]" * 100_000), _names(None)),
    "not-utf8": (_raw_manifest(b'\xff\xfe{"kind": "images\x80\x81"}'), _names(None)),
    "episodes-a-string": (_edit_episodes(_episodes("ep0.npy")), _names("episodes")),
    "episodes-list-of-ints": (_edit_episodes(_episodes([1, 2, 3])), _names("episodes")),
    "episode-length-x": (_edit_episodes(_first_episode_length), _names("length")),
    "features-a-list": (_edit_images(lambda raw: raw.update(features=sorted(raw["features"]))), _names("features")),
    "splits-null": (_edit_images(lambda raw: raw.update(splits=None)), _names("splits")),
}


def _bad_manifest(name: str, command: str):
    make, names = BAD_MANIFESTS[name]

    def setup(w):
        make(w)
        return [command, w.out], names(w)

    return setup


@dataclasses.dataclass(frozen=True)
class Refusal:
    setup: Callable[[World], tuple[list, list]]  # builds the attack; returns (CLI args, what the error must name)
    process: bool = False  # a subprocess with a timeout: the old code hangs or reads forever here
    one_line: bool = True


REFUSALS = {
    "verify-dotdot-shard": Refusal(_verify_bad_entry("dotdot")),
    "verify-absolute-shard": Refusal(_verify_bad_entry("absolute")),
    "verify-dev-zero-shard-entry": Refusal(_verify_bad_entry("dev-zero"), process=True),
    "verify-shard-is-a-link-to-dev-zero": Refusal(_shard_links_to_dev_zero, process=True),
    "overwrite-dotdot-shard": Refusal(_overwrite_bad_entry("dotdot")),
    "overwrite-absolute-shard": Refusal(_overwrite_bad_entry("absolute")),
    "overwrite-dotdot-index-file": Refusal(_overwrite_bad_index_entry),
    "overwrite-plan-with-dotdot-files": Refusal(_overwrite_bad_plan),
    "state-folder-is-a-link-fresh-out": Refusal(_state_link("fresh")),
    "state-folder-is-a-link-beside-a-finished-dataset": Refusal(_state_link("finished")),
    "state-folder-is-a-link-overwrite": Refusal(_state_link("finished", overwrite=True)),
    "verify-swapped-episode-lengths": Refusal(_verify_swapped_lengths, one_line=False),
    "npz-ambiguous-member-fail": Refusal(_ambiguous_npz_fail),
    "npy-declares-8tb-fail": Refusal(_declaring_npy_fail, process=True),
    **{
        f"{command}-{name}": Refusal(_bad_manifest(name, command))
        for name in BAD_MANIFESTS
        for command in ("info", "verify")
    },
}


@pytest.mark.parametrize("row", REFUSALS.values(), ids=REFUSALS.keys())
def test_cli_refuses_in_one_line_and_touches_nothing_outside_out(world, row):
    args, names = row.setup(world)
    before = snapshot(world.root, skip=("out",))

    ran = run_cli(world.cli, args, process=row.process)

    assert_cli_error(ran, names, one_line=row.one_line)
    assert_untouched(before, snapshot(world.root, skip=("out",)))


# --- the library refuses with ValueError/OSError naming the culprit ------------------------------------------------


def _readers_bad_entry(kind: str, reader: str):
    def setup(w):
        entry = BAD_ENTRIES[kind](w)
        if reader == "info":
            return lambda: readers.info(w.out), [_entry(entry)]
        return lambda: readers.images(w.out, batch_size=1), [_entry(entry)]  # building it must fail: nothing read

    return setup


def _readers_bad_manifest(name: str):
    make, names = BAD_MANIFESTS[name]

    def setup(w):
        make(w)
        return lambda: readers.info(w.out), names(w)

    return setup


def _first_batch(ds) -> None:
    next(iter(ds))


def _windows_swapped_lengths(w):
    _swapped_lengths(w)
    return lambda: _first_batch(readers.windows(w.out, length=3, batch_size=1, shuffle=False)), [w.out]


def _windows_fewer_than_a_batch(w):
    w.episodes()
    assert readers.info(w.out).num_windows("train", 9) == 2
    def call():
        _first_batch(readers.windows(w.out, length=9, batch_size=64))

    return call, [number(2), re.compile(r"batch[_ ]size")]


def _images_fewer_than_a_batch(w):
    make_tree(w.src, classes=("only",), per_class=31)
    ok(w.cli("images", w.src, w.out, "--workers", "0", "--quiet"))
    return lambda: _first_batch(readers.images(w.out, batch_size=64)), [number(31)]


def _horizon_too_long(w):
    w.episodes()  # longest episode: 10 steps; 9 + 5 do not fit, 9 alone would
    return lambda: _first_batch(readers.windows(w.out, length=9, targets=5, batch_size=1)), ["horizon"]


LIBRARY_REFUSALS = {
    **{
        f"readers-{reader}-{kind}-shard": _readers_bad_entry(kind, reader)
        for kind in BAD_ENTRIES
        for reader in ("info", "images")
    },
    **{f"readers-info-{name}": _readers_bad_manifest(name) for name in BAD_MANIFESTS},
    "windows-swapped-episode-lengths": _windows_swapped_lengths,
    "windows-fewer-windows-than-a-batch": _windows_fewer_than_a_batch,
    "images-fewer-images-than-a-batch": _images_fewer_than_a_batch,
    "horizon-too-long-says-horizon": _horizon_too_long,
}


@pytest.mark.parametrize("setup", LIBRARY_REFUSALS.values(), ids=LIBRARY_REFUSALS.keys())
def test_library_refuses_with_value_or_os_error_naming_the_culprit(world, setup):
    call, names = setup(world)
    before = snapshot(world.root, skip=("out",))

    assert_raises_naming(call, names)

    assert_untouched(before, snapshot(world.root, skip=("out",)))


# --- a conversion skips the bad input with its reason --------------------------------------------------------------


def _skip_ambiguous_npz(w):
    _ambiguous_npz(w)
    return "episodes", {"bad.npz": "ambiguous"}, 3


def _skip_special_images(w):
    make_tree(w.src)
    os.mkfifo(os.path.join(w.src, "cat", "x.jpg"))
    os.symlink("/dev/zero", os.path.join(w.src, "cat", "z.jpg"))
    return "images", {"cat/x.jpg": "not a regular file", "cat/z.jpg": "not a regular file"}, 12


def _skip_special_episodes(w):
    good = good_episodes(w.src)
    os.mkfifo(os.path.join(w.src, "x.npy"))
    os.symlink("/dev/zero", os.path.join(w.src, "z.npy"))
    return "episodes", {"x.npy": "not a regular file", "z.npy": "not a regular file"}, good


def _skip_declaring_npy(w):
    good = good_episodes(w.src)
    write_declaring_npy(os.path.join(w.src, "huge.npy"))
    return "episodes", {"huge.npy": ("truncated", "declares")}, good


def _skip_zip_bomb(w):
    good = good_episodes(w.src, npz="x")
    shutil.copy(w.request.getfixturevalue("zip_bomb"), os.path.join(w.src, "bomb.npz"))
    return "episodes", {"bomb.npz": MAX_EPISODE_BYTES}, good


def _skip_broken_link(w):
    good = good_episodes(w.src)
    os.symlink("missing", os.path.join(w.src, "ep9.npy"))
    return "episodes", {"ep9.npy": "broken symlink"}, good


def _skip_passwd_link(w):
    good = good_episodes(w.src)
    os.symlink("/etc/passwd", os.path.join(w.src, "p.npy"))
    return "episodes", {"p.npy": ""}, good


def _no_passwd_bytes(w: World, manifest_text: str) -> None:
    with open("/etc/passwd", "rb") as f:
        head = f.read(6).decode("utf-8", "replace")
    assert head not in manifest_text, "dataset.json quotes /etc/passwd"
    reason = {r["path"]: r["reason"] for r in json.loads(manifest_text)["rejected"]}["p.npy"]
    assert "root" not in reason.replace(w.root, "<tmp>"), f"the reason quotes the linked file: {reason!r}"


def _skip_pickle_npy(w):
    good = good_episodes(w.src)
    with open(os.path.join(w.src, "evil.npy"), "wb") as f:
        f.write(npy_bytes(pickle_array(w.path("pwned")), allow_pickle=True))
    return "episodes", {"evil.npy": "pickle"}, good


def _skip_pickle_npz(w):
    good = good_episodes(w.src, npz="obs")
    np.savez(os.path.join(w.src, "evil.npz"), obs=pickle_array(w.path("pwned")))
    return "episodes", {"evil.npz": "pickle"}, good


def _never_unpickled(w: World, manifest_text: str) -> None:
    assert not os.path.exists(w.path("pwned")), "a pickle in an episode file was loaded"


MAX_EPISODE_BYTES = re.compile(r"max[-_]episode[-_]bytes")


@dataclasses.dataclass(frozen=True)
class Skip:
    setup: Callable[[World], tuple[str, dict, int]]  # builds SRC; returns (kind, {relpath: reason}, good inputs)
    options: tuple = ("--on-error", "skip")
    process: bool = False  # a subprocess with a timeout: the old code blocks on a FIFO or reads /dev/zero forever
    check: Callable[[World, str], None] | None = None  # more, given the manifest's text


SKIPS = {
    "npz-ambiguous-member-skip": Skip(_skip_ambiguous_npz),
    "images-fifo-and-link-to-dev-zero": Skip(_skip_special_images, options=(), process=True),
    "episodes-fifo-and-link-to-dev-zero": Skip(_skip_special_episodes, process=True),
    "npy-declares-8tb-skip": Skip(_skip_declaring_npy, process=True),
    "npz-zip-bomb-over-max-episode-bytes": Skip(_skip_zip_bomb,
                                                   options=("--on-error", "skip", "--max-episode-bytes", "64MiB")),
    "broken-npy-symlink": Skip(_skip_broken_link),
    "npy-link-to-etc-passwd-quotes-nothing": Skip(_skip_passwd_link, check=_no_passwd_bytes),
    "holds-npy-object-array-never-unpickled": Skip(_skip_pickle_npy, check=_never_unpickled),
    "holds-npz-object-array-never-unpickled": Skip(_skip_pickle_npz, check=_never_unpickled),
}


@pytest.mark.parametrize("row", SKIPS.values(), ids=SKIPS.keys())
def test_conversion_skips_the_bad_input_with_its_reason(world, row):
    kind, bad, good = row.setup(world)
    before = snapshot(world.root, skip=("out",))

    ran = run_cli(world.cli, [kind, world.src, world.out, *row.options, "--workers", "0", "--quiet"],
                  process=row.process, timeout=120)

    assert ran.code == 0, (ran.stdout, ran.stderr, ran.exception)
    with open(os.path.join(world.out, MANIFEST), encoding="utf-8") as f:
        text = f.read()
    manifest = json.loads(text)
    rejected = {r["path"]: r["reason"] for r in manifest["rejected"]}
    assert sorted(rejected) == sorted(bad)
    for path, reason in bad.items():
        assert mentions(rejected[path], reason), f"{path}: reason {rejected[path]!r} does not say {reason!r}"
    splits = manifest["splits"].values()
    converted = sum(len(s["episodes"]) for s in splits) if kind == "episodes" else sum(s["records"] for s in splits)
    assert converted == good
    if row.check is not None:
        row.check(world, text)
    assert_untouched(before, snapshot(world.root, skip=("out",)))


# --- the zip bomb --------------------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory) -> str:
    """One .npz member of 25,000,000 float64 zeros: 200 MB declared, a few hundred kB on disk."""
    path = str(tmp_path_factory.mktemp("zip-bomb") / "bomb.npz")
    np.savez_compressed(path, x=np.zeros((25_000_000,), np.float64))
    assert os.path.getsize(path) < 2**20
    return path


def test_zip_bomb_over_the_library_limit_is_rejected_naming_it(world, zip_bomb):
    good = good_episodes(world.src, npz="x")
    shutil.copy(zip_bomb, os.path.join(world.src, "bomb.npz"))

    manifest = convert_episode_tree(world.src, world.out, on_error="skip",
                                    episode=EpisodeOptions(max_episode_bytes=64 * 2**20))

    rejected = {r["path"]: r["reason"] for r in manifest.rejected}
    assert sorted(rejected) == ["bomb.npz"]
    assert MAX_EPISODE_BYTES.search(rejected["bomb.npz"]), rejected["bomb.npz"]
    assert len(manifest.splits["train"].episodes) == good


_PEAK_RSS = r"""
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.stderr.write(done.stderr)
"""


@pytest.mark.slow
def test_zip_bomb_under_the_default_limit_converts_in_bounded_memory(world, zip_bomb):
    good = good_episodes(world.src, npz="x")
    shutil.copy(zip_bomb, os.path.join(world.src, "bomb.npz"))
    command = [sys.executable, "-m", "tfshard", "episodes", world.src, world.out, "--workers", "0", "--quiet"]

    # A wrapper of its own, so RUSAGE_CHILDREN holds the conversion alone, not every child this test run started.
    done = subprocess.run([sys.executable, "-c", _PEAK_RSS, *command], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300)

    code, peak_kib = map(int, done.stdout.split())
    assert code == 0, done.stderr
    manifest = world.manifest()
    assert manifest["rejected"] == []
    lengths = {e["source"]: e["length"] for e in manifest["splits"]["train"]["episodes"]}
    assert len(lengths) == good + 1 and lengths["bomb.npz"] == 25_000_000
    assert peak_kib < 1.5 * 2**20, f"peak RSS {peak_kib / 2**20:.2f} GiB converting a 200 MB episode"


# --- other inputs with the same names, sizes and mtimes ------------------------------------------------------------


def test_same_names_sizes_and_mtimes_but_other_pixels_are_not_taken_for_the_old_inputs(world):
    w = world
    v1 = make_tree(w.src)
    ok(w.cli("images", w.src, w.out, "--workers", "0", "--quiet"))
    cache = w.path("cache")
    first = pixels(w.out, cache)
    np.testing.assert_array_equal(first, pixels(w.out))
    v2_root = w.path("v2")
    v2 = {}
    for i, (rel, data) in enumerate(sorted(v1.items())):
        v2[rel] = jpeg_of_length(len(data), seed=1000 + i)
        os.makedirs(os.path.dirname(os.path.join(v2_root, rel)), exist_ok=True)
        with open(os.path.join(v2_root, rel), "wb") as f:
            f.write(v2[rel])
        old = os.stat(os.path.join(w.src, rel))
        os.utime(os.path.join(v2_root, rel), ns=(old.st_atime_ns, old.st_mtime_ns))
        new = os.stat(os.path.join(v2_root, rel))
        assert (new.st_size, new.st_mtime_ns) == (old.st_size, old.st_mtime_ns) and v2[rel] != data
    before = snapshot(w.root, skip=("out", "cache"))

    again = run_cli(w.cli, ["images", v2_root, w.out, "--workers", "0", "--quiet"])

    if again.code == 0:
        assert records(w.out) == v2, "exit 0, and OUT still holds the old inputs' images"
    else:
        assert_cli_error(again, [w.out, "--overwrite"])
    ok(w.cli("images", v2_root, w.out, "--workers", "0", "--quiet", "--overwrite"))
    assert records(w.out) == v2
    fresh = pixels(w.out)
    assert not np.array_equal(fresh, first)
    np.testing.assert_array_equal(pixels(w.out, cache), fresh, err_msg="the cache served the old inputs' pixels")
    assert_untouched(before, snapshot(w.root, skip=("out", "cache")))


# --- a cache filled while a shard was damaged ----------------------------------------------------------------------


@pytest.mark.parametrize("repair", [(), ("--overwrite",)], ids=["rerun-repairs", "overwrite-repairs"])
def test_cache_filled_from_a_damaged_shard_is_not_served_after_the_repair(world, repair):
    w = world.images()
    path = os.path.join(w.out, w.first_shard())
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * 0.6))
    cache = w.path("cache")
    damaged = pixels(w.out, cache, ignore_errors=True)
    assert 0 < len(damaged) < 12
    before = snapshot(w.root, skip=("out", "cache"))

    # A shard whose bytes are not the manifest's may be a user's file as well as a damaged shard: refused, naming it.
    command = ("images", w.src, w.out, "--num-shards", "3", "--workers", "0", "--quiet", *repair)
    assert_cli_error(run_cli(w.cli, command), [path, "does not match", "remove it"])
    os.remove(path)  # what the message says to do with a damaged shard
    ok(w.cli(*command))

    whole = pixels(w.out, ignore_errors=True)
    assert len(whole) == 12
    np.testing.assert_array_equal(pixels(w.out, cache, ignore_errors=True), whole,
                                  err_msg="the cache still serves the records of the damaged shard")
    assert_untouched(before, snapshot(w.root, skip=("out", "cache")))


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


# --- a deleted shard read with ignore_errors -----------------------------------------------------------------------

_READ_ALL = r"""
import json, sys
from tfshard import readers
try:
    for _ in readers.images(sys.argv[1], batch_size=1, ignore_errors=True):
        pass
    print(json.dumps({"raised": None}))
except Exception as e:
    print(json.dumps({"raised": type(e).__name__, "not_found": isinstance(e, FileNotFoundError), "message": str(e)}))
"""


def test_deleted_shard_with_ignore_errors_raises_file_not_found_naming_it(world):
    w = world.images()
    shard = w.first_shard()
    os.remove(os.path.join(w.out, shard))
    before = snapshot(w.root, skip=("out",))

    try:
        done = subprocess.run(python("-c", _READ_ALL, w.out), cwd=REPO, env=ENV, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("readers.images(ignore_errors=True) over a deleted shard never ends")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] is not None, "the missing shard was skipped silently"
    assert result["not_found"], result
    assert shard in result["message"], result
    assert_untouched(before, snapshot(w.root, skip=("out",)))


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


# --- two cached pipelines in one process ---------------------------------------------------------------------------


def test_two_pipelines_on_one_cache_iterated_together_both_give_every_record(world):
    w = world.images()
    cache = w.path("cache")
    expected = pixels(w.out)
    before = snapshot(w.root, skip=("out", "cache"))

    def pipeline():
        return iter(readers.images(w.out, batch_size=1, image_size=(16, 16), training=False, cache=cache,
                                   drop_remainder=False))

    live = {"a": pipeline(), "b": pipeline()}
    got: dict[str, list] = {"a": [], "b": []}
    while live:
        for name in list(live):
            try:
                got[name].append(next(live[name])[0].numpy())
            except StopIteration:
                del live[name]

    for name in got:
        np.testing.assert_array_equal(np.concatenate(got[name]), expected, err_msg=f"pipeline {name}")
    assert_untouched(before, snapshot(w.root, skip=("out", "cache")))


# --- numpy integers for int arguments ------------------------------------------------------------------------------


def test_numpy_integer_targets_and_length_work_like_ints(world):
    w = world.episodes()

    def windows(length, targets):
        ds = readers.windows(w.out, length=length, targets=targets, batch_size=1, shuffle=False, features="data")
        return [(x.numpy(), y.numpy()) for x, y in ds]

    expected = windows(4, 2)
    got = windows(np.int64(4), np.int64(2))

    assert len(got) == len(expected) == readers.info(w.out).num_windows("train", 4, horizon=2)
    for (x, y), (ex, ey) in zip(got, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


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


@pytest.mark.parametrize("tamper", [
    lambda stats: stats.update(class_counts=[99, 1]),
    lambda stats: stats.update(class_counts=[20, -8]),
    lambda stats: stats.update(class_counts=[12]),
    lambda stats: stats.update(converted="lots"),
    lambda stats: stats["pixels"].update(sums=[1e30, 0, 0]),
    lambda stats: stats["pixels"].update(count=-400),
], ids=["skewed", "negative", "short", "wrong-type", "huge-sums", "negative-count"])
def test_tampered_commit_record_only_means_its_shard_is_written_again(world, tamper):
    """A commit record whose shard still hashes right but whose statistics lie is not believed: the shard is rewritten
    and the manifest's counts and pixel statistics are those of a clean run."""
    world.images()  # 2 classes x 6 images, 3 shards
    clean = world.manifest()
    state = os.path.join(world.out, STATE)
    # an unfinished conversion that committed its first shard: that shard and its commit record in place
    for name in [MANIFEST, "inputs.json"] + [s["file"] for s in clean["splits"]["train"]["shards"][1:]]:
        os.remove(os.path.join(world.out, name))
    os.makedirs(state)
    shard = clean["splits"]["train"]["shards"][0]
    split = clean["splits"]["train"]
    stats = {"class_counts": [split["class_counts"]["cat"], split["class_counts"]["dog"]], "converted": 0,
             "pixels": {"count": 256 * shard["records"], "sums": [0, 0, 0], "squares": [0, 0, 0]}}
    stats["class_counts"] = [shard["records"], 0]
    tamper(stats)
    with open(os.path.join(state, shard["file"] + ".json"), "w") as f:
        json.dump({"info": shard, "stats": stats, "rejected": []}, f)
    with open(os.path.join(state, "plan.json"), "w") as f:
        json.dump({"fingerprint": clean["fingerprint"], "files": [s["file"] for s in split["shards"]]}, f)
    ok(world.cli("images", world.src, world.out, "--num-shards", "3", "--workers", "0", "--quiet"))
    assert world.manifest() == clean
    ok(world.cli("verify", world.out))


def test_removal_journal_through_a_symlink_is_refused(world):
    world.images()
    state = os.path.join(world.out, STATE)
    os.makedirs(state)
    outside = os.path.join(world.victim, "journal.json")
    with open(outside, "w") as f:
        json.dump({"files": [MANIFEST]}, f)
    os.symlink(outside, os.path.join(state, "removing.json"))
    before = snapshot(world.root, skip=("out",))
    ran = run_cli(world.cli, ["images", world.src, world.out, "--num-shards", "3", "--workers", "0", "--quiet"])
    assert_cli_error(ran, ["removing.json", "symlink"])
    assert os.path.exists(os.path.join(world.out, MANIFEST))  # nothing was removed on its word
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


@pytest.mark.parametrize("args, named", [(["--limit", "0"], "--limit"), (["--limit", "-1"], "--limit"),
                                          (["--src", "/nonexistent-src"], "/nonexistent-src")])
def test_bench_compare_refuses_bad_arguments_up_front(world, args, named):
    world.images()
    ran = run_cli(world.cli, ["bench", world.out, "--compare", "--batch-size", "2", "--image-size", "16", *args])
    assert_cli_error(ran, [named])
