"""readers.images(): every record once, labels right, seeded determinism, per-pipeline shards, augmentation."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    convert_image_tree,
    edit_manifest,
    flat_jpegs,
    labels_of,
    make_tree,
    random_episodes,
    read_manifest,
    save_episodes,
    write_manifest,
    write_text,
)
from PIL import Image
from tfshard import readers
from tfshard.ingest import ConvertOptions, ImageOptions, convert_images
from tfshard.readers import image_ops, options, python_steps

NUM_CLASSES = 24


def _colour(label: int) -> tuple[int, int, int]:
    """A distinct flat colour per class, far enough apart to survive JPEG and resizing."""
    return (label * 10 % 256, 255 - label * 10 % 256, (label * 37) % 256)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """24 classes, one flat-coloured 40x32 JPEG each, in 4 shards: labels identify records."""
    root = tmp_path_factory.mktemp("reader")
    src, out = root / "src", root / "out"
    for label in range(NUM_CLASSES):
        folder = src / f"c{label:02d}"
        folder.mkdir(parents=True)
        Image.new("RGB", (40, 32), _colour(label)).save(folder / "img.jpg", quality=95)
    convert_images(str(src), str(out), ConvertOptions(num_shards=4), workers=0, progress=False)
    return str(out)


def test_info_gives_class_names_counts_and_steps(dataset):
    info = readers.info(dataset)
    assert info.class_names == [f"c{i:02d}" for i in range(NUM_CLASSES)]
    assert info.num_records("train") == NUM_CLASSES
    assert info.steps_per_epoch("train", 5) == 4 and info.steps_per_epoch("train", 5, drop_remainder=False) == 5


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("cache", [None, "memory"])
def test_every_record_exactly_once_per_epoch(dataset, training, cache):
    ds = readers.images(dataset, batch_size=5, image_size=(16, 16), training=training, seed=1, cache=cache,
                        drop_remainder=False)
    for _ in range(2):  # no repeat: each epoch is one pass
        assert sorted(labels_of(ds)) == list(range(NUM_CLASSES))


def test_output_types_shapes_and_range(dataset):
    images, labels = next(iter(readers.images(dataset, batch_size=4, image_size=(16, 12), seed=0)))
    assert images.dtype == tf.float32 and images.shape == (4, 16, 12, 3)
    assert labels.dtype == tf.int64 and labels.shape == (4,)
    assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0


def test_eval_pixels_match_their_label(dataset):
    ds = readers.images(dataset, batch_size=8, image_size=(8, 8), training=False, drop_remainder=False)
    for images, labels in ds:
        for image, label in zip(images.numpy(), labels.numpy()):
            np.testing.assert_allclose(image.mean(axis=(0, 1)) * 255, _colour(int(label)), atol=6)


def test_eval_is_in_file_order_and_reproducible(dataset):
    a = labels_of(readers.images(dataset, batch_size=7, image_size=(8, 8), training=False, drop_remainder=False))
    b = labels_of(readers.images(dataset, batch_size=7, image_size=(8, 8), training=False, drop_remainder=False))
    assert a == b


def _epochs(ds, n=2):
    return [[(images.numpy(), labels.numpy()) for images, labels in ds] for _ in range(n)]


def _same(epoch_a, epoch_b) -> bool:
    return all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(epoch_a, epoch_b))


@pytest.mark.parametrize("cache", [None, "memory"])
def test_seed_gives_the_same_stream_and_epochs_differ(dataset, cache):
    def make():
        return readers.images(dataset, batch_size=6, image_size=(16, 16), seed=7, cache=cache)

    first, second = _epochs(make()), _epochs(make())
    assert _same(first[0], second[0]) and _same(first[1], second[1])  # reproducible, epoch by epoch
    assert not _same(first[0], first[1])  # but each epoch is shuffled and augmented anew


def test_without_seed_runs_differ(dataset):
    def make():
        return readers.images(dataset, batch_size=6, image_size=(16, 16))

    assert not _same(_epochs(make(), 1)[0], _epochs(make(), 1)[0])


def test_augmentation_happens_after_the_cache(dataset, tmp_path):
    """A cached training pipeline still augments differently every epoch (the cache holds un-augmented images).

    The images are flat colours, which crop and flip leave as they are: the colour recipe's jitter shows.
    """
    ds = readers.images(dataset, batch_size=NUM_CLASSES, image_size=(16, 16), seed=3, cache=str(tmp_path),
                        shuffle_buffer=1, augment="color")
    (a_images, a_labels), = list(ds)
    (b_images, b_labels), = list(ds)
    assert len(list(tmp_path.glob("tfshard-*.index"))) == 1  # the first epoch wrote a complete cache
    order_a, order_b = np.argsort(a_labels.numpy()), np.argsort(b_labels.numpy())
    assert not np.allclose(a_images.numpy()[order_a], b_images.numpy()[order_b])


def test_no_augmentation_and_a_callable(dataset):
    plain = readers.images(dataset, batch_size=4, image_size=(8, 8), seed=0, augment=None, cache="memory")
    calls = []

    def invert(images, seed):
        calls.append(seed.shape)
        return 1.0 - images

    custom = readers.images(dataset, batch_size=4, image_size=(8, 8), seed=0, augment=invert, cache="memory")
    (p, _), (c, _) = next(iter(plain)), next(iter(custom))
    assert calls == [tf.TensorShape([2])]  # traced once, with a stateless seed
    np.testing.assert_allclose(c.numpy(), 1.0 - p.numpy(), atol=1e-6)  # same crop and order, then the callable


@pytest.mark.parametrize("pipelines", [2, 3, 4])
def test_input_pipelines_read_disjoint_complete_shares(dataset, pipelines):
    seen = []
    for pipeline in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=pipeline)
        seen.append(labels_of(readers.images(dataset, batch_size=1, image_size=(8, 8), training=False,
                                           input_context=context)))
    flat = [label for share in seen for label in share]
    assert sorted(flat) == list(range(NUM_CLASSES))  # complete and disjoint
    assert all(share for share in seen)


def test_fewer_shards_than_pipelines_says_how_many_to_write(dataset):
    context = tf.distribute.InputContext(num_input_pipelines=8, input_pipeline_id=0)
    with pytest.raises(ValueError, match="4 shards, fewer than the 8 input pipelines.*--min-shards 8"):
        readers.images(dataset, batch_size=1, input_context=context)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"batch_size": 0}, "batch_size"), ({"batch_size": 2, "image_size": (0, 4)}, "image_size"),
     ({"batch_size": 2, "augment": "fancy"}, "augment"), ({"batch_size": 2, "shuffle_buffer": 0}, "shuffle_buffer")],
)
def test_bad_arguments_are_refused_up_front(dataset, kwargs, match):
    with pytest.raises(ValueError, match=match):
        readers.images(dataset, **kwargs)


# (argument, value, the range the message shows): numbers TensorFlow would crash on (SIGSEGV) or refuse with its own
# error are refused up front, showing the value and the range
IMAGE_ARGUMENTS = [
    pytest.param("shuffle_buffer", 2**31, "[1, 16,777,216]", id="shuffle_buffer-2**31-segfaults-tf-shuffle"),
    pytest.param("shuffle_buffer", 2**30, "[1, 16,777,216]", id="shuffle_buffer-2**30"),
    pytest.param("shuffle_buffer", 0, "[1, 16,777,216]", id="shuffle_buffer-0"),
    pytest.param("read_buffer_bytes", 2**40, "[1, 1,073,741,824]", id="read_buffer_bytes-2**40-segfaults-tfrecord"),
    pytest.param("read_buffer_bytes", 0, "[1, 1,073,741,824]", id="read_buffer_bytes-0"),
    pytest.param("num_parallel_reads", 2**31, "[1, 4,096]", id="num_parallel_reads-2**31-segfaults-interleave"),
    pytest.param("num_parallel_reads", 0, "[1, 4,096]", id="num_parallel_reads-0"),
    pytest.param("batch_size", 2**40, "[1, 2,147,483,647]", id="batch_size-2**40"),
    pytest.param("batch_size", 2.0, "[1, 2,147,483,647]", id="batch_size-float"),
    pytest.param("shuffle_buffer", True, "[1, 16,777,216]", id="shuffle_buffer-bool"),
]


@pytest.mark.parametrize("name, value, shown", IMAGE_ARGUMENTS)
def test_images_refuses_numbers_out_of_range_showing_value_and_range(dataset, name, value, shown):
    arguments = {"batch_size": 2, name: value}
    refusal = f"{dataset}: {name} must be a positive integer (got {name}={value!r}), in {shown}"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        readers.images(dataset, **arguments)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "3", True], ids=["negative", "2**63", "float", "string", "bool"])
def test_a_seed_that_is_not_a_non_negative_int64_is_refused_naming_it(dataset, seed):
    refusal = f"{dataset}: seed must be None or an integer in [0, 2**63 - 1] (got seed={seed!r}); pass"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        readers.images(dataset, batch_size=2, seed=seed)
    with pytest.raises(ValueError, match=r"seed must be None or an integer in \[0, 2\*\*63 - 1\]"):
        readers.images([dataset, dataset], batch_size=2, seed=seed)  # the index-driven stream too


def test_image_size_beyond_any_real_image_is_refused(dataset):
    with pytest.raises(ValueError, match=r"image_size: sides must be in \[1, 16,384\] pixels \(got 1000000\)"):
        readers.images(dataset, batch_size=2, image_size=10**6)


def test_numpy_integers_are_integers(dataset):
    ds = readers.images(dataset, batch_size=np.int64(2), shuffle_buffer=np.int32(8),
                        read_buffer_bytes=np.int64(2**20), training=False)
    assert len(ds) == NUM_CLASSES // 2


def test_dataset_info_prints_as_one_short_line(dataset):
    assert repr(readers.info(dataset)) == (f"DatasetInfo({dataset!r}: images, {NUM_CLASSES} classes, "
                                           f"train {NUM_CLASSES} records in 4 shards)")


def test_unknown_split_and_missing_dataset(dataset, tmp_path):
    with pytest.raises(ValueError, match="no split 'val'.*'train'"):
        readers.images(dataset, "val", batch_size=1)
    with pytest.raises(FileNotFoundError, match="dataset.json"):
        readers.images(str(tmp_path), batch_size=1)


@pytest.mark.parametrize("kwargs, fused", [
    (dict(training=False), {"MapAndBatchDataset"}),
    (dict(seed=0), {"MapAndBatchDataset"}),
    (dict(seed=0, repeat=True), {"MapAndBatchDataset", "ShuffleAndRepeatDatasetV2"}),
    (dict(seed=0, repeat=True, cache="memory"), {"ShuffleAndRepeatDatasetV2"}),
])
def test_runs_without_tf_datas_static_rewrites_and_builds_their_fusions_itself(dataset, kwargs, fused):
    """The rewrites cost every iterator a Grappler pass over the pipeline before its first batch (readers/options.py);
    the decode map fused with its batch and a shuffle with its repeat are built directly instead."""
    ds = readers.images(dataset, batch_size=4, image_size=8, **kwargs)
    assert ds.options().experimental_optimization.apply_default_optimizations is False
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node} | {node.op for f in graph.library.function for node in f.node_def}
    assert fused <= ops, sorted(op for op in ops if op.endswith("Dataset") or "Dataset" in op)


def _op_dtype_pairs(ds: tf.data.Dataset) -> set[tuple[str, str]]:
    graph = tf.compat.v1.GraphDef.FromString(ds._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN).numpy())
    nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
    return {(node.op, tf.as_dtype(node.attr["T"].type).name) for node in nodes if node.attr["T"].type}


def test_evaluation_sets_up_no_int32_arithmetic_and_no_check_op_of_its_own(dataset):
    """Each new pair of op and T costs the first iterator of a process ~1.5 ms (oneDNN's graph pass;
    readers/image_ops.py): the centre crop's window is in the float32 ops the resize uses, and the shard checks use
    ops without T (python_steps.no_problem)."""
    pairs = _op_dtype_pairs(readers.images(dataset, batch_size=4, image_size=8, training=False))
    assert not {pair for pair in pairs if pair[1] == "int32"}, sorted(pairs)
    assert not pairs & {("EnsureShape", "string"), ("Equal", "string"), ("Sub", "int64")}, sorted(pairs)
    assert len(pairs) <= 16, sorted(pairs)


@pytest.mark.parametrize("size, padding", [(224, 32), (299, 32), (8, 32), (1, 0), (512, 3)])
def test_the_centre_crop_window_is_the_centred_square_to_the_pixel(size, padding):
    rng = np.random.default_rng(size)
    small = np.stack(np.meshgrid(np.arange(1, 26), np.arange(1, 26)), -1).reshape(-1, 2)
    sides = np.concatenate([rng.integers(1, 65536, (40, 2)), small])
    share = np.float32(size) / np.float32(size + padding)
    for height, width in sides.tolist():
        side = max(int(np.float32(min(height, width)) * share), 1)
        expected = [(height - side + 1) // 2, (width - side + 1) // 2, side, side]
        assert image_ops.center_crop_window(tf.constant([height, width, 3]), size, padding).numpy().tolist() == \
            expected, (height, width)


@pytest.mark.parametrize("global_seed", [None, 5])
@pytest.mark.parametrize("seed", [0, 3, 2**40])
def test_seeded_datasets_built_without_eager_ops_give_tf_datas_orders(seed, global_seed):
    def two_epochs(ds):
        return [[int(x) for x in ds] for _ in range(2)]

    def built(make):
        if global_seed is not None:
            tf.random.set_seed(global_seed)
        try:
            return make()
        finally:
            tf.random.set_seed(None)

    ours = built(lambda: [options.seeded_shuffle(tf.data.Dataset.range(40), 16, seed),
                          options.random_numbers(seed).take(4), options.random_numbers(seed, True).take(4)])
    tfs = built(lambda: [tf.data.Dataset.range(40).shuffle(16, seed=seed, reshuffle_each_iteration=True),
                         tf.data.Dataset.random(seed=seed).take(4),
                         tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(4)])
    for a, b in zip(ours, tfs):
        assert two_epochs(a) == two_epochs(b)


def test_a_check_passes_only_an_empty_problem():
    problems = tf.constant(["", "x", "\n", " ", "a\nb"])
    assert python_steps.no_problem(problems).numpy().tolist() == [True, False, False, False, False]


def test_works_under_a_distribution_strategy(dataset):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: readers.images(dataset, batch_size=ctx.get_per_replica_batch_size(4), image_size=(8, 8), seed=0,
                                   input_context=ctx)
    )
    assert sum(int(tf.size(labels)) for _, labels in dist) == NUM_CLASSES // 4 * 4


def _rewrite_shard(out: str, index: int, records: list[bytes]) -> None:
    """Rewrites train shard ``index`` with ``records`` and records its new count, size and sha256 in the manifest."""
    import hashlib

    manifest = read_manifest(out)
    shard = manifest["splits"]["train"]["shards"][index]
    path = os.path.join(out, shard["file"])
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        data = f.read()
    added = len(records) - shard["records"]
    shard.update(records=len(records), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    split = manifest["splits"]["train"]  # a manifest whose totals disagree with its shards is refused on load
    split.update(records=sum(s["records"] for s in split["shards"]), bytes=sum(s["bytes"] for s in split["shards"]))
    split["class_counts"][manifest["class_names"][0]] += added  # the counts still add up to the records
    write_manifest(out, manifest)


def _write_undecodable_record(out: str) -> None:
    """Appends to the last shard a record carrying JPEG bytes that do not decode (valid TFRecord CRCs)."""
    example = tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff\xd8\xff" + b"\0" * 50])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
    }))
    last = readers.info(out).shard_paths("train")[-1]
    records = [r.numpy() for r in tf.data.TFRecordDataset(last)] + [example.SerializeToString()]
    _rewrite_shard(out, 3, records)


def test_ignore_errors_skips_an_undecodable_record_and_keeps_the_rest(dataset, tmp_path):
    import shutil

    broken = str(tmp_path / "broken")
    shutil.copytree(dataset, broken)
    _write_undecodable_record(broken)
    with pytest.raises(tf.errors.InvalidArgumentError):
        labels_of(readers.images(broken, batch_size=1, image_size=(8, 8), training=False))
    kept = labels_of(readers.images(broken, batch_size=1, image_size=(8, 8), training=False, ignore_errors=True))
    assert sorted(kept) == list(range(NUM_CLASSES))


@pytest.fixture(scope="module")
def undecodable(tmp_path_factory, dataset):
    """A copy of ``dataset`` whose every record is undecodable, and one with a single undecodable record added."""
    import shutil

    root = tmp_path_factory.mktemp("undecodable")
    every, one = str(root / "every"), str(root / "one")
    shutil.copytree(dataset, every)
    shutil.copytree(dataset, one)
    _write_undecodable_record(one)
    bad = tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff\xd8\xff" + b"\0" * 50])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
    })).SerializeToString()
    for i, shard in enumerate(read_manifest(every)["splits"]["train"]["shards"]):
        _rewrite_shard(every, i, [bad] * shard["records"])
    return every, one


@pytest.mark.parametrize("kwargs", [dict(seed=0), dict(training=False), dict(seed=0, cache="memory")],
                         ids=["training", "evaluation", "cached"])
def test_ignore_errors_with_repeat_fails_an_epoch_that_gives_no_image_instead_of_looping(undecodable, kwargs):
    every, one = undecodable
    ds = readers.images(every, batch_size=2, image_size=8, ignore_errors=True, repeat=True, **kwargs)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(
            f"{every}: split train: an epoch gave no image, every record was skipped (ignore_errors=True")):
        next(iter(ds))
    # one bad record among good ones: skipped, and the stream runs on across epochs
    records = readers.info(one).num_records("train") - 1
    ds = readers.images(one, batch_size=1, image_size=8, ignore_errors=True, repeat=True, **kwargs)
    assert sorted(int(y[0]) for _, y in ds.take(3 * records)) == sorted(3 * labels_of(readers.images(
        one, batch_size=1, image_size=8, training=False, ignore_errors=True)))


def test_public_names_stay_functions_after_their_modules_load():
    import tfshard.readers.images  # noqa: F401  (binding the submodule must not shadow the function)
    from tfshard import ingest

    assert callable(readers.images) and readers.images is readers.images
    assert callable(ingest.verify) and ingest.verify is ingest.verify


# --- readers.class_weights --------------------------------------------------------------------------------------


def test_class_weights_are_the_balanced_weights_of_the_labels_read_back(converted_images, tmp_path):
    src = tmp_path / "src"
    make_tree(src, per_class=6)
    for name in ("000", "001", "002", "003"):
        os.remove(src / "dog" / f"{name}.jpg")  # cat 6, dog 2
    convert_image_tree(src, tmp_path / "out")
    for out, expected in ((converted_images.out, {0: 1.0, 1: 1.0}), (str(tmp_path / "out"), {0: 8 / 12, 1: 8 / 4})):
        labels = np.array(labels_of(readers.images(out, batch_size=4, image_size=8, training=False)))
        counts = np.bincount(labels)
        oracle = {c: len(labels) / (len(counts) * int(n)) for c, n in enumerate(counts)}  # sklearn's "balanced"
        assert readers.class_weights(out, "train") == oracle == expected


def test_class_weights_refuse_a_class_with_no_record_naming_it(converted_images_copy):
    edit_manifest(converted_images_copy.out, lambda raw: raw["splits"]["train"].update(class_counts={"cat": 12,
                                                                                                      "dog": 0}))
    with pytest.raises(ValueError, match=re.escape(f"{converted_images_copy.out}: split 'train': class 1 ('dog') "
                                                   "has no record, so no balanced weight")):
        readers.class_weights(converted_images_copy.out, "train")
    with pytest.raises(ValueError, match="no split 'val'"):
        readers.class_weights(converted_images_copy.out, "val")


@pytest.mark.parametrize("kind, shown", [("multi", "an images dataset with multi labels"),
                                         ("value", "an images dataset with value labels"),
                                         ("episodes", "an episodes dataset without labels")])
def test_class_weights_refuse_datasets_without_one_class_per_image(tmp_path, kind, shown):
    src, out = tmp_path / "src", tmp_path / "out"
    if kind == "episodes":
        save_episodes(src, dict(zip(["a.npy", "b.npy"], random_episodes([6, 7]))))
        convert_episode_tree(src, out)
    else:
        flat_jpegs(src, ["a", "b", "c"])
        rows = "path,label\na.jpg,cat;dog\nb.jpg,dog\nc.jpg,cat\n" if kind == "multi" else "path,age\na.jpg,1.5\n" \
            "b.jpg,2\nc.jpg,3\n"
        convert_image_tree(src, out, image=ImageOptions(labels_file=write_text(tmp_path / "l.csv", rows)), seed=None)
    with pytest.raises(ValueError, match=re.escape(f"{out}: class weights need one class per image (got {shown})")):
        readers.class_weights(str(out), "train")


# --- shards checked before reading ------------------------------------------------------------------------------


@pytest.fixture
def copy(dataset, tmp_path):
    """A copy of the dataset to damage: (out, its shard paths)."""
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(dataset, out)
    return out, readers.info(out).shard_paths("train")


@pytest.mark.parametrize("ignore_errors", [False, True])
def test_missing_shard_is_an_error_before_reading_even_with_ignore_errors(copy, ignore_errors):
    """With ignore_errors a deleted shard made the reader retry its open forever at 100% CPU."""
    out, shards = copy
    os.remove(shards[2])
    with pytest.raises(FileNotFoundError, match=re.escape(shards[2]) + r": shard of split 'train' is missing.*"
                                                 + re.escape(f"run `tfshard verify {out}`, then rerun the conversion")):
        readers.images(out, batch_size=1, image_size=(8, 8), ignore_errors=ignore_errors)


@pytest.mark.parametrize("ignore_errors", [False, True])
@pytest.mark.parametrize("kind, shown", [("fifo", "a FIFO"), ("dev-zero", "a character device"),
                                         ("folder", "a folder")])
def test_shard_that_is_not_a_regular_file_is_refused(copy, kind, shown, ignore_errors):
    """A FIFO would block the reader, /dev/zero would never end."""
    out, shards = copy
    os.remove(shards[1])
    if kind == "fifo":
        os.mkfifo(shards[1])
    elif kind == "dev-zero":
        os.symlink("/dev/zero", shards[1])
    else:
        os.mkdir(shards[1])
    with pytest.raises(ValueError, match=re.escape(shards[1]) + f": {shown}, not a regular file.*tfshard verify"):
        readers.images(out, batch_size=1, image_size=(8, 8), ignore_errors=ignore_errors)


def test_shard_of_another_size_is_refused_and_with_ignore_errors_logged(copy, caplog):
    out, shards = copy
    size = os.path.getsize(shards[0])
    with open(shards[0], "ab") as f:
        f.write(b"\0" * 5)
    message = re.escape(f"{shards[0]}: shard of split 'train' is not the size the manifest says "
                        f"(got {size + 5} bytes, manifest says {size}); run `tfshard verify {out}`")
    with pytest.raises(ValueError, match=message):
        readers.images(out, batch_size=1, image_size=(8, 8))

    import logging

    caplog.set_level(logging.WARNING, logger="tfshard.readers.files")
    kept = labels_of(readers.images(out, batch_size=1, image_size=(8, 8), training=False, ignore_errors=True))
    assert sorted(kept) == list(range(NUM_CLASSES))  # the records before the extra bytes are all there
    assert any(re.search(message, r.getMessage()) for r in caplog.records)


_READ_AFTER_REMOVING = r"""
import json, os, sys
from tfshard import readers

out, gone = sys.argv[1], sys.argv[2]
ds = readers.images(out, batch_size=1, image_size=(8, 8), training=False, ignore_errors=True)
os.remove(gone)
print(json.dumps(sorted(int(v) for _, labels in ds for v in labels.numpy())), flush=True)
"""


@pytest.mark.slow
def test_shard_gone_after_the_pipeline_was_built_is_skipped_with_ignore_errors(copy):
    """Run in a child with a timeout: before the fix the iteration never ended."""
    import json
    import subprocess
    import sys

    out, shards = copy
    lost = {int(tf.io.parse_single_example(r, {"image/class/label": tf.io.FixedLenFeature([], tf.int64)})
                ["image/class/label"]) for r in tf.data.TFRecordDataset(shards[2])}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        child = subprocess.run([sys.executable, "-c", _READ_AFTER_REMOVING, out, shards[2]], cwd=repo,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"}, capture_output=True, text=True,
                               timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("a shard removed after the pipeline was built made ignore_errors spin forever")
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.splitlines()[-1]) == sorted(set(range(NUM_CLASSES)) - lost)
    assert f"{shards[2]}: shard is gone" in child.stderr  # ignore_errors logged it


# --- an epoch of no batch is refused up front ----------------------------------------------------------------------


def test_fewer_records_than_one_batch_with_drop_remainder_is_an_error_up_front(dataset):
    """Training drops the remainder, so 24 records in batches of 64 made an epoch of nothing."""
    with pytest.raises(ValueError, match=re.escape(
            f"{dataset}: split 'train' has 24 records for this pipeline, fewer than batch_size=64 with "
            "drop_remainder=True, so an epoch would yield no batch; "
            "pass a smaller batch_size or drop_remainder=False")):
        readers.images(dataset, batch_size=64)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    with pytest.raises(ValueError, match=r"has 12 records for this pipeline, fewer than batch_size=13"):
        readers.images(dataset, batch_size=13, input_context=context)
    assert labels_of(readers.images(dataset, batch_size=12, image_size=(8, 8), input_context=context))
    assert sorted(labels_of(readers.images(dataset, batch_size=64, image_size=(8, 8), drop_remainder=False))) == list(
        range(NUM_CLASSES))
    assert len(labels_of(readers.images(dataset, batch_size=64, image_size=(8, 8), training=False))) == NUM_CLASSES


def test_one_pipeline_feeding_two_replicas_needs_a_batch_for_each(dataset):
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match=r"has 24 records for this pipeline, fewer than the 26 a step takes from it "
                                         r"\(batch_size=13 for each of the 2 replicas it feeds\)"):
        readers.images(dataset, batch_size=13, input_context=context)
    assert len(labels_of(readers.images(dataset, batch_size=12, image_size=(8, 8), input_context=context))) == 24


# --- what a new user trips on -------------------------------------------------------------------------------------


def test_an_episodes_dataset_is_refused_up_front_naming_the_readers(tmp_path):
    """It used to build, then fail mid-fit with a graph error about the missing image/class/label."""
    src, out = tmp_path / "src", tmp_path / "out"
    save_episodes(src, dict(zip(["a.npy", "b.npy"], random_episodes([6, 7]))))
    convert_episode_tree(src, out)
    with pytest.raises(ValueError, match=re.escape(f"{out}: an 'episodes' dataset, not images (got kind='episodes' "
                                                   "in dataset.json); read it with readers.windows or "
                                                   "readers.episodes")):
        readers.images(str(out), batch_size=8)


@pytest.mark.parametrize("image_size, shape", [
    (8, (8, 8)), (np.int64(8), (8, 8)), ((8, 6), (8, 6)), ([8, 6], (8, 6)), ((np.int32(8), np.int64(6)), (8, 6)),
    (np.array([8, 6]), (8, 6)),
])
def test_image_size_is_an_int_for_a_square_or_a_height_width_pair(dataset, image_size, shape):
    """The CLI's --image-size is one int; readers.images(image_size=64) raised "object of type 'int' has no len()"."""
    images, _ = next(iter(readers.images(dataset, batch_size=2, image_size=image_size, training=False)))
    assert images.shape == (2, *shape, 3)


@pytest.mark.parametrize("image_size, error", [
    (0, ValueError), (-3, ValueError), ((8, 0), ValueError), (np.int64(0), ValueError),
    (8.0, TypeError), ((8.0, 8), TypeError), ((8,), TypeError), ((8, 8, 3), TypeError), ("8", TypeError),
    (True, TypeError), ((True, 8), TypeError), (None, TypeError),
])
def test_bad_image_size_names_the_value(dataset, image_size, error):
    with pytest.raises(error, match=r"image_size: .*\(got " + re.escape(repr(image_size)) + r"\)"):
        readers.images(dataset, batch_size=2, image_size=image_size)


def _shard_records(out: str, context=None) -> int:
    """Records of this pipeline's shards, from the manifest (shard i of n pipelines: every n-th from i)."""
    shards = readers.info(out).manifest.splits["train"].shards
    if context is None:
        return sum(s.records for s in shards)
    return sum(s.records for s in shards[context.input_pipeline_id :: context.num_input_pipelines])


@pytest.mark.parametrize("training, drop_remainder, cache", [
    (True, None, None), (True, None, "memory"), (False, None, None), (True, False, None), (False, True, None),
])
@pytest.mark.parametrize("pipelines", [1, 2])
def test_the_batch_count_is_known_and_exact(dataset, training, drop_remainder, cache, pipelines):
    """Unknown cardinality made Keras warn "Your input ran out of data" at the end of every epoch."""
    for pipeline in range(pipelines):
        context = None if pipelines == 1 else tf.distribute.InputContext(pipelines, pipeline)
        ds = readers.images(dataset, batch_size=5, image_size=(8, 8), training=training, seed=0, cache=cache,
                            drop_remainder=drop_remainder, input_context=context)
        records = _shard_records(dataset, context)
        drop = training if drop_remainder is None else drop_remainder
        expected = records // 5 if drop else -(-records // 5)
        assert records % 5  # so dropping the remainder or not makes a difference
        assert len(ds) == int(ds.cardinality()) == expected
        for _ in range(2):
            assert len(list(ds)) == expected


def test_the_batch_count_is_unknown_when_records_may_be_skipped(dataset):
    ds = readers.images(dataset, batch_size=5, image_size=(8, 8), ignore_errors=True)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY


@pytest.mark.parametrize("training", [True, False])
def test_keras_fit_does_not_warn_that_the_input_ran_out_of_data(dataset, caplog, training):
    import logging
    import warnings

    import keras
    ds = readers.images(dataset, batch_size=5, image_size=(8, 8), training=training, seed=0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(NUM_CLASSES)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(batch))

    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=[counter])

    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "ran out of data" in m], said
    assert len(history.history["loss"]) == 2
    assert batches == list(range(NUM_CLASSES // 5 if training else -(-NUM_CLASSES // 5))) * 2


# --- uint8 output and on-device normalisation --------------------------------------------------------------------


@pytest.mark.parametrize("training", [True, False])
def test_uint8_output_is_the_float_output_times_255(dataset, training):
    """dtype="uint8" ships the very pixels the float32 path scales: same order, same crops, no cast."""
    kwargs = dict(batch_size=6, image_size=(16, 16), training=training, seed=4, drop_remainder=False)
    (as_float, labels_f), = list(readers.images(dataset, **kwargs).take(1))
    (as_uint8, labels_u), = list(readers.images(dataset, dtype="uint8", **kwargs).take(1))
    assert as_uint8.dtype == tf.uint8 and as_float.dtype == tf.float32
    np.testing.assert_array_equal(labels_u.numpy(), labels_f.numpy())
    np.testing.assert_allclose(as_uint8.numpy() / 255.0, as_float.numpy(), atol=1e-6)


def test_colour_jitter_needs_float_output(dataset):
    with pytest.raises(ValueError, match="dtype='float32'"):
        readers.images(dataset, batch_size=2, augment="color", dtype="uint8")
    with pytest.raises(ValueError, match="dtype"):
        readers.images(dataset, batch_size=2, dtype="float16")


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_normalization_layer_uses_the_manifest_statistics(dataset, dtype):
    info = readers.info(dataset)
    split = info.manifest.splits["train"]
    layer = readers.normalization(dataset, dtype=dtype)
    scale = 255.0 if dtype == "uint8" else 1.0
    pixel = np.asarray(split.pixel_mean, np.float32) * scale  # the mean pixel normalises to 0
    one_std_up = pixel + np.asarray(split.pixel_std, np.float32) * scale  # and one std above it to 1
    out = np.asarray(layer(np.stack([pixel, one_std_up])[None, None]))  # [1, 1, 2, 3]
    np.testing.assert_allclose(out[0, 0, 0], 0.0, atol=1e-4)
    np.testing.assert_allclose(out[0, 0, 1], 1.0, atol=1e-4)


@pytest.mark.parametrize("dtype, step", [("uint8", 10.0), ("float32", 0.1)])
def test_normalization_centres_a_constant_channel_instead_of_dividing_by_a_tiny_std(tmp_path, dtype, step):
    """Grey images: every channel is constant (std 0). The layer maps the grey to 0 and a value off it by its
    distance, as scikit-learn's StandardScaler does, where a floor of 1e-6 under the std made it ~1e5."""
    for i in range(4):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("L", (16, 16), 128).save(folder / f"{i}.jpg", quality=95)
    out = str(tmp_path / "out")
    convert_images(str(tmp_path / "src"), out, ConvertOptions(num_shards=1), workers=0, progress=False)
    split = readers.info(out).manifest.splits["train"]
    assert split.pixel_std == [0.0, 0.0, 0.0], split.pixel_std
    grey = np.asarray(split.pixel_mean, np.float32) * (255.0 if dtype == "uint8" else 1.0)
    out_values = np.asarray(readers.normalization(out, dtype=dtype)(np.stack([grey, grey + step])[None, None]))
    np.testing.assert_allclose(out_values[0, 0], [[0.0] * 3, [step] * 3], atol=1e-4)


def test_normalization_of_an_episodes_dataset_is_per_feature_and_refuses_image_options(tmp_path):
    save_episodes(tmp_path / "src", {"a.npy": np.arange(10, dtype=np.float32).reshape(5, 2)})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    layer = readers.normalization(str(tmp_path / "out"))  # the one feature, "data"
    np.testing.assert_allclose(layer(np.asarray([[[4.0, 5.0]]], np.float32)).numpy(), [[[0.0, 0.0]]], atol=1e-6)
    with pytest.raises(ValueError, match="dtype='uint8' is for images"):
        readers.normalization(str(tmp_path / "out"), dtype="uint8")


# --- the default recipe done per image in the decode map ----------------------------------------------------------


@pytest.fixture(scope="module")
def gradients(tmp_path_factory):
    """16 JPEGs whose brightness rises left to right: any crop of one rises too, and a mirrored crop falls."""
    root = tmp_path_factory.mktemp("gradients")
    ramp = np.repeat(np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], 48, axis=0).repeat(3, axis=2)
    for i in range(16):
        folder = root / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(ramp).save(folder / f"{i}.jpg", quality=95)
    convert_images(str(root / "src"), str(root / "out"), ConvertOptions(num_shards=2), workers=0, progress=False)
    return str(root / "out")


def _mirrored(images: np.ndarray) -> np.ndarray:
    """Per image: does brightness fall from the left edge to the right one?"""
    return images[:, :, 0, :].mean(axis=(1, 2)) > images[:, :, -1, :].mean(axis=(1, 2))


@pytest.mark.parametrize("cache", [None, "memory"])
def test_default_training_mirrors_about_half_the_images_and_augment_none_none(gradients, cache):
    kwargs = dict(batch_size=16, image_size=(16, 16), seed=2, cache=cache)
    flipped = np.concatenate([_mirrored(images.numpy()) for _ in range(4)
                              for images, _ in readers.images(gradients, **kwargs)])
    assert 0.25 < flipped.mean() < 0.75, flipped
    plain = np.concatenate([_mirrored(images.numpy()) for images, _ in readers.images(gradients, augment=None,
                                                                                        **kwargs)])
    assert not plain.any()


def test_the_fused_flip_mirrors_exactly_the_crop_it_would_return_unflipped(gradients):
    """decode_random_crop(flip=True) is the same crop as flip=False, mirrored or not, to the last value."""
    from tfshard.readers.image_ops import decode_random_crop

    (encoded,) = list(tf.data.TFRecordDataset(os.path.join(gradients, "train-00000-of-00002.tfrecord")).take(1))
    jpeg = tf.io.parse_single_example(encoded, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})["image/encoded"]
    outcomes = set()
    for s in range(24):
        seed = tf.constant([s, 7], tf.int64)
        plain = decode_random_crop(jpeg, seed, (12, 12)).numpy()
        flipped = decode_random_crop(jpeg, seed, (12, 12), flip=True).numpy()
        as_float = decode_random_crop(jpeg, seed, (12, 12), flip=True, unit_float=True).numpy()
        np.testing.assert_allclose(as_float * 255.0, flipped, atol=1e-3)
        if np.array_equal(flipped, plain):
            outcomes.add("kept")
        else:
            np.testing.assert_array_equal(flipped, plain[:, ::-1])
            outcomes.add("mirrored")
    assert outcomes == {"kept", "mirrored"}
