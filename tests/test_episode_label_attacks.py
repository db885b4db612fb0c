"""Hostile-user attacks on episode labels (issue 22): labels files that are not files, rows that play with paths,
tampered manifests. Failing tests here are confirmed bugs."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from tfshard import readers
from tfshard.format.untrusted import manifest_from_dict
from tfshard.ingest import ConvertOptions, EpisodeOptions, InputError, VerifyError, convert_episodes, verify
from tfshard.ingest.labels import open_rows


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
def labelled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labelled")
    src = _src(tmp)
    out = tmp / "out"
    _convert(src, out, _csv(tmp, [(f"ep{i}.npy", "ab"[i % 2]) for i in range(4)]))
    return out


def _tampered(labelled, tmp_path, edit):
    out = tmp_path / "t"
    shutil.copytree(labelled, out)
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
def test_tampered_label_manifest_is_refused_by_readers(labelled, tmp_path, name):
    edit, field = TAMPERS[name]
    out = _tampered(labelled, tmp_path, edit)
    with pytest.raises(Exception, match=field):
        list(readers.episodes(out, "train"))
    with pytest.raises(Exception, match=field):
        list(readers.windows(out, "train", length=3, batch_size=2, targets="label"))
    with pytest.raises(Exception, match=field):
        verify(out)


def test_value_label_nan_string_is_refused(labelled, tmp_path):
    out = _tampered(labelled, tmp_path, lambda raw: raw.update(labels="value", class_names=[]) or
                    raw["features"]["episode/label"].update(dtype="float32") or _episodes(raw)[0].update(label="NaN"))
    with open(os.path.join(out, "dataset.json")) as f:
        with pytest.raises(Exception, match="label"):
            manifest_from_dict(json.load(f))


def test_verify_refuses_duplicate_class_names_that_readers_refuse(labelled, tmp_path):
    # BUG: readers refuse class_names ['a', 'a'] ("names a class a second time") but `tfshard verify` says OK:
    # verify loads the manifest without the consistency checks that hold the duplicate-name rule.
    out = _tampered(labelled, tmp_path, lambda raw: raw.update(class_names=["a", "a"]))
    with pytest.raises(Exception, match="class_names"):
        list(readers.episodes(out, "train"))
    with pytest.raises((VerifyError, Exception), match="class_names"):
        verify(out)
