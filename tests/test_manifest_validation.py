"""Untrusted manifests, state files and inputs: each row is one attack on tfshard, its setup, the action, and what
must hold, in a world made by tests/untrusted_world.py, and each checks that nothing outside OUT changed.

The rows are grouped by the shape of their expectation:

* ``REFUSALS``: the CLI exits 1 through its own error path (never an uncaught exception), with one stderr line
  ``error: ...`` naming the offending path or manifest field, and no traceback;
* ``LIBRARY_REFUSALS``: the library raises ValueError or OSError (``InputError`` subclasses ValueError) naming it,
  never a bare KeyError/TypeError/MemoryError/RecursionError/UnicodeDecodeError;
* ``SKIPS``: a conversion finishes; the bad input is in ``rejected`` with its reason, every good one is converted;
* the scenarios after them: zip bombs, stale inputs and caches, a deleted shard, lying commit records and removal
  journals. What a conversion does to its output folder (locks, two writers at once, kill -9 mid-``--overwrite``,
  a full disk, links planted in OUT) is in tests/test_output_folder.py.
"""


from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable

import numpy as np
import pytest
from helpers import (
    convert_episode_tree,
    make_tree,
    npy_bytes,
    snapshot,
)
from tfshard import readers
from tfshard.ingest import EpisodeOptions
from untrusted_world import (
    ENV,
    MANIFEST,
    REPO,
    STATE,
    World,
    assert_cli_error,
    assert_raises_naming,
    assert_untouched,
    good_episodes,
    jpeg_of_length,
    mentions,
    new_world,
    number,
    ok,
    pickle_array,
    pixels,
    python,
    records,
    run_cli,
    write_declaring_npy,
)


@pytest.fixture
def world(tmp_path, cli, request) -> World:
    return new_world(tmp_path, cli, request)

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


def _first_shard_sha256_and_a_newline(raw):
    shard = raw["splits"]["train"]["shards"][0]
    shard["sha256"] += "\n"  # the pattern's "$" matched before it


def _raw_manifest(data: bytes):
    def setup(w):
        w.images()
        w.write_manifest(data)

    return setup


def _splits_given_twice(w):
    """The real manifest with a second, empty ``splits`` after the first: ``json`` keeps the last (a dataset of nothing,
    its shards unlisted), another reader the first."""
    w.images()
    with open(os.path.join(w.out, MANIFEST), "rb") as f:
        text = f.read().rstrip()
    w.write_manifest(text[:-1] + b', "splits": {}}\n')


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
    "sha256-and-a-newline": (_edit_images(_first_shard_sha256_and_a_newline), _names("sha256")),
    "number-of-5000-digits": (_raw_manifest(b'{"format_version": ' + b"9" * 5000 + b"}"), _names(None)),
    "not-utf8": (_raw_manifest(b'\xff\xfe{"kind": "images\x80\x81"}'), _names(None)),
    "episodes-a-string": (_edit_episodes(_episodes("ep0.npy")), _names("episodes")),
    "episodes-list-of-ints": (_edit_episodes(_episodes([1, 2, 3])), _names("episodes")),
    "episode-length-x": (_edit_episodes(_first_episode_length), _names("length")),
    "features-a-list": (_edit_images(lambda raw: raw.update(features=sorted(raw["features"]))), _names("features")),
    "splits-null": (_edit_images(lambda raw: raw.update(splits=None)), _names("splits")),
    "splits-given-twice": (_splits_given_twice, _names("key 'splits' twice")),
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


def _windows_episode_of_a_terabyte(w):
    """A length no shard holds: the resident reader sized its arrays by it before reading (numpy's MemoryError)."""
    w.episodes()

    def edit(raw):
        raw["splits"]["train"]["episodes"][0]["length"] = 10**12

    w.edit_manifest(edit)
    return lambda: _first_batch(readers.windows(w.out, length=3, batch_size=1)), [MANIFEST, "episodes", "bytes hold"]


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
    "windows-episode-of-a-terabyte": _windows_episode_of_a_terabyte,
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


# --- bench --compare checks its arguments up front ---------------------------------------------------------------


@pytest.mark.parametrize("args, named", [(["--limit", "0"], "--limit"), (["--limit", "-1"], "--limit"),
                                          (["--src", "/nonexistent-src"], "/nonexistent-src")])
def test_bench_compare_refuses_bad_arguments_up_front(world, args, named):
    world.images()
    ran = run_cli(world.cli, ["bench", world.out, "--compare", "--batch-size", "2", "--image-size", "16", *args])
    assert_cli_error(ran, [named])

