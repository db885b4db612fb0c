"""Images labelled by a file (``--labels``): class, multi-label and value labels, split columns, Kaggle ids,
through the converter, ``readers.images``, ``model.fit``, ``info``, ``verify``, ``preview`` and TFDS; the last section
holds the bugs hostile labels files found, one test each."""

from __future__ import annotations

import json
import os
import re
import unicodedata

import numpy as np
import pytest
from helpers import convert_image_tree, flat_jpegs, read_manifest, write_jpeg, write_text
from tfshard import readers
from tfshard.format.dataset import load_manifest
from tfshard.format.errors import InputError
from tfshard.format.manifest import ManifestError
from tfshard.ingest import ConvertOptions, ImageOptions, convert_images
from tfshard.ingest import labels as labels_lib
from tfshard.ingest.holdout import Holdout
from tfshard.tools.report import summary_lines

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
    ("path,label\nsub\\img00.jpg,cat\n", r"row 2: path 'sub\\\\img00.jpg' holds \\ separators \(a Windows path\?\)"),
    ("path,label\nimg00.jpg,cat\nimg00,dog\n", r"row 3: names 'img00.jpg' again \(first on row 2\)"),
    ("path,label\nimg00.jpg,1.5\nimg01.jpg,1e400\n", r"row 3: label '1e400' is outside float32's range"),
    ("path,a,b\nimg00.jpg,1,x\n", r"row 2: label 'x' is not a finite float32 number"),
    (b"path,label\nimg00.jpg,caf\xe9\n", "not UTF-8 text"),
    ("path,label\nimg00.jpg ,a\n", r"row 2: 'img00\.jpg ' has spaces around it, which the input's name 'img00\.jpg'"),
    ("path,split,label\nimg00.jpg," + "x" * 101 + ",a\n",  # it names the shard files: ENAMETOOLONG mid-run
     r"row 2: split 'x+ is not a split name .*; use letters, digits or _, at most 100"),
    ('{"path": "img00.jpg", "label": "a"}\n{"path": "img01.jpg"}\n', "row 2: has other keys than the first line"),
    ('{"path": "img00.jpg", "label": "a"}\nnot json\n', r"row 2: is not JSON \(Expecting value"),
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
    from tfshard.format.errors import OutputExistsError

    csv = tmp_path / "l.csv"
    write(csv, "path,label\n" + "".join(f"{n}.jpg,{i % 2}\n" for i, n in enumerate(NAMES)))
    first = convert(flat, tmp_path / "out", csv)
    assert convert(flat, tmp_path / "out", csv) == first  # the same labels: complete, nothing to do
    write(csv, "path,label\n" + "".join(f"{n}.jpg,{(i + 1) % 2}\n" for i, n in enumerate(NAMES)))
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        convert(flat, tmp_path / "out", csv)


def test_rows_naming_no_input_stream_through_in_no_memory(tmp_path):
    import subprocess
    import sys

    rows = 200_000  # a dict of every row would take ~50 MB: 5x the bound below
    csv = tmp_path / "big.csv"
    with open(csv, "w") as f:
        f.write("path,label\n")
        f.writelines(f"d{i % 100}/{i}.jpg,c{i % 10}\n" for i in range(rows))
    # A fresh process (no TensorFlow): its peak RSS grows by what it keeps of the file: the two rows that name an
    # input and the first 100 that name none (it was the whole {path: (row, label)} dict, ~250 bytes a row).
    child = (
        "import resource, sys\n"
        "from tfshard.ingest import labels\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "with labels.open_rows(sys.argv[1], splits=True, columns=True) as rows:\n"
        "    found, bad = labels.decide(rows, sys.argv[2], ['d7/507.jpg', 'd99/199999.jpg'])\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
        "print(found.by_path, found.class_names, len(bad), bad.unlisted, bad[0].row, bad[-1].row, grown)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(csv), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("{'d7/507.jpg': 0, 'd99/199999.jpg': 1} ['c7', 'c9'] 100 199898 2 101 ")
    assert int(done.stdout.split()[-1]) < 10 * 2**20  # not the ~50 MB a dict of every row took


@pytest.mark.slow
def test_a_row_per_image_of_a_large_image_tree(tmp_path):
    """A labels file of a row per image of a 30,000-image tree is scanned and matched in one pass: anything quadratic
    in the rows or the images (~10^9 steps here) would not finish (it was 100,000 images: 3x the time, no more)."""
    from tfshard.ingest import ConvertOptions
    from tfshard.ingest.kinds.images import ImageJob

    src = tmp_path / "src"
    originals = [tmp_path / f"{k}.jpg" for k in range(4)]
    for k, original in enumerate(originals):
        write_jpeg(original, k)
    paths = [f"c{i % 50}/{i}.jpg" for i in range(30_000)]
    for name in {p.split("/")[0] for p in paths}:
        (src / name).mkdir(parents=True)
    for i, path in enumerate(paths):  # hard links: 30,000 images on disk
        os.link(originals[i % 4], src / path)
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{p},{p.split('/')[0]}\n" for p in paths))
    job = ImageJob(str(src), ConvertOptions(image=ImageOptions(labels_file=csv), on_error="fail"))  # scan + match
    assert len(job.items["train"]) == 30_000 and len(job.class_names) == 50 and job.rejected == []
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


# --- labels files as spreadsheets and scripts write them ----------------------------------------------------------


def decided(path, src, inputs, **kwargs):
    """``labels.decide`` over a labels file, as an image conversion reads it: ``(Labels, BadRows)``."""
    with labels_lib.open_rows(str(path), splits=True, columns=True) as rows:
        return labels_lib.decide(rows, str(src), inputs, kinds=labels_lib.LABEL_KINDS, **kwargs)


def test_a_stray_quote_is_one_bad_row_and_the_rows_after_it_are_read(flat, tmp_path):
    # Was: `img01,"dog` read every later row into one class name; exit 0 with 2 of 6 images, even under fail.
    csv = write(tmp_path / "l.csv", 'path,label\nimg00,cat\nimg01,"dog\nimg02,cat\nimg03,dog\nimg04,cat\nimg05,dog\n')
    with pytest.raises(InputError, match=r'l\.csv: row 3: does not parse as CSV \(unexpected end of data\) '
                                         r'\(got \'img01,"dog\'\); close each quote on its line') as caught:
        convert(flat, tmp_path / "fail", csv, on_error="fail")
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "fail")
    manifest = convert(flat, tmp_path / "skip", csv)
    assert manifest.splits["train"].records == 5 and manifest.class_names == ["cat", "dog"]
    assert [(r["path"], r["reason"].split(":")[0]) for r in manifest.rejected] == [('img01,"dog', "l.csv row 3")]


NUL, BOM = "\x00", "\ufeff"


@pytest.mark.parametrize("row, problem", [
    ('img01,"dog"s', "does not parse as CSV (',' expected after '\"')"),  # text after the closing quote
    ("img01,dog\rcat", "holds a carriage return inside the line (lines ending in \\r alone"),  # a lone CR
    ("img01", "has 1 column, the header has 2"),  # a row of only a path
    ("img01,dog,x", "has 3 columns, the header has 2; quote a field that holds a ','"),
    (f"img01,d{NUL}og", "holds a NUL or a byte-order mark"),
    (f"{BOM}img01,dog", "holds a NUL or a byte-order mark"),  # two exports joined: a BOM mid-file
    ("img01,do\x1bg", "label holds the control character U+001B"),  # would reach the terminal in the summary
    ("img01," + "x" * 200_000, "is over 131,072 characters"),  # skipped without being held
    # Was: classes that print alike ('ca\u200bt' and 'cat'), text the terminal prints reversed, a label of a caption
    # printed whole by the summary (one 780 KB line for six such labels) and kept in every record
    ("img01,ca\u200bt", "label holds the invisible character U+200B"),
    ("img01,\u202edog", "label holds the invisible character U+202E"),
    ("img01,a;" + "y" * 1001, f"label {'y' * 40!r}... of 1,001 characters is over the 1,000-character limit"),
])
def test_a_row_that_does_not_parse_is_a_bad_row_of_its_own(tmp_path, row, problem):
    csv = write(tmp_path / "l.csv", f"path,label\r\nimg00,cat\r\n{row}\r\nimg02,dog\r\n\r\nimg03,cat\r\n")  # CRLF
    labels, bad = decided(csv, tmp_path, ["img00.jpg", "img01.jpg", "img02.jpg", "img03.jpg"])
    assert labels.by_path == {"img00.jpg": 0, "img02.jpg": 1, "img03.jpg": 0}  # blank line 5 skipped
    assert [p.row for p in bad] == [3] and bad[0].problem.startswith(problem) and len(bad[0].text) <= 200


@pytest.mark.parametrize("sep", [";", "\t"])
def test_a_semicolon_or_tab_separated_file_is_read_by_its_header(flat, tmp_path, sep):
    # Was: "header has no label column" for a spreadsheet's ;-separated export, and for a TSV.
    rows = [f"img00.jpg{sep}cat", f'img01.jpg{sep}"cat;dog"', f"img02.jpg{sep}dog", f"img03.jpg{sep}a{sep}b"]
    csv = write(tmp_path / "l.csv", f"path{sep}label\n" + "\n".join(rows) + "\n")
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.labels == "multi" and manifest.class_names == ["cat", "dog"]
    assert read_labels(tmp_path / "out").tolist() == [[1, 0], [1, 1], [0, 1]]
    (bad,) = manifest.rejected
    assert bad["reason"].startswith(f"l.csv row 5: has 3 columns, the header has 2; quote a field that holds a {sep!r}")
    with labels_lib.open_rows(csv) as read:
        assert read.dialect == f"CSV separated by {sep!r}"


@pytest.mark.parametrize("content, match", [
    ("\ufeffpath,label\na.jpg,x\n".encode("utf-16"), "is UTF-16 text"),  # Excel's "Unicode text"
    ("path,label\na.jpg,x\n".encode("utf-16-le"), r"header row holds a NUL.*UTF-16"),  # the same without a BOM
    ("path,label\na.jpg,x\n".encode("utf-32"), "is UTF-32 text"),  # Python writes its BOM
    # the row that holds the byte, not one of the 8 KiB a decoder reads ahead
    (b"path,label\n" + b"b.jpg,x\n" * 1000 + b"a.jpg,caf\xe9\n",
     r"row 1002 is not UTF-8 text \(got b'a\.jpg,caf\\xe9\\n'; Latin-1 or Windows-1252"),
    (b'{"path": "a.jpg", "label": "x"}\n', r"header row is a JSON object .*; rename the labels file to \.jsonl"),
    (b'path,"label\na.jpg,x\n', r"header row does not parse as CSV"),
    (b"path," + b"c," * 70_000 + b"label\n", "header row is over 131,072 characters"),
    (b"\n\n", "empty labels file"),
])
def test_a_file_that_is_no_utf8_csv_is_one_line(tmp_path, content, match):
    path = tmp_path / "l.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=match) as caught:
        decided(path, tmp_path, ["a.jpg"])
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("labels, kind, rule", [
    (["nan", "inf", "2.5"], "class", "'inf' is not a decimal number: class names, sorted; pass --label-kind value"),
    (["Infinity", "-inf", "1"], "class", "'-inf' is not a decimal number"),
    (["1_000", "2_000", "0.5"], "class", "'1_000' is not a decimal number"),
    (["\u0661\u0662", "3.5"], "class", "'\u0661\u0662' is not a decimal number"),  # Arabic-Indic 12: float() takes it
    (["\uff11", "0.5"], "class", "'\uff11' is not a decimal number"),  # a fullwidth 1
    (["1.", ".5", "-0", "1e-05", "+2E+3", "7"], "value", "every label is a decimal number, and '.5' is not an integer"),
    (["7", "-2", "+07"], "class", "every label is an integer: classes in numeric order"),
])
def test_only_plain_decimal_numbers_are_numbers_and_the_rule_is_said(tmp_path, labels, kind, rule):
    # Was: whatever float() takes was a number: 'nan', 'inf', '1_000', '١٢' made (or broke) value labels.
    names = [f"img{i:02d}.jpg" for i in range(len(labels))]
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n},{v}\n" for n, v in zip(names, labels)))
    decided_labels, bad = decided(csv, tmp_path, names)
    assert decided_labels.kind == kind and rule in decided_labels.rule and list(bad) == []
    if kind == "class" and "integer" not in rule:
        assert decided_labels.class_names == sorted(labels)  # every one a class, none a bad value
    if kind == "value":
        assert [decided_labels.by_path[n] for n in names] == [1.0, 0.5, -0.0, np.float32(1e-05).item(), 2000.0, 7.0]


@pytest.mark.parametrize("content, match", [
    ("img00.jpg,cat\nimg01.jpg,dog\n", r"its first row names an input \(got 'img00\.jpg'\), so the file has no header"),
    # Was: read as a header as a row is not (a Kaggle id, ./), so img00 was left out, counted only as unlabelled
    ("img00,cat\nimg01,dog\n", r"its first row names an input \(got 'img00'\), so the file has no header"),
    ("./img00.jpg,cat\nimg01.jpg,dog\n", r"its first row names an input \(got '\./img00\.jpg'\), so the file"),
    ("path,split,label\nimg00,train,a\nimg01,Train,b\n", r"row 3 names the split 'Train', row 2 'train'; write "
                                                         "each split one way"),
    ("path,label\rimg00,cat\rimg01,dog\r", r"header row holds a carriage return: lines end in \\r alone"),
    ('path,"lab\x1bel"\nimg00,cat\n', r"header names a column holding the control character U\+001B"),
    ('path,"lab\u202eel"\nimg00,cat\n', r"header names a column holding the invisible character U\+202E"),
])
def test_a_file_read_wrong_without_a_word_is_one_line(flat, tmp_path, content, match):
    # Was: the first data row taken as the header (its image silently unlabelled); 'Train' and 'train' two splits;
    # a classic-Mac file one header of every row; an escape sequence printed by the summary.
    csv = write(tmp_path / "l.csv", content)
    with pytest.raises(InputError, match=match) as caught:
        convert(flat, tmp_path / "out", csv)
    assert str(caught.value).startswith(f"{csv}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("header", ["path,label", "id,label", "Path,class"])
def test_a_header_of_column_names_is_a_header_when_an_input_has_that_stem(tmp_path, header):
    csv = write(tmp_path / "l.csv", f"{header}\npath,x\nid,y\nlabel,x\n")
    labels, bad = decided(csv, tmp_path, ["path.jpg", "id.jpg", "label.jpg"])
    assert labels.by_path == {"path.jpg": 0, "id.jpg": 1, "label.jpg": 0} and list(bad) == []


@pytest.mark.parametrize("sep_line, sep", [("sep=;", ";"), ("sep=\t", "\t"), ('"sep=;"', ";"), ("sep=|", "|")])
def test_excel_sep_line_names_the_delimiter(tmp_path, sep_line, sep):
    # Was: `sep=<tab>` and a quoted `"sep=;"` (a CSV writer's row) taken as the header: "no label column".
    csv = write(tmp_path / "l.csv", f'{sep_line}\r\npath{sep}label\r\nimg00.jpg{sep}"a;b"\r\nimg01.jpg{sep}1,5\r\n')
    labels, bad = decided(csv, tmp_path, ["img00.jpg", "img01.jpg"])
    assert labels.by_path == {"img00.jpg": (1, 2), "img01.jpg": (0,)} and list(bad) == []
    assert labels.class_names == ["1,5", "a", "b"]


def test_a_decimal_comma_is_pointed_out_and_read_as_a_number_where_numbers_are_asked_for(tmp_path):
    # Was: the rule said "pass --label-kind value to read the labels as numbers", and --label-kind value then made
    # every row with a decimal comma a bad row; two value columns of an Excel export lost every such row.
    names = ["img00.jpg", "img01.jpg", "img02.jpg"]
    values = write(tmp_path / "v.csv", "sep=;\npath;label\nimg00.jpg;0,5\nimg01.jpg;-1,25\nimg02.jpg;2\n")
    labels, _ = decided(values, tmp_path, names)
    assert labels.kind == "class" and labels.rule == ("'-1,25' is not a decimal number (a decimal comma?): class "
                                                      "names, sorted; pass --label-kind value to read the labels as "
                                                      "numbers")
    labels, bad = decided(values, tmp_path, names, forced="value")
    assert labels.by_path == {"img00.jpg": 0.5, "img01.jpg": -1.25, "img02.jpg": 2.0} and list(bad) == []
    two = write(tmp_path / "t.csv", "path;age;score\nimg00.jpg;31,5;1\nimg01.jpg;2;0,25\n")
    assert decided(two, tmp_path, names)[0].by_path == {"img00.jpg": (31.5, 1.0), "img01.jpg": (2.0, 0.25)}
    # only there: in a TSV 1,000 may be a thousand, never 1.0
    tsv = write(tmp_path / "t.tsv", "path\tage\tscore\nimg00.jpg\t1,000\t1\nimg01.jpg\t2\t3\n")
    labels, bad = decided(tsv, tmp_path, names)
    assert labels.by_path == {"img01.jpg": (2.0, 3.0)} and bad[0].problem.startswith("label '1,000' is not a finite")
    # a quoted 0,5 in a CSV stays a name, and says how
    quoted = write(tmp_path / "q.csv", 'path,label\nimg00.jpg,"0,5"\nimg01.jpg,1.5\n')
    assert "(a decimal comma? write numbers with a point)" in decided(quoted, tmp_path, names)[0].rule
    labels, bad = decided(quoted, tmp_path, names, forced="value")
    assert labels.by_path == {"img01.jpg": 1.5} and "0.5 (with a decimal point: a comma is one only in a file " \
                                                    "separated by ';')" in bad[0].problem


def test_words_float_takes_are_class_names_never_values(flat, tmp_path):
    # Was: labels 'nan', 'inf', 'Infinity', '1_000', '٣' and '2.5' made a value dataset (1_000 read as 1000.0, '٣'
    # as 3.0) and three of its images bad rows.
    values = ["nan", "inf", "Infinity", "1_000", "\u0663", "2.5"]
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(NAMES, values)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.labels == "class" and manifest.class_names == sorted(values) and manifest.rejected == []
    assert read_labels(tmp_path / "out").tolist() == [sorted(values).index(v) for v in values]


def test_the_summary_says_which_rule_decided_the_kind(flat, tmp_path):
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{i / 4}\n" for i, n in enumerate(NAMES)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert ("  label kind: value (every label is a decimal number, and '0.25' is not an integer; pass --label-kind "
            "class to read them as class names)") in summary_lines("out", manifest)
    forced = convert(flat, tmp_path / "forced", csv, label_kind="class")
    assert "  label kind: class (--label-kind class)" in summary_lines("out", forced)


def test_one_name_in_two_unicode_normal_forms_is_one_class(flat, tmp_path):
    # Was: 'café' typed (NFC) and as macOS writes it (NFD) made two classes that print alike.
    nfc, nfd = (unicodedata.normalize(form, "caf\u00e9") for form in ("NFC", "NFD"))
    values = [nfc, nfd, "tea", nfd, nfc, "tea"]
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(NAMES, values)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.class_names == [nfc, "tea"] and read_labels(tmp_path / "out").tolist() == [0, 0, 1, 0, 0, 1]
    tags = write(tmp_path / "m.jsonl", "".join(json.dumps({"path": f"{n}.jpg", "label": [v, "x"]}) + "\n"
                                               for n, v in zip(NAMES, values)))
    labels, _ = decided(tags, flat, [f"{n}.jpg" for n in NAMES[:6]])
    assert labels.kind == "multi" and labels.class_names == [nfc, "tea", "x"]


def test_column_names_are_matched_ignoring_case_and_spaces(flat, tmp_path):
    # Was: a `Split` column beside `label` silently ignored: every image in train.
    csv = write(tmp_path / "l.csv", " Label ,PATH,Split\n" + "".join(
        f"{'cat' if i % 2 else 'dog'},{n}.jpg,{'val' if i < 2 else 'train'}\n" for i, n in enumerate(NAMES)))
    manifest = convert(flat, tmp_path / "out", csv)
    assert {k: v.records for k, v in manifest.splits.items()} == {"train": 10, "val": 2}
    assert manifest.class_names == ["cat", "dog"] and manifest.rejected == []
    rows = [{"Path": f"{n}.jpg", "SPLIT": "val" if i < 2 else "train", "label": "a"} for i, n in enumerate(NAMES)]
    rows[3] = {"path": "img03.jpg", "split": "train", "LABEL": "b"}  # another line's spelling of the same keys
    labels, bad = decided(write(tmp_path / "l.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), flat,
                          [f"{n}.jpg" for n in NAMES])
    assert list(bad) == [] and labels.splits["img01.jpg"] == "val" and labels.by_path["img03.jpg"] == 1


@pytest.mark.parametrize("header, both", [("path,label,Label", "'label' twice, as 'label' and 'Label'"),
                                          ("path, split,SPLIT,label", "'split' twice, as 'split' and 'SPLIT'")])
def test_two_columns_differing_only_in_case_are_one_line(flat, tmp_path, header, both):
    csv = write(tmp_path / "l.csv", f"{header}\nimg00.jpg,a,b{',c' * (header.count(',') - 2)}\n")
    with pytest.raises(InputError, match=rf"l\.csv: header names the column {re.escape(both)}") as caught:
        convert(flat, tmp_path / "out", csv)
    assert "\n" not in str(caught.value)


def test_bad_rows_naming_no_input_are_listed_up_to_a_cap_and_counted(flat, tmp_path, cli):
    # Was: one `rejected` entry per row naming no image: 100,000 rows made a 20.6 MB manifest for 10 images.
    cap = labels_lib.MAX_LISTED_ROWS
    rows = [f"{n}.jpg,{i % 2}" for i, n in enumerate(NAMES)] + [f"ghost{i:04d}.jpg,1" for i in range(cap + 250)]
    rows.insert(3, "img00.jpg,1")  # names an image again: a bad row naming no new input, among the listed
    rows[7] = "img06.jpg,"  # an empty label: a bad row naming an image, always listed
    csv = write(tmp_path / "l.csv", "path,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    manifest = convert(flat, out, csv)
    assert manifest.splits["train"].records == 11 and manifest.rejected_unlisted == 251
    assert len(manifest.rejected) == cap + 1 and "img06.jpg" in {r["path"] for r in manifest.rejected}
    assert os.path.getsize(out / "dataset.json") < 64_000 and load_manifest(str(out)) == manifest
    summary = "\n".join(summary_lines(str(out), manifest))
    assert "rejected: 352 files and labels rows (dataset.json lists 101; 251 more bad rows of the labels" in summary
    assert "... and 342 more" in summary
    info = cli("info", out)
    assert info.exit_code == 0 and "rejected: 352 files and labels rows" in info.output
    assert cli("verify", out).exit_code == 0
    raw = read_manifest(out)
    for lie, match in ((-1, "must be at least 0"), ("5", "must be an integer")):
        (out / "dataset.json").write_text(json.dumps({**raw, "rejected_unlisted": lie}))
        with pytest.raises(ManifestError, match=rf"field rejected_unlisted: {match}"):
            load_manifest(str(out))
    del raw["rejected_unlisted"]  # a manifest written before the cap still loads
    (out / "dataset.json").write_text(json.dumps(raw))
    assert load_manifest(str(out)).rejected_unlisted == 0


def test_an_append_records_the_bad_rows_of_its_own_labels_file_only(tmp_path):
    # Was: each append kept every bad row of the labels files before it: listed rows piled up with each append.
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, NAMES[:3])
    ghosts = "".join(f"ghost{i}.jpg,a\n" for i in range(3))
    first = write(tmp_path / "first.csv", "path,label\nimg00.jpg,a\nimg01.jpg,b\nimg02.jpg,\n" + ghosts)
    assert len(convert(src, out, first).rejected) == 4
    flat_jpegs(src, ["new"])
    second = write(tmp_path / "second.csv", "path,label\nimg00.jpg,a\nimg01.jpg,b\nimg02.jpg,\nnew.jpg,b\n"
                   "other.jpg,a\n")
    appended = convert_images(str(src), str(out), ConvertOptions(image=ImageOptions(labels_file=second), seed=None),
                              workers=0, progress=False, append=True)
    assert appended.splits["train"].records == 3
    assert sorted(r["path"] for r in appended.rejected) == ["img02.jpg", "other.jpg,a"]
    assert appended.rejected_unlisted == 0


def test_json_lines_nested_too_deep_or_too_long_is_one_bad_row(flat, tmp_path):
    # Was: a line of 100,000 '[' a 63-line RecursionError traceback.
    deep = "[" * 100_000
    lines = ['{"path": "img00.jpg", "label": "a"}', deep, '{"path": "img01.jpg", "label": "' + "b" * 300_000 + '"}',
             '{"path": "img02.jpg", "label": NaN}', '{"path": "img03.jpg", "label": "b", "Label": "c"}',
             '{"path": "img04.jpg", "label": "b"}']
    path = write(tmp_path / "l.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"l\.jsonl: row 2: is nested too deep for a row \(got '\[\[\[") as caught:
        convert(flat, tmp_path / "fail", path, on_error="fail")
    assert "\n" not in str(caught.value)
    labels, bad = decided(path, flat, [f"{n}.jpg" for n in NAMES])
    assert labels.by_path == {"img00.jpg": 0, "img04.jpg": 1}
    assert [(p.row, p.problem.split(";")[0]) for p in bad] == [
        (2, "is nested too deep for a row"), (3, "is over 131,072 characters"),
        (4, "is not JSON (NaN is no JSON number)"), (5, "has other keys than the first line")]
    with pytest.raises(InputError, match=r"d\.jsonl: line 1 is nested too deep for a row; start with an object"):
        decided(write(tmp_path / "d.jsonl", deep + "\n"), flat, [])


def test_one_huge_line_takes_no_more_memory_than_a_row(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "huge.jsonl"  # one line of 64 MiB and no line end: what it takes is bounded by a row
    with open(path, "w") as f:
        f.write('{"path": "a.jpg", "label": "a"}\n{"path": "b.jpg", "label": "')
        f.write("x" * (64 << 20))
    child = (
        "import resource, sys\n"
        "from tfshard.ingest import labels\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "with labels.open_rows(sys.argv[1]) as rows:\n"
        "    found, bad = labels.decide(rows, '.', ['a.jpg', 'b.jpg'])\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
        "print(found.by_path, [(p.row, p.problem[:30]) for p in bad], grown)\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith("{'a.jpg': 0} [(2, 'is over 131,072 characters; sh')] ")
    assert int(done.stdout.split()[-1]) < 8 << 20  # was several times the line's 64 MiB


def test_a_bad_row_naming_its_image_leaves_it_out_and_is_not_counted_as_without_a_row(flat, tmp_path):
    # Was: an image whose row held a control character or a bad split was both a rejected row and "unlabelled (no
    # row in the labels file)"; listed only within the cap of rows naming no image.
    rows = ["img00.jpg,train,cat", "img01.jpg,train,do\x07g", "img02.jpg,tr ain,cat", "img01.jpg,train,dog",
            "img03.jpg,train,dog"]
    csv = write(tmp_path / "l.csv", "path,split,label\n" + "\n".join(rows) + "\n")
    manifest = convert(flat, tmp_path / "out", csv)
    assert manifest.splits["train"].records == 2 and manifest.ignored["unlabelled"] == 12 - 4
    assert [(r["path"], r["reason"].split(":")[0]) for r in manifest.rejected] == [
        ("img01.jpg", "l.csv row 3"), ("img01.jpg,dog", "l.csv row 5"), ("img02.jpg", "l.csv row 4")]
    assert "names 'img01.jpg' again (first on row 3)" in manifest.rejected[1]["reason"]
    assert "img01.jpg" not in manifest.ignored_files and "img04.jpg" in manifest.ignored_files


def test_json_lines_lone_surrogates_are_bad_rows_never_a_crash(flat, tmp_path, cli):
    # Was: a "\ud800" escape in a label crashed a worker ('utf-8' codec can't encode, naming no file); in a path the
    # dataset was written and the summary then crashed, exit 1.
    lines = [r'{"path": "img00.jpg", "label": "a"}', r'{"path": "img01.jpg", "label": "c\ud800t"}',
             r'{"path": "img\ud800.jpg", "label": "a"}', r'{"path": "img02.jpg", "label": ["b", "\udcff"]}',
             r'{"path": "img03.jpg", "label": "b\ud83d\ude00"}']  # a whole pair is one character: a name
    path = write(tmp_path / "l.jsonl", "\n".join(lines) + "\n")
    done = cli("images", flat, tmp_path / "out", "--labels", path)
    assert done.exit_code == 0, done.output
    manifest = load_manifest(str(tmp_path / "out"))
    assert manifest.class_names == ["a", "b\U0001f600"] and manifest.splits["train"].records == 2
    assert sorted((r["path"], r["reason"].split(";")[0]) for r in manifest.rejected) == [
        ("img01.jpg", "l.jsonl row 2: label holds the lone surrogate U+D800"),
        ("img02.jpg", "l.jsonl row 4: label holds the lone surrogate U+DCFF"),
        ('{"path": "img\\ud800.jpg", "label": "a"}', "l.jsonl row 3: path 'img\\ud800.jpg' holds a lone surrogate "
                                                    "(half of a \\u escape pair), which no file name holds")]
    keyed = write(tmp_path / "k.jsonl", r'{"path": "img00.jpg", "lab\udc00el": "a"}' + "\n")
    with pytest.raises(InputError, match=r"k\.jsonl: header names a column holding the lone surrogate U\+DC00"):
        decided(keyed, flat, ["img00.jpg"])


def test_a_labels_file_written_to_while_it_is_read_is_one_line(tmp_path):
    # Was: a file a script was still writing read as far as it went, the rest of its rows silently missing.
    csv = write(tmp_path / "l.csv", "path,label\n" + "".join(f"img{i:05d}.jpg,a\n" for i in range(2000)))
    with labels_lib.open_rows(csv) as rows:
        read = iter(rows)
        next(read)
        with open(csv, "a") as f:
            f.write("img99999.jpg,b\n")
        with pytest.raises(InputError, match=r"l\.csv: labels file changed while it was read \(got 30,011 bytes when "
                                             r"opened, 30,026 when read to its end\); let whatever writes it finish"):
            list(read)


def test_a_summary_line_stays_one_short_line_whatever_the_labels_file_names(flat, tmp_path):
    path = write(tmp_path / "l.jsonl", "".join(json.dumps({"path": f"{n}.jpg", "label": [i] * 30}) + "\n"
                                               for i, n in enumerate(NAMES[:3])))
    manifest = convert(flat, tmp_path / "out", path)
    (line,) = [line for line in summary_lines("out", manifest) if line.startswith("  labels:")]
    assert "value (float32 [30]: label[0], label[1], " in line and "label[9], ... 20 more)" in line


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


# =====================================================================================================================
# Attacks on images labelled by a file (``--labels``): odd labels files, JSON Lines corners, names that only look
# alike, tampered manifests, and what reads the dataset back. A test per bug found (each failed before its fix), then
# guards for tricky cases that held.
# =====================================================================================================================


SIX_NAMES = [f"img{i:02d}" for i in range(6)]


@pytest.fixture(scope="module")
def flat_six(tmp_path_factory):
    """img00.jpg .. img05.jpg in one folder."""
    root = tmp_path_factory.mktemp("flat")
    flat_jpegs(root, SIX_NAMES)
    return root


def convert_kind(src, out, labels_file, kind=None, **options):
    return convert_image_tree(src, out, image=ImageOptions(labels_file=str(labels_file), label_kind=kind),
                              seed=None, **options)


def jsonl(path, *rows) -> str:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


def rows_of(path, **kwargs) -> list:
    """Every row of a labels file as read: ``Row``s and ``RowProblem``s in order."""
    with labels_lib.open_rows(str(path), **kwargs) as rows:
        return list(rows)


def decided_plain(path, src, inputs, **kwargs):
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
    labels, problems = decided_plain(jsonl(tmp_path / "m.jsonl", {"path": "a.jpg", "label": "x"},
                                           {"path": "b.jpg", "label": "y"}, {"path": "a.jpg", "label": "z"}),
                                     tmp_path, ["a.jpg", "b.jpg"])
    assert labels.by_path == {"a.jpg": 0, "b.jpg": 1}
    assert [p.row for p in problems] == [3] and "first on row 1" in problems[0].problem


def test_json_lines_first_line_not_an_object_is_a_file_error(tmp_path):
    # Was: '[1, 2]' became the header and the next object's keys a row labelling an input named 'path'.
    path = write(tmp_path / "l.jsonl", '[1, 2]\n{"path": "a.jpg", "label": "x"}\n')
    with pytest.raises(InputError, match=r"l\.jsonl: line 1 is not a JSON object of the columns"):
        rows_of(path, splits=True, columns=True)


def test_json_lines_lists_of_one_name_or_none_are_multi_label(flat_six, tmp_path):
    # Was: ["x"] rows made class labels and [] an "empty label" reject.
    path = jsonl(tmp_path / "l.jsonl", *({"path": f"{n}.jpg", "label": [["x"], [], ["y"]][i % 3]}
                                         for i, n in enumerate(SIX_NAMES)))
    manifest = convert_kind(flat_six, tmp_path / "out", path)
    assert manifest.labels == "multi" and manifest.class_names == ["x", "y"] and manifest.rejected == []
    assert read_labels(tmp_path / "out").tolist() == [[1, 0], [0, 0], [0, 1]] * 2
    assert convert_kind(flat_six, tmp_path / "cls", path, kind="class").labels == "class"  # --label-kind still decides


def test_json_lines_list_of_another_length_says_so(tmp_path):
    # Was: "has 3 columns, the header has 2; quote a field that holds a comma" (a CSV fix, for JSON).
    path = jsonl(tmp_path / "l.jsonl", {"path": "a.jpg", "label": [1.5, 2.0]}, {"path": "b.jpg", "label": [1.0]})
    (problem,) = [r for r in rows_of(path, splits=True, columns=True) if isinstance(r, labels_lib.RowProblem)]
    assert problem.row == 2 and "list of numbers of another length" in problem.problem
    assert "quote" not in problem.problem


# --- bugs found: CSV headers and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("header, twice", [("path,label,label", "label"), ("path,a,a", "a"),
                                           ("path,split,split,label", "split"), ("path,path,label", "path")])
def test_a_column_named_twice_is_refused(flat_six, tmp_path, header, twice):
    # Was: the first `label` (or `split`) taken and the other silently dropped; `a,a` two value columns named alike.
    path = write(tmp_path / "l.csv", f"{header}\n" + "".join(f"{n}.jpg,1,2{',3' * (header.count(',') - 2)}\n"
                                                             for n in SIX_NAMES))
    with pytest.raises(InputError, match=rf"l\.csv: header names the column '{twice}' twice") as caught:
        convert_kind(flat_six, tmp_path / "out", path)
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


def test_an_unnamed_label_column_is_refused(flat_six, tmp_path):
    # Was: a value dataset whose label_columns is [''].
    path = write(tmp_path / "l.csv", "path,\n" + "".join(f"{n}.jpg,{i / 2}\n" for i, n in enumerate(SIX_NAMES)))
    with pytest.raises(InputError, match=r"l\.csv: header leaves a label column unnamed"):
        convert_kind(flat_six, tmp_path / "out", path)
    trailing = write(tmp_path / "t.csv", "path,label,\n" + "".join(f"{n}.jpg,c,\n" for n in SIX_NAMES))  # spreadsheet
    assert convert_kind(flat_six, tmp_path / "t", trailing).class_names == ["c"]


def test_integer_looking_names_among_names_keep_their_own_class(flat_six, tmp_path):
    # Was: '01' (a class of its own among 'cat') read as int 1: labelled class '1', and '01;cat' rejected.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(
        f"{n}.jpg,{v}\n" for n, v in zip(SIX_NAMES, ["01", "1", "cat", "01", "1", "cat"])))
    manifest = convert_kind(flat_six, tmp_path / "out", path)
    assert manifest.class_names == ["01", "1", "cat"]
    assert read_labels(tmp_path / "out").tolist() == [0, 1, 2, 0, 1, 2]
    assert manifest.splits["train"].class_counts == {"01": 2, "1": 2, "cat": 2}
    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(
        f"{n}.jpg,{v}\n" for n, v in zip(SIX_NAMES, ["01;cat", "1", "cat", "01", "1;01", ""])))
    manifest = convert_kind(flat_six, tmp_path / "multi", multi)
    assert manifest.rejected == [] and manifest.class_names == ["01", "1", "cat"]
    assert read_labels(tmp_path / "multi")[[0, 4]].tolist() == [[1, 0, 1], [1, 1, 0]]
    numeric = write(tmp_path / "n.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(SIX_NAMES, [
        "01", "1", "+1", "2", "02", "10"])))  # integers only: numeric classes, 01 is 1
    assert convert_kind(flat_six, tmp_path / "num", numeric).class_names == ["1", "2", "10"]
    assert read_labels(tmp_path / "num").tolist() == [0, 0, 0, 1, 1, 2]


def test_a_stem_two_inputs_share_says_so(tmp_path):
    # Was: "'a' does not exist under SRC" for a row naming a.jpg and a.png alike.
    write_jpeg(tmp_path / "src" / "a.jpg", 0)
    write_jpeg(tmp_path / "src" / "a.png", 1)
    write_jpeg(tmp_path / "src" / "b.jpg", 2)
    path = write(tmp_path / "l.csv", "id,label\na,x\nb,y\n")
    with pytest.raises(InputError, match=r"row 2: 'a' is the stem of 2 inputs \(a\.jpg, a\.png\) \(got 'a,x'\); "
                                         "give the file name with its extension"):
        convert_kind(tmp_path / "src", tmp_path / "out", path, on_error="fail")


def test_a_file_name_is_never_a_stem(tmp_path):
    # Was: a row 'a.jpg' (no such file; .jpg is an input's extension) silently labelled 'a.jpg.png'.
    write_jpeg(tmp_path / "src" / "a.jpg.png", 0)
    labels, problems = decided_plain(write(tmp_path / "l.csv", "path,label\na.jpg,x\na.jpg.png,y\nb.jpg,y\n"),
                                     tmp_path / "src", ["a.jpg.png", "b.jpg"])
    assert labels.by_path == {"a.jpg.png": 0, "b.jpg": 0} and labels.class_names == ["y"]
    assert [(p.row, p.problem.split(";")[0]) for p in problems] == [(2, "'a.jpg' does not exist under SRC")]
    assert decided_plain(write(tmp_path / "k.csv", "id,label\na1.b2,x\n"), "src",
                         ["a1.b2.jpg"])[0].by_path == {"a1.b2.jpg": 0}  # a Kaggle id with a dot is still one


@pytest.mark.parametrize("row_form, file_form", [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_path_in_another_unicode_normal_form_matches(tmp_path, row_form, file_form):
    # Was: 'café.jpg' typed on Linux/Windows (NFC) "does not exist" for a file macOS wrote (NFD), and the reverse.
    name = "caf\u00e9"
    write_jpeg(tmp_path / "src" / f"{unicodedata.normalize(file_form, name)}.jpg", 0)
    write_jpeg(tmp_path / "src" / "b.jpg", 1)
    path = write(tmp_path / "l.csv", f"path,label\n{unicodedata.normalize(row_form, name)}.jpg,x\n"
                 f"{unicodedata.normalize(row_form, name)},y\nb,y\n")  # the second row: the same file by its stem
    labels, problems = decided_plain(path, tmp_path / "src", [f"{unicodedata.normalize(file_form, name)}.jpg", "b.jpg"])
    assert labels.by_path == {f"{unicodedata.normalize(file_form, name)}.jpg": 0, "b.jpg": 1}
    assert [p.row for p in problems] == [3] and "again (first on row 2)" in problems[0].problem


# --- bugs found: what a conversion writes -------------------------------------------------------------------------


def test_multi_label_values_of_no_class_are_refused_before_writing(flat_six, tmp_path):
    # Was: a dataset.json of labels "multi" and no class_names, which its own readers then refused.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{';' if i % 2 else ';;'}\n"
                                                             for i, n in enumerate(SIX_NAMES)))
    with pytest.raises(InputError, match=r"l\.csv: its multi-label values name no class") as caught:
        convert_kind(flat_six, tmp_path / "out", path)
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


def test_when_no_row_labels_an_image_the_error_names_the_labels_file(flat_six, tmp_path):
    # Was: "no images found (extensions .jpg, ...); check SRC", with six images right there.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,cat\n" for n in SIX_NAMES))
    with pytest.raises(InputError, match=rf"no image is labelled by {path} \(got 0 images without a row, 6 bad "
                                         r"rows; first: l\.csv row 2: label 'cat' is not a number"):
        convert_kind(flat_six, tmp_path / "out", path, kind="value")
    elsewhere = write(tmp_path / "e.csv", "path,label\nother/x.jpg,cat\n")
    with pytest.raises(InputError, match=r"got 6 images without a row, 1 bad rows; first: e\.csv row 2: "
                                         "'other/x.jpg' does not exist under SRC"):
        convert_kind(flat_six, tmp_path / "out", elsewhere)


def test_multi_hot_batches_have_a_static_class_dimension(flat_six, tmp_path):
    # Was: TensorSpec(shape=(B, None)): a head's size, or a metric's num_labels, could not be read from the data.
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{'a;b' if i % 2 else 'c'}\n"
                                                             for i, n in enumerate(SIX_NAMES)))
    convert_kind(flat_six, tmp_path / "out", path)
    for kwargs in (dict(training=False), dict(seed=0), dict(seed=0, cache="memory")):
        ds = readers.images(str(tmp_path / "out"), batch_size=2, image_size=8, **kwargs)
        assert ds.element_spec[1].shape.as_list()[-1] == 3, kwargs
        assert ds.element_spec[1].shape.as_list() == ([None, 3] if kwargs == dict(training=False) else [2, 3])


# --- bugs found: tampered manifests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valued(flat_six, tmp_path_factory):
    """A two-column value dataset, converted once, to tamper with copies of."""
    root = tmp_path_factory.mktemp("valued")
    path = write(root / "v.csv", "path,a,b\n" + "".join(f"{n}.jpg,{i / 4},{i}\n" for i, n in enumerate(SIX_NAMES)))
    convert_kind(flat_six, root / "out", path)
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
def test_a_labels_file_that_is_no_regular_file_is_one_line(flat_six, tmp_path, make, kind):
    path = str(tmp_path / "labels.csv")
    make(path)
    with pytest.raises(InputError, match=rf"labels\.csv: labels file is {kind}, not a regular file") as caught:
        convert_kind(flat_six, tmp_path / "out", path)  # never blocks on the FIFO, never reads /dev/zero forever
    assert "\n" not in str(caught.value) and not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("url", ["gs://bucket/labels.csv", "https://example.com/labels.csv"])
def test_a_labels_file_given_as_a_url_says_only_a_local_file_is_read(flat_six, tmp_path, url):
    # Was: "labels file not found", of a file that may well be there.
    with pytest.raises(InputError, match=rf"^{url}: labels file is a URL, but only a local file is read; copy it"):
        convert_kind(flat_six, tmp_path / "out", url)


def test_bom_crlf_and_quoted_commas_round_trip(tmp_path):
    write_jpeg(tmp_path / "src" / "a,b.jpg", 0)
    write_jpeg(tmp_path / "src" / "c.jpg", 1)
    write_jpeg(tmp_path / "src" / "d.jpg", 2)
    path = tmp_path / "l.csv"
    # Was: `d.jpg, "big, red"` (a space before the quote, as written by hand) 3 columns, and `c.jpg, "small"` the
    # class '"small"' beside 'small'
    path.write_bytes('\ufeffpath, label\r\n"a,b.jpg","big, red"\r\n./c.jpg, "small"\r\n d.jpg, "big, red"\r\n'
                     .encode("utf-8"))
    manifest = convert_kind(tmp_path / "src", tmp_path / "out", path)
    assert manifest.class_names == ["big, red", "small"] and read_labels(tmp_path / "out").tolist() == [0, 1, 0]


def test_value_edge_numbers(flat_six, tmp_path):
    values = ["-0.0", "1e400", "3.5e38", "3.4028235e38", "NaN", "-1e-3"]
    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{v}\n" for n, v in zip(SIX_NAMES, values)))
    assert convert_kind(flat_six, tmp_path / "names", path).labels == "class"  # 'NaN' is no decimal number: a name
    manifest = convert_kind(flat_six, tmp_path / "out", path, kind="value")
    assert manifest.labels == "value"
    assert [r["reason"].split(": ", 1)[1].split(" (")[0].split(";")[0] for r in manifest.rejected] == [
        "label '1e400' is outside float32's range", "label '3.5e38' is outside float32's range",
        "label 'NaN' is not a number"]
    got = read_labels(tmp_path / "out")
    assert got.tolist() == [0.0, np.float32(3.4028235e38), np.float32(-1e-3)] and np.signbit(got[0])


def test_a_split_column_meets_held_out_fractions(flat_six, tmp_path):
    path = write(tmp_path / "l.csv", "path,split,label\n" + "".join(
        f"{n}.jpg,{'val' if i == 0 else 'holdout' if i == 1 else 'train'},{i % 2}\n" for i, n in enumerate(SIX_NAMES)))
    with pytest.raises(InputError, match=r"already has a 'val' split \(got --val-fraction 0.5\)"):
        convert_kind(flat_six, tmp_path / "out", path, holdout=Holdout(val_fraction=0.5))
    manifest = convert_kind(flat_six, tmp_path / "t", path, holdout=Holdout(test_fraction=0.5, stratify=True))
    assert {k: v.records for k, v in manifest.splits.items()} == {"val": 1, "holdout": 1, "train": 2, "test": 2}
    assert read_labels(tmp_path / "t", "holdout").tolist() == [1]  # a split of any name is read back
    multi = write(tmp_path / "m.csv", "path,label\n" + "".join(f"{n}.jpg,a;b\n" for n in SIX_NAMES))
    with pytest.raises(InputError, match="--stratify keeps each class's share exact"):
        convert_kind(flat_six, tmp_path / "m", multi, holdout=Holdout(val_fraction=0.5, stratify=True))


def test_label_kind_without_labels_is_one_line(flat_six, tmp_path, cli):
    result = cli("images", flat_six, tmp_path / "out", "--label-kind", "multi")
    assert result.exit_code != 0 and "--label-kind: only with a labels file" in result.output
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
def test_multi_hot_labels_train_under_a_mirrored_strategy(flat_six, tmp_path, strategies):
    import tensorflow as tf

    path = write(tmp_path / "l.csv", "path,label\n" + "".join(f"{n}.jpg,{'a;b' if i % 2 else 'c'}\n"
                                                             for i, n in enumerate(SIX_NAMES)))
    convert_kind(flat_six, tmp_path / "out", path)
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
