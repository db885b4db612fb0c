"""The inputs file (``inputs.json``) every image conversion writes, and ``--append``, which converts only the inputs
not yet in the dataset into new shards of the next generation and leaves every existing shard as it was."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import convert_image_tree, make_tree, write_jpeg
from tfshard.format.dataset import load_manifest
from tfshard.format.inputs import load_inputs
from tfshard.format.manifest import ManifestError, is_output_name
from tfshard.ingest import ImageOptions

INPUTS = "inputs.json"


def _inputs_raw(out) -> dict:
    with open(os.path.join(str(out), INPUTS)) as f:
        return json.load(f)


def _write_inputs_raw(out, raw) -> None:
    with open(os.path.join(str(out), INPUTS), "w") as f:
        json.dump(raw, f)


# --- the inputs file ------------------------------------------------------------------------------------------------


def test_every_image_conversion_lists_its_inputs_and_exact_pixel_sums(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=3)
    shutil.copyfile(src / "cat" / "000.jpg", src / "dog" / "copy.jpg")
    (src / "dog" / "bad.jpg").write_bytes(b"not a jpeg")
    manifest = convert_image_tree(src, out, num_shards=2, dedupe=True)
    inputs = load_inputs(str(out), manifest)
    states = {r.path: (r.state, r.label, r.sha256 is None) for r in inputs.inputs}
    assert states["dog/bad.jpg"] == ("rejected", "dog", True)
    assert states["dog/copy.jpg"][0] == "dropped" or states["cat/000.jpg"][0] == "dropped"
    assert sum(state == "written" for state, _, _ in states.values()) == manifest.splits["train"].records == 6
    st = os.stat(src / "cat" / "001.jpg")
    record = next(r for r in inputs.inputs if r.path == "cat/001.jpg")
    assert (record.size, record.mtime_ns, record.ctime_ns) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    sums = inputs.pixel_sums["train"]
    mean = [round(s / sums["count"] / 255, 6) for s in sums["sums"]]
    assert mean == manifest.splits["train"].pixel_mean
    assert is_output_name(INPUTS)


def test_overwrite_replaces_the_inputs_file_with_the_new_datasets(tmp_path):
    src, other, out = tmp_path / "src", tmp_path / "other", tmp_path / "out"
    make_tree(src, per_class=2)
    make_tree(other, classes=("emu",), per_class=2, seed=50)
    convert_image_tree(src, out)
    manifest = convert_image_tree(other, out, overwrite=True)
    assert [r.path for r in load_inputs(str(out), manifest).inputs] == ["emu/000.jpg", "emu/001.jpg"]


@pytest.mark.parametrize("change, field", [
    (lambda raw: raw["inputs"][0].update(sha256="abc"), r"field inputs\[0\]\.sha256"),
    (lambda raw: raw["inputs"][1].update(label="zebra"), r"field inputs\[1\]\.label"),
    (lambda raw: raw["inputs"][0].update(size=-1), r"field inputs\[0\]\.size"),
    (lambda raw: raw["inputs"][0].update(path="cat/001.jpg"), r"field inputs\[1\]\.path: must be a path named once"),
    (lambda raw: raw["inputs"].pop(), r"field inputs: must list the 4 written inputs"),
    (lambda raw: raw.update(fingerprint="0" * 64), "field fingerprint"),
    (lambda raw: raw["pixel_sums"]["train"].update(sums=[1, 2]), r"field pixel_sums\['train'\]\.sums"),
    (lambda raw: raw["inputs"][0].update(state="kept"), r"field inputs\[0\]\.state"),
    (lambda raw: raw["inputs"][0].update(extra=1), r"field inputs\[0\]: has unknown keys extra"),
])
def test_a_tampered_inputs_file_is_refused_in_one_line_naming_the_field(tmp_path, change, field):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=2)
    manifest = convert_image_tree(src, out)
    raw = _inputs_raw(out)
    change(raw)
    _write_inputs_raw(out, raw)
    with pytest.raises(ManifestError, match=field) as caught:
        load_inputs(str(out), manifest)
    assert "\n" not in str(caught.value) and INPUTS in str(caught.value)


def test_value_and_multi_labels_are_held_as_floats_and_class_names(tmp_path):
    src = tmp_path / "src"
    for i in range(3):
        write_jpeg(src / f"{i}.jpg", i)
    (tmp_path / "values.csv").write_text("path,x,y\n0.jpg,0.5,1\n1.jpg,2.25,3\n2.jpg,-1,0\n")
    (tmp_path / "multi.csv").write_text("path,label\n0.jpg,cat;dog\n1.jpg,dog\n2.jpg,\n")
    for name, expected in (("values", [2.25, 3.0]), ("multi", ["dog"])):
        out = tmp_path / name
        manifest = convert_image_tree(src, out, image=ImageOptions(labels_file=str(tmp_path / f"{name}.csv")))
        labels = {r.path: r.label for r in load_inputs(str(out), manifest).inputs}
        assert labels["1.jpg"] == expected
    assert load_manifest(str(tmp_path / "multi")).labels == "multi"
