"""Images labelled by a file (``--labels``): class, multi-label and value labels, split columns, Kaggle ids,
through the converter, ``readers.images``, ``model.fit``, ``info``, ``verify``, ``preview`` and TFDS."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import convert_image_tree, flat_jpegs, write_jpeg, write_text
from tfshard import readers
from tfshard.ingest import ImageOptions
from tfshard.ingest.errors import InputError
from tfshard.ingest.holdout import Holdout

NAMES = [f"img{i:02d}" for i in range(12)]


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """A flat folder of 12 JPEGs, img00.jpg .. img11.jpg, and a README the scan ignores."""
    root = tmp_path_factory.mktemp("flat")
    flat_jpegs(root, NAMES)
    (root / "README.txt").write_text("not an image")
    return root


write = write_text


def read_labels(out, split="train") -> np.ndarray:
    """Every label of a split in record order (written unshuffled, so sorted by path), via readers.images."""
    ds = readers.images(str(out), split=split, batch_size=64, image_size=8, training=False)
    return np.concatenate([labels.numpy() for _, labels in ds])


def convert(src, out, labels_file, **options):
    kind = options.pop("label_kind", None)
    return convert_image_tree(src, out, image=ImageOptions(labels_file=str(labels_file), label_kind=kind),
                              seed=None, **options)


# --- each kind, round trip -------------------------------------------------------------------------------------


def test_class_labels_from_kaggle_ids_without_extensions(flat, tmp_path):
    labels = ["dog" if i % 3 else "cat" for i in range(12)]
    csv = write(tmp_path / "train.csv", "id,label\n" + "".join(f"{n},{c}\n" for n, c in zip(NAMES, labels)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.labels == "class" and manifest.class_names == ["cat", "dog"]
    assert manifest.features["image/class/label"]["dtype"] == "int64"
    got = read_labels(tmp_path / "out")
    assert got.dtype == np.int64 and got.tolist() == [["cat", "dog"].index(c) for c in labels]
    assert manifest.ignored["other"] == 1  # README.txt


def test_multi_label_yields_multi_hot_and_an_empty_value_is_no_class(flat, tmp_path):
    values = ["cat;outdoor", "dog", "", "outdoor ; cat", "dog;cat;dog"] + ["dog"] * 7
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(NAMES, values)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.labels == "multi" and manifest.class_names == ["cat", "dog", "outdoor"]
    assert "image/class/label" not in manifest.features and manifest.features["image/class/labels"]["shape"] == [-1]
    got = read_labels(tmp_path / "out")
    assert got.dtype == np.float32 and got.shape == (12, 3)
    assert got[:5].tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 0]]
    assert manifest.splits["train"].class_counts == {"cat": 3, "dog": 9, "outdoor": 2}  # images holding each


def test_value_labels_one_column_and_several_from_json_lines(flat, tmp_path):
    csv = write(tmp_path / "age.csv", "path,age\n" + "".join(f"{n}.jpg,{i * 1.5}\n" for i, n in enumerate(NAMES)))
    manifest = convert(flat, tmp_path / "one", csv)
    assert manifest.labels == "value" and manifest.label_columns == ["age"] and manifest.class_names == []
    got = read_labels(tmp_path / "one")
    assert got.dtype == np.float32 and got.shape == (12,) and got.tolist() == [i * 1.5 for i in range(12)]
    rows = [json.dumps({"path": f"{n}.jpg", "x": i / 3, "y": -i}) for i, n in enumerate(NAMES)]
    jsonl = write(tmp_path / "xy.jsonl", "\n".join(rows) + "\n")
    manifest = convert(flat, tmp_path / "two", jsonl)
    assert manifest.label_columns == ["x", "y"] and manifest.features["image/value"]["shape"] == [2]
    assert readers.info(str(tmp_path / "two")).label_kind == "value"
    assert "value labels (x, y)" in repr(readers.info(str(tmp_path / "two")))
    got = read_labels(tmp_path / "two")
    assert got.shape == (12, 2)
    assert got.tolist() == [[np.float32(i / 3).item(), -i] for i in range(12)]


def test_json_lines_lists_are_multi_label_and_label_kind_forces_a_kind(flat, tmp_path):
    rows = [json.dumps({"label": ["a", "b"] if i % 2 else ["b"], "path": f"{n}.jpg"}) for i, n in enumerate(NAMES)]
    manifest = convert(flat, tmp_path / "multi", write(tmp_path / "m.jsonl", "\n".join(rows)))
    assert manifest.labels == "multi" and read_labels(tmp_path / "multi")[:2].tolist() == [[0, 1], [1, 1]]
    csv = write(tmp_path / "ints.csv", "path,label\n" + "".join(f"{n}.jpg,{i % 4}\n" for i, n in enumerate(NAMES)))
    assert convert(flat, tmp_path / "cls", csv).labels == "class"  # integers: classes, in numeric order
    manifest = convert(flat, tmp_path / "val", csv, label_kind="value")
    assert manifest.labels == "value" and read_labels(tmp_path / "val").tolist() == [i % 4 for i in range(12)]
    manifest = convert(flat, tmp_path / "one", csv, label_kind="multi")  # one class each, multi-hot
    assert manifest.labels == "multi" and read_labels(tmp_path / "one").sum(axis=1).tolist() == [1] * 12


def test_split_column_and_splits_folders_alike(flat, tmp_path):
    csv = write(tmp_path / "s.csv", "path,split,label\n" + "".join(
        f"{n}.jpg,{'val' if i < 3 else 'train'},{i % 2}\n" for i, n in enumerate(NAMES)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert {k: v.records for k, v in manifest.splits.items()} == {"train": 9, "val": 3}
    assert read_labels(tmp_path / "out", "val").tolist() == [0, 1, 0]
    bad = write(tmp_path / "b.csv", "path,split,label\nimg00.jpg,va l,1\n")
    with pytest.raises(InputError, match=r"row 2: split 'va l' is not a split name"):
        convert(flat, tmp_path / "bad", bad, on_error="fail")


# --- in training ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_multi_label_and_regression_train_in_model_fit(flat, tmp_path):
    import tensorflow as tf

    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(
        f"{n}.jpg,{'a;b' if i % 2 else 'c'}\n" for i, n in enumerate(NAMES)))
    value = write(tmp_path / "v.csv", "path,a,b\n" + "".join(f"{n}.jpg,{i / 7},{i}\n" for i, n in enumerate(NAMES)))
    for labels_file, head, loss in ((multi, tf.keras.layers.Dense(3, activation="sigmoid"), "binary_crossentropy"),
                                    (value, tf.keras.layers.Dense(2), "mse")):
        out = tmp_path / ("out-" + os.path.basename(labels_file))
        convert(flat, out, labels_file)
        ds = readers.images(str(out), batch_size=4, image_size=16, seed=0)
        model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.GlobalAveragePooling2D(), head])
        model.compile("adam", loss)
        history = model.fit(ds, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


# --- bad labels files and rows ----------------------------------------------------------------------------------


@pytest.mark.parametrize("content, match", [
    ("path\nimg00.jpg\n", "header has no label column"),
    ("path,label\n../img00.jpg,cat\n", r"row 2: path '../img00.jpg' is not inside SRC"),
    ("path,label\nnothere.jpg,cat\n", r"row 2: 'nothere.jpg' does not exist under SRC"),
    ("path,label\nimg00.jpg,cat\nimg00,dog\n", r"row 3: names 'img00.jpg' again \(first on row 2\)"),
    ("path,label\nimg00.jpg,cat\nimg01.jpg,nan\n", r"row 3: label 'nan' is not finite"),
    ("path,a,b\nimg00.jpg,1,x\n", r"row 2: label 'x' is not a finite float32 number"),
    (b"path,label\nimg00.jpg,caf\xe9\n", "not UTF-8 text"),
    ('{"path": "img00.jpg", "label": "a"}\n{"path": "img01.jpg"}\n', "row 2: has other keys than the first line"),
    ('{"path": "img00.jpg", "label": "a"}\nnot json\n', "line 2 is not JSON"),
])
def test_a_bad_labels_file_or_row_is_one_line_naming_it(flat, tmp_path, content, match):
    path = tmp_path / ("labels.jsonl" if str(content).startswith("{") else "labels.csv")
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=match) as caught:
        convert(flat, tmp_path / "out", path, on_error="fail")
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)
    assert not os.path.exists(tmp_path / "out")


def test_bad_rows_are_recorded_with_row_numbers_under_skip_and_unlabelled_files_counted(flat, tmp_path):
    csv = write(tmp_path / "l.csv", "path,label\nimg00.jpg,cat\nimg01.jpg,\nnope.jpg,dog\nimg02.jpg,dog\n")
    manifest = convert(flat, tmp_path / "out", csv)  # images: skip is the default
    assert manifest.splits["train"].records == 2
    assert [(r["path"], r["reason"].split(":")[0]) for r in manifest.rejected] == [
        ("img01.jpg", "l.csv row 3"), ("nope.jpg,dog", "l.csv row 4")]
    assert manifest.ignored["unlabelled"] == 9 and "img03.jpg" in manifest.ignored_files


def test_a_changed_labelling_is_another_dataset(flat, tmp_path):
    from tfshard.ingest.errors import OutputExistsError

    csv = tmp_path / "l.csv"
    write(csv, "path,label\n" + "".join(f"{n}.jpg,{i % 2}\n" for i, n in enumerate(NAMES)))
    first = convert(flat, tmp_path / "out", csv)
    assert convert(flat, tmp_path / "out", csv) == first  # the same labels: complete, nothing to do
    write(csv, "path,label\n" + "".join(f"{n}.jpg,{(i + 1) % 2}\n" for i, n in enumerate(NAMES)))
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        convert(flat, tmp_path / "out", csv)


def test_a_million_rows_stream_into_a_dict_and_no_more_memory(tmp_path):
    import subprocess
    import sys

    rows = 1_000_000
    csv = tmp_path / "big.csv"
    with open(csv, "w") as f:
        f.write("path,label\n")
        f.writelines(f"d{i % 100}/{i}.jpg,c{i % 10}\n" for i in range(rows))
    # A fresh process (no TensorFlow): its peak RSS grows by what reading the file holds, and nothing else.
    child = (
        "import resource, sys\n"
        "from tfshard.ingest import labels\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "read = labels.read_rows(sys.argv[1], splits=True, columns=True)\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
        "print(len(read.values), read.values['d7/507.jpg'], grown)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(csv)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    words = done.stdout.split()
    assert int(words[0]) == rows and "(509, 'c7')" in done.stdout
    assert int(words[-1]) < 400 * rows  # the {path: (row, label)} dict (~250 bytes a row measured), not the text again


@pytest.mark.slow
def test_a_row_per_image_of_a_hundred_thousand_image_tree(tmp_path):
    from tfshard.ingest import ConvertOptions
    from tfshard.ingest.jobs import ImageJob

    src = tmp_path / "src"
    originals = [tmp_path / f"{k}.jpg" for k in range(4)]
    for k, original in enumerate(originals):
        write_jpeg(original, k)
    paths = [f"c{i % 50}/{i}.jpg" for i in range(100_000)]
    for name in {p.split("/")[0] for p in paths}:
        (src / name).mkdir(parents=True)
    for i, path in enumerate(paths):  # hard links: 100,000 images on disk (a file takes at most 65,000 links)
        os.link(originals[i % 4], src / path)
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{p},{p.split('/')[0]}\n" for p in paths))
    job = ImageJob(str(src), ConvertOptions(image=ImageOptions(labels_file=csv), on_error="fail"))  # scan + match
    assert len(job.items["train"]) == 100_000 and len(job.class_names) == 50 and job.rejected == []
    assert job.items["train"][0].label == job.class_names.index(job.items["train"][0].relpath.split("/")[0])


def test_hash_splits_do_not_move_when_the_tree_grows(flat, tmp_path):
    src = tmp_path / "src"
    for i in range(30):
        write_jpeg(src / f"a{i:02d}.jpg", i)
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"a{i:02d}.jpg,{i % 3}\n" for i in range(60)))

    def splits() -> dict[str, str]:
        manifest = convert(src, tmp_path / "out", csv, holdout=Holdout(val_fraction=0.3), overwrite=True,
                           on_error="skip")
        return {name: split for split in manifest.splits for name in _filenames(tmp_path / "out", split)}

    before = splits()
    for i in range(30, 60):
        write_jpeg(src / f"a{i:02d}.jpg", i)
    (src / "a03.jpg").unlink()
    after = splits()
    assert len(after) == 59 and all(after[name] == split for name, split in before.items() if name in after)
    assert set(after.values()) == {"train", "val"}


def _filenames(out, split) -> list[str]:
    import tensorflow as tf
    from tfshard.readers import info

    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(r, spec)["image/filename"].numpy().decode()
            for r in tf.data.TFRecordDataset(info(str(out)).shard_paths(split))]


# --- what reads a finished dataset --------------------------------------------------------------------------------


def test_info_verify_preview_and_tfds_follow_the_kind(flat, tmp_path, cli):
    import tensorflow_datasets as tfds

    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(
        f"{n}.jpg,{'a;b' if i % 2 else 'b'}\n" for i, n in enumerate(NAMES)))
    value = write(tmp_path / "v.csv", "path,a,b\n" + "".join(f"{n}.jpg,{i / 4},{i}\n" for i, n in enumerate(NAMES)))
    for labels_file, kind, label_of_first in ((multi, "multi-label, 2 classes (a, b)", [1]),
                                              (value, "value (float32 [2]: a, b)", [0.0, 0.0])):
        out = tmp_path / ("out-" + os.path.basename(labels_file))
        result = cli("images", flat, out, "--labels", labels_file, "--no-shuffle", "--workers", "0", "--tfds")
        assert result.exit_code == 0, result.output
        assert f"labels: 12 images labelled ({kind})" in result.output
        assert kind in cli("info", out).output
        assert cli("verify", out).exit_code == 0
        sheet = cli("preview", out, "-o", tmp_path / f"{os.path.basename(labels_file)}.png", "-n", "2")
        assert sheet.exit_code == 0, sheet.output
        builder = tfds.builder_from_directory(str(out))
        _, label = next(iter(builder.as_dataset(split="train", as_supervised=True)))
        assert label.numpy().tolist() == label_of_first


def test_a_tampered_multi_label_record_fails_verify(flat, tmp_path, cli):
    import tensorflow as tf
    from helpers import read_records, shard_files, tfrecord_bytes

    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(
        f"{n}.jpg,{'a;b' if i % 2 else 'b'}\n" for i, n in enumerate(NAMES)))
    out = tmp_path / "out"
    convert(flat, out, multi)
    shard = out / shard_files(out)[0]
    records = read_records(str(shard))
    example = tf.train.Example.FromString(records[0])
    example.features.feature["image/class/labels"].int64_list.value[:] = [5]  # no class 5
    records[0] = example.SerializeToString()
    shard.write_bytes(tfrecord_bytes(records))
    result = cli("verify", out)
    assert result.exit_code != 0 and "image/class/labels" in result.output + str(result.exception)
