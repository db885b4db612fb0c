"""Episode conversion end to end: numpy files → shards + dataset.json → readers.episodes, compared with the source;
the last section holds hostile episode inputs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
import zipfile

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    Tripwire,
    convert_episode_tree,
    edit_manifest,
    files_under,
    npy_bytes,
    random_episodes,
    read_records,
    save_episodes,
    shard_files,
)
from tfshard import readers
from tfshard.format.manifest import EPISODE_DTYPES, ManifestError
from tfshard.format.untrusted import from_json
from tfshard.ingest import EpisodeOptions, InputError, VerifyError, load_manifest, verify
from tfshard.ingest.episodes import MAX_FEATURES, read_episode_header
from tfshard.ingest.scan import SourceFile

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "bool", "complex64", ">f8"]


def read_back(out, split="train", **kwargs) -> list[dict]:
    """Every episode of a split, in the reader's (manifest) order, as numpy arrays."""
    return list(readers.episodes(str(out), split, **kwargs).as_numpy_iterator())


def assert_same_array(got: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Equal values, the little-endian twin of the source dtype, and the very same bytes (so -0.0 and NaN count)."""
    little = expected.dtype.newbyteorder("<") if expected.dtype.byteorder == ">" else expected.dtype
    assert got.dtype == little, what
    assert got.dtype.byteorder in "=<|", what
    assert got.shape == expected.shape, what
    np.testing.assert_array_equal(got, expected, err_msg=what)
    assert got.tobytes() == expected.astype(little).tobytes(), what


def episodes_tree(src, lengths=(12, 5, 30, 1, 9), seed=0) -> dict[str, np.ndarray]:
    """One .npy episode per length, in nested folders (sorted relpaths deliberately not in creation order)."""
    rels = ["z/deep/run.npy", "a/b/run1.npy", "a/run0.npy", "c.npy", "a/b/c/run2.npy"][: len(lengths)]
    written = dict(zip(rels, random_episodes(lengths, seed, width=3)))
    save_episodes(src, written)
    return written


# --- round trips ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, None])
def test_npy_episodes_in_nested_folders_round_trip_in_manifest_order(tmp_path, seed):
    src, out = tmp_path / "src", tmp_path / "out"
    written = episodes_tree(src)

    manifest = convert_episode_tree(src, out, num_shards=2, seed=seed)

    entries = manifest.splits["train"].episodes
    assert sorted(e.source for e in entries) == sorted(written)
    # ids are positions in the sorted relpath order of every file under SRC, whatever the record order
    assert {e.source: e.id for e in entries} == {rel: i for i, rel in enumerate(sorted(written))}
    if seed is None:
        assert [e.source for e in entries] == sorted(written)
    got = read_back(out)
    assert len(got) == len(entries)
    for episode, entry in zip(got, entries):
        assert set(episode) == {"data"}
        assert entry.length == len(written[entry.source])
        assert_same_array(episode["data"], written[entry.source], entry.source)


def test_npz_episodes_with_named_arrays_round_trip(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    rng = np.random.default_rng(1)
    written = {}
    for i, t in enumerate([7, 20, 3, 11]):
        written[f"runs/ep{i}.npz"] = {
            "obs": rng.normal(size=(t, 2, 3)).astype(np.float32),
            "action": rng.integers(-5, 5, t).astype(np.int64),
            "reward": rng.normal(size=t),
            "done": np.arange(t) == t - 1,
        }
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=3)

    entries = manifest.splits["train"].episodes
    got = read_back(out)
    assert [e.source for e in entries] != sorted(written)  # the write-time shuffle did reorder (seed 0)
    assert len(got) == len(written)
    for episode, entry in zip(got, entries):
        source = written[entry.source]
        assert set(episode) == set(source)
        for name in source:
            assert_same_array(episode[name], source[name], f"{entry.source}:{name}")
    # asking for some features reads just those
    only = read_back(out, features=["done", "obs"])
    assert all(set(e) == {"done", "obs"} for e in only)
    np.testing.assert_array_equal(only[0]["obs"], got[0]["obs"])


def test_npy_mixed_with_npz_is_an_odd_schema(tmp_path):
    src = tmp_path / "src"
    save_episodes(src, dict(zip(["a.npy", "b.npy", "c.npy"], random_episodes([4, 5, 6]))))
    save_episodes(src, {"d.npz": {"obs": np.zeros((4, 2), np.float32), "action": np.zeros(4, np.int32)}})

    with pytest.raises(InputError, match=re.escape(str(src / "d.npz")) + r": feature names differ") as caught:
        convert_episode_tree(src, tmp_path / "out")
    assert "['action', 'obs']" in str(caught.value) and "['data']" in str(caught.value)
    assert not (tmp_path / "out").exists()

    manifest = convert_episode_tree(src, tmp_path / "skip", on_error="skip")
    assert [r["path"] for r in manifest.rejected] == ["d.npz"]
    assert sorted(e.source for e in manifest.splits["train"].episodes) == ["a.npy", "b.npy", "c.npy"]


def _values(dtype: str, shape: tuple, steps: int, rng) -> np.ndarray:
    """Seeded values of ``dtype`` that include the awkward ones: extremes, -0.0, subnormals, full-range uint64."""
    dt = np.dtype(dtype)
    full = (steps, *shape)
    if dt.kind == "b":
        return rng.integers(0, 2, full).astype(bool)
    if dt.kind in "iu":
        limits = np.iinfo(dt)
        values = rng.integers(limits.min, limits.max, full, dtype=dt.newbyteorder("="), endpoint=True)
        values.flat[0], values.flat[-1] = limits.min, limits.max
        return values.astype(dt)
    real = dt if dt.kind == "f" else np.dtype(np.float32)
    parts = [rng.normal(size=full) * 100 for _ in range(1 if dt.kind == "f" else 2)]
    values = parts[0] + 1j * parts[1] if dt.kind == "c" else parts[0]
    values = values.astype(dt)
    finfo = np.finfo(real)
    values.flat[0], values.flat[-1] = finfo.max, -0.0
    values.flat[1 % values.size] = finfo.smallest_subnormal
    return values


@pytest.mark.filterwarnings("ignore:overflow encountered in square:RuntimeWarning")  # float64 max squared: std inf
@pytest.mark.parametrize("shape", [(), (3,), (2, 4)], ids=["scalar", "vector", "matrix"])
def test_every_numeric_dtype_round_trips_exactly(tmp_path, shape):
    src, out = tmp_path / "src", tmp_path / "out"
    rng = np.random.default_rng(len(shape))
    names = {d: "f8_big_endian" if d == ">f8" else d for d in DTYPES}
    written = {f"ep{i}.npz": {names[d]: _values(d, shape, t, rng) for d in DTYPES} for i, t in enumerate([6, 9])}
    save_episodes(src, written)
    assert np.load(src / "ep0.npz")["f8_big_endian"].dtype.str == ">f8"  # really big-endian on disk

    manifest = convert_episode_tree(src, out)

    for d, name in names.items():
        spec = manifest.features[f"data/{name}"]
        assert (spec["dtype"], spec["shape"]) == (np.dtype(d).newbyteorder("<").str if d == ">f8" else np.dtype(d).str,
                                                  list(shape)), name
    assert manifest.features["data/f8_big_endian"]["dtype"] == "<f8"
    dataset = readers.episodes(str(out))
    assert dataset.element_spec["uint64"].dtype == tf.uint64 and dataset.element_spec["bool"].dtype == tf.bool
    got = list(dataset.as_numpy_iterator())  # read_back(out), from the pipeline built above
    for episode, entry in zip(got, manifest.splits["train"].episodes):
        for name, source in written[entry.source].items():
            assert_same_array(episode[name], source, f"{entry.source}:{name}")
    assert got[0]["f8_big_endian"].dtype == np.dtype("<f8")


@pytest.mark.parametrize("max_record_bytes, steps_per_record", [(1, 1), (100, 8), (12 * 16, 16), (10**6, 50)])
def test_long_episodes_are_chunked_and_join_back(tmp_path, max_record_bytes, steps_per_record):
    src, out = tmp_path / "src", tmp_path / "out"
    written = dict(zip(["long.npy", "mid.npy", "short.npy"], random_episodes([50, 17, 5], width=3)))  # 12 B/step
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=2, episode=EpisodeOptions(max_record_bytes=max_record_bytes))

    split = manifest.splits["train"]
    expected_records = sum(-(-len(a) // steps_per_record) for a in written.values())
    assert split.records == sum(s.records for s in split.shards) == expected_records
    if steps_per_record < 50:
        assert split.records > len(written)
    assert split.episode_lengths == [len(written[e.source]) for e in split.episodes]
    for episode, entry in zip(read_back(out), split.episodes):
        assert_same_array(episode["data"], written[entry.source], entry.source)


def test_a_manifest_that_counts_one_record_per_episode_of_chunked_shards_fails_naming_the_episode(tmp_path):
    """An episode that is one record is decoded without a join (``episode_decode.whole_records``), chosen by the
    manifest's counts; a manifest that says so of chunked shards fails on the first chunk, not a torn episode."""
    src, out = tmp_path / "src", tmp_path / "out"
    save_episodes(src, dict(zip(["a.npy", "b.npy"], random_episodes([50, 17], width=3))))
    convert_episode_tree(src, out, num_shards=1, episode=EpisodeOptions(max_record_bytes=100))

    def one_record_each(raw):
        split = raw["splits"]["train"]
        split["records"] = split["shards"][0]["records"] = len(split["episodes"])

    edit_manifest(out, one_record_each)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r": episode 0 a\.npy has a record of chunk 0 of 7 where the manifest counts one record "
                             r"per episode; run `tfshard verify"):
        list(readers.episodes(str(out)))


def test_chunked_npz_features_of_different_widths_join_back(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    rng = np.random.default_rng(5)
    written = {f"e{i}.npz": {"obs": rng.normal(size=(t, 5)), "flag": rng.integers(0, 2, t).astype(bool)}
               for i, t in enumerate([40, 13, 26])}
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=2, episode=EpisodeOptions(max_record_bytes=123))

    assert manifest.splits["train"].records == sum(-(-t // 3) for t in [40, 13, 26])  # 41 B/step: 3 steps a record
    for episode, entry in zip(read_back(out), manifest.splits["train"].episodes):
        for name, source in written[entry.source].items():
            assert_same_array(episode[name], source, f"{entry.source}:{name}")


def test_split_folders_make_splits(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = {
        "train/x/a.npy": random_episodes([10], 1)[0], "train/b.npy": random_episodes([4], 2)[0],
        "val/c.npy": random_episodes([6], 3)[0], "val/deep/er/d.npy": random_episodes([8], 4)[0],
    }
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=1)

    assert sorted(manifest.splits) == ["train", "val"]
    assert shard_files(out) == ["train-00000-of-00001.tfrecord", "val-00000-of-00001.tfrecord"]
    every = sorted(written)
    for split in ("train", "val"):
        entries = manifest.splits[split].episodes
        assert sorted(e.source for e in entries) == [r for r in every if r.startswith(split + "/")]
        for episode, entry in zip(read_back(out, split), entries):
            assert entry.id == every.index(entry.source)  # ids count across splits
            assert_same_array(episode["data"], written[entry.source], entry.source)


def test_train_and_valid_folders_are_splits(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = {"train/a.npy": random_episodes([10], 1)[0], "valid/b.npy": random_episodes([6], 2)[0]}
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=1)

    assert sorted(manifest.splits) == ["train", "valid"]
    for split, rel in (("train", "train/a.npy"), ("valid", "valid/b.npy")):
        (episode,) = read_back(out, split)
        assert_same_array(episode["data"], written[rel], rel)


def test_split_and_other_folders_mixed_are_refused_as_for_images(tmp_path):
    from tfshard.ingest.scan import scan_image_folders

    src = tmp_path / "src"
    save_episodes(src, {"train/a.npy": random_episodes([4], 1)[0], "runs/b.npy": random_episodes([4], 2)[0]})
    (src / "train" / "cat").mkdir()  # an image tree of the same layout, for the same message
    with pytest.raises(InputError, match=re.escape(
        f"{src}: mixes split folders (train) with folders that are not split names (got ['runs']); split folders "
        "must be named train, val, valid, validation, test"
    )) as episodes_error:
        convert_episode_tree(src, tmp_path / "out")
    with pytest.raises(InputError) as images_error:
        scan_image_folders(str(src))
    assert str(episodes_error.value) == str(images_error.value)  # one rule, one message


def test_episode_files_beside_split_folders_are_refused(tmp_path):
    src = tmp_path / "src"
    save_episodes(src, {"train/a.npy": random_episodes([4], 1)[0], "val/b.npy": random_episodes([4], 2)[0],
                        "c.npy": random_episodes([4], 3)[0]})
    (src / "README.md").write_text("a note beside the splits is fine")
    with pytest.raises(InputError, match=re.escape(
        f"{src}: holds input files beside its split folders (train, val) (got ['c.npy']); they would belong to "
        "no split: move them into a split folder (e.g. train/), or use no split folders"
    )):
        convert_episode_tree(src, tmp_path / "out")


def test_ignored_files_are_named(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    save_episodes(src, {"train/a.npy": random_episodes([4], 1)[0]})
    (src / "notes.txt").write_text("x")
    (src / "train" / "a.json").write_text("{}")
    (src / "train" / ".DS_Store").write_bytes(b"\0")

    result = cli("episodes", src, out, "--workers", "0")

    assert result.exit_code == 0, result.output
    manifest = load_manifest(str(out))
    assert manifest.ignored == {"hidden": 1, "other": 2}
    assert manifest.ignored_files == ["notes.txt", "train/a.json"]
    assert "  ignored: 1 hidden, 2 non-.npy/.npz files:\n    notes.txt\n    train/a.json\n" in result.stdout


def test_gzip_round_trip(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = episodes_tree(src)

    manifest = convert_episode_tree(src, out, num_shards=2, compression="gzip",
                                    episode=EpisodeOptions(max_record_bytes=60))

    assert manifest.compression == "gzip"
    assert shard_files(out) == ["train-00000-of-00002.tfrecord.gz", "train-00001-of-00002.tfrecord.gz"]
    for name in shard_files(out):
        assert (out / name).read_bytes()[:2] == b"\x1f\x8b"
    for episode, entry in zip(read_back(out), manifest.splits["train"].episodes):
        assert_same_array(episode["data"], written[entry.source], entry.source)
    assert verify(str(out)) == manifest


# --- bad input ------------------------------------------------------------------------------------------------


def test_schema_mismatch_names_the_odd_file_and_what_differs(tmp_path):
    src = tmp_path / "src"
    save_episodes(src, dict(zip(["a.npy", "b.npy", "c.npy"], random_episodes([4, 5, 6]))))
    save_episodes(src, {"sub/odd.npy": np.zeros((4, 3), np.float64)})

    with pytest.raises(InputError, match=re.escape(str(src / "sub" / "odd.npy")) + r": features differ: "
                       r"data: <f8\[3\] vs expected <f4\[2\]"):
        convert_episode_tree(src, tmp_path / "out")

    manifest = convert_episode_tree(src, tmp_path / "skip", on_error="skip")
    (rejected,) = manifest.rejected
    assert rejected["path"] == "sub/odd.npy" and "<f8[3] vs expected <f4[2]" in rejected["reason"]
    assert sorted(e.source for e in manifest.splits["train"].episodes) == ["a.npy", "b.npy", "c.npy"]


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_object_arrays_are_refused_and_never_unpickled(tmp_path, on_error):
    src, marker = tmp_path / "src", tmp_path / "unpickled"
    save_episodes(src, {"good.npy": random_episodes([5])[0]})
    src.joinpath("sub").mkdir()
    np.save(src / "sub" / "pickled.npy", np.array([Tripwire(str(marker))] * 5, dtype=object), allow_pickle=True)
    np.savez(src / "pickled.npz", data=np.array([Tripwire(str(marker))] * 5, dtype=object))

    if on_error == "fail":
        with pytest.raises(InputError, match=re.escape(f"{src / 'pickled.npz'}: feature 'data' is an object array")):
            convert_episode_tree(src, tmp_path / "out")
    else:
        manifest = convert_episode_tree(src, tmp_path / "out", on_error="skip")
        assert [r["path"] for r in manifest.rejected] == ["pickled.npz", "sub/pickled.npy"]
        assert all("object array" in r["reason"] for r in manifest.rejected)
        assert [e.source for e in manifest.splits["train"].episodes] == ["good.npy"]

    assert not marker.exists()
    np.load(src / "sub" / "pickled.npy", allow_pickle=True)  # the tripwire works: loading the pickle trips it
    assert marker.exists()


@pytest.mark.parametrize("array", [np.array(["abc", "def", "ghi"]), np.array([b"ab", b"cd"]),
                                   np.arange(3).astype("datetime64[s]"), np.zeros(3, [("a", "<f4"), ("b", "<i2")])],
                         ids=["unicode", "bytes", "datetime", "structured"])
def test_non_numeric_dtypes_are_refused(tmp_path, array):
    src = tmp_path / "src"
    save_episodes(src, {"good.npy": np.zeros((4,)), "text.npy": array})

    with pytest.raises(InputError, match=re.escape(str(src / "text.npy")) +
                       re.escape(f": feature 'data' has dtype {array.dtype.str} (not numeric)")):
        convert_episode_tree(src, tmp_path / "out")
    manifest = convert_episode_tree(src, tmp_path / "skip", on_error="skip")
    assert [r["path"] for r in manifest.rejected] == ["text.npy"]


def _nan_tree(src, value=np.nan, dtype=np.float32) -> dict:
    written = {rel: a.astype(dtype) for rel, a in zip(["a.npy", "b.npy", "c.npy"], random_episodes([8, 6, 7]))}
    written["b.npy"][4, 1] = value
    save_episodes(src, written)
    return written


@pytest.mark.parametrize("value, shown", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_value_with_on_nan_fail_names_file_and_index(tmp_path, value, shown):
    src = tmp_path / "src"
    _nan_tree(src, value)

    with pytest.raises(InputError, match=re.escape(f"{src / 'b.npy'}: non-finite value {shown} in feature 'data' "
                                                   "at index [4, 1]; clean the data or pass --on-nan skip|keep")):
        convert_episode_tree(src, tmp_path / "out", episode=EpisodeOptions(on_nan="fail"))


def test_nan_in_a_complex_npz_feature_is_found(tmp_path):
    src = tmp_path / "src"
    bad = np.ones((5, 2), np.complex64)
    bad[3, 0] = complex(1, np.nan)
    save_episodes(src, {"ok.npz": {"z": np.ones((5, 2), np.complex64)}, "bad.npz": {"z": bad}})

    with pytest.raises(InputError, match=re.escape(f"{src / 'bad.npz'}: non-finite value") + r".* in feature 'z' at "
                       r"index \[3, 0\]"):
        convert_episode_tree(src, tmp_path / "out")


@pytest.fixture(scope="module")
def nan_skipped(tmp_path_factory):
    """``_nan_tree`` converted with ``on_nan="skip"`` (and ``on_error="skip"``), read back once: ``(out, episodes)``,
    the episodes by source."""
    root = tmp_path_factory.mktemp("nan_skipped")
    written = _nan_tree(root / "src")
    manifest = convert_episode_tree(root / "src", root / "out", on_error="skip", episode=EpisodeOptions(on_nan="skip"))
    entries = manifest.splits["train"].episodes
    got = read_back(root / "out")
    assert len(got) == len(entries)
    for episode, entry in zip(got, entries):
        assert_same_array(episode["data"], written[entry.source])
    return root / "out", {entry.source: episode for entry, episode in zip(entries, got)}


@pytest.mark.parametrize("on_error", [
    "skip",
    "fail",
])
def test_nan_with_on_nan_skip_leaves_the_episode_out_with_its_reason(tmp_path, on_error, nan_skipped):
    src = tmp_path / "src"
    written = _nan_tree(src)

    manifest = convert_episode_tree(src, tmp_path / "out", on_error=on_error, episode=EpisodeOptions(on_nan="skip"))

    (rejected,) = manifest.rejected
    assert rejected["path"] == "b.npy"
    assert "non-finite value nan in feature 'data' at index [4, 1]" in rejected["reason"]
    entries = manifest.splits["train"].episodes
    assert sorted(e.source for e in entries) == ["a.npy", "c.npy"]
    # It reads back as the source: the shards are those `nan_skipped` read back with readers.episodes.
    golden_out, golden = nan_skipped
    assert shard_files(tmp_path / "out") == shard_files(golden_out)
    for name in shard_files(golden_out):
        assert (tmp_path / "out" / name).read_bytes() == (golden_out / name).read_bytes(), name
    assert entries == load_manifest(str(golden_out)).splits["train"].episodes
    for entry in entries:
        assert_same_array(golden[entry.source]["data"], written[entry.source], entry.source)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_nan_with_on_nan_keep_is_written_and_read_back(tmp_path, dtype):
    src, out = tmp_path / "src", tmp_path / "out"
    written = _nan_tree(src, dtype=dtype)
    written["c.npy"][0, 0] = -np.inf
    save_episodes(src, {"c.npy": written["c.npy"]})

    manifest = convert_episode_tree(src, out, episode=EpisodeOptions(on_nan="keep"))

    assert manifest.rejected == []
    by_source = {e.source: episode for e, episode in zip(manifest.splits["train"].episodes, read_back(out))}
    assert sorted(by_source) == sorted(written)
    for rel, episode in by_source.items():
        assert_same_array(episode["data"], written[rel], rel)
    assert np.isnan(by_source["b.npy"]["data"][4, 1]) and np.isneginf(by_source["c.npy"]["data"][0, 0])


def test_empty_episodes_are_skipped_with_a_reason_even_with_on_error_fail(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = dict(zip(["a.npy", "b.npy"], random_episodes([5, 3])))
    save_episodes(src, written)
    save_episodes(src, {"empty.npy": np.zeros((0, 2), np.float32), "empty.npz": {"data": np.zeros((0, 2), np.float32)}})

    manifest = convert_episode_tree(src, out, on_error="fail")

    assert manifest.rejected == [{"path": "empty.npy", "reason": "empty episode (0 time steps); left out"},
                                 {"path": "empty.npz", "reason": "empty episode (0 time steps); left out"}]
    assert sorted(e.source for e in manifest.splits["train"].episodes) == ["a.npy", "b.npy"]
    assert {e.source: e.id for e in manifest.splits["train"].episodes} == {"a.npy": 0, "b.npy": 1}


def test_no_episodes_at_all_is_a_clear_error(tmp_path):
    empty_only, text_only = tmp_path / "empty_only", tmp_path / "text_only"
    save_episodes(empty_only, {"e.npy": np.zeros((0, 3))})
    text_only.mkdir()
    (text_only / "notes.txt").write_text("no episodes here")

    with pytest.raises(InputError, match=re.escape(str(text_only)) + ": no .npy or .npz episodes found"):
        convert_episode_tree(text_only, tmp_path / "out1")
    with pytest.raises(InputError, match=re.escape(str(empty_only)) + ": no usable .npy/.npz episodes found"):
        convert_episode_tree(empty_only, tmp_path / "out2")
    with pytest.raises(FileNotFoundError, match="nowhere: source folder not found"):
        convert_episode_tree(tmp_path / "nowhere", tmp_path / "out3")


# --- dataset.json -----------------------------------------------------------------------------------------------


def test_manifest_features_statistics_and_lengths(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    rng = np.random.default_rng(3)
    written = {}
    for split, lengths in (("train", [9, 30, 4]), ("val", [12, 2])):
        for i, t in enumerate(lengths):
            written[f"{split}/e{i}.npz"] = {
                "obs": (rng.normal(size=(t, 2, 3)) * [1, 10, 100] + [5, -50, 500]).astype(np.float32),
                "count": rng.integers(0, 1000, t).astype(np.int32),
                "on": rng.integers(0, 2, (t, 2)).astype(bool),
            }
    save_episodes(src, written)

    manifest = convert_episode_tree(src, out, num_shards=2)

    assert load_manifest(str(out)) == manifest
    assert manifest.kind == "episodes"
    data = {k: (v["dtype"], v["shape"]) for k, v in manifest.features.items() if k.startswith("data/")}
    assert data == {"data/obs": ("<f4", [2, 3]), "data/count": ("<i4", []), "data/on": ("|b1", [2])}
    info = readers.info(str(out))
    for split in ("train", "val"):
        entry = manifest.splits[split]
        sources = [written[e.source] for e in entry.episodes]
        assert entry.episode_lengths == [len(s["obs"]) for s in sources] == info.episode_lengths(split)
        assert entry.records == sum(s.records for s in entry.shards) == len(sources)
        for name in ("obs", "count", "on"):
            steps = np.concatenate([s[name] for s in sources]).astype(np.float64)
            steps = steps.reshape(sum(entry.episode_lengths), -1)  # every step of the split, trailing axes flattened
            assert np.allclose(entry.feature_mean[name], steps.mean(0), rtol=1e-5), (split, name)
            assert np.allclose(entry.feature_std[name], steps.std(0), rtol=1e-5), (split, name)
            assert len(entry.feature_mean[name]) == steps.shape[1]


def test_shard_sizes_and_hashes_match_the_files(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    episodes_tree(src)

    manifest = convert_episode_tree(src, out, num_shards=3, episode=EpisodeOptions(max_record_bytes=50))

    shards = manifest.splits["train"].shards
    assert [s.file for s in shards] == shard_files(out) == [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)]
    for shard in shards:
        data = (out / shard.file).read_bytes()
        assert (shard.bytes, shard.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert shard.records == sum(1 for _ in tf.data.TFRecordDataset(str(out / shard.file)))
    assert sorted(os.listdir(out)) == sorted(shard_files(out) + ["dataset.json"])


# --- rerun, resume, verify, workers ---------------------------------------------------------------------------


def test_running_twice_changes_nothing(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    episodes_tree(src)
    options = {"num_shards": 2, "episode": EpisodeOptions(max_record_bytes=64)}
    first = convert_episode_tree(src, out, **options)
    files = files_under(out)
    inodes = {name: (os.stat(out / name).st_ino, os.stat(out / name).st_mtime_ns) for name in files}

    assert convert_episode_tree(src, out, **options) == first
    assert files_under(out) == files
    assert {name: (os.stat(out / name).st_ino, os.stat(out / name).st_mtime_ns) for name in files} == inodes


def _deleted_shard(tmp_path):
    src, out, clean = tmp_path / "src", tmp_path / "out", tmp_path / "clean"
    episodes_tree(src)
    options = {"num_shards": 3, "episode": EpisodeOptions(max_record_bytes=64)}
    manifest = convert_episode_tree(src, out, **options)
    convert_episode_tree(src, clean, **options)
    os.remove(out / manifest.splits["train"].shards[1].file)
    return src, out, clean, options, manifest


def test_deleted_shard_is_rewritten_byte_identically_with_overwrite(tmp_path):
    src, out, clean, options, manifest = _deleted_shard(tmp_path)
    with pytest.raises(VerifyError, match=re.escape(str(out / manifest.splits["train"].shards[1].file)) +
                       ": missing shard"):
        verify(str(out))

    assert convert_episode_tree(src, out, overwrite=True, **options) == manifest

    assert files_under(out) == files_under(clean)
    assert verify(str(out)) == manifest


def test_deleted_shard_is_rewritten_byte_identically_by_a_plain_rerun(tmp_path):
    src, out, clean, options, manifest = _deleted_shard(tmp_path)

    assert convert_episode_tree(src, out, **options) == manifest

    assert files_under(out) == files_under(clean)


def test_verify_passes_then_catches_a_flipped_byte(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    episodes_tree(src)
    manifest = convert_episode_tree(src, out, num_shards=2)
    assert verify(str(out)) == manifest

    path = out / manifest.splits["train"].shards[0].file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(VerifyError) as caught:
        verify(str(out))
    problems = caught.value.problems
    assert problems and all(p.startswith(f"{path}: ") for p in problems), problems
    assert any("corrupted shard (sha256" in p for p in problems), problems


def test_two_workers_write_the_same_bytes_as_in_process(tmp_path):
    src = tmp_path / "src"
    episodes_tree(src)
    rng = np.random.default_rng(9)
    save_episodes(src, {f"npz/e{i}.npz": {"data": rng.normal(size=(t, 3)).astype(np.float32)} for i, t in
                        enumerate([40, 3, 22])})
    save_episodes(src, {"npz/empty.npy": np.zeros((0, 3), np.float32)})
    options = {"num_shards": 3, "seed": 4, "episode": EpisodeOptions(max_record_bytes=100)}

    serial = convert_episode_tree(src, tmp_path / "w0", workers=0, **options)
    parallel = convert_episode_tree(src, tmp_path / "w2", workers=2, **options)

    assert serial == parallel
    assert (tmp_path / "w0" / "dataset.json").read_bytes() == (tmp_path / "w2" / "dataset.json").read_bytes()
    files = files_under(tmp_path / "w0")
    assert len(files) == 4 and files == files_under(tmp_path / "w2")


# --- CLI --------------------------------------------------------------------------------------------------------


def test_cli_episodes_prints_episodes_and_steps_then_info_and_verify(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    written = episodes_tree(src)
    steps = sum(len(a) for a in written.values())

    result = cli("episodes", src, out, "--workers", "0", "--num-shards", "2", "--max-record-size", "100")
    assert result.exit_code == 0, result.output
    assert f"{len(written)} episodes, {steps} steps" in result.stdout
    assert f"{out}: {load_manifest(str(out)).total_records} records" in result.stdout

    info = cli("info", out)
    assert info.exit_code == 0, info.output
    assert "episodes, format 1" in info.stdout
    assert "features: data <f4[3]" in info.stdout
    assert f"train: {len(written)} episodes, {steps} steps, length 1..30" in info.stdout
    assert "data: mean [" in info.stdout

    checked = cli("verify", out)
    assert checked.exit_code == 0 and "OK" in checked.stdout, checked.output


def test_cli_nan_is_one_line_naming_the_file_and_the_option(tmp_path, cli):
    src = tmp_path / "src"
    _nan_tree(src)

    result = cli("episodes", src, tmp_path / "out", "--workers", "0", "--quiet")

    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert result.stderr.startswith(f"error: {src / 'b.npy'}: non-finite value nan in feature 'data' at index [4, 1]")
    assert "--on-nan" in result.stderr


def test_cli_on_nan_skip_leaves_the_episode_out(tmp_path, cli):
    src = tmp_path / "src"
    _nan_tree(src)

    result = cli("episodes", src, tmp_path / "out", "--workers", "0", "--quiet", "--on-nan", "skip")

    assert result.exit_code == 0, result.output
    assert [r["path"] for r in load_manifest(str(tmp_path / "out")).rejected] == ["b.npy"]


@pytest.mark.slow
def test_cli_bench_times_windows(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    save_episodes(src, dict(zip(["a.npy", "b.npy", "c.npy"], random_episodes([20, 40, 5]))))
    convert_episode_tree(src, out)
    windows = (20 - 8) // 2 + 1 + (40 - 8) // 2 + 1  # 7 + 17: c.npy is shorter than the window

    result = cli("bench", out, "--window", "8", "--shift", "2", "--epochs", "1", "--batch-size", "4")

    assert result.exit_code == 0, result.output
    assert f"{windows} windows of 8 (shift 2), batch 4" in result.stdout
    assert re.search(rf"epoch 1: {windows} windows in [\d.]+ s: [\d,]+ windows/s", result.stdout), result.stdout
    assert "epoch 2" not in result.stdout


# =====================================================================================================================
# Hostile episode inputs: .npz files of very many members, dtypes TensorFlow cannot hold, null statistics in `info`.
# =====================================================================================================================


def _header(path, max_features: int = MAX_FEATURES):
    return read_episode_header(SourceFile.of(str(path), os.path.basename(path), "train", -1, os.stat(path)),
                               max_features=max_features)


def _npz_of_members(path, names, content: bytes) -> None:
    """An .npz whose members all hold ``content`` (zipfile warns of the duplicates some tests write on purpose)."""
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore", UserWarning)
        for name in names:
            archive.writestr(name, content)


# --- an .npz of very many members ------------------------------------------------------------------------------


def test_npz_of_20000_members_is_refused_before_any_member_is_read(tmp_path):
    # Members that are not numpy at all: had the scan parsed their headers, the reason would say so instead.
    path = tmp_path / "wide.npz"
    _npz_of_members(path, [f"a{i:05d}.npy" for i in range(20_000)], b"not a numpy header")

    rejection = _header(path)

    assert "the .npz holds 20,000 arrays, over the limit of 1,024 features per episode" in rejection.reason
    assert "readable" not in rejection.reason and not rejection.chosen


def test_feature_limit_counts_arrays_and_is_a_parameter(tmp_path):
    arrays = {f"f{i}": np.zeros((3, 2), np.float32) for i in range(5)}
    np.savez(tmp_path / "five.npz", **arrays)

    assert set(_header(tmp_path / "five.npz", max_features=5).schema) == set(arrays)
    assert "holds 5 arrays, over the limit of 4 features" in _header(tmp_path / "five.npz", max_features=4).reason


def test_npz_at_the_default_limit_is_read(tmp_path):
    np.savez(tmp_path / "wide.npz", **{f"f{i:04d}": np.arange(3, dtype=np.int8) for i in range(MAX_FEATURES)})

    source = _header(tmp_path / "wide.npz")

    assert source.length == 3 and len(source.schema) == MAX_FEATURES


def test_many_duplicate_members_are_named_in_a_bounded_reason(tmp_path):
    path = tmp_path / "dup.npz"
    _npz_of_members(path, [f"d{i % 3000:04d}.npy" for i in range(6000)], npy_bytes(np.zeros(2)))

    reason = _header(path).reason

    assert reason.startswith("ambiguous member names in the .npz (d0000.npy, d0001.npy, ")
    assert "and 2,990 more both name one array" in reason and len(reason) < 400


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_over_wide_npz_through_the_converter(tmp_path, on_error):
    src = tmp_path / "src"
    save_episodes(src, {"good.npy": random_episodes([4])[0]})
    _npz_of_members(src / "wide.npz", [f"a{i}.npy" for i in range(MAX_FEATURES + 1)], npy_bytes(np.zeros(4)))

    if on_error == "fail":
        with pytest.raises(InputError, match=re.escape(f"{src / 'wide.npz'}: the .npz holds 1,025 arrays")):
            convert_episode_tree(src, tmp_path / "out")
        return
    manifest = convert_episode_tree(src, tmp_path / "out", on_error="skip")
    assert [(r["path"], "1,025 arrays" in r["reason"]) for r in manifest.rejected] == [("wide.npz", True)]
    assert [e.source for e in manifest.splits["train"].episodes] == ["good.npy"]


# --- dtypes TensorFlow cannot hold -------------------------------------------------------------------------------

# float128 and complex256 where long double is wider than float64 (x86-64 Linux); 32-bit x86 has float96, '<f12'.
_WIDE = [np.dtype(d) for d in (np.longdouble, np.clongdouble) if np.dtype(d) not in (np.float64, np.complex128)]


@pytest.fixture(scope="module")
def good_alone(tmp_path_factory):
    """The one good episode the rows below put beside a rejected file, converted alone and read back once:
    ``(out, episode)``. A conversion that rejects the other file must write exactly these shards."""
    root = tmp_path_factory.mktemp("good_alone")
    good = random_episodes([5])[0]
    save_episodes(root / "src", {"good.npy": good})
    convert_episode_tree(root / "src", root / "out")
    (episode,) = readers.episodes(str(root / "out"), "train").as_numpy_iterator()
    assert np.array_equal(episode["data"], good)
    return root / "out"


@pytest.mark.skipif(not _WIDE, reason="long double is float64 on this platform: nothing to refuse")
@pytest.mark.parametrize("dtype", _WIDE + [d.newbyteorder(">") for d in _WIDE], ids=lambda d: d.str)
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_dtypes_tensorflow_cannot_hold_are_refused_at_the_scan(tmp_path, dtype, on_error, good_alone):
    src = tmp_path / "src"
    good = random_episodes([5])[0]
    save_episodes(src, {"good.npy": good, "wide.npz": {"obs": good, "reward": np.ones((5, 2), dtype, order="F")}})
    reason = f"feature 'reward' has dtype {dtype.str} ({dtype.name}), which TensorFlow cannot hold"

    if on_error == "fail":
        with pytest.raises(InputError, match=re.escape(f"{src / 'wide.npz'}: {reason}")) as raised:
            convert_episode_tree(src, tmp_path / "out")
        assert "\n" not in str(raised.value)
        return
    manifest = convert_episode_tree(src, tmp_path / "out", on_error="skip")
    assert [r["path"] for r in manifest.rejected] == ["wide.npz"] and reason in manifest.rejected[0]["reason"]
    # What was written reads back: the very shards and episode table of the good episode converted alone, which
    # `good_alone` read back with readers.episodes.
    alone = load_manifest(str(good_alone))
    assert (manifest.features, manifest.splits) == (alone.features, alone.splits)
    assert shard_files(tmp_path / "out") == shard_files(good_alone)
    for name in shard_files(good_alone):
        assert (tmp_path / "out" / name).read_bytes() == (good_alone / name).read_bytes(), name


def test_a_header_naming_float96_is_refused_at_the_scan(tmp_path):
    # '<f12' is long double on 32-bit x86; wherever numpy cannot even build it the header is unreadable instead.
    src = tmp_path / "src"
    save_episodes(src, {"good.npy": random_episodes([5])[0]})
    with open(src / "f12.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f12", "fortran_order": False, "shape": (5,)})
        f.write(bytes(60))

    manifest = convert_episode_tree(src, tmp_path / "out", on_error="skip")

    assert [r["path"] for r in manifest.rejected] == ["f12.npy"]
    assert manifest.features.keys() >= {"data/data"} and manifest.features["data/data"]["dtype"] == "<f4"


def test_every_dtype_the_readers_decode_round_trips_in_any_byte_order_and_layout(tmp_path):
    """Each of the 56 arrays (14 dtypes, C or Fortran order, either byte order) is written as the little-endian C-order
    bytes of its values, checked in the record itself; so the four variants of a dtype are the same record bytes and
    manifest entry, and readers.episodes decodes one of them per dtype (the variant rotating, so every byte order and
    layout is read back for some dtypes): decoding all 56 repeated the same decode four times, at ~0.2 s a feature."""
    rng = np.random.default_rng(0)
    arrays = {}
    variants = [f"{order}_{'big' if endian == '>' else 'little'}" for order in "CF" for endian in "<>"]
    for name in sorted(EPISODE_DTYPES):
        little = np.dtype(name)
        base = rng.integers(0, 100, (6, 2, 3))
        values = {"b": base % 2 == 0, "f": base / 4, "c": base / 4 + 1j * base[::-1]}.get(little.kind, base)
        for order in "CF":
            for endian in "<>":
                arrays[f"{little.name}_{order}_{'big' if endian == '>' else 'little'}"] = np.asarray(
                    values, little.newbyteorder(endian), order=order)
    save_episodes(tmp_path / "src", {"all.npz": arrays})
    expected = {name: np.ascontiguousarray(a, a.dtype.newbyteorder("<")) for name, a in arrays.items()}

    manifest = convert_episode_tree(tmp_path / "src", tmp_path / "out")

    assert not manifest.rejected
    for name, array in expected.items():
        assert manifest.features[f"data/{name}"]["dtype"] == array.dtype.str, name
    (shard,) = manifest.splits["train"].shards
    (record,) = map(tf.train.Example.FromString, read_records(tmp_path / "out" / shard.file))
    written = {key[len("data/"):]: feature.bytes_list.value for key, feature in record.features.feature.items()
               if key.startswith("data/")}
    assert sorted(written) == sorted(arrays)
    for name, array in expected.items():
        assert list(written[name]) == [array.tobytes()], name
    read = [f"{np.dtype(d).name}_{variants[i % 4]}" for i, d in enumerate(sorted(EPISODE_DTYPES))]
    (episode,) = readers.episodes(str(tmp_path / "out"), "train", features=read).as_numpy_iterator()
    assert sorted(episode) == sorted(read)
    for name in read:
        assert episode[name].dtype == expected[name].dtype, name
        assert episode[name].tobytes() == expected[name].tobytes(), name


@pytest.fixture(scope="module")
def one_episode(tmp_path_factory):
    """One float32 episode converted once for this module; read-only (a test that changes it copies it)."""
    root = tmp_path_factory.mktemp("one_episode")
    save_episodes(root / "src", {"a.npy": random_episodes([4])[0]})
    convert_episode_tree(root / "src", root / "out")
    return root / "out"


@pytest.mark.parametrize("dtype", ["<f16", "<c32", "<f12", ">f4", "=f8", "<u16", "<b1", "float32", ["<f4"]])
def test_manifest_naming_a_dtype_no_reader_decodes_is_refused_on_load(tmp_path, dtype, one_episode):
    shutil.copytree(one_episode, tmp_path / "out")
    raw = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert from_json(json.dumps(raw)).features["data/data"]["dtype"] == "<f4"  # the untouched manifest loads
    raw["features"]["data/data"]["dtype"] = dtype
    (tmp_path / "out" / "dataset.json").write_text(json.dumps(raw))

    with pytest.raises(ManifestError, match=re.escape("field features['data/data'].dtype: must be 'string', 'int64'")):
        from_json(json.dumps(raw))
    with pytest.raises(ValueError, match=re.escape("dataset.json")):
        readers.episodes(str(tmp_path / "out"), "train")


# --- `tfshard info` on statistics that are null ------------------------------------------------------------------


def test_info_shows_null_statistics_as_na(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    wide, narrow = random_episodes([5, 6], width=8)
    wide[2, 3] = np.nan  # column 3 of `obs`: mean and std not finite, so null in dataset.json
    narrow_nan = random_episodes([5], width=2)[0]
    narrow_nan[0, 0] = np.inf
    save_episodes(src, {"a.npz": {"obs": wide[:5], "act": narrow_nan},
                        "b.npz": {"obs": narrow[:5], "act": np.ones_like(narrow_nan)}})
    converted = cli("episodes", src, out, "--on-nan", "keep", "--workers", "0", "--quiet")
    assert converted.exit_code == 0, converted.output
    stats = json.loads((out / "dataset.json").read_text())["splits"]["train"]
    assert stats["feature_mean"]["obs"][3] is None and stats["feature_std"]["act"][0] is None

    result = cli("info", out)

    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    lines = {line.split(":")[0].strip(): line for line in result.output.splitlines() if line.startswith("    ")}
    obs_mean = lines["obs"].split("mean [", 1)[1].split("]", 1)[0].split(", ")
    assert obs_mean[3] == "n/a" and "n/a" not in obs_mean[:3] + obs_mean[4:6] and "(8 values)" in lines["obs"]
    assert re.search(r"act: mean \[n/a, [-0-9.e]+\], std \[n/a, [-0-9.e]+\]$", lines["act"]), lines["act"]
