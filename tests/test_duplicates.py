"""Identical images across and within splits: found at conversion, reported, and dropped with --dedupe.

Round trips read the shards back and compare with the source; interrupted --dedupe runs (a bad file with
on_error="fail", and kill -9 of the real CLI) are rerun and compared byte for byte with an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess

import pytest
import tensorflow as tf
from helpers import assert_same_tree, edit_manifest, image_features, make_tree, snapshot
from stop_point import kill_group, start_held
from tfshard.format.dataset import load_manifest
from tfshard.format.duplicates import MAX_LISTED_DUPLICATES, summarize
from tfshard.format.manifest import ManifestError
from tfshard.ingest import ConvertOptions, InputError, OutputExistsError, convert_episodes, convert_images
from tfshard.ingest.beam_runner import BeamRunner
from tfshard.ingest.duplicates import write_order

STATE = ".tfshard-state"


def _copy(src, source: str, target: str) -> None:
    os.makedirs(os.path.dirname(os.path.join(src, target)), exist_ok=True)
    shutil.copyfile(os.path.join(src, source), os.path.join(src, target))


@pytest.fixture
def duplicated(tmp_path):
    """train/val/test trees with: a val image copied into train, a test image copied into val and train, and a
    train image copied inside train (under another class)."""
    src = str(tmp_path / "src")
    make_tree(src, splits=("train", "val", "test"), per_class=3)
    _copy(src, "val/cat/000.jpg", "train/dog/copy-of-val.jpg")
    _copy(src, "test/dog/001.jpg", "val/cat/copy-of-test.jpg")
    _copy(src, "test/dog/001.jpg", "train/cat/copy-of-test.jpg")
    _copy(src, "train/cat/002.jpg", "train/dog/copy-in-train.jpg")
    return src


def _filenames(out, manifest) -> dict[str, list[str]]:
    """The ``image/filename`` of every record, per split, read back with tf.data."""
    found = {}
    for split, info in manifest.splits.items():
        ds = tf.data.TFRecordDataset([os.path.join(out, s.file) for s in info.shards])
        found[split] = sorted(tf.io.parse_single_example(r, image_features())["image/filename"].numpy().decode()
                              for r in ds)
    return found


def _source_files(src) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder, _, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), src).replace(os.sep, "/")
            found.setdefault(rel.split("/")[0], []).append(rel)
    return {split: sorted(paths) for split, paths in found.items()}


GROUPS = [
    ["test/dog/001.jpg", "train/cat/copy-of-test.jpg", "val/cat/copy-of-test.jpg"],
    ["train/cat/002.jpg", "train/dog/copy-in-train.jpg"],
    ["train/dog/copy-of-val.jpg", "val/cat/000.jpg"],
]


def test_duplicates_across_and_within_splits_are_reported_and_all_kept(duplicated, tmp_path):
    out = str(tmp_path / "out")
    manifest = convert_images(duplicated, out, ConvertOptions(num_shards=2), workers=0, progress=False)

    found = manifest.duplicates
    assert {k: v for k, v in found.items() if k != "listed"} == {
        "groups": 3, "across_splits": 2, "within_split": 1, "copies": 7, "dropped": 0}
    assert [g["paths"] for g in found["listed"]] == GROUPS
    with open(os.path.join(duplicated, GROUPS[0][0]), "rb") as f:
        assert found["listed"][0]["sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert _filenames(out, manifest) == _source_files(duplicated)  # reporting alone drops nothing
    assert manifest.rejected == [] and load_manifest(out).duplicates == found


def test_cli_summary_names_the_duplicates(duplicated, tmp_path, cli):
    result = cli("images", duplicated, tmp_path / "out", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert "duplicates: 3 images found more than once (2 across splits, 1 within a split); pass --dedupe" in \
        result.output
    assert "test/dog/001.jpg = train/cat/copy-of-test.jpg = val/cat/copy-of-test.jpg" in result.output

    deduped = cli("images", duplicated, tmp_path / "deduped", "--workers", "0", "--dedupe")
    assert deduped.exit_code == 0, deduped.output
    assert "4 copies dropped (--dedupe, listed in rejected)" in deduped.output
    assert "train/dog/copy-of-val.jpg: duplicate of val/cat/000.jpg (identical bytes)" in deduped.output


def test_dedupe_keeps_test_over_val_over_train_and_one_copy_inside_a_split(duplicated, tmp_path):
    out = str(tmp_path / "out")
    manifest = convert_images(duplicated, out, ConvertOptions(num_shards=2, dedupe=True), workers=0, progress=False)

    read = _filenames(out, manifest)
    # the held-out splits keep their copies; inside train the copy written first stays (record order)
    assert "val/cat/000.jpg" in read["val"] and "train/dog/copy-of-val.jpg" not in read["train"]
    assert "test/dog/001.jpg" in read["test"] and "val/cat/copy-of-test.jpg" not in read["val"]
    assert "train/cat/copy-of-test.jpg" not in read["train"]
    assert len({"train/cat/002.jpg", "train/dog/copy-in-train.jpg"} & set(read["train"])) == 1
    every = {p for paths in _source_files(duplicated).values() for p in paths}
    dropped = {r["path"]: r["reason"] for r in manifest.rejected}
    assert set(dropped) | {p for paths in read.values() for p in paths} == every  # nothing lost: kept or listed
    assert len(dropped) == manifest.duplicates["dropped"] == 4
    assert dropped["train/dog/copy-of-val.jpg"].startswith("duplicate of val/cat/000.jpg (identical bytes)")
    assert dropped["val/cat/copy-of-test.jpg"].startswith("duplicate of test/dog/001.jpg")
    assert [g["paths"] for g in manifest.duplicates["listed"]] == GROUPS  # every copy still named


def test_dedupe_is_a_chosen_skip_never_an_error_with_on_error_fail(duplicated, tmp_path):
    manifest = convert_images(duplicated, str(tmp_path / "out"), ConvertOptions(dedupe=True, on_error="fail"),
                              workers=0, progress=False)
    assert manifest.duplicates["dropped"] == 4


def test_dedupe_changes_the_fingerprint_and_is_left_out_of_the_identity_when_off(duplicated, tmp_path):
    plain = convert_images(duplicated, str(tmp_path / "plain"), ConvertOptions(), workers=0, progress=False)
    deduped = convert_images(duplicated, str(tmp_path / "deduped"), ConvertOptions(dedupe=True), workers=0,
                             progress=False)
    assert plain.fingerprint != deduped.fingerprint
    assert "dedupe" not in ConvertOptions().identity("images")  # older datasets keep their fingerprint
    assert deduped.options["dedupe"] is True
    with pytest.raises(Exception, match="other inputs or options"):
        convert_images(duplicated, str(tmp_path / "plain"), ConvertOptions(dedupe=True), workers=0, progress=False)


def test_a_split_of_copies_only_is_left_out_and_its_empty_shards_dropped(tmp_path):
    src = str(tmp_path / "src")
    make_tree(src, splits=("val",), per_class=2)
    for rel in ("cat/000.jpg", "cat/001.jpg", "dog/000.jpg", "dog/001.jpg"):
        _copy(src, f"val/{rel}", f"train/{rel}")
    manifest = convert_images(src, str(tmp_path / "out"), ConvertOptions(dedupe=True), workers=0, progress=False)
    assert list(manifest.splits) == ["val"] and len(manifest.rejected) == 4
    assert sorted(os.listdir(tmp_path / "out")) == ["dataset.json", "inputs.json", "val-00000-of-00001.tfrecord"]
    assert manifest.duplicates["across_splits"] == 4


def test_dedupe_is_refused_on_beam_and_for_episodes_and_report_only_works_on_beam(duplicated, tmp_path):
    with pytest.raises(InputError, match=r"^dedupe: the Beam runner .*drop runner beam\), or drop dedupe"):
        convert_images(duplicated, str(tmp_path / "beam"), ConvertOptions(dedupe=True), progress=False,
                       runner=BeamRunner("--runner=DirectRunner"))
    assert not os.path.exists(tmp_path / "beam")
    with pytest.raises(InputError, match="^dedupe: .*episodes"):
        convert_episodes(duplicated, str(tmp_path / "episodes"), ConvertOptions(dedupe=True), progress=False)
    local = convert_images(duplicated, str(tmp_path / "local"), ConvertOptions(num_shards=2), workers=0,
                           progress=False)
    beam = convert_images(duplicated, str(tmp_path / "beam"), ConvertOptions(num_shards=2), progress=False,
                          runner=BeamRunner("--runner=DirectRunner"))
    assert beam.duplicates == local.duplicates and beam.duplicates["groups"] == 3


# --- the pure core ---------------------------------------------------------------------------------------------------


def test_write_order_puts_test_then_held_out_splits_then_train():
    assert write_order(["train", "val", "test"]) == ["test", "val", "train"]
    assert write_order(["validation", "train", "valid"]) == ["valid", "validation", "train"]
    assert write_order(["train"]) == ["train"]


def test_summarize_against_a_brute_force_oracle():
    images = {"train": [(f"train/{i}", f"{i % 5:064x}") for i in range(23)],
              "val": [(f"val/{i}", f"{i % 7:064x}") for i in range(9)]}
    found = summarize(images, 3)
    every = [(p, h, s) for s, pairs in images.items() for p, h in pairs]
    groups = {h: [(p, s) for p, hh, s in every if hh == h] for _, h, _ in every}
    groups = {h: g for h, g in groups.items() if len(g) > 1}
    assert found["groups"] == len(groups)
    assert found["copies"] == sum(map(len, groups.values()))
    assert found["across_splits"] == sum(len({s for _, s in g}) > 1 for g in groups.values())
    assert found["within_split"] == sum(any([s for _, s in g].count(s) > 1 for _, s in g) for g in groups.values())
    assert [g["sha256"] for g in found["listed"]] == [h for _, h in sorted((sorted(g), h) for h, g in groups.items())]


def test_listed_groups_are_capped_and_counts_cover_all():
    images = {"train": [(f"a/{i}", f"{i:064x}") for i in range(150)] + [(f"b/{i}", f"{i:064x}") for i in range(150)]}
    found = summarize(images, 0)
    assert found["groups"] == 150 and len(found["listed"]) == MAX_LISTED_DUPLICATES


# --- untrusted: a tampered manifest or commit record ----------------------------------------------------------------


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(groups=-1), "duplicates.groups"),
    (lambda d: d.update(across_splits=9), "duplicates.across_splits"),
    (lambda d: d.update(dropped=7), "duplicates.dropped"),
    (lambda d: d["listed"][0].update(sha256="../x"), r"duplicates.listed\[0\].sha256"),
    (lambda d: d["listed"][0].update(paths=[1, 2]), r"duplicates.listed\[0\].paths\[0\]"),
    (lambda d: d["listed"].extend(d["listed"] * 2), "duplicates.listed"),
    (lambda d: d.update(extra=1), "duplicates"),
])
def test_a_tampered_duplicates_field_is_refused_naming_it(duplicated, tmp_path, change, field):
    out = str(tmp_path / "out")
    convert_images(duplicated, out, ConvertOptions(), workers=0, progress=False)
    edit_manifest(out, lambda raw: change(raw["duplicates"]))
    with pytest.raises(ManifestError, match=rf"dataset.json: field {field}"):
        load_manifest(out)


# --- interrupted --dedupe runs resume to the bytes of an uninterrupted run --------------------------------------------

RESUME = ConvertOptions(num_shards=2, seed=None, dedupe=True)


@pytest.fixture
def interrupted_dedupe(duplicated, tmp_path):
    """(src, out, clean files): a --dedupe run stopped by a bad file in train's last shard, after val and test."""
    with open(os.path.join(duplicated, "train", "dog", "zzz.jpg"), "wb") as f:  # sorts last in train
        f.write(b"not a jpeg")
    _copy(duplicated, "val/dog/002.jpg", "train/dog/zz-copy-of-val.jpg")  # in the shard written on resume
    out = str(tmp_path / "out")
    with pytest.raises(InputError, match="zzz.jpg"):
        convert_images(duplicated, out, ConvertOptions(num_shards=2, seed=None, dedupe=True, on_error="fail"),
                       workers=0, progress=False)
    committed = sorted(n for n in os.listdir(out) if n.endswith(".tfrecord"))
    assert committed == ["test-00000-of-00002.tfrecord", "test-00001-of-00002.tfrecord",
                         "train-00000-of-00002.tfrecord", "val-00000-of-00002.tfrecord",
                         "val-00001-of-00002.tfrecord"]
    clean = str(tmp_path / "clean")
    manifest = convert_images(duplicated, clean, RESUME, workers=0, progress=False)
    assert "train/dog/zz-copy-of-val.jpg" in {r["path"] for r in manifest.rejected}
    return duplicated, out, snapshot(clean)


@pytest.mark.parametrize("tamper", [None, "val-00001-of-00002.tfrecord", "train-00000-of-00002.tfrecord"])
def test_interrupted_dedupe_resumes_byte_identical(interrupted_dedupe, tamper):
    src, out, clean = interrupted_dedupe
    if tamper is not None:  # a changed committed shard is refused, never removed; once the user removes it, it is
        with open(os.path.join(out, tamper), "r+b") as f:  # written again, after later shards were committed
            f.seek(20)
            f.write(b"\xff")
        with pytest.raises(OutputExistsError, match=rf"{re.escape(tamper)}: does not match its commit record"):
            convert_images(src, out, RESUME, workers=0, progress=False)
        os.remove(os.path.join(out, tamper))
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert_same_tree(snapshot(out), clean)


def test_a_commit_record_with_tampered_hashes_rewrites_its_shard(interrupted_dedupe, caplog):
    src, out, clean = interrupted_dedupe
    record = os.path.join(out, STATE, "val-00000-of-00002.tfrecord.json")
    with open(record) as f:
        raw = json.load(f)
    raw["stats"]["hashes"][0][1] = "not a hash"
    with open(record, "w") as f:
        json.dump(raw, f)
    convert_images(src, out, RESUME, workers=0, progress=False)
    assert "not a [path, sha256] pair" in caplog.text
    assert_same_tree(snapshot(out), clean)


@pytest.mark.slow
def test_kill_9_during_dedupe_then_rerun_is_byte_identical(tmp_path, cli):
    """The real command, held once val's shards and one of train's are committed (tests/stop_point.py) and killed
    there with its decode worker: the rerun (in-process) must rebuild the kept hashes."""
    src = str(tmp_path / "src")
    make_tree(src, classes=[f"c{i}" for i in range(4)], per_class=12, splits=("train", "val"), size=(16, 16))
    for i in range(0, 12, 3):
        _copy(src, f"val/c1/{i:03d}.jpg", f"train/c2/dup-{i:03d}.jpg")
    args = ["images", src, "OUT", "--num-shards", "4", "--dedupe", "--quiet", "--workers", "1"]
    clean = str(tmp_path / "clean")
    done = cli(*[clean if a == "OUT" else a for a in args])
    assert done.exit_code == 0, done.output
    out = str(tmp_path / "out")
    proc = start_held([out if a == "OUT" else a for a in args], "write_shard#6", str(tmp_path / "held"),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    assert len([n for n in os.listdir(out) if n.endswith(".tfrecord")]) == 5
    assert not os.path.exists(os.path.join(out, "dataset.json"))
    rerun = cli(*[out if a == "OUT" else a for a in args])
    assert rerun.exit_code == 0, rerun.output
    assert_same_tree(snapshot(out), snapshot(clean))
    assert load_manifest(out).duplicates["dropped"] == 4
