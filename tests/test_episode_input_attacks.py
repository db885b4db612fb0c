"""Hostile episode inputs: .npz files of very many members, dtypes TensorFlow cannot hold, null statistics in `info`."""

from __future__ import annotations

import json
import os
import re
import warnings
import zipfile

import numpy as np
import pytest
from helpers import convert_episode_tree, npy_bytes, random_episodes, save_episodes
from tfshard import readers
from tfshard.format.manifest import EPISODE_DTYPES, ManifestError
from tfshard.format.untrusted import from_json
from tfshard.ingest import InputError
from tfshard.ingest.episodes import MAX_FEATURES, read_episode_header
from tfshard.ingest.scan import SourceFile


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


@pytest.mark.skipif(not _WIDE, reason="long double is float64 on this platform: nothing to refuse")
@pytest.mark.parametrize("dtype", _WIDE + [d.newbyteorder(">") for d in _WIDE], ids=lambda d: d.str)
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_dtypes_tensorflow_cannot_hold_are_refused_at_the_scan(tmp_path, dtype, on_error):
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
    (episode,) = readers.episodes(str(tmp_path / "out"), "train").as_numpy_iterator()  # what was written reads back
    assert np.array_equal(episode["data"], good)


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
    rng = np.random.default_rng(0)
    arrays = {}
    for name in sorted(EPISODE_DTYPES):
        little = np.dtype(name)
        base = rng.integers(0, 100, (6, 2, 3))
        values = {"b": base % 2 == 0, "f": base / 4, "c": base / 4 + 1j * base[::-1]}.get(little.kind, base)
        for order in "CF":
            for endian in "<>":
                arrays[f"{little.name}_{order}_{'big' if endian == '>' else 'little'}"] = np.asarray(
                    values, little.newbyteorder(endian), order=order)
    save_episodes(tmp_path / "src", {"all.npz": arrays})

    manifest = convert_episode_tree(tmp_path / "src", tmp_path / "out")

    assert not manifest.rejected
    (episode,) = readers.episodes(str(tmp_path / "out"), "train").as_numpy_iterator()
    assert sorted(episode) == sorted(arrays)
    for name, expected in arrays.items():
        assert episode[name].dtype == expected.dtype.newbyteorder("<"), name
        assert episode[name].tobytes() == np.ascontiguousarray(expected, expected.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("dtype", ["<f16", "<c32", "<f12", ">f4", "=f8", "<u16", "<b1", "float32", ["<f4"]])
def test_manifest_naming_a_dtype_no_reader_decodes_is_refused_on_load(tmp_path, dtype):
    save_episodes(tmp_path / "src", {"a.npy": random_episodes([4])[0]})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
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
