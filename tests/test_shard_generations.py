"""Shard names with a generation (``train-g0001-00000-of-00002.tfrecord``), what ``--append`` writes: the names,
the manifest's checks of a split's order, renumbering that keeps a generation, and readers and verify on them.

The dataset with a generation here is assembled by hand from two conversions, so the readers and checks are tested
on the names and manifest layout alone; tests/test_append.py makes them with --append itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from helpers import edit_manifest, labels_of, make_tree, read_manifest, write_manifest
from tfshard import readers
from tfshard.format.dataset import load_manifest
from tfshard.format.manifest import ManifestError, is_output_name, is_shard_name
from tfshard.format.names import index_file_name, shard_file_name, shard_generation
from tfshard.ingest import ConvertOptions, convert_images
from tfshard.ingest.images import PixelSums
from tfshard.ingest.plan import plan_split
from tfshard.ingest.renumber import plan_renumbering
from tfshard.tools.verify import verify


@pytest.mark.parametrize("args, name", [
    (("train", 3, 10), "train-00003-of-00010.tfrecord"),
    (("train", 0, 2, None, 1), "train-g0001-00000-of-00002.tfrecord"),
    (("val", 1, 2, "gzip", 12), "val-g0012-00001-of-00002.tfrecord.gz"),
    (("test", 0, 1, None, 9999), "test-g9999-00000-of-00001.tfrecord"),
])
def test_shard_names_and_their_generation(args, name):
    assert shard_file_name(*args) == name
    assert is_shard_name(name) and is_output_name(index_file_name(name))
    assert shard_generation(name) == (args[4] if len(args) > 4 else 0)


@pytest.mark.parametrize("name", ["train-g1-00000-of-00002.tfrecord", "train-g00001-00000-of-00002.tfrecord",
                                  "train-g0001-00000-of-00002.tfrecord/../x", "../train-g0001-00000-of-00001.tfrecord",
                                  "train-x0001-00000-of-00002.tfrecord",
                                  "train-00000-of-00002.tfrecord\n", "train-00000-of-00002.idx\n"])  # "$" took these
def test_malformed_generation_names_are_not_shard_names(name):
    assert not is_shard_name(name) and not is_output_name(name)


def test_generation_out_of_range_is_refused():
    with pytest.raises(ValueError, match="generation: must be in"):
        shard_file_name("train", 0, 1, generation=10_000)


def test_renumbering_keeps_a_shards_generation():
    specs = [s.__class__(**{**s.__dict__, "file_name": shard_file_name("train", s.index, s.num_shards, None, 2)})
             for s in plan_split("train", [1, 1, 1], num_shards=3)]
    renumbering = plan_renumbering(specs, {s.file_name: r for s, r in zip(specs, [1, 0, 1])}, compression=None,
                                   index=False)
    assert [s.file_name for s in renumbering.specs] == ["train-g0002-00000-of-00002.tfrecord",
                                                        "train-g0002-00001-of-00002.tfrecord"]


@pytest.fixture
def two_generations(tmp_path):
    """A dataset of generation 0 (2 shards) plus generation 1 (2 shards) of other images, joined by hand: shards,
    totals, class counts, pixel statistics and inputs.json, as an append joins them."""
    first, second = tmp_path / "first", tmp_path / "second"
    make_tree(first, per_class=4, seed=0)
    for rel in make_tree(second, per_class=3, seed=100):  # other names: one input is never in two records
        os.rename(second / rel, second / rel.replace("/", "/g1-"))
    out, other = str(tmp_path / "out"), str(tmp_path / "other")
    convert_images(str(first), out, ConvertOptions(num_shards=2), workers=0, progress=False)
    convert_images(str(second), other, ConvertOptions(num_shards=2), workers=0, progress=False)
    raw, extra = read_manifest(out), read_manifest(other)
    split, added = raw["splits"]["train"], extra["splits"]["train"]
    for i, shard in enumerate(added["shards"]):
        name = shard_file_name("train", i, 2, None, 1)
        shutil.copyfile(os.path.join(other, shard["file"]), os.path.join(out, name))
        split["shards"].append({**shard, "file": name})
    split["records"] += added["records"]
    split["bytes"] += added["bytes"]
    split["class_counts"] = {k: v + added["class_counts"][k] for k, v in split["class_counts"].items()}
    inputs, extra_inputs = (json.loads(open(os.path.join(o, "inputs.json")).read()) for o in (out, other))
    sums, extra_sums = inputs["pixel_sums"]["train"], extra_inputs["pixel_sums"]["train"]
    sums["count"] += extra_sums["count"]
    for key in ("sums", "squares"):
        sums[key] = [a + b for a, b in zip(sums[key], extra_sums[key])]
    inputs["inputs"] += extra_inputs["inputs"]
    with open(os.path.join(out, "inputs.json"), "w") as f:
        json.dump(inputs, f)
    with open(os.path.join(out, "inputs.json"), "rb") as f:
        raw["inputs_sha256"] = hashlib.sha256(f.read()).hexdigest()  # the inputs file the manifest is written with
    split["pixel_mean"], split["pixel_std"] = PixelSums(sums["count"], tuple(sums["sums"]),
                                                        tuple(sums["squares"])).mean_std()
    write_manifest(out, raw)
    return out, split


def test_readers_and_verify_take_a_split_of_two_generations(two_generations):
    out, split = two_generations
    manifest = load_manifest(out)
    assert [s.file for s in manifest.splits["train"].shards] == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord",
        "train-g0001-00000-of-00002.tfrecord", "train-g0001-00001-of-00002.tfrecord"]
    ds = readers.images(out, batch_size=2, image_size=(16, 16), training=False, drop_remainder=False)
    assert sorted(labels_of(ds)) == [0] * 7 + [1] * 7
    assert verify(out).splits["train"].records == 14  # every record, CRC, count and sha256 against the manifest


@pytest.mark.parametrize("change, problem", [
    (lambda shards: shards.insert(1, shards.pop(2)), r"shards\[2\].file: must come before the shards of generation 1"),
    (lambda shards: shards.pop(2), r"must be shard 0 of 1 of generation 1 .*train-g0001-00000-of-00001"),
    (lambda shards: shards[2].update(file="train-g0000-00000-of-00002.tfrecord"), "must be shard 0 of 3 of split"),
    (lambda shards: shards[3].update(file="val-g0001-00001-of-00002.tfrecord"), "must be shard 1 of 2 of generation 1"),
])
def test_a_split_whose_generations_are_out_of_order_or_gapped_is_refused(two_generations, change, problem):
    out, _ = two_generations
    edit_manifest(out, lambda raw: change(raw["splits"]["train"]["shards"]))
    with pytest.raises(ManifestError, match=problem):
        load_manifest(out, consistency=False)
