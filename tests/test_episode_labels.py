"""Episode labels at conversion (issue 22): class folders, a ``--labels`` CSV, their records, manifest, checks;
the last section holds hostile labels files and tampered manifests."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    assert_same_tree,
    convert_episode_tree,
    edit_manifest,
    random_episodes,
    read_manifest,
    save_episodes,
    snapshot,
    write_manifest,
)
from tfshard import readers
from tfshard.format.records import LABEL_KEY, episode_parse_spec
from tfshard.format.untrusted import manifest_from_dict
from tfshard.ingest import (
    ConvertOptions,
    EpisodeOptions,
    InputError,
    OutputExistsError,
    VerifyError,
    convert_episodes,
    load_manifest,
    verify,
)
from tfshard.ingest import labels as labels_lib
from tfshard.ingest.labels import open_rows

CLASSES = ("walk", "run", "sit")


def class_tree(src, splits=(None,), classes=CLASSES, per_class=2) -> list[str]:
    """``src/[split/]<class>/epN.npy`` tiny episodes; returns their relpaths."""
    rels = ["/".join(p for p in (split, name, f"ep{i}.npy") if p)
            for split in splits for name in classes for i in range(per_class)]
    save_episodes(src, dict(zip(rels, random_episodes(range(3, 3 + len(rels)), seed=1))))
    return rels


def record_labels(out, manifest) -> dict[str, list]:
    """Each episode source's ``episode/label`` in every one of its chunk records, parsed from the shards."""
    spec = {**episode_parse_spec([]), LABEL_KEY: tf.io.FixedLenFeature([], tf.as_dtype(
        manifest.features[LABEL_KEY]["dtype"]))}
    found: dict[str, list] = {}
    for split in manifest.splits.values():
        for shard in split.shards:
            for record in tf.data.TFRecordDataset(os.path.join(out, shard.file)):
                parsed = tf.io.parse_single_example(record, spec)
                found.setdefault(parsed["episode/source"].numpy().decode(), []).append(parsed[LABEL_KEY].numpy())
    return found


def labels_of(manifest) -> dict[str, int | float]:
    return {e.source: e.label for split in manifest.splits.values() for e in split.episodes}


def write_csv(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


# --- class folders --------------------------------------------------------------------------------------------------


def test_class_folders_label_every_episode_by_its_sorted_folder(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    rels = class_tree(src)

    manifest = convert_episode_tree(src, out, num_shards=2, episode=EpisodeOptions(max_record_bytes=16))

    assert manifest.labels == "class" and manifest.class_names == ["run", "sit", "walk"]
    expected = {rel: manifest.class_names.index(rel.split("/")[0]) for rel in rels}
    assert labels_of(manifest) == expected
    chunks = record_labels(out, manifest)
    assert any(len(v) > 1 for v in chunks.values())  # chunked: the label is in every chunk record
    assert {source: set(v) for source, v in chunks.items()} == {rel: {label} for rel, label in expected.items()}
    assert manifest.features[LABEL_KEY]["dtype"] == "int64"
    assert read_manifest(out)["labels"] == "class"
    verify(str(out))
    assert load_manifest(str(out)) == manifest
    read = list(readers.episodes(str(out), "train").as_numpy_iterator())
    assert [int(e["label"]) for e in read] == [e.label for e in manifest.splits["train"].episodes]


def test_class_folders_under_split_folders_share_one_class_list(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    class_tree(src, splits=("train",), classes=("walk", "run"))
    class_tree(src / "val", classes=("sit", "walk"), per_class=1)  # a class the train split has none of

    manifest = convert_episode_tree(src, out)

    assert manifest.class_names == ["run", "sit", "walk"]
    assert labels_of(manifest) == {"train/run/ep0.npy": 0, "train/run/ep1.npy": 0, "train/walk/ep0.npy": 2,
                                   "train/walk/ep1.npy": 2, "val/sit/ep0.npy": 1, "val/walk/ep0.npy": 2}
    verify(str(out))


@pytest.mark.parametrize("layout", [
    ["a.npy", "b.npy"],  # flat
    ["walk/a.npy", "b.npy"],  # mixed depths
    ["walk/a.npy", "walk/b.npy"],  # one folder only
    ["walk/x/a.npy", "run/x/b.npy"],  # deeper
    ["walk/a.npy", "run/x/b.npy"],
])
def test_other_layouts_stay_unlabelled(tmp_path, layout):
    src, out = tmp_path / "src", tmp_path / "out"
    save_episodes(src, dict(zip(layout, random_episodes([4, 5]))))

    manifest = convert_episode_tree(src, out)

    assert manifest.labels is None and manifest.class_names == [] and LABEL_KEY not in manifest.features
    assert set(labels_of(manifest).values()) == {None}
    assert read_manifest(out)["labels"] is None
    verify(str(out))


def test_no_class_folders_turns_them_off(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    class_tree(src)
    manifest = convert_episode_tree(src, out, episode=EpisodeOptions(class_folders=False))
    assert manifest.labels is None and LABEL_KEY not in manifest.features


def test_an_unreadable_file_counts_for_the_class_folder_rule(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    class_tree(src, classes=("run", "sit"))
    os.symlink("nowhere.npy", src / "loose.npy")  # found, broken: one file not in a class folder
    manifest = convert_episode_tree(src, out, on_error="skip")
    assert manifest.labels is None and [r["path"] for r in manifest.rejected] == ["loose.npy"]


@pytest.mark.parametrize("name", ["label", "episode/label"])
def test_a_feature_named_label_is_refused_in_a_labelled_dataset_only(tmp_path, name):
    """Both names a labelled dataset gives its labels: ``label`` (what readers yield) and ``episode/label`` (the
    records' key and the resident arrays' one, where such a feature's array was overwritten by the labels)."""
    src = tmp_path / "src"
    save_episodes(src, {f"{c}/ep.npz": {"obs": np.ones((3, 2), np.float32), name: np.zeros(3)} for c in CLASSES})
    with pytest.raises(InputError, match=rf"ep\.npz: has an array named '{name}'.*rename the array, or convert "
                                         r"without labels \(--no-class-folders"):
        convert_episode_tree(src, tmp_path / "out")
    manifest = convert_episode_tree(src, tmp_path / "out2", episode=EpisodeOptions(class_folders=False))
    assert manifest.labels is None and f"data/{name}" in manifest.features


# --- a labels file ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, kind, class_names", [
    (["walk", "run", "walk"], "class", ["run", "walk"]),
    (["2", "10", "-1"], "class", ["-1", "2", "10"]),  # numeric order, not text order
    (["0.5", "1", "1e-3"], "value", []),
    (["3", "x"], "class", ["3", "x"]),
    (["7", "07", "+7"], "class", ["7"]),  # the same integer
    (["1", "", "2"], "class", ["1", "2"]),  # empty decides nothing (it is a bad value)
    (["1", "nan", "2.5"], "class", ["1", "2.5", "nan"]),  # only decimal numbers are numbers: 'nan' is a name
    (["1", "-" + "9" * 5000, "9" * 5000], "class", ["-" + "9" * 5000, "1", "9" * 5000]),  # int() takes 4,300 digits
])
def test_label_kind_over_every_value(values, kind, class_names):
    assert labels_lib.label_kind(values)[:2] == (kind, class_names)


def test_integer_classes_sort_as_int_sorts_them():
    rng = np.random.default_rng(0)
    numbers = [int(n) for n in rng.integers(-10**6, 10**6, 500)] + [0, 1, -1, 10, -10, 100, -100]
    texts = [f"{'+' if n >= 0 and i % 3 == 0 else ''}{'-' if n < 0 else ''}{'0' * (i % 2)}{abs(n)}"
             for i, n in enumerate(numbers)] + ["-0", "+0", "000"]
    kind, names, _ = labels_lib.label_kind(texts)
    assert kind == "class" and names == [str(n) for n in sorted(set(numbers))]


def flat_tree(src, count=4) -> list[str]:
    rels = [f"ep{i}.npy" for i in range(count)]
    save_episodes(src, dict(zip(rels, random_episodes(range(3, 3 + count)))))
    return rels


def test_labels_file_of_names_ints_and_floats(tmp_path):
    src = tmp_path / "src"
    class_tree(src, splits=("train", "val"), classes=("a", "b"), per_class=1)  # class folders, which the file overrides
    rels = ["train/a/ep0.npy", "train/b/ep0.npy", "val/a/ep0.npy", "val/b/ep0.npy"]
    cases = {
        "names": (["walk", "run", "walk", "sit"], "class", ["run", "sit", "walk"], [2, 0, 2, 1]),
        "ints": (["2", "10", "-1", "10"], "class", ["-1", "2", "10"], [1, 2, 0, 2]),
        "floats": (["0.1", "2", "-1e-3", "3.5"], "value", [], [float(np.float32(v)) for v in (0.1, 2, -1e-3, 3.5)]),
    }
    for name, (values, kind, class_names, labels) in cases.items():
        csv = write_csv(tmp_path / f"{name}.csv", "path,label\n" + "".join(f"{r},{v}\n" for r, v in zip(rels, values)))
        out = tmp_path / name
        manifest = convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))
        assert (manifest.labels, manifest.class_names) == (kind, class_names), name
        assert labels_of(manifest) == dict(zip(rels, labels)), name
        held = {source: [v.item() for v in chunk] for source, chunk in record_labels(out, manifest).items()}
        assert held == {rel: [label] for rel, label in zip(rels, labels)}, name  # float32 == the manifest's float
        assert manifest.features[LABEL_KEY]["dtype"] == ("float32" if kind == "value" else "int64")
        assert manifest.ignored["unlabelled"] == 0
        verify(str(out))


def test_labels_file_columns_header_and_unlabelled_episodes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "\ufeffnote,file,label\nx,ep0.npy,run\n\ny,./ep2.npy, sit \n")
    with pytest.raises(InputError):  # the path is the first column: "x" is no episode
        convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))
    csv = write_csv(tmp_path / "labels.csv", "\ufefffile,note,label\nep0.npy,x,run\n\n./ep2.npy,y, sit \n")

    manifest = convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))

    assert manifest.class_names == ["run", "sit"] and labels_of(manifest) == {"ep0.npy": 0, "ep2.npy": 1}
    assert manifest.ignored["unlabelled"] == 2 and manifest.ignored_files == ["ep1.npy", "ep3.npy"]
    assert manifest.rejected == []


def test_ids_without_npy_label_their_episodes_and_count_none_unlabelled(tmp_path):
    # Was: Kaggle-style ids (`ep0` for ep0.npy) labelled every episode, yet dataset.json and the summary called
    # every one unlabelled.
    from tfshard.tools.report import summary_lines

    src = tmp_path / "src"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "id,label\nep0,a\nep1,b\nep2,a\n")  # ep3 has no row

    manifest = convert_episode_tree(src, tmp_path / "out", episode=EpisodeOptions(labels_file=csv))

    assert labels_of(manifest) == {"ep0.npy": 0, "ep1.npy": 1, "ep2.npy": 0}
    assert manifest.ignored["unlabelled"] == 1 and manifest.ignored_files == ["ep3.npy"]
    assert "  labels: 3 episodes labelled (class, 2 classes (a, b)), 1 unlabelled (no row in the labels file; left " \
        "out)" in summary_lines("out", manifest)


def bad_rows_case(tmp_path) -> tuple:
    src = tmp_path / "src"
    flat_tree(src, count=5)
    (src / "notes.txt").write_text("not an episode")
    (src / "folder.npy").mkdir()
    csv = write_csv(tmp_path / "labels.csv", "\n".join([
        "path,label",  # row 1
        "ep0.npy,1.5",  # 2: good
        "missing.npy,2",  # 3: no such file
        "../ep1.npy,2",  # 4: leaves SRC
        "/abs/ep1.npy,2",  # 5: absolute
        "notes.txt,2",  # 6: not an episode file
        "folder.npy,2",  # 7: a folder
        "ep0.npy,3",  # 8: duplicate
        "ep1.npy,",  # 9: empty value (ep1 is left out)
        "ep2.npy,nan",  # 10: not a number (with --label-kind value)
        "ep3.npy,1e39",  # 11: outside float32
        "ep4.npy,2,extra",  # 12: too many columns
    ]) + "\n")
    return src, csv


def test_bad_rows_under_skip_are_recorded_with_their_row_numbers(tmp_path):
    src, csv = bad_rows_case(tmp_path)
    out = tmp_path / "out"

    manifest = convert_episode_tree(src, out, on_error="skip", episode=EpisodeOptions(labels_file=csv,
                                                                                      label_kind="value"))

    assert manifest.labels == "value" and labels_of(manifest) == {"ep0.npy": 1.5}
    reasons = {r["path"]: r["reason"] for r in manifest.rejected}
    expected = {
        "missing.npy,2": "labels.csv row 3: 'missing.npy' does not exist under SRC",
        "../ep1.npy,2": "labels.csv row 4: path '../ep1.npy' is not inside SRC",
        "/abs/ep1.npy,2": "labels.csv row 5: path '/abs/ep1.npy' is not inside SRC",
        "notes.txt,2": "labels.csv row 6: 'notes.txt' is not an input file",
        "folder.npy,2": "labels.csv row 7: 'folder.npy' is a folder",
        "ep0.npy,3": "labels.csv row 8: names 'ep0.npy' again (first on row 2)",
        "ep1.npy": "labels.csv row 9: an empty label",
        "ep2.npy": "labels.csv row 10: label 'nan' is not a number (--label-kind value)",
        "ep3.npy": "labels.csv row 11: label '1e39' is outside float32's range",
        "ep4.npy,2,extra": "labels.csv row 12: has 3 columns, the header has 2",
    }
    assert set(reasons) == set(expected)
    for path, start in expected.items():
        assert reasons[path].startswith(start), (path, reasons[path])
    assert manifest.ignored["unlabelled"] == 1 and manifest.ignored_files == ["ep4.npy", "notes.txt"]
    verify(str(out))


def test_a_bad_row_under_fail_is_one_line_naming_the_row_and_the_fix(tmp_path):
    src, csv = bad_rows_case(tmp_path)
    with pytest.raises(InputError) as caught:
        convert_episode_tree(src, tmp_path / "out", episode=EpisodeOptions(labels_file=csv))
    message = str(caught.value)
    assert message.startswith(f"{csv}: row 3: 'missing.npy' does not exist under SRC (got 'missing.npy,2'); "
                              "fix the path or remove the row, or pass --on-error skip")
    assert "\n" not in message
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("content, match", [
    (None, "labels file not found"),
    (b"", r"empty labels file \(no header row\)"),
    (b"path\nep0.npy\n", "header has no label column"),
    (b"path,a,b\nep0.npy,1,2\n", "has more than two columns and none named 'label'"),
    (b"path,label\nep0.npy,caf\xe9\n", "not UTF-8 text"),
    ("folder", "labels file is a folder, not a regular file"),
])
def test_a_bad_labels_file_is_one_line_naming_it(tmp_path, content, match):
    src = tmp_path / "src"
    flat_tree(src)
    path = tmp_path / "labels.csv"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=match) as caught:
        convert_episode_tree(src, tmp_path / "out", episode=EpisodeOptions(labels_file=str(path)))
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("labels, match", [
    ([[0.5, 1], [1, 2]], r"gives the label as a list of 2 numbers \(got \['id', 'label\[0\]', 'label\[1\]'\]\), a "
                         "vector, but an episode's label is one value; give each episode one number or class name"),
    ([["a", "b"], ["a"]], r"gives labels as JSON lists of names, which are multi-label, but an episode has one label"),
])
def test_json_lists_as_episode_labels_are_one_line(tmp_path, labels, match):
    # Was: a list of numbers a TypeError traceback from a worker; a list of names silently the class 'a;b'.
    src = tmp_path / "src"
    flat_tree(src)
    path = write_csv(tmp_path / "labels.jsonl", "".join(json.dumps({"id": f"ep{i}", "label": label}) + "\n"
                                                        for i, label in enumerate(labels)))
    with pytest.raises(InputError, match=match) as caught:
        convert_episode_tree(src, tmp_path / "out", on_error="skip", episode=EpisodeOptions(labels_file=path))
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)
    assert not os.path.exists(tmp_path / "out")


def test_rows_are_streamed_into_a_dict_of_paths(tmp_path):
    rows = 50_000  # linear in rows: one pass, one dict (quadratic would be ~10^9 steps: never ends)
    csv = write_csv(tmp_path / "big.csv", "path,label\n" + "".join(f"d/{i}.npy,{i % 7}\n" for i in range(rows)))
    with labels_lib.open_rows(csv) as read:
        labels, problems = labels_lib.decide(read, str(tmp_path), [f"d/{i}.npy" for i in range(rows)])
    assert len(labels.by_path) == rows and labels.by_path["d/123.npy"] == 4 and problems == []


# --- resume and identity ---------------------------------------------------------------------------------------------


def test_an_interrupted_labelled_conversion_resumes_byte_identically(tmp_path):
    src = tmp_path / "src"
    class_tree(src, classes=("run", "sit"))
    big = random_episodes([4000, 4000, 4000])
    save_episodes(src, {"sit/yy.npy": big[0], "sit/zzz.npy": big[2]})  # the plan puts zz.npz in the last shard
    np.savez_compressed(src / "sit" / "zz.npz", data=big[1])
    broken = bytearray((src / "sit" / "zz.npz").read_bytes())
    broken[len(broken) // 2] ^= 0xFF  # its header reads; its data does not load
    (src / "sit" / "zz.npz").write_bytes(bytes(broken))
    out, clean = tmp_path / "out", tmp_path / "clean"
    with pytest.raises(InputError, match="zz.npz"):
        convert_episode_tree(src, out, num_shards=2, seed=None)
    assert "train-00000-of-00002.tfrecord" in os.listdir(out) and "dataset.json" not in os.listdir(out)

    manifest = convert_episode_tree(src, out, num_shards=2, seed=None, on_error="skip")
    convert_episode_tree(src, clean, num_shards=2, seed=None, on_error="skip")

    assert manifest.labels == "class" and [r["path"] for r in manifest.rejected] == ["sit/zz.npz"]
    assert [len(s.episodes) for s in manifest.splits.values()] == [6]
    assert_same_tree(snapshot(out), snapshot(clean))
    again = convert_episode_tree(src, out, num_shards=2, seed=None, on_error="skip")  # complete: a no-op
    assert again == manifest and snapshot(out) == snapshot(clean)


def test_a_changed_labelling_is_another_dataset(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "path,label\nep0.npy,a\nep1.npy,b\n")
    first = convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))
    moved = write_csv(tmp_path / "same.csv", "path,label\nep1.npy,b\nep0.npy,a\n")  # the same labels elsewhere
    assert convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=moved)) == first

    write_csv(csv, "path,label\nep0.npy,b\nep1.npy,a\n")
    with pytest.raises(OutputExistsError, match="made from other inputs or options; pass --overwrite"):
        convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))
    with pytest.raises(OutputExistsError):
        convert_episode_tree(src, out)  # unlabelled: another dataset too
    second = convert_episode_tree(src, out, overwrite=True, episode=EpisodeOptions(labels_file=csv))
    assert labels_of(second) == {"ep0.npy": 1, "ep1.npy": 0} and second.fingerprint != first.fingerprint


def test_a_tampered_commit_record_label_is_refused(tmp_path):
    from tfshard.ingest.kinds.episodes import EpisodeJob
    from tfshard.ingest.options import ConvertOptions

    src = tmp_path / "src"
    class_tree(src, classes=("run", "sit"))
    job = EpisodeJob(str(src), ConvertOptions(on_error="fail"))
    raw = {"episodes": [{"id": 0, "source": "run/ep0.npy", "length": 3, "label": 0}], "sums": {}}
    assert job.stats_from_dict(raw, 1).episodes[0]["label"] == 0
    for label in (2, -1, None, True, 0.5):
        raw["episodes"][0]["label"] = label
        with pytest.raises(ValueError, match="label"):
            job.stats_from_dict(raw, 1)
    del raw["episodes"][0]["label"]
    with pytest.raises(ValueError, match="not an episode entry"):
        job.stats_from_dict(raw, 1)


# --- the manifest and verify against tampering ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled_golden(tmp_path_factory):
    """``class_tree`` converted once for this module, in 2 shards; read-only (``labelled`` hands out copies)."""
    root = tmp_path_factory.mktemp("labelled_golden")
    class_tree(root / "src")
    convert_episode_tree(root / "src", root / "out", num_shards=2)
    return root / "out"


@pytest.fixture
def labelled(labelled_golden, tmp_path):
    """A copy of ``labelled_golden`` the test may change, and its dataset.json as plain JSON: ``(out, raw)``."""
    out = tmp_path / "out"
    shutil.copytree(labelled_golden, out)
    return out, read_manifest(out)


def _episode(raw: dict) -> dict:
    return raw["splits"]["train"]["episodes"][0]


@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(labels="both"), r"field labels: must be null or one of \('class', 'value'\)"),
    (lambda m: m.update(labels=1), "field labels: must be null or one of"),
    (lambda m: m.update(class_names=[]), r"field class_names: must name the classes \(labels is 'class'\)"),
    (lambda m: m.update(labels="value"), "field class_names: must be empty"),
    (lambda m: m.update(labels=None), "field class_names: must be empty"),
    (lambda m: _episode(m).update(label=3), r"episodes\[0\].label: must be an index into the 3 class_names"),
    (lambda m: _episode(m).update(label=-1), r"episodes\[0\].label: must be an index"),
    (lambda m: _episode(m).update(label=True), r"episodes\[0\].label: must be an index"),
    (lambda m: _episode(m).update(label=None), r"episodes\[0\].label: must be an index"),
    (lambda m: _episode(m).update(label=1.0), r"episodes\[0\].label: must be an index"),
    (lambda m: m["features"].pop(LABEL_KEY), r"features\['episode/label'\]: must be a int64 feature"),
    (lambda m: m["features"][LABEL_KEY].update(dtype="float32"), r"features\['episode/label'\]: must be a int64"),
])
def test_untrusted_labels_fields_are_refused_naming_the_field(labelled, change, match):
    _, raw = labelled
    change(raw)
    with pytest.raises(ValueError, match=match):
        manifest_from_dict(raw)


@pytest.mark.parametrize("change, match", [
    (lambda m: (m.update(labels="value", class_names=[]), m["features"][LABEL_KEY].update(dtype="float32"),
                _episode(m).update(label=float("nan"))), r"label: must be a finite number \(labels is 'value'\)"),
    (lambda m: (m.update(labels=None, class_names=[]), m["features"].pop(LABEL_KEY)),
     r"label: must be null: the dataset has no labels"),
    (lambda m: (m.update(labels=None, class_names=[]), [e.update(label=None) for s in m["splits"].values()
                                                         for e in s["episodes"]]),
     r"features\['episode/label'\]: must be absent"),
    (lambda m: m.update(kind="images", labels="class"), "must be the record keys of class labels"),
])
def test_untrusted_labels_against_the_kind_and_features(labelled, change, match):
    _, raw = labelled
    change(raw)
    with pytest.raises(ValueError, match=match):
        manifest_from_dict(json.loads(json.dumps(raw)))


def test_an_old_manifest_without_labels_still_loads(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_tree(src)
    convert_episode_tree(src, out)
    raw = read_manifest(out)
    del raw["labels"]
    for split in raw["splits"].values():
        for episode in split["episodes"]:
            del episode["label"]
    write_manifest(out, raw)
    assert load_manifest(str(out)).labels is None
    verify(str(out))


def test_verify_names_the_shard_and_episode_of_a_label_that_differs_from_its_records(labelled):
    out, raw = labelled
    episode = _episode(raw)
    episode["label"] = (episode["label"] + 1) % 3
    write_manifest(out, raw)
    with pytest.raises(VerifyError) as caught:
        verify(str(out))
    shard = raw["splits"]["train"]["shards"][episode["shard"]]["file"]
    [problem] = caught.value.problems
    assert f"{shard}: episode {episode['id']} ({episode['source']}) has label " in problem
    assert f"in its records, the manifest says {episode['label']}" in problem


def test_verify_finds_labels_the_manifest_does_not_declare(labelled):
    out, raw = labelled
    edit_manifest(out, lambda m: (m.update(labels=None, class_names=[]), m["features"].pop(LABEL_KEY),
                                  [e.update(label=None) for s in m["splits"].values() for e in s["episodes"]]))
    with pytest.raises(VerifyError, match="not a tfshard episodes record"):  # an int64 label read as float32
        verify(str(out))


# --- the command line ------------------------------------------------------------------------------------------------


def test_cli_labels_file_info_and_a_bad_csv(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "path,label\nep0.npy,walk\nep1.npy,run\nep2.npy,walk\n")

    result = cli("episodes", src, out, "--labels", csv, "--workers", "0", "--num-shards", "1")

    assert result.exit_code == 0, result.output
    assert "labels: 3 episodes labelled (class, 2 classes (run, walk)), 1 unlabelled" in result.output
    info = cli("info", out)
    assert info.exit_code == 0, info.output
    assert "  labels: class, 2 classes (run, walk)\n" in info.output and "    labels: run 1, walk 2\n" in info.output

    write_csv(csv, "path,label\nep0.npy,walk\nnowhere.npy,run\n")
    bad = cli("episodes", src, tmp_path / "out2", "--labels", csv, "--workers", "0")
    assert bad.exit_code == 1 and bad.output.strip().count("\n") == 0 and "Traceback" not in bad.output
    assert f"{csv}: row 3: 'nowhere.npy' does not exist under SRC" in bad.output


def test_cli_label_kind_reads_integers_as_values_and_the_summary_says_why(tmp_path, cli):
    src = tmp_path / "src"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "path,label\nep0.npy,1\nep1.npy,2\nep2.npy,nan\nep3.npy,3\n")

    decided = cli("episodes", src, tmp_path / "out", "--labels", csv, "--workers", "0")
    forced = cli("episodes", src, tmp_path / "values", "--labels", csv, "--workers", "0", "--on-error", "skip",
                 "--label-kind", "value")
    multi = cli("episodes", src, tmp_path / "multi", "--labels", csv, "--label-kind", "multi")

    assert decided.exit_code == 0 and "label kind: class ('nan' is not a decimal number: class names, sorted; " \
        "pass --label-kind value to read the labels as numbers)" in decided.output
    assert forced.exit_code == 0 and "label kind: value (--label-kind value)" in forced.output
    assert labels_of(load_manifest(str(tmp_path / "values"))) == {"ep0.npy": 1.0, "ep1.npy": 2.0, "ep3.npy": 3.0}
    assert multi.exit_code == 1 and "--label-kind: must be 'class', 'value' or None for episodes" in multi.output


def test_cli_no_class_folders(tmp_path, cli):
    src, out = tmp_path / "src", tmp_path / "out"
    class_tree(src, classes=("run", "sit"), per_class=1)
    result = cli("episodes", src, out, "--no-class-folders", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert read_manifest(out)["labels"] is None and "labels:" not in result.output


def test_info_of_value_labels_shows_their_range(tmp_path):
    from tfshard.tools.report import describe_lines

    src, out = tmp_path / "src", tmp_path / "out"
    flat_tree(src)
    csv = write_csv(tmp_path / "labels.csv", "path,label\nep0.npy,0.5\nep1.npy,-2\nep2.npy,4\nep3.npy,1.5\n")
    manifest = convert_episode_tree(src, out, episode=EpisodeOptions(labels_file=csv))
    lines = describe_lines(str(out), manifest)
    assert "  labels: value (float32)" in lines and "    labels: min -2, mean 1, max 4" in lines
    assert "  labels: 4 episodes labelled (value (float32)), 0 unlabelled (no row in the labels file; left out)" \
        in lines


# =====================================================================================================================
# Hostile-user attacks on episode labels (issue 22): labels files that are not files, rows that play with paths,
# tampered manifests. Failing tests here are confirmed bugs.
# =====================================================================================================================


def _src(tmp_path, n=4):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        np.save(src / f"ep{i}.npy", np.full((5, 2), i, np.float32))
    return src


def _csv(tmp_path, rows, name="labels.csv"):
    path = tmp_path / name
    path.write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows), encoding="utf-8")
    return str(path)


def _convert(src, out, labels):
    options = ConvertOptions(episode=EpisodeOptions(labels_file=labels))
    return convert_episodes(str(src), str(out), options, workers=0, progress=False)


@pytest.fixture(scope="module")
def labelled_by_csv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labelled")
    src = _src(tmp)
    out = tmp / "out"
    _convert(src, out, _csv(tmp, [(f"ep{i}.npy", "ab"[i % 2]) for i in range(4)]))
    return out


def _tampered(labelled_by_csv, tmp_path, edit):
    out = tmp_path / "t"
    shutil.copytree(labelled_by_csv, out)
    with open(out / "dataset.json") as f:
        raw = json.load(f)
    edit(raw)
    with open(out / "dataset.json", "w") as f:
        json.dump(raw, f)
    return str(out)


# --- 1. the labels file is no file ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder"])
def test_labels_file_that_is_not_a_regular_file_is_one_line(tmp_path, kind):
    path = str(tmp_path / "labels.csv")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    else:
        os.mkdir(path)
    with pytest.raises(InputError, match="not a regular file") as e:
        open_rows(path)
    assert path in str(e.value) and "\n" not in str(e.value)


# --- 2. rows that play with paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("row", ["EP0.NPY", "ep0.NPY", "ep0.npy ", "src/ep0.npy", "../src/ep0.npy"])
def test_row_that_is_no_episode_path_is_refused(tmp_path, row):
    src = _src(tmp_path, 2)
    labels = _csv(tmp_path, [(row, "a"), ("ep1.npy", "b")])
    with pytest.raises(InputError, match="row 2"):
        _convert(src, tmp_path / "out", labels)


@pytest.mark.parametrize("row", ["run0", "run0.npy"])
def test_a_path_relative_to_its_split_folder_names_the_path_from_src(tmp_path, row):
    # Was: "'run0' does not exist under SRC; fix the path", with train/run0.npy right there.
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    np.save(src / "train" / "run0.npy", np.zeros((5, 2), np.float32))
    labels = _csv(tmp_path, [(row, "a")])
    with pytest.raises(InputError, match=rf"row 2: '{row}' does not exist under SRC, but 'train/run0\.npy' does "
                                         r".*; give the path relative to SRC, its folders included"):
        _convert(src, tmp_path / "out", labels)


def test_row_with_a_trailing_slash_names_a_folder_not_the_episode_file(tmp_path):
    # BUG: _clean_path's posixpath.normpath turns 'ep0.npy/' (a folder's path) into 'ep0.npy', so the row labels
    # the file; the docs say a row naming a folder is a bad row.
    src = _src(tmp_path, 2)
    labels = _csv(tmp_path, [("ep0.npy/", "a"), ("ep1.npy", "b")])
    with pytest.raises(InputError, match=r"row 2: path .ep0.npy/. names a folder, not an input file"):
        _convert(src, tmp_path / "out", labels)


# --- 3. tampered manifests --------------------------------------------------------------------------------------


def _episodes(raw):
    return next(iter(raw["splits"].values()))["episodes"]


TAMPERS = {
    "class_names_shortened": (lambda raw: raw.update(class_names=raw["class_names"][:1]), "label"),
    "bool_label": (lambda raw: _episodes(raw)[1].update(label=True), "label"),
    "float_label_in_class": (lambda raw: _episodes(raw)[1].update(label=1.0), "label"),
    "feature_removed": (lambda raw: raw["features"].pop("episode/label"), "episode/label"),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_label_manifest_is_refused_by_readers(labelled_by_csv, tmp_path, name):
    edit, field = TAMPERS[name]
    out = _tampered(labelled_by_csv, tmp_path, edit)
    with pytest.raises(Exception, match=field):
        list(readers.episodes(out, "train"))
    with pytest.raises(Exception, match=field):
        list(readers.windows(out, "train", length=3, batch_size=2, targets="label"))
    with pytest.raises(Exception, match=field):
        verify(out)


def test_value_label_nan_string_is_refused(labelled_by_csv, tmp_path):
    out = _tampered(labelled_by_csv, tmp_path, lambda raw: raw.update(labels="value", class_names=[]) or
                    raw["features"]["episode/label"].update(dtype="float32") or _episodes(raw)[0].update(label="NaN"))
    with open(os.path.join(out, "dataset.json")) as f:
        with pytest.raises(Exception, match="label"):
            manifest_from_dict(json.load(f))


def test_verify_refuses_duplicate_class_names_that_readers_refuse(labelled_by_csv, tmp_path):
    # BUG: readers refuse class_names ['a', 'a'] ("names a class a second time") but `tfshard verify` says OK:
    # verify loads the manifest without the consistency checks that hold the duplicate-name rule.
    out = _tampered(labelled_by_csv, tmp_path, lambda raw: raw.update(class_names=["a", "a"]))
    with pytest.raises(Exception, match="class_names"):
        list(readers.episodes(out, "train"))
    with pytest.raises((VerifyError, Exception), match="class_names"):
        verify(out)
