"""The pure episode core: header-only scan, schema agreement, NaN policy, chunking into raw little-endian bytes."""

import re

import numpy as np
import pytest
from helpers import make_tree
from tfshard.format.errors import InputError
from tfshard.ingest.episodes import (
    EpisodeOptions,
    EpisodeSource,
    common_schema,
    prepare_episode,
    read_episode_header,
    scan_episode_files,
)
from tfshard.ingest.scan import Rejection


def _headers(root):
    files = scan_episode_files(str(root)).files
    return [read_episode_header(f) for split in files.values() for f in split]


def test_headers_give_schema_and_length_without_loading(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((7, 3, 2), np.float32))
    np.savez(tmp_path / "b.npz", obs=np.zeros((5, 4), ">f8"), action=np.zeros((5,), np.int16))
    a, b = _headers(tmp_path)
    assert (a.length, {n: (s.dtype, s.shape) for n, s in a.schema.items()}) == (7, {"data": ("<f4", (3, 2))})
    assert b.length == 5 and b.schema["obs"].dtype == "<f8" and b.schema["action"].shape == ()


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: np.save(p / "x.npy", np.zeros((0, 3), np.float32)), "empty episode"),
        (lambda p: np.save(p / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True), "object array"),
        (lambda p: np.savez(p / "x.npz", a=np.zeros(4), b=np.zeros(5)), "disagree on the time axis"),
        (lambda p: np.save(p / "x.npy", np.float32(3)), "scalar"),
        (lambda p: (p / "x.npy").write_bytes(b"not numpy"), "not a readable numpy file"),
    ],
)
def test_unusable_files_are_rejected_with_a_reason(tmp_path, make, reason):
    make(tmp_path)
    (rejection,) = _headers(tmp_path)
    assert isinstance(rejection, Rejection) and rejection.relpath.startswith("x.np") and reason in rejection.reason


def test_the_odd_episode_is_named_with_what_differs(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"ok{i}.npy", np.zeros((4, 2), np.float32))
    np.save(tmp_path / "odd.npy", np.zeros((4, 3), np.float64))
    schema, odd = common_schema([h for h in _headers(tmp_path) if isinstance(h, EpisodeSource)])
    assert schema["data"].dtype == "<f4"
    (rejection,) = odd
    assert rejection.relpath == "odd.npy" and "<f8[3] vs expected <f4[2]" in rejection.reason


def _prepared(tmp_path, array, **options):
    np.save(tmp_path / "e.npy", array)
    (header,) = _headers(tmp_path)
    return prepare_episode(header, header.schema, EpisodeOptions(**options))


def test_chunks_are_whole_steps_of_little_endian_bytes_that_join_back(tmp_path):
    array = np.arange(50 * 3, dtype=">f4").reshape(50, 3)  # big-endian on disk
    prepared = _prepared(tmp_path, array, max_record_bytes=100)  # 8 steps of 12 bytes per chunk
    assert [(start, n) for start, n, _ in prepared.chunks][:2] == [(0, 8), (8, 8)]
    joined = np.concatenate([np.frombuffer(c["data"], "<f4").reshape(n, 3) for _, n, c in prepared.chunks])
    np.testing.assert_array_equal(joined, array)
    assert prepared.sums["data"].count == 50
    np.testing.assert_allclose(prepared.sums["data"].sums, array.astype(np.float64).sum(0))


@pytest.mark.parametrize("on_nan", ["fail", "skip", "keep"])
def test_nan_policy(tmp_path, on_nan):
    array = np.ones((6, 2), np.float32)
    array[4, 1] = np.nan
    if on_nan == "fail":
        with pytest.raises(InputError, match=r"e\.npy: non-finite value nan in feature 'data' at index \[4, 1\]"):
            _prepared(tmp_path, array, on_nan=on_nan)
        return
    result = _prepared(tmp_path, array, on_nan=on_nan)
    if on_nan == "skip":
        assert isinstance(result, Rejection) and "index [4, 1]" in result.reason
    else:
        assert result.length == 6


def test_scan_recurses_sorted_with_splits(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "deep").mkdir(parents=True)
        np.save(tmp_path / split / "deep" / "b.npy", np.zeros((3, 1)))
        np.save(tmp_path / split / "a.npy", np.zeros((3, 1)))
    (tmp_path / "train" / "notes.txt").write_text("x")
    tree = scan_episode_files(str(tmp_path))
    assert tree.rejected == []
    assert {s: [f.relpath for f in fs] for s, fs in tree.files.items()} == {
        "train": ["train/a.npy", "train/deep/b.npy"], "val": ["val/a.npy", "val/deep/b.npy"]}
    assert tree.ignored_other == 1
    assert tree.ignored_files == ["train/notes.txt"]


SPLIT_LAYOUTS = [
    # top-level folders, top-level input files -> split names, or the error's words
    ([], [], []),
    (["cat", "dog"], [], []),
    (["train"], [], ["train"]),
    (["train", "valid"], [], ["train", "valid"]),
    (["test", "train", "val", "valid", "validation"], [], ["test", "train", "val", "valid", "validation"]),
    (["cat", "dog"], ["a.npy"], []),  # no split folders: top-level files are inputs like any other
    (["Train", "Val"], [], []),  # split names are matched exactly: these are two class folders
    (["dev", "train"], [], "mixes split folders (train) with folders that are not split names (got ['dev'])"),
    (["train", "val"], ["a.npy"], "holds input files beside its split folders (train, val) (got ['a.npy'])"),
]


@pytest.mark.parametrize("folders, files, expected", SPLIT_LAYOUTS)
def test_split_folders_golden(folders, files, expected):
    from tfshard.ingest.scan import split_folders

    if isinstance(expected, str):
        with pytest.raises(InputError, match=re.escape(f"src: {expected}; ")):
            split_folders("src", folders, files)
    else:
        assert split_folders("src", folders, files) == expected


def test_both_kinds_bring_what_the_engine_needs(tmp_path):
    """Each kind of input is a ``Kind`` (``ingest/kinds/protocol.py``): the members the engine uses, and no others."""
    from tfshard.ingest import ConvertOptions
    from tfshard.ingest.kinds.episodes import EpisodeJob
    from tfshard.ingest.kinds.images import ImageJob
    from tfshard.ingest.kinds.protocol import Kind

    make_tree(str(tmp_path / "images"), per_class=1)
    (tmp_path / "episodes").mkdir()
    np.save(tmp_path / "episodes" / "a.npy", np.zeros((4, 2)))
    options = ConvertOptions(on_error="skip")
    for job in (ImageJob(str(tmp_path / "images"), options), EpisodeJob(str(tmp_path / "episodes"), options)):
        assert isinstance(job, Kind), type(job).__name__
        assert sum(len(items) for items in job.items.values()) > 0
