"""Attacks on `tfshard preview` (readers.preview) and `tfshard tfds` (TFDS metadata): real conversions, real
decodes, the real tensorflow-datasets, real processes. Seven of them found bugs, since fixed: a symlink planted at
OUT/.tmp-tfds, a planted temporary of `tfshard preview -o`, a deeply nested dataset_info.json, an empty split,
newlines in names, and a user's *.labels.txt file."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import convert_episode_tree, convert_image_tree, image_features, make_tree, save_episodes, write_jpeg
from PIL import Image
from tfshard import readers
from tfshard.ingest import ConvertOptions, EpisodeOptions, VerifyError, convert_images, verify
from tfshard.ingest.tfds import write_tfds_metadata
from tfshard.readers.image_ops import decode_center_crop
from tfshard.tools.preview import MAX_ROWS, _stats_text, sheet_size, tile_box

TFDS_NAMES = {"dataset_info.json", "features.json", "image.class.label.labels.txt"}
WHITE = 255


def _records(out: str, split: str = "train") -> list[dict]:
    """Every record of a split in manifest order, parsed with the manifest's own feature table."""
    paths = readers.info(out).shard_paths(split)
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, image_features()).items()}
            for r in tf.data.TFRecordDataset(paths)]


def _tile(sheet, row, column, tile) -> np.ndarray:
    return np.asarray(sheet.crop(tile_box(row, column, tile)))


def _first_of_each_class(out: str, split: str = "train") -> dict:
    first = {}
    for record in _records(out, split):
        first.setdefault(int(record["image/class/label"]), record["image/encoded"])
    return first


def _write(path, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def _snapshot(root, skip) -> dict:
    found = {}
    for folder, dirs, files in os.walk(root):
        if os.path.abspath(folder).startswith(os.path.abspath(skip)):
            continue
        for name in files + dirs:
            path = os.path.join(folder, name)
            if os.path.abspath(path) != os.path.abspath(skip):
                found[path] = (os.lstat(path).st_size, os.lstat(path).st_mtime_ns)
    return found


# ----------------------------------------------------------------------------------------------------- preview: images


def test_over_max_rows_classes_first_sixteen_rows_hold_the_readers_decode(tmp_path):
    make_tree(str(tmp_path / "src"), classes=[f"c{i:02d}" for i in range(MAX_ROWS + 4)], per_class=1, size=(40, 30))
    out = str(tmp_path / "out")
    convert_image_tree(tmp_path / "src", out, num_shards=2)
    sheet = readers.preview(out, n=3, tile=16)  # n larger than the one image per class
    assert sheet.size == sheet_size(MAX_ROWS, 3, 16)  # 16 rows, the footer says how many more
    first = _first_of_each_class(out)
    for row in range(MAX_ROWS):
        assert np.array_equal(_tile(sheet, row, 0, 16), decode_center_crop(first[row], (16, 16)).numpy()), row
        assert _tile(sheet, row, 1, 16).min() == WHITE and _tile(sheet, row, 2, 16).min() == WHITE
    footer = np.asarray(sheet.convert("L"))[-14:]
    assert footer.min() < 100  # the footer line is drawn


def test_grayscale_cmyk_unicode_and_overlong_names_draw_at_the_minimum_tile(tmp_path):
    src = tmp_path / "src"
    long_class, long_file = "ü" * 120, "é" * 100 + ".jpg"
    write_jpeg(str(src / "猫🐱" / "gray.jpg"), 1, size=(30, 20), mode="L")
    os.makedirs(src / long_class)
    Image.new("CMYK", (24, 36), (10, 200, 30, 0)).save(src / long_class / "cmyk.jpg")
    write_jpeg(str(src / long_class / long_file), 2, size=(17, 17))
    out = str(tmp_path / "out")
    convert_image_tree(src, out)
    names = readers.info(out).class_names
    first = {label: [r["image/encoded"] for r in _records(out) if r["image/class/label"] == label] for label in (0, 1)}
    for augmented in (False, True):
        sheet = readers.preview(out, n=2, tile=16, augmented=augmented, seed=7)
        assert sheet.size == sheet_size(len(names), 2, 16) and sheet.mode == "RGB"
    sheet = readers.preview(out, n=2, tile=16)
    for label in (0, 1):
        for column, encoded in enumerate(first[label]):
            assert np.array_equal(_tile(sheet, label, column, 16), decode_center_crop(encoded, (16, 16)).numpy())


@pytest.mark.parametrize("bad", [{"tile": 15}, {"tile": 0}, {"n": -1}, {"n": 0}, {"split": "nope"}])
def test_bad_sheet_arguments_are_value_errors_naming_the_dataset(image_tree, tmp_path, cli, bad):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    with pytest.raises(ValueError, match=str(out)):
        readers.preview(out, **bad)
    (option, value), = bad.items()
    flag = {"n": "-n"}.get(option, f"--{option}")
    result = cli("preview", out, "-o", tmp_path / "x.png", flag, value)
    assert result.exit_code == 1 and f"error: {out}" in result.output and not os.path.exists(tmp_path / "x.png")


def test_a_class_with_no_images_in_the_split_is_an_empty_labelled_row(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), classes=("a", "b"), per_class=2, splits=["train"])
    write_jpeg(str(src / "val" / "a" / "only.jpg"), 50, size=(20, 20))
    out = str(tmp_path / "out")
    convert_image_tree(src, out)
    assert readers.info(out).manifest.splits["val"].class_counts == {"a": 1, "b": 0}
    sheet = readers.preview(out, "val", n=2, tile=16)
    assert sheet.size == sheet_size(2, 2, 16)
    assert _tile(sheet, 0, 0, 16).min() < WHITE and _tile(sheet, 1, 0, 16).min() == WHITE
    top = tile_box(1, 0, 16)[1]
    assert np.asarray(sheet.crop((4, top, 140, top + 16)).convert("L")).min() < 100  # the name "b" is still written


def test_deleted_truncated_or_corrupt_shards_fail_clearly(image_tree, tmp_path, cli):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    shard = readers.info(out).shard_paths("train")[0]
    data = open(shard, "rb").read()
    cases = [(data[: len(data) // 2], ValueError, "not the size the manifest says"),
             (data[:100] + bytes(len(data) - 100), tf.errors.DataLossError, "corrupted record"),
             (None, FileNotFoundError, "is missing")]
    for content, error, message in cases:
        if content is None:
            os.remove(shard)
        else:
            with open(shard, "wb") as f:
                f.write(content)
        with pytest.raises(error, match=message):
            readers.preview(out, tile=16)
        result = cli("preview", out, "-o", tmp_path / "x.png", "--tile", "16")
        assert result.exit_code == 1 and message in result.output, result.output
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_newline_in_class_and_file_names_does_not_break_the_sheet(tmp_path):
    write_jpeg(str(tmp_path / "src" / "two\nlines" / "a\nb.jpg"), 3)
    out = str(tmp_path / "out")
    convert_image_tree(tmp_path / "src", out)
    assert readers.info(out).class_names == ["two\nlines"]  # the converter accepts it, so the sheet must draw it
    assert readers.preview(out, n=1, tile=16).size == sheet_size(1, 1, 16)


# -------------------------------------------------------------------------------------------------- preview: episodes


@pytest.fixture
def odd_episodes(tmp_path):
    """1-, 3- and 2-step episodes: 4-d float64, complex64, bool, int64, uint8, and inf/NaN kept (--on-nan keep)."""
    files = {}
    for i, steps in enumerate([1, 3, 2]):
        files[f"e{i}.npz"] = {"m": np.arange(steps * 24, dtype=np.float64).reshape(steps, 2, 3, 4),
                              "z": (np.arange(steps) + 1j).astype(np.complex64), "b": np.arange(steps) % 2 == 0,
                              "i": np.arange(steps, dtype=np.int64) * -5, "u": np.arange(steps, dtype=np.uint8),
                              "n": np.array([np.inf, np.nan, -np.inf][:steps], np.float32)}
    save_episodes(tmp_path / "eps", files)
    convert_episode_tree(tmp_path / "eps", tmp_path / "eps-out", episode=EpisodeOptions(on_nan="keep"))
    return str(tmp_path / "eps-out")


def test_episode_plot_of_odd_features_and_short_episodes(odd_episodes):
    info = readers.info(odd_episodes).manifest.splits["train"]
    assert info.feature_mean["n"] == [None]  # NaN kept: null in the manifest, n/a in the title
    assert _stats_text(info.feature_mean["n"], info.feature_std["n"]) == "mean [n/a], std [n/a]"
    assert "mean n/a" in _stats_text(info.feature_mean.get("z"), None)
    for options in ({}, {"length": 1, "shift": 1}, {"length": 3}, {"n": 10}):  # episode 0 has 1 step: no windows
        picture = readers.preview(odd_episodes, **options)
        assert picture.size == (1000, 220 * 7) and len(picture.getcolors(2**24)) > 50, options


@pytest.mark.parametrize("bad", [{"length": 0}, {"length": -3}, {"shift": 0}, {"shift": -1}, {"n": -2}, {"length": 50},
                                 {"length": 50, "shift": -1}, {"split": "nope"}])
def test_bad_episode_plot_arguments_are_value_errors_naming_the_dataset(odd_episodes, bad):
    with pytest.raises(ValueError, match=str(odd_episodes)):
        readers.preview(odd_episodes, **bad)


def test_episode_split_with_no_episodes_is_a_clear_error(tmp_path, cli):
    save_episodes(tmp_path / "e", {"train/a.npy": np.ones((4, 2), np.float32),
                                   "val/b.npy": np.full((4, 2), np.nan, np.float32)})
    out = tmp_path / "out"
    convert_episode_tree(tmp_path / "e", out, episode=EpisodeOptions(on_nan="skip"))
    assert list(readers.info(str(out)).manifest.splits) == ["train"]  # a split of only rejected inputs is left out
    with pytest.raises(ValueError, match=f"{out}.*no split 'val'"):
        readers.preview(str(out), "val")


# ------------------------------------------------------------------------------------------------------- preview: CLI


def test_cli_output_paths_directory_symlink_overwrite_and_failed_draws(image_tree, tmp_path, cli):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    pics = tmp_path / "pics"
    os.makedirs(pics / "taken.png")
    result = cli("preview", out, "-o", pics / "taken.png", "--tile", "16")
    assert result.exit_code == 1 and str(pics / "taken.png") in result.output
    assert os.path.isdir(pics / "taken.png") and os.listdir(pics) == ["taken.png"]  # no temporary left
    result = cli("preview", out, "-o", pics / "none" / "x.png")
    assert result.exit_code == 1 and "does not exist" in result.output
    (pics / "old.png").write_bytes(b"old")
    assert cli("preview", out, "-o", pics / "old.png", "--split", "nope").exit_code == 1
    assert (pics / "old.png").read_bytes() == b"old"  # a failed draw leaves the previous picture
    assert cli("preview", out, "-o", pics / "old.png", "--tile", "16", "-n", "1").exit_code == 0
    with Image.open(pics / "old.png") as picture:
        assert picture.format == "PNG" and picture.size == sheet_size(2, 1, 16)
    os.symlink(pics / "old.png", pics / "link.jpg")
    assert cli("preview", out, "-o", pics / "link.jpg", "--tile", "16").exit_code == 0
    with Image.open(pics / "link.jpg") as picture:
        assert picture.format == "JPEG" and picture.size == sheet_size(2, 8, 16)
    assert sorted(os.listdir(pics)) == ["link.jpg", "old.png", "taken.png"]


def test_cli_preview_does_not_write_through_a_planted_temporary_symlink(image_tree, tmp_path, cli):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    os.makedirs(tmp_path / "shared")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "shared" / f".tmp-{os.getpid()}-sheet.png")  # the CLI runs in this process
    result = cli("preview", out, "-o", tmp_path / "shared" / "sheet.png", "--tile", "16")
    assert victim.read_bytes() == b"precious", result.output
    assert not os.path.islink(tmp_path / "shared" / "sheet.png")


# ------------------------------------------------------------------------------------------------------------ tfds


def test_tfds_train_val_index_and_an_empty_class_match_every_record(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), classes=("a", "b", "c"), per_class=3, splits=["train"], size=(20, 12))
    write_jpeg(str(src / "val" / "a" / "v0.jpg"), 70, size=(10, 14), mode="L")
    write_jpeg(str(src / "val" / "c" / "v1.jpg"), 71)
    out = str(tmp_path / "out")
    convert_image_tree(src, out, index=True, num_shards=2)
    before = _snapshot(tmp_path, out)
    first = cli("tfds", out)
    assert first.exit_code == 0, first.output
    contents = {n: open(os.path.join(out, n), "rb").read() for n in TFDS_NAMES}
    assert cli("tfds", out).exit_code == 0  # twice: the same files again
    assert {n: open(os.path.join(out, n), "rb").read() for n in TFDS_NAMES} == contents
    builder = tfds.builder_from_directory(out)
    assert builder.info.features["image/class/label"].names == ["a", "b", "c"]
    for split, count in (("train", 9), ("val", 2)):
        theirs = list(builder.as_dataset(split=split).as_numpy_iterator())
        ours = _records(out, split)
        assert len(theirs) == len(ours) == count == builder.info.splits[split].num_examples
        for element, record in zip(theirs, ours):
            assert np.array_equal(element["image/encoded"],
                                  tf.io.decode_jpeg(record["image/encoded"], channels=3).numpy())
            for key in ("image/class/label", "image/filename", "image/class/text", "image/height", "image/width",
                        "image/channels", "image/format"):
                assert element[key] == record[key], key
    verify(out)
    assert _snapshot(tmp_path, out) == before  # nothing outside OUT changed
    assert not [n for n in os.listdir(out) if n.startswith(".tmp")]


def test_episode_dtypes_are_refused_with_a_reason_or_read_back_exactly(tmp_path):
    for dtype in ("float16", "uint64", "uint32", "complex64", "int8", "bool", "uint16"):
        values = (np.arange(14).reshape(7, 2) * 37 % 11).astype(dtype)
        if dtype == "uint64":
            values[3, 1] = 2**64 - 3
        save_episodes(tmp_path / dtype, {"e.npz": {"x": values}})
        out = str(tmp_path / f"{dtype}-out")
        convert_episode_tree(tmp_path / dtype, out)
        try:
            write_tfds_metadata(out)
        except ValueError as e:
            assert f"{out}: feature 'x': TFDS cannot decode" in str(e) and dtype in str(e)
            assert not TFDS_NAMES & set(os.listdir(out)), dtype
            continue
        (element,) = tfds.builder_from_directory(out).as_dataset(split="train").as_numpy_iterator()
        assert element["data/x"].dtype == values.dtype and np.array_equal(element["data/x"], values), dtype


def test_tfds_metadata_with_an_empty_split_opens_in_tfds(tmp_path):
    save_episodes(tmp_path / "e", {"train/a.npy": np.ones((4, 2), np.float32),
                                   "val/b.npy": np.full((4, 2), np.nan, np.float32)})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "e", out, episode=EpisodeOptions(on_nan="skip"))
    try:
        write_tfds_metadata(out)
    except ValueError as e:  # refusing, naming the split, is fine too
        assert "val" in str(e)
        return
    datasets = tfds.builder_from_directory(out).as_dataset()
    assert {s: len(list(d)) for s, d in datasets.items()} in ({"train": 1}, {"train": 1, "val": 0})


def test_tfds_while_another_process_holds_the_lock_fails_and_writes_nothing(image_tree, tmp_path, cli):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, sys, time\n"
        f"fd = os.open({os.path.join(out, '.tfshard-lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.pwrite(fd, json.dumps({'pid': os.getpid(), 'host': 'elsewhere'}).encode(), 0)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"{out}: locked by pid {holder.pid}"):
            write_tfds_metadata(out)
        result = cli("tfds", out)
        assert result.exit_code == 1 and "locked by" in result.output
        assert not TFDS_NAMES & set(os.listdir(out)) and ".tmp-tfds" not in os.listdir(out)
    finally:
        holder.kill()
        holder.wait()
    assert set(write_tfds_metadata(out)) == TFDS_NAMES


def test_a_file_or_fifo_planted_at_the_temporary_folder_is_replaced(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    temp = os.path.join(out, ".tmp-tfds")
    with open(temp, "w") as f:
        f.write("planted")
    assert set(write_tfds_metadata(out)) == TFDS_NAMES and not os.path.lexists(temp)
    os.mkfifo(temp)
    assert set(write_tfds_metadata(out)) == TFDS_NAMES and not os.path.lexists(temp)
    verify(out)


def test_a_symlink_planted_at_the_temporary_folder_deletes_nothing_outside_out(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    outside = tmp_path / "precious"
    os.makedirs(outside)
    (outside / "keep.txt").write_text("mine")
    os.symlink(outside, os.path.join(out, ".tmp-tfds"))
    try:
        write_tfds_metadata(out)
    except (ValueError, OSError, tf.errors.OpError):
        pass  # refusing is fine; deleting someone else's files is not
    assert (outside / "keep.txt").read_text() == "mine"


def test_verify_reports_unreadable_dataset_info_without_hanging(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    path = os.path.join(out, "dataset_info.json")

    def plant(make):
        if os.path.lexists(path):
            os.remove(path)
        make()
        with pytest.raises(VerifyError) as caught:
            verify(out)
        assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(f"{path}: not TFDS metadata")

    plant(lambda: os.mkfifo(path))  # would block an open()
    plant(lambda: os.symlink("/dev/zero", path))  # never ends
    for content in (b"\xff\x00 not json", json.dumps({"splits": {"train": 1}}).encode(), b"[1, 2]",
                    json.dumps({"splits": [{"name": "train", "shardLengths": ["x"]}]}).encode(), b""):
        plant(functools.partial(_write, path, content))
    plant(lambda: (_write(path, b""), os.truncate(path, (1 << 30) + 1)))  # sparse: over the size limit


def test_verify_reports_deeply_nested_dataset_info(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    with open(os.path.join(out, "dataset_info.json"), "w") as f:
        f.write("[" * 100_000)
    with pytest.raises(VerifyError, match="dataset_info.json: not TFDS metadata"):
        verify(out)


def test_conversions_after_tfds_leave_metadata_consistent_or_gone(tmp_path, cli):
    src = tmp_path / "src"
    make_tree(str(src), per_class=4)
    out = str(tmp_path / "out")
    assert cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2").exit_code == 0
    assert cli("tfds", out).exit_code == 0
    shard = readers.info(out).shard_paths("train")[0]
    os.remove(shard)  # damaged: a same-inputs rerun writes the same bytes again and keeps the metadata
    assert cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2").exit_code == 0
    assert TFDS_NAMES <= set(os.listdir(out))
    verify(out)
    assert len(list(tfds.builder_from_directory(out).as_dataset(split="train"))) == 8
    result = cli("images", src, out, "-q", "--workers", "0", "--num-shards", "2", "--overwrite")  # same inputs
    assert result.exit_code == 0, result.output
    verify(out)  # the metadata went with the old shards, or still describes the new ones
    if TFDS_NAMES & set(os.listdir(out)):
        assert len(list(tfds.builder_from_directory(out).as_dataset(split="train"))) == 8


def test_tfds_on_a_missing_or_non_dataset_folder_fails_and_creates_nothing(tmp_path, cli):
    from tfshard.format.names import is_output_name, is_tfds_name

    for name in ("../dataset_info.json", "a/features.json", "x.labels.txt/", "labels.txt", "dataset_info.json.tmp"):
        assert not is_tfds_name(name) and not is_output_name(name), name
    os.makedirs(tmp_path / "empty")
    for out in (tmp_path / "missing", tmp_path / "empty"):
        result = cli("tfds", out)
        assert result.exit_code == 1 and f"error: {out}" in result.output, result.output
    assert sorted(os.listdir(tmp_path)) == ["empty"] and os.listdir(tmp_path / "empty") == []


def test_overwrite_removes_only_the_tfds_files_tfshard_wrote(image_tree, tmp_path):
    out = str(tmp_path / "out")
    convert_image_tree(image_tree[0], out)
    write_tfds_metadata(out)
    for name in ("notes.txt", "my.labels.txt"):
        _write(os.path.join(out, name), b"user data")
    convert_images(image_tree[0], out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    left = set(os.listdir(out))
    assert not TFDS_NAMES & left and "notes.txt" in left
    assert "my.labels.txt" in left
