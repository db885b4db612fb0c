"""Round trips: ingest image folders → read the shards back with tf.data → compare with the source files."""

from __future__ import annotations

import collections
import hashlib
import io
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_image_tree, image_features, make_tree, shard_files, write_jpeg
from PIL import Image
from tfshard.ingest import ConvertOptions, ImageOptions, InputError, convert_images, load_manifest

FEATURES = image_features()


def read_split(out, manifest, split="train") -> list[dict]:
    """Every record of one split, in shard order then record order, as plain Python values."""
    files = [os.path.join(out, shard.file) for shard in manifest.splits[split].shards]
    dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, FEATURES))
    records = []
    for example in dataset.as_numpy_iterator():
        record = dict(example)
        record["image/filename"] = record["image/filename"].decode("utf-8")
        record["image/class/text"] = record["image/class/text"].decode("utf-8")
        records.append(record)
    return records


def read_all(out, manifest) -> dict[str, dict]:
    """{filename: record} over every split; asserts no filename is in two records."""
    records = [r for split in manifest.splits for r in read_split(out, manifest, split)]
    counts = collections.Counter(r["image/filename"] for r in records)
    assert [name for name, n in counts.items() if n > 1] == []
    return {r["image/filename"]: r for r in records}


def save(path, image: Image.Image, fmt: str, **kwargs) -> bytes:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image.save(path, fmt, **kwargs)
    with open(path, "rb") as f:
        return f.read()


def noise(seed: int, size=(16, 16), channels=3) -> np.ndarray:
    shape = (size[1], size[0], channels) if channels > 1 else (size[1], size[0])
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def pil_decode(data: bytes) -> np.ndarray:
    """PIL's full decode as (h, w, c) uint8."""
    array = np.asarray(Image.open(io.BytesIO(data)))
    return array[..., None] if array.ndim == 2 else array


def mixed_size_tree(src) -> dict[str, bytes]:
    """Three classes of JPEGs whose widths and heights differ (so a swap shows), plus two grayscale ones."""
    written = make_tree(src, classes=("cat", "dog", "emu"), per_class=4, size=(24, 16))
    for i, size in enumerate([(16, 32), (32, 24), (17, 23)]):
        rel = f"dog/odd_{i}.jpg"
        written[rel] = write_jpeg(os.path.join(src, rel), 100 + i, size)
    for i in range(2):
        rel = f"emu/gray_{i}.jpg"
        written[rel] = write_jpeg(os.path.join(src, rel), 200 + i, (20, 16), mode="L")
    return written


# --- every image in exactly one record, with the right fields ------------------------------------------------------


def test_every_source_image_is_in_exactly_one_record_with_its_fields(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = mixed_size_tree(str(src))

    manifest = convert_image_tree(src, out, num_shards=3)

    records = read_all(str(out), manifest)
    assert sorted(records) == sorted(written)
    classes = ["cat", "dog", "emu"]
    assert manifest.class_names == classes
    for rel, data in written.items():
        record = records[rel]
        source = Image.open(io.BytesIO(data))
        assert record["image/class/text"] == rel.split("/")[0], rel
        assert record["image/class/label"] == classes.index(rel.split("/")[0]), rel
        assert (record["image/width"], record["image/height"]) == source.size, rel
        assert record["image/channels"] == (1 if source.mode == "L" else 3), rel
        assert record["image/format"] == b"jpeg"
        assert record["image/encoded"] == data, f"{rel}: passthrough JPEG bytes changed"


def test_passthrough_records_decode_like_the_source(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = mixed_size_tree(str(src))

    manifest = convert_image_tree(src, out)

    records = read_all(str(out), manifest)
    worst_default = 0
    for rel, data in written.items():
        record = records[rel]
        encoded = record["image/encoded"]
        decoded = tf.io.decode_jpeg(encoded).numpy()
        assert decoded.shape == (record["image/height"], record["image/width"], record["image/channels"])
        np.testing.assert_array_equal(decoded, tf.io.decode_jpeg(data).numpy(), err_msg=rel)
        reference = pil_decode(data)
        # libjpeg-turbo's accurate integer IDCT is what PIL uses: bit-exact.
        accurate = tf.io.decode_jpeg(encoded, dct_method="INTEGER_ACCURATE").numpy()
        np.testing.assert_array_equal(accurate, reference, err_msg=rel)
        worst_default = max(worst_default, int(np.abs(decoded.astype(int) - reference).max()))
    # TF's default dct_method is INTEGER_FAST (AAN IDCT); on these noise images it strays up to 6 levels from
    # PIL's ISLOW decode (measured: 5-6 over 160 seeded noise JPEGs), never more.
    assert worst_default <= 6


# --- split layout ----------------------------------------------------------------------------------------------------


def test_split_folders_are_splits_and_labels_are_shared_across_splits(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    layout = {"train": ("cat", "dog", "emu"), "val": ("cat", "emu"), "test": ("dog",)}  # dog missing from val
    written = {}
    for i, (split, classes) in enumerate(layout.items()):
        for rel, data in make_tree(str(src / split), classes=classes, per_class=3, seed=100 * i).items():
            written[f"{split}/{rel}"] = data

    manifest = convert_image_tree(src, out, num_shards=2)

    assert manifest.class_names == ["cat", "dog", "emu"]
    assert sorted(manifest.splits) == ["test", "train", "val"]
    assert shard_files(str(out)) == sorted(f"{s}-{i:05d}-of-00002.tfrecord" for s in layout for i in range(2))
    assert sorted(os.listdir(out)) == sorted(shard_files(str(out)) + ["dataset.json", "inputs.json"])
    for split, classes in layout.items():
        records = read_split(str(out), manifest, split)
        assert sorted(r["image/filename"] for r in records) == sorted(r for r in written if r.startswith(split + "/"))
        for record in records:
            name = record["image/filename"].split("/")[1]
            assert record["image/class/text"] == name
            assert record["image/class/label"] == ["cat", "dog", "emu"].index(name)
            assert record["image/encoded"] == written[record["image/filename"]]
        assert manifest.splits[split].class_counts == {c: (3 if c in classes else 0) for c in ["cat", "dog", "emu"]}
        assert manifest.splits[split].records == 3 * len(classes)


def test_validation_is_a_split_name(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(str(src / "train"), per_class=2)
    make_tree(str(src / "validation"), per_class=2, seed=50)

    manifest = convert_image_tree(src, out)

    assert sorted(manifest.splits) == ["train", "validation"]
    assert shard_files(str(out)) == ["train-00000-of-00001.tfrecord", "validation-00000-of-00001.tfrecord"]
    assert {r["image/filename"] for r in read_split(str(out), manifest, "validation")} == {
        f"validation/{c}/{i:03d}.jpg" for c in ("cat", "dog") for i in range(2)
    }


def test_mixing_split_folders_and_class_folders_is_an_error(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src / "train"), per_class=2)
    make_tree(str(src), classes=("zebra",), per_class=2)

    with pytest.raises(InputError, match="zebra") as error:
        convert_image_tree(src, tmp_path / "out")

    assert str(src) in str(error.value)
    assert not (tmp_path / "out").exists()


# --- image options ---------------------------------------------------------------------------------------------------


def test_grayscale_jpeg_passes_through_as_one_channel(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    data = write_jpeg(str(src / "cat" / "gray.jpg"), 1, (24, 16), mode="L")

    record = read_all(str(out), convert_image_tree(src, out))["cat/gray.jpg"]

    assert record["image/channels"] == 1
    assert record["image/encoded"] == data
    assert tf.io.decode_jpeg(record["image/encoded"]).shape == (16, 24, 1)


def test_rgb_option_makes_grayscale_three_channels(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    data = write_jpeg(str(src / "cat" / "gray.jpg"), 1, (24, 16), mode="L")

    manifest = convert_image_tree(src, out, image=ImageOptions(rgb=True))

    record = read_all(str(out), manifest)["cat/gray.jpg"]
    assert record["image/channels"] == 3
    assert (record["image/height"], record["image/width"]) == (16, 24)
    decoded = tf.io.decode_jpeg(record["image/encoded"]).numpy().astype(int)
    assert decoded.shape == (16, 24, 3)
    # R=G=B up to chroma rounding, and close to the grey source (re-encoded at quality 95).
    assert np.abs(decoded - decoded[..., :1]).max() <= 2
    assert np.abs(decoded.mean(-1) - pil_decode(data)[..., 0]).mean() < 4
    assert manifest.options["converted_images"] == 1


@pytest.mark.parametrize(
    "size, expected",
    [((32, 24), (16, 12)), ((16, 32), (8, 16)), ((30, 20), (16, 11)), ((20, 30), (11, 16)), ((12, 10), (12, 10))],
)
def test_max_side_resizes_keeping_aspect_ratio(tmp_path, size, expected):
    src, out = tmp_path / "src", tmp_path / "out"
    data = write_jpeg(str(src / "cat" / "x.jpg"), 3, size)
    save(str(src / "cat" / "y.png"), Image.fromarray(noise(4, size)), "PNG")

    records = read_all(str(out), convert_image_tree(src, out, image=ImageOptions(max_side=16)))

    for rel in ("cat/x.jpg", "cat/y.png"):
        record = records[rel]
        assert (record["image/width"], record["image/height"]) == expected, rel
        assert tf.io.decode_jpeg(record["image/encoded"]).shape == (expected[1], expected[0], 3), rel
    assert (records["cat/x.jpg"]["image/encoded"] == data) == (size == expected)


@pytest.mark.parametrize(
    "options, expected",
    [
        ({}, 1),
        ({"num_shards": 4}, 4),
        ({"num_shards": 2, "min_shards": 3}, 3),
        ({"min_shards": 5}, 5),
        ({"shard_bytes": "third"}, 3),
        ({"shard_bytes": "quarter", "num_shards": 2}, 2),  # num_shards wins over shard_bytes
        ({"shard_bytes": 1}, 12),  # never more shards than records
    ],
)
def test_shard_count_options(image_tree, tmp_path, options, expected):
    src, written = image_tree
    out = tmp_path / "out"
    total = sum(len(data) for data in written.values())
    if options.get("shard_bytes") == "third":
        options["shard_bytes"] = math.ceil(total / 3)
    elif options.get("shard_bytes") == "quarter":
        options["shard_bytes"] = math.ceil(total / 4)

    manifest = convert_image_tree(src, out, **options)

    assert shard_files(str(out)) == [f"train-{i:05d}-of-{expected:05d}.tfrecord" for i in range(expected)]
    shards = manifest.splits["train"].shards
    assert [s.file for s in shards] == shard_files(str(out))
    assert all(s.records >= 1 for s in shards)
    assert sum(s.records for s in shards) == len(written)
    assert sorted(read_all(str(out), manifest)) == sorted(written)


def test_more_shards_than_images_is_an_input_error(image_tree, tmp_path):
    src, _ = image_tree

    # convert_images documents InputError for "too few images for the shards asked".
    with pytest.raises(InputError, match="13 shards"):
        convert_image_tree(src, tmp_path / "out", num_shards=13)


def test_same_seed_gives_byte_identical_output(image_tree, tmp_path):
    src, _ = image_tree
    convert_image_tree(src, tmp_path / "a", seed=7, num_shards=2)
    convert_image_tree(src, tmp_path / "b", seed=7, num_shards=2)

    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b")) == sorted(shard_files(str(tmp_path / "a")) + ["dataset.json",
                                                                                               "inputs.json"])
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_seed_changes_record_order_and_none_keeps_sorted_order(image_tree, tmp_path):
    src, written = image_tree
    orders = {}
    for seed in (None, 0, 1):
        out = tmp_path / f"out-{seed}"
        manifest = convert_image_tree(src, out, seed=seed, num_shards=3)
        orders[seed] = [r["image/filename"] for r in read_split(str(out), manifest)]

    assert orders[None] == sorted(written)
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(written)
    assert orders[0] != orders[None]
    assert orders[1] != orders[None]
    assert orders[0] != orders[1]


def test_extensions_in_any_case_and_ignored_files(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    rgb = Image.fromarray(noise(1))
    save(str(src / "cat" / "a.JPG"), rgb, "JPEG")
    save(str(src / "cat" / "b.Jpeg"), rgb, "JPEG")
    save(str(src / "cat" / "c.png"), rgb, "PNG")
    save(str(src / "dog" / "d.bmp"), rgb, "BMP")
    save(str(src / "dog" / "e.gif"), rgb, "GIF")
    save(str(src / "dog" / "f.webp"), rgb, "WEBP")
    save(str(src / "dog" / "sub" / "g.PNG"), rgb, "PNG")  # a class folder's subfolder belongs to the class
    save(str(src / "dog" / "h.tiff"), rgb, "TIFF")
    save(str(src / "dog" / "i.TIF"), rgb, "TIFF")
    # Hidden: 2 files, a hidden folder inside a class and a hidden top-level folder (each counted once).
    save(str(src / "cat" / ".hidden.jpg"), rgb, "JPEG")
    (src / "dog" / "._d.jpg").write_bytes(b"AppleDouble junk")
    save(str(src / "cat" / ".thumbs" / "t.jpg"), rgb, "JPEG")
    save(str(src / ".git" / "objects" / "x.jpg"), rgb, "JPEG")
    (src / ".DS_Store").write_bytes(b"\0")
    # Other: not image extensions.
    (src / "README.md").write_text("about")
    (src / "cat" / "notes.txt").write_text("notes")
    (src / "dog" / "labels.csv").write_text("a,b")

    manifest = convert_image_tree(src, out)

    assert manifest.class_names == ["cat", "dog"]
    assert sorted(read_all(str(out), manifest)) == [
        "cat/a.JPG", "cat/b.Jpeg", "cat/c.png", "dog/d.bmp", "dog/e.gif", "dog/f.webp", "dog/h.tiff", "dog/i.TIF",
        "dog/sub/g.PNG",
    ]
    assert manifest.rejected == []
    assert manifest.ignored == {"hidden": 5, "other": 3}
    assert manifest.ignored_files == ["README.md", "cat/notes.txt", "dog/labels.csv"]  # hidden ones: counted only


def test_train_and_valid_folders_are_splits(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = make_tree(str(src), classes=("cat", "dog"), per_class=3, splits=["train", "valid"])

    manifest = convert_image_tree(src, out)

    assert sorted(manifest.splits) == ["train", "valid"]
    for split in ("train", "valid"):
        got = {r["image/filename"]: r["image/encoded"] for r in read_split(str(out), manifest, split)}
        assert got == {rel: data for rel, data in written.items() if rel.startswith(split + "/")}


def test_folders_that_are_no_split_name_beside_split_folders_are_refused_naming_them(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), classes=("cat",), per_class=2, splits=["train", "dev"])
    with pytest.raises(InputError, match=re.escape(
        f"{src}: mixes split folders (train) with folders that are not split names (got ['dev']); split folders "
        "must be named train, val, valid, validation, test: rename those folders, move them into a split folder, "
        "or use no split folders"
    )):
        convert_image_tree(src, tmp_path / "out")


def test_ignored_files_are_named_in_sorted_order_up_to_a_cap(tmp_path):
    from tfshard.ingest.scan import MAX_LISTED_IGNORED

    src = tmp_path / "src"
    make_tree(str(src), per_class=1)
    names = [f"cat/label-{i:03d}.txt" for i in reversed(range(MAX_LISTED_IGNORED + 50))]
    for rel in names:
        (src / rel).write_text("x")

    manifest = convert_image_tree(src, tmp_path / "out")

    assert manifest.ignored == {"hidden": 0, "other": MAX_LISTED_IGNORED + 50}
    assert manifest.ignored_files == sorted(names)[:MAX_LISTED_IGNORED]


# --- dataset.json ----------------------------------------------------------------------------------------------------


def test_manifest_shards_counts_and_classes_match_the_files(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(str(src / "train"), classes=("cat", "dog"), per_class=5)
    make_tree(str(src / "val"), classes=("cat",), per_class=3, seed=40)

    manifest = convert_image_tree(src, out, num_shards=2)

    assert load_manifest(str(out)) == manifest
    assert manifest.class_names == ["cat", "dog"]
    assert manifest.splits["train"].class_counts == {"cat": 5, "dog": 5}
    assert manifest.splits["val"].class_counts == {"cat": 3, "dog": 0}
    for name, split in manifest.splits.items():
        assert split.records == sum(s.records for s in split.shards) == len(read_split(str(out), manifest, name))
        assert split.bytes == sum(s.bytes for s in split.shards)
        for shard in split.shards:
            data = (out / shard.file).read_bytes()
            assert shard.bytes == len(data), shard.file
            assert shard.sha256 == hashlib.sha256(data).hexdigest(), shard.file
            assert shard.records == sum(1 for _ in tf.data.TFRecordDataset(str(out / shard.file))), shard.file


def test_pixel_stats_of_png_inputs_equal_numpy_over_the_decoded_images(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    arrays = []
    for i in range(4):
        pixels = noise(i, (16 + 4 * i, 16))
        pixels[..., 1] //= 2  # channels differ, so a channel mix-up shows
        save(str(src / ("cat" if i % 2 else "dog") / f"{i}.png"), Image.fromarray(pixels), "PNG")
        arrays.append(pixels.reshape(-1, 3))
    gray = noise(9, (16, 16), channels=1)
    save(str(src / "cat" / "gray.png"), Image.fromarray(gray), "PNG")  # counted as R=G=B
    arrays.append(np.repeat(gray.reshape(-1, 1), 3, axis=1))

    manifest = convert_image_tree(src, out)

    everything = np.concatenate(arrays).astype(np.float64) / 255
    np.testing.assert_allclose(manifest.splits["train"].pixel_mean, everything.mean(0), atol=2e-6)
    np.testing.assert_allclose(manifest.splits["train"].pixel_std, everything.std(0), atol=2e-6)


def test_pixel_mean_of_passthrough_jpegs_is_close_to_the_full_decode(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    written = mixed_size_tree(str(src))

    manifest = convert_image_tree(src, out)

    assert manifest.options["converted_images"] == 0
    pixels = [np.repeat(a, 3, -1) if a.shape[-1] == 1 else a for a in map(pil_decode, written.values())]
    everything = np.concatenate([a.reshape(-1, 3) for a in pixels]).astype(np.float64) / 255
    np.testing.assert_allclose(manifest.splits["train"].pixel_mean, everything.mean(0), atol=0.01)
    # The 1/8-scale decode understates the std (the docstring says so), but it is no mere placeholder.
    assert all(0 < s <= full for s, full in zip(manifest.splits["train"].pixel_std, everything.std(0)))


# --- parallel decode -------------------------------------------------------------------------------------------------


def test_two_workers_write_the_same_bytes_as_in_process(tmp_path):
    src = tmp_path / "src"
    mixed_size_tree(str(src))
    save(str(src / "cat" / "png.jpg"), Image.fromarray(noise(5)), "PNG")
    (src / "dog" / "empty.jpg").write_bytes(b"")
    options = ConvertOptions(num_shards=3, seed=3)

    serial = convert_images(str(src), str(tmp_path / "w0"), options, workers=0, progress=False)
    parallel = convert_images(str(src), str(tmp_path / "w2"), options, workers=2, progress=False)

    assert serial == parallel
    names = sorted(os.listdir(tmp_path / "w0"))
    assert names == sorted(os.listdir(tmp_path / "w2"))
    assert len(names) == 5  # 3 shards, dataset.json, inputs.json
    for name in names:
        assert (tmp_path / "w0" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name


def test_records_hold_exactly_the_keys_the_manifest_declares(converted_images):
    """What is written is what ``features`` in dataset.json says: no key more, none less (one home for the keys)."""
    out = converted_images.out
    manifest = load_manifest(out)
    (shard,) = manifest.splits["train"].shards
    for record in tf.data.TFRecordDataset(os.path.join(out, shard.file)).as_numpy_iterator():
        assert set(tf.train.Example.FromString(record).features.feature) == set(manifest.features)
