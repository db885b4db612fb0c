"""Attacks on images labelled by a file (``--labels``): odd labels files, JSON Lines corners, names that only look
alike, tampered manifests, and what reads the dataset back. A test per bug found (each failed before its fix), then
guards for tricky cases that held."""

from __future__ import annotations

import json
import os
import re
import unicodedata

import numpy as np
import pytest
from helpers import convert_image_tree, flat_jpegs, read_manifest, write_jpeg, write_text
from tfshard import readers
from tfshard.format.errors import InputError
from tfshard.format.manifest import ManifestError
from tfshard.ingest import ImageOptions
from tfshard.ingest import labels as labels_lib
from tfshard.ingest.holdout import Holdout

NAMES = [f"img{i:02d}" for i in range(6)]


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """img00.jpg .. img05.jpg in one folder."""
    root = tmp_path_factory.mktemp("flat")
    flat_jpegs(root, NAMES)
    return root


write = write_text


def convert(src, out, labels_file, kind=None, **options):
    return convert_image_tree(src, out, image=ImageOptions(labels_file=str(labels_file), label_kind=kind),
                              seed=None, **options)


def read_labels(out, split="train") -> np.ndarray:
    ds = readers.images(str(out), split=split, batch_size=64, image_size=8, training=False)
    return np.concatenate([labels.numpy() for _, labels in ds])


def jsonl(path, *rows) -> str:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


def rows_of(path, **kwargs) -> list:
    """Every row of a labels file as read: ``Row``s and ``RowProblem``s in order."""
    with labels_lib.open_rows(str(path), **kwargs) as rows:
        return list(rows)


def decided(path, src, inputs, **kwargs):
    """``labels.decide`` over a labels file: ``(Labels, BadRows)``."""
    with labels_lib.open_rows(str(path)) as rows:
        return labels_lib.decide(rows, str(src), inputs, **kwargs)


# --- bugs found: JSON Lines ---------------------------------------------------------------------------------------


def test_json_lines_first_object_is_row_1_in_order(tmp_path):
    # Was: the first object came back last, as row <last line> (its errors and "first on row N" named that line).
    path = jsonl(tmp_path / "l.jsonl", {"path": "a.jpg", "label": None}, {"path": "b.jpg", "label": "x"},
                 {"path": "c.jpg", "label": "y"})
    rows = rows_of(path, splits=True, columns=True)
    assert [(r.number, r.path) for r in rows if isinstance(r, labels_lib.Row)] == [(2, "b.jpg"), (3, "c.jpg")]
    assert [p.row for p in rows if isinstance(p, labels_lib.RowProblem)] == [1]
    assert "null, true, an object" in rows[0].problem  # not "give every line the first line's keys"
    labels, problems = decided(jsonl(tmp_path / "m.jsonl", {"path": "a.jpg", "label": "x"},
                                     {"path": "b.jpg", "label": "y"}, {"path": "a.jpg", "label": "z"}),
                               tmp_path, ["a.jpg", "b.jpg"])
    assert labels.by_path == {"a.jpg": 0, "b.jpg": 1}
    assert [p.row for p in problems] == [3] and "first on row 1" in problems[0].problem


def test_json_lines_first_line_not_an_object_is_a_file_error(tmp_path):
    # Was: '[1, 2]' became the header and the next object's keys a row labelling an input named 'path'.
    path = write(tmp_path / "l.jsonl", '[1, 2]\n{"path": "a.jpg", "label": "x"}\n')
    with pytest.raises(InputError, match=r"l\.jsonl: line 1 is not a JSON object of the columns"):
        rows_of(path, splits=True, columns=True)


def test_json_lines_lists_of_one_name_or_none_are_multi_label(flat, tmp_path):
    # Was: ["x"] rows made class labels and [] an "empty label" reject.
    path = jsonl(tmp_path / "l.jsonl", *({"path": f"{n}.jpg", "label": [["x"], [], ["y"]][i % 3]}
                                         for i, n in enumerate(NAMES)))
    manifest = convert(flat, tmp_path / "out", path)
    assert manifest.labels == "multi" and manifest.class_names == ["x", "y"] and manifest.rejected == []
    assert read_labels(tmp_path / "out").tolist() == [[1, 0], [0, 0], [0, 1]] * 2
    assert convert(flat, tmp_path / "cls", path, kind="class").labels == "class"  # --label-kind still decides


def test_json_lines_list_of_another_length_says_so(tmp_path):
    # Was: "has 3 columns, the header has 2; quote a field that holds a comma" (a CSV fix, for JSON).
    path = jsonl(tmp_path / "l.jsonl", {"path": "a.jpg", "label": [1.5, 2.0]}, {"path": "b.jpg", "label": [1.0]})
    (problem,) = [r for r in rows_of(path, splits=True, columns=True) if isinstance(r, labels_lib.RowProblem)]
    assert problem.row == 2 and "list of numbers of another length" in problem.problem
    assert "quote" not in problem.problem


# --- bugs found: CSV headers and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("header, twice", [("path,label,label", "label"), ("path,a,a", "a"),
                                           ("path,split,split,label", "split"), ("path,path,label", "path")])
def test_a_column_named_twice_is_refused(flat, tmp_path, header, twice):
    # Was: the first `label` (or `split`) taken and the other silently dropped; `a,a` two value columns named alike.
    path = write(tmp_path / "l.csv", f"{header}\n" + "".join(f"{n}.jpg,1,2{',3' * (header.count(',') - 2)}\n"
                                                             for n in NAMES))
    with pytest.raises(InputError, match=rf"l\.csv: header names the column '{twice}' twice") as caught:
        convert(flat, tmp_path / "out", path)
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


def test_an_unnamed_label_column_is_refused(flat, tmp_path):
    # Was: a value dataset whose label_columns is [''].
    path = write(tmp_path / "l.csv", "path,\n" + "".join(f"{n}.jpg,{i / 2}\n" for i, n in enumerate(NAMES)))
    with pytest.raises(InputError, match=r"l\.csv: header leaves a label column unnamed"):
        convert(flat, tmp_path / "out", path)
    trailing = write(tmp_path / "t.csv", "path,label,\n" + "".join(f"{n}.jpg,c,\n" for n in NAMES))  # spreadsheet
    assert convert(flat, tmp_path / "t", trailing).class_names == ["c"]


def test_integer_looking_names_among_names_keep_their_own_class(flat, tmp_path):
    # Was: '01' (a class of its own among 'cat') read as int 1: labelled class '1', and '01;cat' rejected.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(
        f"{n}.jpg,{v}\n" for n, v in zip(NAMES, ["01", "1", "cat", "01", "1", "cat"])))
    manifest = convert(flat, tmp_path / "out", path)
    assert manifest.class_names == ["01", "1", "cat"]
    assert read_labels(tmp_path / "out").tolist() == [0, 1, 2, 0, 1, 2]
    assert manifest.splits["train"].class_counts == {"01": 2, "1": 2, "cat": 2}
    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(
        f"{n}.jpg,{v}\n" for n, v in zip(NAMES, ["01;cat", "1", "cat", "01", "1;01", ""])))
    manifest = convert(flat, tmp_path / "multi", multi)
    assert manifest.rejected == [] and manifest.class_names == ["01", "1", "cat"]
    assert read_labels(tmp_path / "multi")[[0, 4]].tolist() == [[1, 0, 1], [1, 1, 0]]
    numeric = write(tmp_path / "n.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(NAMES, [
        "01", "1", "+1", "2", "02", "10"])))  # integers only: numeric classes, 01 is 1
    assert convert(flat, tmp_path / "num", numeric).class_names == ["1", "2", "10"]
    assert read_labels(tmp_path / "num").tolist() == [0, 0, 0, 1, 1, 2]


def test_a_stem_two_inputs_share_says_so(tmp_path):
    # Was: "'a' does not exist under SRC" for a row naming a.jpg and a.png alike.
    write_jpeg(tmp_path / "src" / "a.jpg", 0)
    write_jpeg(tmp_path / "src" / "a.png", 1)
    write_jpeg(tmp_path / "src" / "b.jpg", 2)
    path = write(tmp_path / "l.csv", "id,label\na,x\nb,y\n")
    with pytest.raises(InputError, match=r"row 2: 'a' is the stem of 2 inputs \(a\.jpg, a\.png\) \(got 'a,x'\); "
                                         "give the file name with its extension"):
        convert(tmp_path / "src", tmp_path / "out", path, on_error="fail")


def test_a_file_name_is_never_a_stem(tmp_path):
    # Was: a row 'a.jpg' (no such file; .jpg is an input's extension) silently labelled 'a.jpg.png'.
    write_jpeg(tmp_path / "src" / "a.jpg.png", 0)
    labels, problems = decided(write(tmp_path / "l.csv", "path,label\na.jpg,x\na.jpg.png,y\nb.jpg,y\n"),
                               tmp_path / "src", ["a.jpg.png", "b.jpg"])
    assert labels.by_path == {"a.jpg.png": 0, "b.jpg": 0} and labels.class_names == ["y"]
    assert [(p.row, p.problem.split(";")[0]) for p in problems] == [(2, "'a.jpg' does not exist under SRC")]
    assert decided(write(tmp_path / "k.csv", "id,label\na1.b2,x\n"), "src",
                   ["a1.b2.jpg"])[0].by_path == {"a1.b2.jpg": 0}  # a Kaggle id with a dot is still one


@pytest.mark.parametrize("row_form, file_form", [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_path_in_another_unicode_normal_form_matches(tmp_path, row_form, file_form):
    # Was: 'café.jpg' typed on Linux/Windows (NFC) "does not exist" for a file macOS wrote (NFD), and the reverse.
    name = "caf\u00e9"
    write_jpeg(tmp_path / "src" / f"{unicodedata.normalize(file_form, name)}.jpg", 0)
    write_jpeg(tmp_path / "src" / "b.jpg", 1)
    path = write(tmp_path / "l.csv", f"path,label\n{unicodedata.normalize(row_form, name)}.jpg,x\n"
                 f"{unicodedata.normalize(row_form, name)},y\nb,y\n")  # the second row: the same file by its stem
    labels, problems = decided(path, tmp_path / "src", [f"{unicodedata.normalize(file_form, name)}.jpg", "b.jpg"])
    assert labels.by_path == {f"{unicodedata.normalize(file_form, name)}.jpg": 0, "b.jpg": 1}
    assert [p.row for p in problems] == [3] and "again (first on row 2)" in problems[0].problem


# --- bugs found: what a conversion writes -------------------------------------------------------------------------


def test_multi_label_values_of_no_class_are_refused_before_writing(flat, tmp_path):
    # Was: a dataset.json of labels "multi" and no class_names, which its own readers then refused.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{';' if i % 2 else ';;'}\n"
                                                             for i, n in enumerate(NAMES)))
    with pytest.raises(InputError, match=r"l\.csv: its multi-label values name no class") as caught:
        convert(flat, tmp_path / "out", path)
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


def test_when_no_row_labels_an_image_the_error_names_the_labels_file(flat, tmp_path):
    # Was: "no images found (extensions .jpg, ...); check SRC", with six images right there.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,cat\n" for n in NAMES))
    with pytest.raises(InputError, match=rf"no image is labelled by {path} \(got 0 images without a row, 6 bad "
                                         r"rows; first: l\.csv row 2: label 'cat' is not a number"):
        convert(flat, tmp_path / "out", path, kind="value")
    elsewhere = write(tmp_path / "e.csv", "path,label\nother/x.jpg,cat\n")
    with pytest.raises(InputError, match=r"got 6 images without a row, 1 bad rows; first: e\.csv row 2: "
                                         "'other/x.jpg' does not exist under SRC"):
        convert(flat, tmp_path / "out", elsewhere)


def test_multi_hot_batches_have_a_static_class_dimension(flat, tmp_path):
    # Was: TensorSpec(shape=(B, None)): a head's size, or a metric's num_labels, could not be read from the data.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{'a;b' if i % 2 else 'c'}\n"
                                                             for i, n in enumerate(NAMES)))
    convert(flat, tmp_path / "out", path)
    for kwargs in (dict(training=False), dict(seed=0), dict(seed=0, cache="memory")):
        ds = readers.images(str(tmp_path / "out"), batch_size=2, image_size=8, **kwargs)
        assert ds.element_spec[1].shape.as_list()[-1] == 3, kwargs
        assert ds.element_spec[1].shape.as_list() == ([None, 3] if kwargs == dict(training=False) else [2, 3])


# --- bugs found: tampered manifests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valued(flat, tmp_path_factory):
    """A two-column value dataset, converted once, to tamper with copies of."""
    root = tmp_path_factory.mktemp("valued")
    path = write(root / "v.csv", "path,a,b\n" + "".join(f"{n}.jpg,{i / 4},{i}\n" for i, n in enumerate(NAMES)))
    convert(flat, root / "out", path)
    return root / "out"


@pytest.mark.parametrize("change, match", [
    (dict(split_rule={"method": "hash", "seed": 0, "from": "train", "fractions": {"val\n": 0.1}}),
     r"split_rule\.fractions\['val\\n'\]: must be a split name"),
    (dict(split_rule={"method": "hash", "seed": 0, "from": "../x", "fractions": {"val": 0.1}}),
     r"split_rule\.from: must be a split name"),
    (dict(split_rule={"method": "hash", "seed": 0, "from": "train", "fractions": {"val": 0.6, "test": 0.6}}),
     r"split_rule\.fractions: must add up to less than 1"),
    (dict(label_columns=["a", "a"]), r"label_columns\[1\]: names a column a second time"),
])
def test_tampered_label_fields_are_refused_naming_the_field(valued, tmp_path, cli, change, match):
    # Was: each accepted by readers, verify and info ("val\n" printed a broken line in info).
    import shutil

    out = tmp_path / "out"
    shutil.copytree(valued, out)
    manifest = read_manifest(out)
    manifest.update(change)
    (out / "dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=match):
        readers.images(str(out), batch_size=2, image_size=8)
    for command in ("info", "verify"):
        result = cli(command, out)
        assert result.exit_code != 0 and re.search(match, result.output), (command, result.output)


# --- guards: cases that held --------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, kind", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: os.symlink(os.path.dirname(p), p), "a folder"),
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
])
def test_a_labels_file_that_is_no_regular_file_is_one_line(flat, tmp_path, make, kind):
    path = str(tmp_path / "labels.csv")
    make(path)
    with pytest.raises(InputError, match=rf"labels\.csv: labels file is {kind}, not a regular file") as caught:
        convert(flat, tmp_path / "out", path)  # never blocks on the FIFO, never reads /dev/zero forever
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


def test_bom_crlf_and_quoted_commas_round_trip(tmp_path):
    write_jpeg(tmp_path / "src" / "a,b.jpg", 0)
    write_jpeg(tmp_path / "src" / "c.jpg", 1)
    path = tmp_path / "l.csv"
    path.write_bytes('\ufeffpath,label\r\n"a,b.jpg","big, red"\r\n./c.jpg,small\r\n'.encode("utf-8"))
    manifest = convert(tmp_path / "src", tmp_path / "out", path)
    assert manifest.class_names == ["big, red", "small"] and read_labels(tmp_path / "out").tolist() == [0, 1]


def test_value_edge_numbers(flat, tmp_path):
    values = ["-0.0", "1e400", "3.5e38", "3.4028235e38", "NaN", "-1e-3"]
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(NAMES, values)))
    assert convert(flat, tmp_path / "names", path).labels == "class"  # 'NaN' is no decimal number: a name
    manifest = convert(flat, tmp_path / "out", path, kind="value")
    assert manifest.labels == "value"
    assert [r["reason"].split(": ", 1)[1].split(" (")[0].split(";")[0] for r in manifest.rejected] == [
        "label '1e400' is outside float32's range", "label '3.5e38' is outside float32's range",
        "label 'NaN' is not a number"]
    got = read_labels(tmp_path / "out")
    assert got.tolist() == [0.0, np.float32(3.4028235e38), np.float32(-1e-3)] and np.signbit(got[0])


def test_a_split_column_meets_held_out_fractions(flat, tmp_path):
    path = write(tmp_path / "l.csv", "path,split,label\n" + "".join(
        f"{n}.jpg,{'val' if i == 0 else 'holdout' if i == 1 else 'train'},{i % 2}\n" for i, n in enumerate(NAMES)))
    with pytest.raises(InputError, match=r"already has a 'val' split \(got --val-fraction 0.5\)"):
        convert(flat, tmp_path / "out", path, holdout=Holdout(val_fraction=0.5))
    manifest = convert(flat, tmp_path / "t", path, holdout=Holdout(test_fraction=0.5, stratify=True))
    assert {k: v.records for k, v in manifest.splits.items()} == {"val": 1, "holdout": 1, "train": 2, "test": 2}
    assert read_labels(tmp_path / "t", "holdout").tolist() == [1]  # a split of any name is read back
    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(f"{n}.jpg,a;b\n" for n in NAMES))
    with pytest.raises(InputError, match="--stratify keeps each class's share exact"):
        convert(flat, tmp_path / "m", multi, holdout=Holdout(val_fraction=0.5, stratify=True))


def test_label_kind_without_labels_is_one_line(flat, tmp_path, cli):
    result = cli("images", flat, tmp_path / "out", "--label-kind", "multi")
    assert result.exit_code != 0 and "label_kind: only with a labels file" in result.output
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_tfds_of_a_multi_label_class_without_images_and_preview_of_one_value(tmp_path, cli):
    import tensorflow_datasets as tfds

    for i in range(3):
        write_jpeg(tmp_path / "src" / f"{i}.jpg", i)
    (tmp_path / "src" / "bad.jpg").write_bytes(b"not a jpeg")  # its class 'rare' ends with no image
    labels = write(tmp_path / "m.csv", "path,label\n0.jpg,a\n1.jpg,a;b\n2.jpg,\nbad.jpg,rare\n")
    result = cli("images", tmp_path / "src", tmp_path / "out", "--labels", labels, "--tfds", "--workers", "0",
                 "--no-shuffle")
    assert result.exit_code == 0, result.output
    builder = tfds.builder_from_directory(str(tmp_path / "out"))
    assert builder.info.features["image/class/labels"].feature.names == ["a", "b", "rare"]
    got = [label.numpy().tolist() for _, label in builder.as_dataset(split="train", as_supervised=True)]
    assert sorted(got) == [[], [0], [0, 1]]
    write_jpeg(tmp_path / "one" / "a.jpg", 0)
    value = write(tmp_path / "v.csv", "path,label\na.jpg,0.5\n")
    assert cli("images", tmp_path / "one", tmp_path / "vout", "--labels", value, "--workers", "0").exit_code == 0
    sheet = cli("preview", tmp_path / "vout", "-o", tmp_path / "v.png")
    assert sheet.exit_code == 0 and os.path.getsize(tmp_path / "v.png") > 0, sheet.output


@pytest.mark.slow
def test_multi_hot_labels_train_under_a_mirrored_strategy(flat, tmp_path, strategies):
    import tensorflow as tf

    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{'a;b' if i % 2 else 'c'}\n"
                                                             for i, n in enumerate(NAMES)))
    convert(flat, tmp_path / "out", path)
    strategy = strategies[2]

    def dataset(context):
        return readers.images(str(tmp_path / "out"), batch_size=context.get_per_replica_batch_size(4), image_size=8,
                              seed=0, input_context=context, repeat=True)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8, 8, 3)), tf.keras.layers.GlobalAveragePooling2D(),
                                     tf.keras.layers.Dense(3, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy", metrics=[tf.keras.metrics.AUC(multi_label=True, num_labels=3)])
    history = model.fit(strategy.distribute_datasets_from_function(dataset), epochs=1, steps_per_epoch=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
