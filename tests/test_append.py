"""The inputs file (``inputs.json``) every image conversion writes, and ``--append``, which converts only the inputs
not yet in the dataset into new shards of the next generation and leaves every existing shard as it was; and hostile
inputs to ``--append`` (a tampered inputs.json, appends record or state folder, planted shard names)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess

import pytest
from helpers import (
    assert_same_tree,
    convert_image_tree,
    flat_jpegs,
    image_features,
    make_tree,
    read_manifest,
    snapshot,
    write_jpeg,
    write_text,
)
from stop_point import kill_group, start_held
from tfshard import readers
from tfshard.format.dataset import load_manifest
from tfshard.format.inputs import load_inputs
from tfshard.format.manifest import ManifestError, is_output_name
from tfshard.ingest import (
    ConvertOptions,
    ImageOptions,
    InputError,
    OptionError,
    OutputExistsError,
    convert_episodes,
    convert_images,
)
from tfshard.ingest import append as append_lib
from tfshard.ingest.beam_runner import BeamRunner
from tfshard.ingest.holdout import Holdout
from tfshard.tools.verify import verify

INPUTS = "inputs.json"
STATE = ".tfshard-state"


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


# --- --append -------------------------------------------------------------------------------------------------------


def _append(src, out, **options):
    """convert_images(..., append=True) in-process; returns (manifest, RunStatus)."""
    found = []
    options.setdefault("on_error", "skip")
    manifest = convert_images(str(src), str(out), ConvertOptions(**options), workers=0, progress=False,
                              append=True, on_status=found.append)
    return manifest, found[0]


def _records(out, manifest) -> dict[str, list[tuple[str, str, bytes]]]:
    """Per split, the sorted ``(filename, class name, encoded image)`` of every record, read with tf.data."""
    import tensorflow as tf

    found = {}
    for split, info in manifest.splits.items():
        ds = tf.data.TFRecordDataset([os.path.join(str(out), s.file) for s in info.shards])
        rows = [tf.io.parse_single_example(r, image_features()) for r in ds]
        found[split] = sorted((r["image/filename"].numpy().decode(), manifest.class_names[int(r["image/class/label"])],
                               r["image/encoded"].numpy()) for r in rows)
    return found


def _read_back(out) -> list[tuple[str, float]]:
    """``readers.images`` (training=False): the sorted (class name, pixel sum) of every image."""
    ds = readers.images(str(out), batch_size=4, image_size=(16, 16), training=False, drop_remainder=False)
    names = load_manifest(str(out)).class_names
    return sorted((names[int(label)], round(float(image.sum()), 2)) for images, labels in ds
                  for image, label in zip(images.numpy(), labels.numpy()))


def _shards(out) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in os.listdir(out) if ".tfrecord" in n}


@pytest.fixture
def grown(tmp_path):
    """(src, out, old shards): a dataset of cat/dog, then SRC grown by a new class (emu) and two new cats."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=4)
    convert_image_tree(src, out, num_shards=2)
    old = _shards(out)
    make_tree(src, classes=("emu",), per_class=3, seed=100)
    for i in range(2):
        write_jpeg(src / "cat" / f"new-{i}.jpg", 200 + i)
    return src, out, old


def test_append_equals_a_full_conversion_of_the_union_and_keeps_every_old_shard(grown, tmp_path):
    src, out, old = grown
    before = load_manifest(str(out))
    manifest, status = _append(src, out, num_shards=2)
    full = convert_image_tree(src, tmp_path / "full", num_shards=2)

    assert not status.complete and status.append.new_inputs == 5 and status.append.new_classes == ["emu"]
    assert {n: b for n, b in _shards(out).items() if n in old} == old  # byte-identical, same names
    assert [s.file for s in manifest.splits["train"].shards] == [s.file for s in before.splits["train"].shards] + [
        "train-g0001-00000-of-00002.tfrecord", "train-g0001-00001-of-00002.tfrecord"]
    assert manifest.splits["train"].shards[:2] == before.splits["train"].shards  # same sha256
    assert manifest.class_names == ["cat", "dog", "emu"]  # new classes after the old: old labels unchanged
    assert _records(out, manifest) == _records(tmp_path / "full", full)
    assert _read_back(out) == _read_back(tmp_path / "full")
    split, whole = manifest.splits["train"], full.splits["train"]
    assert split.class_counts == whole.class_counts and split.records == whole.records
    assert (split.pixel_mean, split.pixel_std) == (whole.pixel_mean, whole.pixel_std)
    assert load_inputs(str(out), manifest).pixel_sums == load_inputs(str(tmp_path / "full"), full).pixel_sums
    assert manifest.appends == [{"generation": 1, "records_added": 5, "new_classes": ["emu"], "changed": 0,
                                 "deleted": 0, "changed_paths": [], "deleted_paths": []}]
    assert verify(str(out)).splits["train"].records == 13


def test_a_second_append_is_the_next_generation_and_a_rerun_does_nothing(grown):
    src, out, _ = grown
    _append(src, out, num_shards=2)
    write_jpeg(src / "dog" / "late.jpg", 300)
    manifest, _ = _append(src, out, num_shards=2)
    assert [s.file for s in manifest.splits["train"].shards][-1] == "train-g0002-00000-of-00001.tfrecord"
    assert [a["generation"] for a in manifest.appends] == [1, 2]  # one new image: one shard, not two
    files = snapshot(out)
    again, status = _append(src, out, num_shards=2)
    assert status.complete and status.append.new_inputs == 0 and again == manifest
    assert_same_tree(snapshot(out), files)


def test_changed_and_deleted_inputs_are_reported_and_their_records_stay(grown, cli):
    src, out, old = grown
    write_jpeg(src / "cat" / "000.jpg", 999)  # other bytes under an old path
    os.remove(src / "dog" / "001.jpg")
    result = cli("images", src, out, "--num-shards", "2", "--append", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert "changed since they were converted: 1" in result.output and "cat/000.jpg" in result.output
    assert "deleted from SRC: 1" in result.output and "dog/001.jpg" in result.output
    assert "--overwrite" in result.output
    manifest = load_manifest(str(out))
    assert manifest.appends[0]["changed_paths"] == ["cat/000.jpg"]
    assert manifest.appends[0]["deleted_paths"] == ["dog/001.jpg"]
    names = [name for name, _, _ in _records(out, manifest)["train"]]
    assert names.count("cat/000.jpg") == 1 and "dog/001.jpg" in names  # the old records, not dropped nor doubled
    assert manifest.splits["train"].records == 13
    rerun = cli("images", src, out, "--num-shards", "2", "--append", "--workers", "0")
    assert rerun.exit_code == 0 and "nothing new to append" in rerun.output and "cat/000.jpg" in rerun.output


@pytest.mark.parametrize("kind", ["class", "multi"])
def test_labels_file_append_puts_a_new_class_after_the_old(tmp_path, kind):
    src, out = tmp_path / "src", tmp_path / "out"
    rows = {f"{i}.jpg": ("b" if i % 2 else "a") + (";c" if kind == "multi" and i == 0 else "") for i in range(4)}
    for i in range(4):
        write_jpeg(src / f"{i}.jpg", i)
    labels = tmp_path / "labels.csv"
    labels.write_text("path,label\n" + "".join(f"{p},{v}\n" for p, v in rows.items()))
    image = ImageOptions(labels_file=str(labels))
    convert_image_tree(src, out, image=image)
    old = _shards(out)
    write_jpeg(src / "4.jpg", 4)
    with open(labels, "a") as f:
        f.write("4.jpg,A;b\n" if kind == "multi" else "4.jpg,A\n")  # "A" sorts first: it must still come last
    manifest, status = _append(src, out, image=image)
    assert manifest.class_names == (["a", "b", "c", "A"] if kind == "multi" else ["a", "b", "A"])
    assert status.append.new_classes == ["A"] and {n: b for n, b in _shards(out).items() if n in old} == old
    counts = manifest.splits["train"].class_counts
    assert counts["A"] == 1 and counts["b"] == 2 + (kind == "multi")
    ds = readers.images(str(out), batch_size=5, image_size=(16, 16), training=False, drop_remainder=False)
    labels_read = [lab for _, batch in ds for lab in batch.numpy().tolist()]
    if kind == "multi":  # a multi-hot vector per image over every class; the new image's is b and A
        assert sorted(map(tuple, labels_read)) == [(0, 1, 0, 0), (0, 1, 0, 0), (0, 1, 0, 1), (1, 0, 0, 0),
                                                   (1, 0, 1, 0)]
    else:
        assert sorted(labels_read) == [0, 0, 1, 1, 2]


def _labelled(tmp_path, count: int, text: str):
    """``(src, out, labels file)``: ``count`` images ``0.jpg``, ... converted with the labels file ``text``."""
    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(count):
        write_jpeg(src / f"{i}.jpg", i)
    labels = tmp_path / "labels.csv"
    labels.write_text(text)
    convert_image_tree(src, out, image=ImageOptions(labels_file=str(labels)))
    return src, out, labels


def test_an_append_writing_a_split_of_the_dataset_another_way_is_refused(tmp_path):
    # Was: a labels file of the new rows only, `Val` where the dataset has `val`, added a split `Val` beside it (one
    # labels file writing both is refused).
    src, out, labels = _labelled(tmp_path, 4, "path,split,label\n0.jpg,train,a\n1.jpg,train,b\n2.jpg,val,a\n"
                                 "3.jpg,val,b\n")
    old = _shards(out)
    write_jpeg(src / "4.jpg", 4)
    labels.write_text("path,split,label\n4.jpg,Val,a\n")
    with pytest.raises(InputError, match=r"SRC gives the split 'Val' but the dataset has 'val'; write each split"):
        _append(src, out, image=ImageOptions(labels_file=str(labels)))
    assert _shards(out) == old


def test_an_append_whose_labels_file_has_only_the_new_rows_says_so_not_changed(tmp_path, cli):
    # Was: every old image was "changed since they were converted", and the fix given, --overwrite with that labels
    # file, would have left every old image out of the dataset.
    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(3):
        write_jpeg(src / f"{i}.jpg", i)
    first = tmp_path / "first.csv"
    first.write_text("path,label\n0.jpg,a\n1.jpg,b\n2.jpg,a\n")
    convert_image_tree(src, out, image=ImageOptions(labels_file=str(first)))
    write_jpeg(src / "3.jpg", 3)
    write_jpeg(src / "1.jpg", 99)  # a changed file is still called one
    new = tmp_path / "new.csv"
    new.write_text("path,label\n1.jpg,b\n3.jpg,b\n")
    result = cli("images", src, out, "--labels", new, "--append", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert ("no row in the labels file: 2 images of the dataset, kept as converted: 0.jpg, 2.jpg; pass the whole "
            "labels file (old rows and new)") in result.output
    assert "changed since they were converted: 1, kept as converted (shards are never rewritten): 1.jpg;" in \
        result.output
    manifest = load_manifest(str(out))
    assert manifest.splits["train"].records == 4 and manifest.appends[0]["changed_paths"] == ["0.jpg", "1.jpg", "2.jpg"]


def test_value_labels_append_with_the_same_columns_only(tmp_path):
    src, out, labels = _labelled(tmp_path, 3, "path,x,y\n0.jpg,0.5,1\n1.jpg,2.25,3\n2.jpg,-1,0\n")
    image = ImageOptions(labels_file=str(labels))
    write_jpeg(src / "3.jpg", 3)
    labels.write_text(labels.read_text() + "3.jpg,7.5,8\n")
    manifest, _ = _append(src, out, image=image)
    assert manifest.label_columns == ["x", "y"] and manifest.splits["train"].records == 4
    assert {r.path: r.label for r in load_inputs(str(out), manifest).inputs}["3.jpg"] == [7.5, 8.0]
    write_jpeg(src / "4.jpg", 4)
    other = tmp_path / "other.csv"
    other.write_text("path,x,z\n" + "".join(f"{i}.jpg,{i}.5,1\n" for i in range(5)))
    with pytest.raises(InputError, match=r"columns are \['x', 'z'\] but the dataset's are \['x', 'y'\]"):
        _append(src, out, image=ImageOptions(labels_file=str(other)))
    classes = tmp_path / "classes.csv"
    classes.write_text("path,label\n" + "".join(f"{i}.jpg,cat\n" for i in range(5)))
    with pytest.raises(InputError, match=r"columns are \['label'\] but the dataset's are \['x', 'y'\]"):
        _append(src, out, image=ImageOptions(labels_file=str(classes)))  # read as values, the dataset's kind
    with pytest.raises(OptionError, match=r"label_kind is 'class', but the dataset was converted with 'value'"):
        _append(src, out, image=ImageOptions(labels_file=str(classes), label_kind="class"))


def test_dedupe_drops_a_new_train_copy_and_reports_a_new_val_copy_of_an_old_train_image(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, splits=("train", "val"), per_class=2)
    convert_image_tree(src, out, dedupe=True)
    shutil.copyfile(src / "val" / "cat" / "000.jpg", src / "train" / "dog" / "copy-of-old-val.jpg")
    shutil.copyfile(src / "train" / "cat" / "001.jpg", src / "val" / "dog" / "copy-of-old-train.jpg")
    manifest, _ = _append(src, out, dedupe=True)
    rejected = {r["path"]: r["reason"] for r in manifest.rejected}
    assert rejected["train/dog/copy-of-old-val.jpg"].startswith("duplicate of val/cat/000.jpg")
    assert "val/dog/copy-of-old-train.jpg" not in rejected  # the old train shard cannot lose its copy
    assert manifest.duplicates["across_splits"] == 2 and manifest.duplicates["dropped"] == 1
    assert manifest.splits["val"].records == 5 and manifest.splits["train"].records == 4


def test_hash_held_out_splits_take_new_inputs_by_the_same_rule(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=6)
    convert_image_tree(src, out, holdout=Holdout(val_fraction=0.3, seed=3))
    make_tree(src, classes=("emu",), per_class=6, seed=100)
    manifest, _ = _append(src, out, holdout=Holdout(val_fraction=0.3, seed=3))  # the dataset's own, passed again
    full = convert_image_tree(src, tmp_path / "full", holdout=Holdout(val_fraction=0.3, seed=3))
    assert {s: [r[:2] for r in rows] for s, rows in _records(out, manifest).items()} == {
        s: [r[:2] for r in rows] for s, rows in _records(tmp_path / "full", full).items()}
    with pytest.raises(OptionError, match=r"split_seed is 4, but the dataset was converted with 3; an append "):
        _append(src, out, holdout=Holdout(val_fraction=0.3, seed=4))


def test_an_append_remembers_the_datasets_options_held_out_rule_and_shuffle(tmp_path, cli):
    """Only SRC is passed: the shard counts, image options, held-out rule and write order are the dataset's, so the
    splits are those of a full conversion of the union with the first command's options."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=6)
    first = ["--num-shards", "2", "--quality", "80", "--val-fraction", "0.3", "--split-seed", "3", "--no-shuffle",
             "--index"]
    assert cli("images", src, out, "--workers", "0", *first).exit_code == 0
    before = load_manifest(str(out))
    make_tree(src, classes=("emu",), per_class=6, seed=100)
    result = cli("images", src, out, "--append", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert "appended: 6 new images as generation 1 (new classes: emu)" in result.stdout
    manifest = load_manifest(str(out))
    assert manifest.options == before.options and manifest.split_rule == before.split_rule
    full = convert_images(str(src), str(tmp_path / "full"), num_shards=2, quality=80, val_fraction=0.3, split_seed=3,
                          shuffle=False, index=True, workers=0, progress=False)
    assert {s: [r[:2] for r in rows] for s, rows in _records(out, manifest).items()} == {
        s: [r[:2] for r in rows] for s, rows in _records(tmp_path / "full", full.manifest).items()}
    assert verify(str(out)).splits["train"].records == manifest.splits["train"].records


def test_an_append_takes_the_labels_kind_the_dataset_has(tmp_path):
    """Integer labels read as values by the first conversion (``label_kind="value"``) stay values: the labels file
    of the append, which alone would read as classes, needs no ``label_kind``."""
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, ["a", "b", "c"])
    labels = write_text(tmp_path / "labels.csv", "path,age\na.jpg,3\nb.jpg,7\nc.jpg,3\n")
    convert_images(str(src), str(out), labels=labels, label_kind="value", workers=0, progress=False)
    write_jpeg(src / "d.jpg", 9)
    write_text(tmp_path / "labels.csv", "path,age\na.jpg,3\nb.jpg,7\nc.jpg,3\nd.jpg,12\n")
    result = convert_images(str(src), str(out), labels=labels, append=True, workers=0, progress=False)
    assert result.manifest.labels == "value" and result.manifest.splits["train"].records == 4
    assert {r.path: r.label for r in load_inputs(str(out), result.manifest).inputs}["d.jpg"] == [12.0]
    with pytest.raises(OptionError, match=r"label_kind is 'class', but the dataset was converted with 'value'"):
        convert_images(str(src), str(out), labels=labels, label_kind="class", append=True, workers=0, progress=False)


def test_an_append_given_another_value_than_the_datasets_is_refused_naming_it_both_ways(grown, cli):
    src, out, old = grown
    with pytest.raises(OptionError, match=r"out: num_shards is 3, but the dataset was converted with 2; an append "
                                          r"\(append=True\) takes the dataset's own options: drop num_shards, or"):
        _append(src, out, num_shards=3)
    result = cli("images", src, out, "--append", "--num-shards", "3", "--workers", "0")
    assert result.exit_code == 1
    assert ("out: --num-shards is 3, but the dataset was converted with 2; an append (--append) takes the dataset's "
            "own options: drop --num-shards, or convert into another folder") in result.stderr
    with pytest.raises(OptionError, match=r"shuffle is False, but the dataset was shuffled with seed 0"):
        _append(src, out, shuffle=False)
    assert _shards(out) == old


def test_a_plain_rerun_on_grown_inputs_says_that_append_adds_them(grown, cli):
    src, out, old = grown
    with pytest.raises(OutputExistsError, match=r"SRC has 5 it has not read: pass append=True to add them as new "
                                                r"shards .*, overwrite=True to rebuild it from SRC as it is now"):
        convert_images(str(src), str(out), workers=0, progress=False)
    result = cli("images", src, out, "--workers", "0")
    assert result.exit_code != 0
    assert "SRC has 5 it has not read: pass --append to add them as new shards" in result.stderr
    assert "--overwrite to rebuild it from SRC as it is now" in result.stderr
    with pytest.raises(OutputExistsError, match=r"other inputs or options; pass --overwrite") as raised:
        convert_images(str(src), str(out), num_shards=3, workers=0, progress=False)  # which an append refuses
    assert "append" not in str(raised.value)
    assert _shards(out) == old


def test_a_cached_reader_serves_the_appended_records(grown, tmp_path):
    src, out, _ = grown
    cache = str(tmp_path / "cache")

    def count() -> int:
        ds = readers.images(str(out), batch_size=4, image_size=(16, 16), training=False, drop_remainder=False,
                            cache=cache)
        return sum(int(labels.shape[0]) for _, labels in ds)

    assert count() == count() == 8  # the second read comes from the cache
    _append(src, out, num_shards=2)
    assert count() == 13


@pytest.mark.parametrize("make, problem", [
    (lambda src, out: shutil.rmtree(out), r"no dataset to append to .*convert SRC first \(drop --append\)"),
    (lambda src, out: os.remove(os.path.join(out, INPUTS)), r"no inputs.json .*--overwrite. once, then append"),
    (lambda src, out: (os.remove(os.path.join(out, INPUTS)), os.symlink("/dev/zero", os.path.join(out, INPUTS))),
     r"inputs.json: a character device, not a regular file; .*remove it first; rewrite the dataset .*--overwrite"),
])
def test_append_without_a_dataset_or_its_inputs_file_is_refused_with_the_fix(grown, make, problem):
    src, out, _ = grown
    make(str(src), str(out))
    with pytest.raises(ValueError, match=problem):  # an InputError; a ManifestError for an unreadable inputs.json
        _append(src, out, num_shards=2)


@pytest.mark.parametrize("options, problem", [
    (dict(num_shards=3), r"num_shards is 3, but the dataset was converted with 2"),
    (dict(num_shards=2, image=ImageOptions(quality=80)), r"quality is 80, but the dataset was converted with 95"),
    (dict(compression="gzip"), r"compression is 'gzip', but the dataset was converted with None"),
    (dict(dedupe=True), r"dedupe is True, but the dataset was converted with False"),
])
def test_append_with_other_output_options_is_refused_naming_the_option(grown, options, problem):
    src, out, old = grown
    with pytest.raises(InputError, match=problem):
        _append(src, out, **options)
    assert _shards(out) == old


def test_append_refusals_stratified_episodes_overwrite_tfds(tmp_path, grown):
    src, out, _ = grown
    with pytest.raises(InputError, match="--append with --overwrite"):
        convert_images(str(src), str(out), ConvertOptions(num_shards=2), append=True, overwrite=True, progress=False)
    with pytest.raises(InputError, match="only image datasets can be appended to"):
        convert_episodes(str(src), str(tmp_path / "episodes"), append=True, progress=False)
    stratified = tmp_path / "stratified"
    convert_image_tree(src, stratified, holdout=Holdout(val_fraction=0.3, stratify=True))
    with pytest.raises(InputError, match="stratified .* no append can keep exact"):
        _append(src, stratified, holdout=Holdout(val_fraction=0.3, stratify=True))


# --- an interrupted append resumes to the bytes of an uninterrupted one ----------------------------------------------


def _listed_shards_exist(out) -> bool:
    """dataset.json (when readable) lists only shards that are there, whole."""
    try:
        raw = read_manifest(out)
    except (FileNotFoundError, ValueError):
        return True  # being replaced: the rename is atomic, so this is a read between two tries
    return all(os.path.isfile(os.path.join(str(out), s["file"])) and os.path.getsize(os.path.join(str(out), s["file"]))
               == s["bytes"] for split in raw["splits"].values() for s in split["shards"])


@pytest.fixture
def base_and_clean(tmp_path):
    """(src, out, clean): a dataset of 8 images then SRC grown by 6 (one of them, sorting last, not an image), and
    the snapshot of an uninterrupted append to a copy of the dataset."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, per_class=4)
    convert_image_tree(src, out, num_shards=2, seed=None)
    make_tree(src, classes=("emu",), per_class=5, seed=100)
    (src / "emu" / "zzz.jpg").write_bytes(b"not a jpeg")
    shutil.copytree(out, tmp_path / "clean")
    _append(src, tmp_path / "clean", num_shards=2, seed=None)
    return src, out, snapshot(tmp_path / "clean")


def test_an_append_stopped_by_an_error_resumes_byte_identical(base_and_clean):
    src, out, clean = base_and_clean
    old = read_manifest(out)
    with pytest.raises(InputError, match="zzz.jpg"):
        _append(src, out, num_shards=2, seed=None, on_error="fail")
    assert "train-g0001-00000-of-00002.tfrecord" in os.listdir(out)  # one new shard committed before the error
    assert read_manifest(out) == old and _listed_shards_exist(out)
    _append(src, out, num_shards=2, seed=None)
    assert_same_tree(snapshot(out), clean)


def test_an_append_killed_between_its_manifest_and_its_inputs_file_finishes_on_rerun(base_and_clean, monkeypatch):
    src, out, clean = base_and_clean
    real = append_lib.write_text_atomic

    def die_at_the_inputs_file(path, text):
        if path == os.path.join(str(out), INPUTS):
            raise KeyboardInterrupt  # as a kill would stop it, after dataset.json
        real(path, text)

    monkeypatch.setattr(append_lib, "write_text_atomic", die_at_the_inputs_file)
    with pytest.raises(KeyboardInterrupt):
        _append(src, out, num_shards=2, seed=None)
    monkeypatch.undo()
    assert read_manifest(out)["appends"] and _listed_shards_exist(out)
    manifest, status = _append(src, out, num_shards=2, seed=None)
    assert status.complete and len(manifest.appends) == 1
    assert_same_tree(snapshot(out), clean)


@pytest.mark.slow
def test_kill_9_during_an_append_then_rerun_is_byte_identical(tmp_path, cli):
    """The append runs as the real command, held as it starts the new generation's third shard (tests/stop_point.py)
    and killed there with its decode worker; the other runs are in-process (their process is not the point)."""
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src, classes=("a", "b"), per_class=10, size=(32, 32))
    args = ["images", str(src), "OUT", "--num-shards", "4", "--quiet", "--workers", "1"]

    def run(folder, *extra):
        done = cli(*[str(folder) if a == "OUT" else a for a in args], *extra)
        assert done.exit_code == 0, done.output

    run(out)
    make_tree(src, classes=("c", "d"), per_class=8, size=(32, 32), seed=100)
    shutil.copytree(out, tmp_path / "clean")
    run(tmp_path / "clean", "--append")
    assert _listed_shards_exist(out)
    proc = start_held([str(out) if a == "OUT" else a for a in args] + ["--append"], "write_shard#3",
                      str(tmp_path / "held"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert len([n for n in os.listdir(out) if n.startswith("train-g0001") and n.endswith(".tfrecord")]) == 2
    assert _listed_shards_exist(out)  # dataset.json never lies meanwhile
    kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    assert _listed_shards_exist(out) and not read_manifest(out).get("appends")
    run(out, "--append")
    assert_same_tree(snapshot(out), snapshot(tmp_path / "clean"))
    assert load_manifest(str(out)).appends[0]["records_added"] == 16


def test_an_unfinished_append_of_other_inputs_is_discarded_and_the_new_one_done(base_and_clean):
    src, out, _ = base_and_clean
    with pytest.raises(InputError, match="zzz.jpg"):
        _append(src, out, num_shards=2, seed=None, on_error="fail")
    os.remove(src / "emu" / "zzz.jpg")
    write_jpeg(src / "emu" / "later.jpg", 500)
    manifest, _ = _append(src, out, num_shards=2, seed=None)
    listed = {s.file for split in manifest.splits.values() for s in split.shards}
    assert {n for n in os.listdir(out) if ".tfrecord" in n} == listed and ".tfshard-state" not in os.listdir(out)
    assert manifest.appends[0]["records_added"] == 6 and verify(str(out)).splits["train"].records == 14


def test_overwrite_removes_what_an_interrupted_append_committed_and_the_next_append_works(base_and_clean, cli):
    """The stopped append's shard is in no manifest, but its commit record proves it: --overwrite removes it with the
    dataset, so nothing is left over for the next append to trip on; verify names the leftover with a fix that works."""
    src, out, _ = base_and_clean
    with pytest.raises(InputError, match="zzz.jpg"):
        _append(src, out, num_shards=2, seed=None, on_error="fail")
    leftover = out / "train-g0001-00000-of-00002.tfrecord"
    assert leftover.exists()
    result = cli("verify", out)
    assert result.exit_code == 1 and f"{leftover}: unexpected shard" in result.stderr
    assert "remove the file, or if an --append was interrupted writing it, run that --append again" in result.stderr
    os.remove(src / "emu" / "zzz.jpg")
    convert_images(str(src), str(out), ConvertOptions(num_shards=2, seed=1), workers=0, progress=False,
                   overwrite=True)
    assert not leftover.exists() and not (out / ".tfshard-state").exists()
    for i in range(2):
        write_jpeg(src / "dog" / f"late-{i}.jpg", 600 + i)
    manifest, status = _append(src, out, num_shards=2, seed=1)
    assert status.append.new_inputs == 2 and manifest.appends[0]["records_added"] == 2
    assert verify(str(out)).splits["train"].records == 15


@pytest.mark.parametrize("refusal", ["planted-shard-name", "other-options-beside-an-unfinished-append"])
def test_a_refused_append_leaves_out_exactly_as_it_found_it(base_and_clean, refusal):
    src, out, _ = base_and_clean
    options = dict(num_shards=2, seed=None)
    if refusal == "planted-shard-name":
        (out / "train-g0001-00000-of-00002.tfrecord").write_text("mine")
        problem = r"tfshard did not write .*train-g0001-00000-of-00002.*move those files out of OUT"
    else:
        with pytest.raises(InputError, match="zzz.jpg"):
            _append(src, out, on_error="fail", **options)
        options["num_shards"] = 3
        problem = r"num_shards is 3, but the dataset was converted with 2"
    before = snapshot(out)
    with pytest.raises(InputError, match=problem):
        _append(src, out, **options)
    assert_same_tree(snapshot(out), before)
    assert (out / ".tfshard-state").exists() == (refusal != "planted-shard-name")


def test_an_append_with_tfds_killed_after_its_manifest_leaves_no_metadata_of_part_of_the_dataset(grown, monkeypatch):
    """Killed between dataset.json and the new TFDS metadata: TFDS finds no metadata (the old, which it would read as
    the whole dataset, went before dataset.json was replaced) rather than the old shards only; a rerun writes it."""
    import tensorflow_datasets as tfds
    from tfshard.tools.tfds import write_tfds_metadata

    src, out, _ = grown
    write_tfds_metadata(str(out))
    real = append_lib.write_text_atomic

    def killed_after_the_manifest(path, text):
        if path == os.path.join(str(out), INPUTS):
            raise KeyboardInterrupt
        real(path, text)

    monkeypatch.setattr(append_lib, "write_text_atomic", killed_after_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        convert_images(str(src), str(out), ConvertOptions(num_shards=2), workers=0, progress=False, append=True,
                       tfds=True)
    monkeypatch.undo()
    assert read_manifest(out)["appends"]
    with pytest.raises(Exception):  # noqa: B017 (TFDS raises its own errors for a folder with no metadata)
        tfds.builder_from_directory(str(out))
    convert_images(str(src), str(out), ConvertOptions(num_shards=2), workers=0, progress=False, append=True, tfds=True)
    assert len(list(tfds.builder_from_directory(str(out)).as_dataset(split="train+train_g0001"))) == 13
    verify(str(out))


def test_an_append_killed_while_discarding_an_unfinished_one_finishes_the_discard_on_rerun(base_and_clean,
                                                                                           monkeypatch):
    import tensorflow as tf

    src, out, _ = base_and_clean
    with pytest.raises(InputError, match="zzz.jpg"):
        _append(src, out, num_shards=2, seed=None, on_error="fail")
    os.remove(src / "emu" / "zzz.jpg")
    write_jpeg(src / "emu" / "later.jpg", 500)
    remove = tf.io.gfile.remove

    def killed_after_the_first_removal(path):
        remove(path)
        raise KeyboardInterrupt

    monkeypatch.setattr(tf.io.gfile, "remove", killed_after_the_first_removal)
    with pytest.raises(KeyboardInterrupt):
        _append(src, out, num_shards=2, seed=None)
    monkeypatch.undo()
    assert (out / ".tfshard-state").exists()  # the commit records stay until the discard is done
    manifest, _ = _append(src, out, num_shards=2, seed=None)
    listed = {s.file for split in manifest.splits.values() for s in split.shards}
    assert {n for n in os.listdir(out) if ".tfrecord" in n} == listed and manifest.appends[0]["records_added"] == 6


def test_append_on_the_beam_runner_writes_what_the_local_runner_does(grown, tmp_path):
    src, out, _ = grown
    shutil.copytree(out, tmp_path / "local")
    _append(src, tmp_path / "local", num_shards=2)
    convert_images(str(src), str(out), ConvertOptions(num_shards=2), progress=False, append=True,
                   runner=BeamRunner("--runner=DirectRunner"))
    assert_same_tree(snapshot(out), snapshot(tmp_path / "local"))


def test_append_with_tfds_names_each_generation_a_split_tfds_reads_as_one(grown, cli):
    import tensorflow_datasets as tfds
    from tfshard.format.tfds import tfds_read_splits
    from tfshard.tools.tfds import write_tfds_metadata

    src, out, _ = grown
    write_tfds_metadata(str(out))  # the first conversion's metadata: an append without --tfds would leave it stale
    with pytest.raises(InputError, match=r"holds TFDS metadata .* pass --tfds to rewrite it"):
        _append(src, out, num_shards=2)
    manifest = convert_images(str(src), str(out), ConvertOptions(num_shards=2), workers=0, progress=False,
                              append=True, tfds=True)
    assert tfds_read_splits(manifest) == {"train": "train+train_g0001"}
    builder = tfds.builder_from_directory(str(out))
    assert set(builder.info.splits) == {"train", "train_g0001"}
    names = builder.info.features["image/class/label"].names
    read = [(names[int(label)], int(label)) for _, label in builder.as_dataset(split="train+train_g0001",
                                                                               as_supervised=True)]
    assert len(read) == manifest.splits["train"].records == 13 and names == ["cat", "dog", "emu"]
    assert sorted(read) == sorted((manifest.class_names[label], label) for label in read_labels_of(out))
    assert cli("verify", out).exit_code == 0  # its TFDS metadata checked against the manifest too
    assert "split='train+train_g0001' reads all of train" in cli("tfds", out).output
    assert "append 1: +5 records, new classes emu; 0 changed and 0 deleted inputs kept as converted" in cli(
        "info", out).output


def read_labels_of(out) -> list[int]:
    from tfshard import readers

    ds = readers.images(str(out), batch_size=64, image_size=8, training=False)
    return [int(v) for _, labels in ds for v in labels.numpy()]


def test_append_with_tfds_of_a_class_tfds_cannot_hold_is_refused_before_anything_changes(grown):
    """The new class's name would be read back stripped by TFDS: refused before any new shard is committed, so the
    dataset, its TFDS metadata (still the whole dataset) and OUT are as they were, and no state folder is left."""
    from tfshard.tools.tfds import write_tfds_metadata

    src, out, _ = grown
    write_tfds_metadata(str(out))
    make_tree(src, classes=("yak ",), per_class=2, seed=300)
    before = snapshot(out)
    with pytest.raises(InputError, match=r"--tfds refused before anything was written: TFDS cannot hold class name "
                                         r"'yak\\x20'.*or drop --tfds"):
        convert_images(str(src), str(out), ConvertOptions(num_shards=2), workers=0, progress=False, append=True,
                       tfds=True)
    assert_same_tree(snapshot(out), before)
    verify(str(out))


# --- hostile inputs to --append: a tampered inputs.json, appends record or state folder, planted shard names --------


def _append_manifest(src, out, **options):
    """convert_images(..., append=True) in-process, skipping bad inputs unless told; returns the manifest."""
    options.setdefault("on_error", "skip")
    options.setdefault("num_shards", 2)
    return convert_images(str(src), str(out), ConvertOptions(**options), workers=0, progress=False, append=True)


@pytest.fixture
def grown_cats(tmp_path):
    """(src, out): a dataset of 3 cats and 3 dogs, then SRC grown by two new cats."""
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


def _entry(raw, path):
    return next(e for e in raw["inputs"] if e["path"] == path)


def _doubled_sums(raw):  # twice the pixels, the same mean and std: possible sums, wrong weight in the merge
    raw["pixel_sums"]["train"] = {key: [2 * v for v in value] if isinstance(value, list) else 2 * value
                                  for key, value in raw["pixel_sums"]["train"].items()}


# Edits every field check passes (each value possible, the counts right): only the bytes dataset.json recorded tell.
QUIET_INPUTS_EDITS = {
    "sha256-of-a-new-image": lambda raw, src: _entry(raw, "cat/000.jpg").update(
        sha256=hashlib.sha256((src / "cat" / "new-0.jpg").read_bytes()).hexdigest()),  # --dedupe: new-0 dropped
    "path-renamed": lambda raw, src: _entry(raw, "cat/000.jpg").update(path="cat/zzz.jpg"),  # 000 converted again
    "pixel-sums-doubled": lambda raw, src: _doubled_sums(raw),
    "mtime-moved": lambda raw, src: _entry(raw, "cat/001.jpg").update(mtime_ns=_entry(raw, "cat/001.jpg")["mtime_ns"]
                                                                       + 1),
}


@pytest.mark.parametrize("edit", QUIET_INPUTS_EDITS, ids=QUIET_INPUTS_EDITS.keys())
def test_an_inputs_file_edited_past_its_field_checks_is_refused_and_the_true_one_appends(grown_cats, edit):
    """dataset.json records the sha256 of the inputs.json written with it: an edited one is refused before anything
    changes, naming it (else a new image is dropped as a copy, an old one converted twice, the statistics skewed);
    the file as written appends as ever."""
    src, out = grown_cats
    true = (out / INPUTS).read_bytes()
    _edit_json(out / INPUTS, lambda raw: QUIET_INPUTS_EDITS[edit](raw, src))
    before = snapshot(out)
    with pytest.raises(ManifestError, match=r"inputs\.json: not the inputs file dataset\.json was written with \(got "
                                            r"sha256 [0-9a-f]{12}\.\.\., its inputs_sha256 is [0-9a-f]{12}\.\.\.\).*"
                                            r"--overwrite") as caught:
        _append_manifest(src, out)
    assert "\n" not in str(caught.value)
    assert_same_tree(snapshot(out), before)
    (out / INPUTS).write_bytes(true)
    manifest = _append_manifest(src, out)
    assert manifest.appends[0]["records_added"] == 2 and verify(str(out)).splits["train"].records == 8


@pytest.mark.parametrize("bad", ["../cat/000.jpg", "/etc/passwd", "cat/../cat/000.jpg", "cat//000.jpg", "./cat/0.jpg"])
def test_an_inputs_file_path_outside_src_is_refused(grown_cats, bad):
    src, out = grown_cats
    _edit_json(out / INPUTS, lambda raw: raw["inputs"][0].update(path=bad))
    with pytest.raises(ManifestError, match=r"inputs\[0\]\.path: must be a relative path inside SRC") as caught:
        _append_manifest(src, out)
    assert "\n" not in str(caught.value) and INPUTS in str(caught.value)
    assert not any("g0001" in n for n in os.listdir(out))


def test_appends_past_the_last_generation_are_refused_naming_out_and_the_fix(grown_cats):
    src, out = grown_cats
    _edit_json(out / "dataset.json", lambda raw: raw.update(appends=[{
        "generation": 9999, "records_added": 0, "new_classes": [], "changed": 0, "deleted": 0,
        "changed_paths": [], "deleted_paths": []}]))
    with pytest.raises(InputError, match=r"out: --append: the dataset already has generation 9999.*--overwrite"):
        _append_manifest(src, out)
    assert not (out / STATE).exists()


def test_an_append_killed_while_removing_its_state_folder_finishes_on_rerun(grown_cats):
    src, out = grown_cats
    _append_manifest(src, out)
    after = load_manifest(str(out))
    (out / STATE).mkdir()  # the staged inputs file already removed, append.json not yet
    (out / STATE / "append.json").write_text(json.dumps({"base": "a" * 64, "target": after.fingerprint}))
    manifest = _append_manifest(src, out)
    assert manifest.fingerprint == after.fingerprint and not (out / STATE).exists()
    assert load_inputs(str(out), manifest) is not None


def test_a_finished_append_record_with_no_inputs_file_anywhere_is_one_line_with_the_fix(grown_cats):
    src, out = grown_cats
    _append_manifest(src, out)
    (out / INPUTS).unlink()
    (out / STATE).mkdir()
    target = load_manifest(str(out)).fingerprint
    (out / STATE / "append.json").write_text(json.dumps({"base": "a" * 64, "target": target}))
    with pytest.raises(OutputExistsError, match=r"inputs.json is in neither .*--overwrite") as caught:
        _append_manifest(src, out)
    assert "\n" not in str(caught.value)


# --- guards: cases that held ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, problem", [
    (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    (lambda p: p.write_text("{garbage"), "not valid JSON"),
    (lambda p: p.write_text(json.dumps({"base": "a" * 64, "target": "b" * 64})), "an append to another dataset"),
    (lambda p: os.symlink(p.parent.parent.parent / "elsewhere.json", p), "a symlink"),
])
def test_a_tampered_append_record_is_refused_in_one_line(grown_cats, make, problem):
    src, out = grown_cats
    (out.parent / "elsewhere.json").write_text("{}")
    (out / STATE).mkdir()
    make(out / STATE / "append.json")
    with pytest.raises(Exception, match=problem) as caught:
        _append_manifest(src, out)
    assert "\n" not in str(caught.value)
    assert (out.parent / "elsewhere.json").read_text() == "{}"


def test_a_planted_file_at_the_next_generations_name_is_never_replaced(grown_cats):
    src, out = grown_cats
    (out / "train-g0001-00000-of-00002.tfrecord").write_text("mine")
    with pytest.raises(Exception, match=r"tfshard did not write .*train-g0001-00000-of-00002"):
        _append_manifest(src, out)
    assert (out / "train-g0001-00000-of-00002.tfrecord").read_text() == "mine"
    assert load_manifest(str(out)).appends == []


def test_an_inputs_file_symlink_is_not_written_through(grown_cats, tmp_path):
    src, out = grown_cats
    shutil.move(out / INPUTS, tmp_path / "real.json")
    before = (tmp_path / "real.json").read_text()
    os.symlink(tmp_path / "real.json", out / INPUTS)
    _append_manifest(src, out)
    assert (tmp_path / "real.json").read_text() == before
    verify(str(out))


def test_an_append_of_only_a_new_split_and_dedupe_within_a_split(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src / "train", per_class=3)
    convert_image_tree(src, out, num_shards=1, dedupe=True)
    make_tree(src / "val", per_class=2, seed=50)
    shutil.copyfile(src / "train" / "cat" / "000.jpg", src / "train" / "cat" / "copy.jpg")
    manifest = _append_manifest(src, out, num_shards=1, dedupe=True)
    assert {k: v.records for k, v in manifest.splits.items()} == {"train": 6, "val": 4}
    assert [s.file for s in manifest.splits["val"].shards] == ["val-g0001-00000-of-00001.tfrecord"]
    states = {r.path: r.state for r in load_inputs(str(out), manifest).inputs}
    assert states["train/cat/copy.jpg"] == "dropped"
    assert manifest.duplicates["within_split"] == 1


def test_every_new_image_rejected_adds_no_shard(grown_cats):
    src, out = grown_cats
    for i in range(2):
        (src / "cat" / f"new-{i}.jpg").write_bytes(b"not a jpeg")
    result = convert_images(str(src), str(out), num_shards=2, append=True, workers=0, progress=False)
    assert result.manifest.total_records == 6 and not any("g0001" in n for n in os.listdir(out))
    assert not (out / STATE).exists()
    assert ("  appended: 0 of 2 new images as generation 1; the other 2 were rejected or dropped as copies (see "
            "rejected)") in result.lines()
    assert result.summary().count(" (0 img/s)") == 1  # the rate of what the append wrote, not of the dataset


def _set(path: str, value):
    """An edit of dataset.json's ``options`` at ``path`` ("image.rgb"); ``...`` removes the key."""
    def change(raw):
        *parents, key = path.split(".")
        held = raw["options"]
        for parent in parents:
            held = held[parent]
        if value is ...:
            del held[key]
        else:
            held[key] = value
    return change


# The options an append takes from an edited manifest: each refused naming its field, never converted with ("false"
# is a true rgb to Python, a string seed shuffles another way).
EDITED_OPTIONS = {
    "string-size": (_set("shard_bytes", "big"), r"field options.shard_bytes: must be an integer \(got 'big'\)"),
    "float-size": (_set("shard_bytes", 1.5), r"field options.shard_bytes: must be an integer \(got 1.5\)"),
    "negative-size": (_set("shard_bytes", -5), r"field options.shard_bytes: must be at least 1 \(got -5\)"),
    "string-shards": (_set("num_shards", "2"), r"field options.num_shards: must be an integer or null \(got '2'\)"),
    "bool-min-shards": (_set("min_shards", True), r"field options.min_shards: must be an integer \(got True\)"),
    "string-seed": (_set("seed", "0"), r"field options.seed: must be an integer or null \(got '0'\)"),
    "string-rgb": (_set("image.rgb", "false"), r"field options.image.rgb: must be true or false \(got 'false'\)"),
    "string-index": (_set("index", "yes"), r"field options.index: must be true or false \(got 'yes'\)"),
    "huge-quality": (_set("image.quality", 10**20), r"field options.image.quality: must be in \[1, 100\]"),
    "other-compression": (_set("compression", "zstd"), r"field options.compression: must be 'gzip' or null"),
    "image-not-an-object": (_set("image", "x"), r"field options.image: must be an object \(got 'x'\)"),
    "missing-key": (_set("shard_bytes", ...), r"records no option shard_bytes \(--shard-size\) \(got no such key in "
                    r"its dataset.json: made by another tfshard version, or edited\); append with the tfshard that "
                    r"made it, or reconvert"),
    "other-held-out-split": (lambda raw: raw.__setitem__("split_rule", {"method": "hash", "seed": 0, "from": "train",
                                                                       "fractions": {"holdout": 0.25}}),
                             r"field split_rule: must hold out val or test \(or both\) from train, the splits "),
    "unknown-key": (_set("image.sharpen", 2), r"records an option image.sharpen, which this tfshard does not know "
                    r"\(got 2 in its dataset.json"),
}


@pytest.mark.parametrize("edit", EDITED_OPTIONS, ids=EDITED_OPTIONS.keys())
def test_an_append_refuses_options_an_edited_manifest_records_naming_the_field(grown_cats, edit):
    src, out = grown_cats
    change, problem = EDITED_OPTIONS[edit]
    _edit_json(out / "dataset.json", change)
    before = snapshot(out)
    with pytest.raises(ValueError, match=problem) as raised:  # a ManifestError (the field), or an InputError
        _append_manifest(src, out)
    assert f"{out}" in str(raised.value) and ("--overwrite" in str(raised.value))
    assert_same_tree(snapshot(out), before)
