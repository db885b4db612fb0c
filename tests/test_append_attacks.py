"""Hostile inputs to ``--append``: a tampered inputs.json, appends record or state folder, planted shard names,
and the cases that must hold (a new split only, --dedupe within a split, verify on an appended dataset)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import convert_image_tree, make_tree, write_jpeg
from tfshard.format.dataset import load_manifest
from tfshard.format.inputs import load_inputs
from tfshard.format.manifest import ManifestError
from tfshard.ingest import ConvertOptions, InputError, OutputExistsError, convert_images
from tfshard.tools.verify import verify

INPUTS = "inputs.json"
STATE = ".tfshard-state"


def _append(src, out, **options):
    options.setdefault("on_error", "skip")
    options.setdefault("num_shards", 2)
    return convert_images(str(src), str(out), ConvertOptions(**options), workers=0, progress=False, append=True)


@pytest.fixture
def grown(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=3)
    convert_image_tree(src, out, num_shards=2)
    for i in range(2):
        write_jpeg(src / "cat" / f"new-{i}.jpg", 200 + i)
    return src, out


def _edit_json(path, change):
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("bad", ["../cat/000.jpg", "/etc/passwd", "cat/../cat/000.jpg", "cat//000.jpg", "./cat/0.jpg"])
def test_an_inputs_file_path_outside_src_is_refused(grown, bad):
    src, out = grown
    _edit_json(out / INPUTS, lambda raw: raw["inputs"][0].update(path=bad))
    with pytest.raises(ManifestError, match=r"inputs\[0\]\.path: must be a relative path inside SRC") as caught:
        _append(src, out)
    assert "\n" not in str(caught.value) and INPUTS in str(caught.value)
    assert not any("g0001" in n for n in os.listdir(out))


def test_appends_past_the_last_generation_are_refused_naming_out_and_the_fix(grown):
    src, out = grown
    _edit_json(out / "dataset.json", lambda raw: raw.update(appends=[{
        "generation": 9999, "records_added": 0, "new_classes": [], "changed": 0, "deleted": 0,
        "changed_paths": [], "deleted_paths": []}]))
    with pytest.raises(InputError, match=r"out: --append: the dataset already has generation 9999.*--overwrite"):
        _append(src, out)
    assert not (out / STATE).exists()


def test_an_append_killed_while_removing_its_state_folder_finishes_on_rerun(grown):
    src, out = grown
    _append(src, out)
    after = load_manifest(str(out))
    (out / STATE).mkdir()  # the staged inputs file already removed, append.json not yet
    (out / STATE / "append.json").write_text(json.dumps({"base": "a" * 64, "target": after.fingerprint}))
    manifest = _append(src, out)
    assert manifest.fingerprint == after.fingerprint and not (out / STATE).exists()
    assert load_inputs(str(out), manifest) is not None


def test_a_finished_append_record_with_no_inputs_file_anywhere_is_one_line_with_the_fix(grown):
    src, out = grown
    _append(src, out)
    (out / INPUTS).unlink()
    (out / STATE).mkdir()
    target = load_manifest(str(out)).fingerprint
    (out / STATE / "append.json").write_text(json.dumps({"base": "a" * 64, "target": target}))
    with pytest.raises(OutputExistsError, match=r"inputs.json is in neither .*--overwrite") as caught:
        _append(src, out)
    assert "\n" not in str(caught.value)


# --- guards: cases that held ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, problem", [
    (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    (lambda p: p.write_text("{garbage"), "not valid JSON"),
    (lambda p: p.write_text(json.dumps({"base": "a" * 64, "target": "b" * 64})), "an append to another dataset"),
    (lambda p: os.symlink(p.parent.parent.parent / "elsewhere.json", p), "a symlink"),
])
def test_a_tampered_append_record_is_refused_in_one_line(grown, make, problem):
    src, out = grown
    (out.parent / "elsewhere.json").write_text("{}")
    (out / STATE).mkdir()
    make(out / STATE / "append.json")
    with pytest.raises(Exception, match=problem) as caught:
        _append(src, out)
    assert "\n" not in str(caught.value)
    assert (out.parent / "elsewhere.json").read_text() == "{}"


def test_a_planted_file_at_the_next_generations_name_is_never_replaced(grown):
    src, out = grown
    (out / "train-g0001-00000-of-00002.tfrecord").write_text("mine")
    with pytest.raises(Exception, match=r"tfshard did not write .*train-g0001-00000-of-00002"):
        _append(src, out)
    assert (out / "train-g0001-00000-of-00002.tfrecord").read_text() == "mine"
    assert load_manifest(str(out)).appends == []


def test_an_inputs_file_symlink_is_not_written_through(grown, tmp_path):
    src, out = grown
    shutil.move(out / INPUTS, tmp_path / "real.json")
    before = (tmp_path / "real.json").read_text()
    os.symlink(tmp_path / "real.json", out / INPUTS)
    _append(src, out)
    assert (tmp_path / "real.json").read_text() == before
    verify(str(out))


def test_an_append_of_only_a_new_split_and_dedupe_within_a_split(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src / "train", per_class=3)
    convert_image_tree(src, out, num_shards=1, dedupe=True)
    make_tree(src / "val", per_class=2, seed=50)
    shutil.copyfile(src / "train" / "cat" / "000.jpg", src / "train" / "cat" / "copy.jpg")
    manifest = _append(src, out, num_shards=1, dedupe=True)
    assert {k: v.records for k, v in manifest.splits.items()} == {"train": 6, "val": 4}
    assert [s.file for s in manifest.splits["val"].shards] == ["val-g0001-00000-of-00001.tfrecord"]
    states = {r.path: r.state for r in load_inputs(str(out), manifest).inputs}
    assert states["train/cat/copy.jpg"] == "dropped"
    assert manifest.duplicates["within_split"] == 1


def test_every_new_image_rejected_adds_no_shard(grown):
    src, out = grown
    for i in range(2):
        (src / "cat" / f"new-{i}.jpg").write_bytes(b"not a jpeg")
    manifest = _append(src, out)
    assert manifest.total_records == 6 and not any("g0001" in n for n in os.listdir(out))
    assert not (out / STATE).exists()
