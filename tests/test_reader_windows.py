"""readers.windows over written episode datasets: exactly numpy's sliding windows, resident or streamed; the
arguments refused up front (on shared module datasets), and the window options of issue 22 (Targets, sampling_rate,
time_range, padding/pad_value, labels) where the modes or the manifest-only counts could disagree."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import types

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    edit_manifest,
    make_tree,
    random_episodes,
    read_manifest,
    save_episodes,
    write_manifest,
)
from tfshard import readers
from tfshard.ingest import ConvertOptions, EpisodeOptions, convert_images
from tfshard.readers.windowing.starts import window_starts
from tfshard.readers.windows.index import index_batches

LENGTHS = [30, 3, 17, 50, 1, 8, 12]  # 3, 1 and 8 are shorter than most windows below: they contribute nothing


def _write(tmp_path_factory, name, **options):
    """Episodes with ``obs`` (float32 [T, 2], random) and ``act`` (int32 [T], a unique id per step)."""
    src = tmp_path_factory.mktemp(f"{name}-src")
    out = tmp_path_factory.mktemp(name) / "out"
    rng = np.random.default_rng(11)
    written, ids = {}, itertools.count()
    for i, t in enumerate(LENGTHS):
        written[f"runs/ep{i:02d}.npz"] = {"obs": rng.normal(size=(t, 2)).astype(np.float32),
                                          "act": np.array([next(ids) for _ in range(t)], np.int32)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, **options)
    listed = manifest.splits["train"].episodes
    order = [written[e.source] for e in sorted(listed, key=lambda e: e.id)]  # source order: resident, unshuffled
    in_manifest = [written[e.source] for e in listed]  # streamed, unshuffled
    return types.SimpleNamespace(out=str(out), manifest=manifest,
                                 episodes={n: [e[n] for e in order] for n in ("obs", "act")},
                                 manifest_order={n: [e[n] for e in in_manifest] for n in ("obs", "act")})


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One record per episode, one shard."""
    return _write(tmp_path_factory, "plain")


@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """Every episode cut into 4-step chunk records (12 bytes a step), over 3 gzip shards."""
    return _write(tmp_path_factory, "chunked", num_shards=3, compression="gzip",
                  episode=EpisodeOptions(max_record_bytes=4 * 12))


@pytest.fixture(scope="module")
def plain_sorted(tmp_path_factory):
    """As ``plain``, written without the write-time shuffle: the manifest lists episodes in source order."""
    return _write(tmp_path_factory, "plain-sorted", seed=None)


@pytest.fixture(scope="module")
def chunked_sorted(tmp_path_factory):
    """As ``chunked``, written without the write-time shuffle."""
    return _write(tmp_path_factory, "chunked-sorted", seed=None, num_shards=3, compression="gzip",
                  episode=EpisodeOptions(max_record_bytes=4 * 12))


def reference(episodes, length, shift, horizon=0):
    """numpy's windows of ``length`` (and the ``horizon`` steps after each), per episode, stepped by ``shift``."""
    windows, futures = [], []
    for episode in episodes:
        t = len(episode)
        if t < length + horizon:
            continue
        view = np.lib.stride_tricks.sliding_window_view(episode[: t - horizon], length, axis=0)[::shift]
        windows.extend(np.moveaxis(view, -1, 1))  # [n, *trailing, L] -> windows of [L, *trailing]
        futures.extend(episode[s + length : s + length + horizon] for s in range(0, t - length - horizon + 1, shift))
    return windows, futures


def stacked(ds) -> tuple[np.ndarray, list[int]]:
    """Every window of one pass over a dataset of tensors, concatenated, and the batch sizes."""
    batches = [batch.numpy() for batch in ds]
    sizes = [len(b) for b in batches]
    return (np.concatenate(batches) if batches else np.zeros([0])), sizes


def ids(ds) -> list[tuple]:
    """One epoch of ``features="act"`` windows as tuples of step ids (a window's identity)."""
    return [tuple(w) for batch in ds for w in batch.numpy()]


# --- resident windows are the reference, in order ------------------------------------------------------------


@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("length, shift", [(1, 1), (4, 1), (5, 3), (3, 7), (17, 16), (30, 2), (50, 1)])
def test_unshuffled_windows_equal_the_reference_in_order(plain, length, shift, drop_remainder):
    batch_size = 7
    expected, _ = reference(plain.episodes["obs"], length, shift)
    count = sum((t - length) // shift + 1 for t in LENGTHS if t >= length)
    assert len(expected) == count == readers.info(plain.out).num_windows("train", length, shift)
    options = dict(length=length, shift=shift, batch_size=batch_size, features="obs", shuffle=False,
                   drop_remainder=drop_remainder)
    if drop_remainder and count < batch_size:  # an epoch of no batch is refused up front
        with pytest.raises(ValueError, match=rf"has {count} windows for this pipeline, fewer than batch_size=7"):
            readers.windows(plain.out, **options)
        return

    ds = readers.windows(plain.out, **options)

    got, sizes = stacked(ds)
    kept = count // batch_size * batch_size if drop_remainder else count
    assert len(got) == kept and all(s == batch_size for s in sizes[:-1])
    assert not sizes or 0 < sizes[-1] <= batch_size and (sizes[-1] == batch_size or not drop_remainder)
    assert int(ds.cardinality()) == len(sizes) == (count // batch_size if drop_remainder else -(-count // batch_size))
    if kept:
        assert got.dtype == np.float32 and got.shape[1:] == (length, 2)
        np.testing.assert_array_equal(got, np.stack(expected[:kept]))


def test_episodes_written_in_chunks_over_gzip_shards_give_the_same_windows(chunked):
    assert chunked.manifest.splits["train"].records > len(LENGTHS)
    expected, _ = reference(chunked.episodes["obs"], 6, 2)
    ds = readers.windows(chunked.out, length=6, shift=2, batch_size=5, features="obs", shuffle=False,
                         drop_remainder=False)
    got, _ = stacked(ds)
    np.testing.assert_array_equal(got, np.stack(expected))


def test_shuffled_epochs_are_the_same_multiset_in_new_orders_and_the_seed_repeats_them(plain):
    expected = sorted(tuple(w) for w in reference(plain.episodes["act"], 4, 2)[0])

    def make(seed):
        return readers.windows(plain.out, length=4, shift=2, batch_size=5, features="act", seed=seed,
                               drop_remainder=False)

    ds, again, other = make(3), make(3), make(4)

    first, second = ids(ds), ids(ds)

    assert sorted(first) == sorted(second) == expected
    assert first != second
    assert ids(again) == first and ids(again) == second
    assert ids(other) != first
    unshuffled = ids(readers.windows(plain.out, length=4, shift=2, batch_size=5, features="act", shuffle=False,
                                     drop_remainder=False))
    assert first != unshuffled and unshuffled == [tuple(w) for w in reference(plain.episodes["act"], 4, 2)[0]]


# --- streamed equals resident -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["plain", "chunked"])
def test_streamed_unshuffled_is_in_manifest_order_and_resident_in_source_order(request, fixture):
    """Resident arrays are laid out by episode id; streaming reads shard after shard, as the manifest lists them."""
    data = request.getfixturevalue(fixture)
    assert data.manifest_order["act"][0] is not data.episodes["act"][0]  # the write-time shuffle moved episodes
    options = {"length": 5, "shift": 2, "batch_size": 6, "shuffle": False, "drop_remainder": False,
               "features": "act"}
    for resident, episodes in ((True, data.episodes), (False, data.manifest_order)):
        got = np.concatenate([b.numpy() for b in readers.windows(data.out, resident=resident, **options)])
        np.testing.assert_array_equal(got, np.stack(reference(episodes["act"], 5, 2)[0]))


@pytest.mark.parametrize("fixture", ["plain_sorted", "chunked_sorted"])
@pytest.mark.parametrize("drop_remainder", [True, False])
def test_streamed_unshuffled_equals_resident_batch_by_batch(request, fixture, drop_remainder):
    """Written with --no-shuffle, the manifest's order is source order: both modes yield the same batches."""
    data = request.getfixturevalue(fixture)
    options = {"length": 5, "shift": 2, "batch_size": 6, "shuffle": False, "drop_remainder": drop_remainder}

    resident = list(readers.windows(data.out, **options))
    streamed = list(readers.windows(data.out, resident=False, **options))

    assert len(streamed) == len(resident) > 1
    for a, b in zip(resident, streamed):
        assert set(a) == set(b) == {"obs", "act"}
        for name in a:
            assert a[name].dtype == b[name].dtype
            np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    expected, _ = reference(data.episodes["act"], 5, 2)
    got = np.concatenate([b["act"].numpy() for b in streamed])
    np.testing.assert_array_equal(got, np.stack(expected[: len(got)]))


def test_streamed_with_a_horizon_equals_resident(chunked_sorted):
    options = {"length": 4, "shift": 3, "batch_size": 4, "features": "obs", "targets": 2, "shuffle": False,
               "drop_remainder": False}
    resident = list(readers.windows(chunked_sorted.out, **options))
    streamed = list(readers.windows(chunked_sorted.out, resident=False, **options))
    assert len(resident) == len(streamed)
    for (x1, y1), (x2, y2) in zip(resident, streamed):
        np.testing.assert_array_equal(x1.numpy(), x2.numpy())
        np.testing.assert_array_equal(y1.numpy(), y2.numpy())


@pytest.mark.parametrize("fixture", ["plain", "chunked"])
def test_streamed_shuffled_is_the_same_multiset(request, fixture):
    data = request.getfixturevalue(fixture)
    ds = readers.windows(data.out, length=3, shift=2, batch_size=4, features="act", resident=False, seed=1,
                         shuffle_buffer=16, drop_remainder=False)
    expected = [tuple(w) for w in reference(data.episodes["act"], 3, 2)[0]]
    first = ids(ds)
    assert sorted(first) == sorted(expected)
    assert first != expected


# --- targets ----------------------------------------------------------------------------------------------------


def test_targets_same_gives_the_windows_twice(plain):
    x, y = next(iter(readers.windows(plain.out, length=4, batch_size=3, features="obs", targets="same",
                                     shuffle=False)))
    np.testing.assert_array_equal(x.numpy(), y.numpy())
    np.testing.assert_array_equal(x.numpy(), np.stack(reference(plain.episodes["obs"], 4, 1)[0][:3]))
    inputs, targets = next(iter(readers.windows(plain.out, length=4, batch_size=3, targets="same", shuffle=False)))
    assert set(inputs) == set(targets) == {"obs", "act"}
    for name in inputs:
        np.testing.assert_array_equal(inputs[name].numpy(), targets[name].numpy())


@pytest.mark.parametrize("features", ["obs", ["obs"]])
def test_targets_feature_name_is_that_features_aligned_window(plain, features):
    ds = readers.windows(plain.out, length=5, shift=4, batch_size=4, features=features, targets="act",
                         shuffle=False, drop_remainder=False)
    xs, ys = [], []
    for x, y in ds:
        xs.append((x if isinstance(features, str) else x["obs"]).numpy())
        assert not isinstance(features, str) or isinstance(x, tf.Tensor)
        assert y.dtype == tf.int32
        ys.append(y.numpy())
    np.testing.assert_array_equal(np.concatenate(xs), np.stack(reference(plain.episodes["obs"], 5, 4)[0]))
    np.testing.assert_array_equal(np.concatenate(ys), np.stack(reference(plain.episodes["act"], 5, 4)[0]))


@pytest.mark.parametrize("length, shift, horizon", [(4, 2, 3), (1, 1, 1), (10, 5, 7), (48, 1, 2)])
def test_targets_horizon_is_the_next_steps(plain, length, shift, horizon):
    windows, futures = reference(plain.episodes["obs"], length, shift, horizon)
    count = sum((t - length - horizon) // shift + 1 for t in LENGTHS if t >= length + horizon)
    assert len(windows) == count == readers.info(plain.out).num_windows("train", length, shift, horizon=horizon)
    assert count < readers.info(plain.out).num_windows("train", length, shift)

    ds = readers.windows(plain.out, length=length, shift=shift, batch_size=5, features="obs", targets=horizon,
                         shuffle=False, drop_remainder=False)

    assert int(ds.cardinality()) == -(-count // 5)
    x, y = (np.concatenate([part.numpy() for part in parts]) for parts in zip(*ds))
    assert x.shape == (count, length, 2) and y.shape == (count, horizon, 2)
    np.testing.assert_array_equal(x, np.stack(windows))
    np.testing.assert_array_equal(y, np.stack(futures))


def test_horizon_targets_with_several_features_are_dicts(plain):
    x, y = next(iter(readers.windows(plain.out, length=3, batch_size=2, targets=2, shuffle=False)))
    assert set(x) == set(y) == {"obs", "act"}
    for name in ("obs", "act"):
        windows, futures = reference(plain.episodes[name], 3, 1, 2)
        np.testing.assert_array_equal(x[name].numpy(), np.stack(windows[:2]))
        np.testing.assert_array_equal(y[name].numpy(), np.stack(futures[:2]))


# --- features and argument checks -------------------------------------------------------------------------------


def test_features_a_name_gives_tensors_a_list_gives_dicts_of_exactly_those(plain):
    options = {"length": 3, "batch_size": 2, "shuffle": False}
    single = readers.windows(plain.out, features="act", **options)
    assert isinstance(single.element_spec, tf.TensorSpec) and single.element_spec.dtype == tf.int32
    assert isinstance(next(iter(single)), tf.Tensor)
    for features in (["act"], ["obs", "act"], ["act", "obs"]):
        element = next(iter(readers.windows(plain.out, features=features, **options)))
        assert isinstance(element, dict) and sorted(element) == sorted(features)
    every = next(iter(readers.windows(plain.out, **options)))
    assert sorted(every) == ["act", "obs"]
    assert every["obs"].shape == (2, 3, 2) and every["act"].shape == (2, 3)


def test_unknown_feature_and_split_are_named(plain):
    with pytest.raises(ValueError, match=r"no feature\(s\) \['nope'\].*the dataset has \['act', 'obs'\]"):
        readers.windows(plain.out, length=3, batch_size=2, features="nope")
    with pytest.raises(ValueError, match=r"no feature\(s\) \['nope'\]"):
        readers.windows(plain.out, length=3, batch_size=2, features=["obs", "nope"])
    with pytest.raises(ValueError, match=r"targets='nope' is neither 'same', 'label' nor a feature"):
        readers.windows(plain.out, length=3, batch_size=2, targets="nope")
    with pytest.raises(ValueError, match=r"no split 'val'"):
        readers.windows(plain.out, "val", length=3, batch_size=2)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """A small image dataset (2 classes of 2 JPEGs), converted once: what the episode readers must refuse."""
    src, out = tmp_path_factory.mktemp("photos-src"), tmp_path_factory.mktemp("photos") / "out"
    make_tree(str(src), per_class=2)
    convert_images(str(src), str(out), ConvertOptions(), workers=0, progress=False)
    return str(out)


def test_an_image_dataset_is_not_episodes(photos):
    with pytest.raises(ValueError, match=r"an 'images' dataset, not episodes"):
        readers.windows(photos, length=3, batch_size=2)


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("argument, value", [("length", 0), ("shift", 0), ("batch_size", 0), ("length", -2),
                                             ("shift", 1.5), ("batch_size", True)])
def test_bad_sizes_name_the_argument(plain, resident, argument, value):
    options = {"length": 3, "shift": 1, "batch_size": 2}
    options[argument] = value
    with pytest.raises(ValueError, match=rf"{argument} must be a positive integer \(got {argument}={value!r}\)"):
        readers.windows(plain.out, resident=resident, **options)


def test_bad_targets_are_refused(plain):
    with pytest.raises(ValueError, match=r"horizon must be at least 1 step \(got targets=0\)"):
        readers.windows(plain.out, length=3, batch_size=2, targets=0)
    refused = r"targets must be None, 'same', 'label', a feature name, a horizon or a readers.Targets \(got "
    with pytest.raises(TypeError, match=refused + r"True\)"):
        readers.windows(plain.out, length=3, batch_size=2, targets=True)
    with pytest.raises(TypeError, match=refused):
        readers.windows(plain.out, length=3, batch_size=2, targets=np.bool_(True))
    with pytest.raises(ValueError, match=r"horizon must be at least 1 step \(got targets=0\)"):
        readers.windows(plain.out, length=3, batch_size=2, targets=np.int32(0))


@pytest.mark.parametrize("resident", [True, False])
def test_a_numpy_integer_horizon_is_taken_like_an_int(plain, resident):
    """length=np.int64(2) was accepted but targets=np.int64(2) refused."""
    options = {"length": np.int64(4), "shift": 3, "batch_size": 4, "features": "obs", "shuffle": False,
               "drop_remainder": False, "resident": resident}
    with_numpy = list(readers.windows(plain.out, targets=np.int64(2), **options))
    with_int = list(readers.windows(plain.out, targets=2, **options))
    assert len(with_numpy) == len(with_int) > 1
    for (x1, y1), (x2, y2) in zip(with_numpy, with_int):
        assert y1.shape[1] == 2
        np.testing.assert_array_equal(x1.numpy(), x2.numpy())
        np.testing.assert_array_equal(y1.numpy(), y2.numpy())


@pytest.mark.parametrize("length, targets", [(51, None), (48, 3), (48, np.int64(3)), (1000, None)])
def test_window_longer_than_every_episode_is_an_error(plain, length, targets):
    fix = "pass a shorter length" + (" or horizon" if targets else "")  # the horizon only when there is one
    fix += re.escape(", or padding='start' (padded windows)")
    with pytest.raises(ValueError, match=rf"no episode of at least {length + (targets or 0)} steps \(longest 50\); "
                                         rf"{fix}$"):
        readers.windows(plain.out, length=length, batch_size=2, targets=targets)


def test_streamed_window_longer_than_every_episode_is_an_error(plain):
    with pytest.raises(ValueError, match=r"no episode of at least 51 steps"):
        readers.windows(plain.out, length=51, batch_size=2, resident=False)


@pytest.mark.parametrize("call", [
    lambda out: readers.windows(out, length=4, batch_size=2, resident=False, shuffle_buffer=0),  # TF's own error
    lambda out: readers.windows(out, length=4, batch_size=2, shuffle_buffer=2**31),
    lambda out: readers.windows(out, length=4, batch_size=2, read_buffer_bytes=2**40),
    lambda out: readers.windows(out, length=2**40, batch_size=2),
    lambda out: readers.episodes(out, num_parallel_reads=2**31, shuffle_files=True),
    lambda out: readers.episodes(out, read_buffer_bytes=-1),
    lambda out: readers.model_windows(out, length=4, batch_size=2, read_buffer_bytes=2**40),
], ids=["streamed-shuffle-0", "resident-shuffle-2**31", "windows-read-buffer-2**40", "length-2**40",
        "episodes-parallel-reads-2**31", "episodes-read-buffer-negative", "model-windows-read-buffer-2**40"])
def test_window_and_episode_readers_refuse_numbers_out_of_range(npy, call):
    """Numbers TensorFlow would crash on (SIGSEGV) or refuse with its own error are refused up front, showing the
    value and the range."""
    refusal = re.escape(npy.out) + r": \w+ must be a positive integer \(got \w+=-?\d+\), in \["
    with pytest.raises(ValueError, match=refusal):
        call(npy.out)


def test_numpy_integers_are_integers(npy):
    assert len(readers.windows(npy.out, length=np.int64(4), batch_size=np.int32(2), shuffle_buffer=np.int64(16))) > 0


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "3", True], ids=["negative", "2**63", "float", "string", "bool"])
@pytest.mark.parametrize("call", [
    lambda out, seed: readers.windows(out, length=4, batch_size=2, seed=seed),
    lambda out, seed: readers.windows(out, length=4, batch_size=2, resident=False, seed=seed),
    lambda out, seed: readers.model_windows(out, length=4, batch_size=2, seed=seed),
    lambda out, seed: readers.episodes(out, shuffle_files=True, seed=seed),
], ids=["windows", "streamed", "model_windows", "episodes"])
def test_a_seed_that_is_not_a_non_negative_int64_is_refused_naming_it(npy, call, seed):
    """As the mixtures' (readers/sampling): TensorFlow would take -1 or 2**63 modulo something, "3" and 1.5 fail
    deep inside it without naming the argument."""
    refusal = re.escape(f"{npy.out}: seed must be None or an integer in [0, 2**63 - 1] (got seed={seed!r}); pass")
    with pytest.raises(ValueError, match=refusal):
        call(npy.out, seed)


def test_largest_seed_and_numpy_seeds_are_taken(npy):
    first = next(iter(readers.windows(npy.out, length=4, batch_size=2, seed=np.int64(2**63 - 1))))
    again = next(iter(readers.windows(npy.out, length=4, batch_size=2, seed=2**63 - 1)))
    np.testing.assert_array_equal(first, again)


def test_episodes_know_their_length(npy):
    """Keras ends each epoch on it instead of warning that the input "ran out of data"."""
    ds = readers.episodes(npy.out)
    assert len(ds) == 3 == sum(1 for _ in ds)
    assert len(readers.episodes(npy.out, shuffle_files=True, seed=1)) == 3


def test_dataset_info_prints_as_one_short_line(npy):
    assert str(readers.info(npy.out)) == f"DatasetInfo({npy.out!r}: episodes, 1 features, train 3 records in 2 shards)"


# --- the index is int32 -----------------------------------------------------------------------------------------


def test_window_starts_are_int32_four_bytes_per_window(plain):
    lengths = readers.info(plain.out).episode_lengths("train")
    starts = window_starts(lengths, 5, 3)
    assert starts.dtype == np.int32 and starts.nbytes == 4 * len(starts)
    offsets = np.cumsum([0] + lengths[:-1])
    assert starts.tolist() == [o + s for o, t in zip(offsets, lengths) for s in range(0, t - 5 + 1, 3)]
    index = index_batches(starts, batch_size=4, shuffle=True, seed=0, drop_remainder=False, replica=0, replicas=1)
    assert index.element_spec == tf.TensorSpec([None], tf.int32)
    assert sorted(np.concatenate(list(index.as_numpy_iterator())).tolist()) == starts.tolist()


# --- training -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("targets", ["act", 2])
def test_a_keras_model_trains_one_epoch_on_the_windows(plain, targets):
    import keras
    length = 6
    ds = readers.windows(plain.out, length=length, shift=2, batch_size=4, features="obs", targets=targets, seed=0)
    if targets == "act":
        outputs = [keras.layers.Dense(length)]
    else:
        outputs = [keras.layers.Dense(4), keras.layers.Reshape((2, 2))]
    model = keras.Sequential([keras.Input((length, 2)), keras.layers.Flatten(), *outputs])
    model.compile(optimizer="sgd", loss="mse")

    history = model.fit(ds, epochs=1, verbose=0, shuffle=False)  # the dataset shuffles itself

    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])
    horizon = targets if isinstance(targets, int) else 0
    assert int(ds.cardinality()) == readers.info(plain.out).num_windows("train", length, 2, horizon) // 4


def test_counts_agree_with_dataset_info_for_many_sizes(plain):
    info = readers.info(plain.out)
    for length, shift in itertools.product([1, 2, 5, 12, 30], [1, 3, 8]):
        ds = readers.windows(plain.out, length=length, shift=shift, batch_size=1, features="act", shuffle=False,
                             drop_remainder=False)
        count = info.num_windows("train", length, shift)
        assert int(ds.cardinality()) == count == len(reference(plain.episodes["act"], length, shift)[0])


# --- shards and records checked against the manifest -------------------------------------------------------------


def _copy(data, tmp_path) -> str:
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(data.out, out)
    return out


def _shard_examples(out: str, index: int) -> list:
    compression = "GZIP" if read_manifest(out)["compression"] == "gzip" else ""
    path = readers.info(out).shard_paths("train")[index]
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path, compression_type=compression)]


def _rewrite_shard(out: str, index: int, examples: list, data: bytes | None = None) -> None:
    """Writes train shard ``index`` anew (``examples``, or the file bytes ``data``) and records its count, size and
    sha256, so only its records disagree."""
    manifest = read_manifest(out)
    shard = manifest["splits"]["train"]["shards"][index]
    path = os.path.join(out, shard["file"])
    if data is None:
        options = tf.io.TFRecordOptions(compression_type="GZIP" if manifest["compression"] == "gzip" else "")
        with tf.io.TFRecordWriter(path, options) as writer:
            for example in examples:
                writer.write(example.SerializeToString())
        with open(path, "rb") as f:
            data = f.read()
    else:
        with open(path, "wb") as f:
            f.write(data)
    shard.update(records=len(examples), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    split = manifest["splits"]["train"]  # the split's totals too: a manifest whose totals disagree is refused on load
    split.update(records=sum(s["records"] for s in split["shards"]), bytes=sum(s["bytes"] for s in split["shards"]))
    write_manifest(out, manifest)


def _set(example, key: str, value: int):
    example = tf.train.Example.FromString(example.SerializeToString())
    example.features.feature[key].int64_list.value[:] = [value]
    return example


def _get(example, key: str) -> int:
    return example.features.feature[key].int64_list.value[0]


def test_swapped_episode_lengths_in_the_manifest_are_caught_by_every_reader(chunked, tmp_path):
    """Resident windows crossed episodes or read unfilled memory; streamed ones now fail on the episode."""
    out = _copy(chunked, tmp_path)
    manifest = read_manifest(out)
    episodes = manifest["splits"]["train"]["episodes"]
    first, second = episodes[0], episodes[1]
    assert first["length"] != second["length"]
    first["length"], second["length"] = second["length"], first["length"]
    write_manifest(out, manifest)
    fix = re.escape(f"run `tfshard verify {out}`; rewrite the dataset with --overwrite")

    with pytest.raises(ValueError, match=re.escape(f"{out}: split 'train': episode {first['id']} ({first['source']}): "
                                                   f"its records say {second['length']} steps, the manifest says "
                                                   f"{first['length']}") + ".*" + fix):
        readers.windows(out, length=2, batch_size=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"steps in its records, the manifest says"):
        list(readers.windows(out, length=2, batch_size=2, resident=False, shuffle=False))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"steps in its records, the manifest says"):
        list(readers.episodes(out))


# Edits of a shard's records around ``i``, the first chunk of an episode of at least 3 chunks of 4 steps.
def _duplicate(examples, i):
    return examples[: i + 1] + examples[i:]


def _drop_second(examples, i):
    return examples[: i + 1] + examples[i + 2 :]


def _other_id(examples, i):
    return examples[:i] + [_set(examples[i], "episode/id", 999)] + examples[i + 1 :]


def _other_id_and_source(examples, i):
    example = _set(examples[i], "episode/id", 999)
    example.features.feature["episode/source"].bytes_list.value[:] = [b"evil\xff\x1b[31m.npz"]
    return examples[:i] + [example] + examples[i + 1 :]


def _other_length(examples, i):
    longer = _set(examples[i], "episode/length", _get(examples[i], "episode/length") + 1)
    return examples[:i] + [longer] + examples[i + 1 :]


def _past_the_end(examples, i):
    second = _set(examples[i + 1], "episode/start", _get(examples[i + 1], "episode/length") - 1)
    return examples[: i + 1] + [second] + examples[i + 2 :]


def _fewer_steps(examples, i):
    fewer = _set(examples[i], "episode/steps", _get(examples[i], "episode/steps") - 1)
    return examples[:i] + [fewer] + examples[i + 1 :]


def _overlapping(examples, i):
    return examples[: i + 1] + [_set(examples[i + 1], "episode/start", 0)] + examples[i + 2 :]


@pytest.mark.parametrize("edit, problem", [
    (_duplicate, r"chunk 0 appears twice"),
    (_drop_second, r"steps 4\.\.8 are covered by no chunk"),
    (_other_id, r"999 \(runs/ep\d+\.npz\): not an episode the manifest lists for shards \[0, 1, 2\] "
                r"\(got episode/id=999\)"),
    (_other_id_and_source, r"999 \(evil\\xff\\x1b\[31m\.npz\): not an episode the manifest lists"),
    (_other_length, r"its records say \d+ steps, the manifest says \d+"),
    (_past_the_end, r"chunk 1 lies outside the episode's \d+ steps \(got episode/start=\d+, episode/steps=4\)"),
    (_fewer_steps, r"chunk 0 feature '\w+' holds \d+ bytes, not 3 steps"),
    (_overlapping, r"steps 0\.\.4 overlap"),
])
def test_resident_windows_refuse_a_chunk_that_disagrees_with_the_manifest(chunked, tmp_path, edit, problem):
    """Every row of the resident arrays must come from exactly one chunk the manifest accounts for."""
    out = _copy(chunked, tmp_path)
    examples = _shard_examples(out, 0)
    i = next(i for i, e in enumerate(examples) if _get(e, "episode/chunk") == 0 and _get(e, "episode/chunks") >= 3)
    _rewrite_shard(out, 0, edit(examples, i))
    with pytest.raises(ValueError, match=re.escape(f"{out}: split 'train': episode ") + r".*" + problem
                                         + r".*" + re.escape(f"run `tfshard verify {out}`")):
        readers.windows(out, length=2, batch_size=2)


def _without(example, key: str):
    example = tf.train.Example.FromString(example.SerializeToString())
    del example.features.feature[key]
    return example


def _as_floats(example, key: str):
    example = tf.train.Example.FromString(example.SerializeToString())
    example.features.feature[key].float_list.value[:] = [1.0, 2.0]
    return example


@pytest.mark.parametrize("edit, problem", [
    (lambda e, i: e[:i] + [_without(e[i], "episode/steps")] + e[i + 1:],
     "a chunk record whose 'episode/steps' is not one int64 value (got no such key)"),
    (lambda e, i: e[:i] + [_as_floats(e[i], "episode/id")] + e[i + 1:],
     "a chunk record whose 'episode/id' is not one int64 value (got 2 float_list values)"),
    (lambda e, i: e[:i] + [_as_floats(e[i], "data/obs")] + e[i + 1:],
     "a chunk record whose 'data/obs' is not one string value (got 2 float_list values)"),
])
def test_resident_windows_refuse_a_record_that_is_no_chunk_naming_its_shard(chunked, tmp_path, edit, problem):
    out = _copy(chunked, tmp_path)
    _rewrite_shard(out, 1, edit(_shard_examples(out, 1), 0))
    shard = readers.info(out).shard_paths("train")[1]
    with pytest.raises(ValueError, match=re.escape(f"{shard}: {problem}; run `tfshard verify {out}`")):
        readers.windows(out, length=2, batch_size=2)


def test_resident_windows_refuse_a_record_longer_than_any_chunk_before_reading_it(chunked, tmp_path):
    """A gzip shard whose first frame claims 1 GiB (its length's CRC valid) and holds a few MB of zeros: refused at
    its header, unread, instead of inflating gigabytes into memory."""
    from tfshard.format.tfrecord import gzip_member, masked_crc

    out = _copy(chunked, tmp_path)
    length = (1 << 30).to_bytes(8, "little")
    forged = length + masked_crc([length]).to_bytes(4, "little") + bytes(1 << 22)
    _rewrite_shard(out, 0, [None], data=gzip_member(forged))
    shard = readers.info(out).shard_paths("train")[0]
    with pytest.raises(tf.errors.DataLossError, match=re.escape(f"{shard}: corrupted record at byte 0: its length says "
                                                                f"{1 << 30} bytes, more than the ") + r"\d+ a record "
                                                      r"here can hold; " + re.escape(f"run `tfshard verify {out}`")):
        readers.windows(out, length=2, batch_size=2)


def test_resident_windows_of_some_features_load_records_holding_all_of_them(tmp_path):
    """A record holds every feature, whichever ``features=`` the reader loads: the longest a record can be is counted
    over all of them. Here the unloaded ``big`` (160 bytes a step) makes each record ~96 KB more than ``small`` alone
    (4 bytes a step) and the keys' allowance can hold; bounding by the loaded feature refused every record."""
    src, out = tmp_path / "src", tmp_path / "out"
    rng = np.random.default_rng(3)
    episodes = {f"ep{i}.npz": {"small": rng.normal(size=(600,)).astype(np.float32),
                               "big": rng.normal(size=(600, 40)).astype(np.float32)} for i in range(2)}
    save_episodes(src, episodes)
    manifest = convert_episode_tree(src, out)
    in_order = [episodes[e.source]["small"] for e in sorted(manifest.splits["train"].episodes, key=lambda e: e.id)]
    windows = readers.windows(str(out), length=600, batch_size=2, features="small")
    got = np.concatenate([batch.numpy() for batch in windows])  # shuffled: one window per episode, any order
    np.testing.assert_array_equal(got[np.argsort(got[:, 0])], np.stack(sorted(in_order, key=lambda e: e[0])))


def test_resident_windows_load_records_of_many_long_feature_names(tmp_path):
    """The keys count too: 300 features named by 250 characters make each record ~85 KB of keys around 6 KB of data,
    more than a fixed allowance for the keys held; every ``data/<name>`` key is counted with its framing."""
    src, out = tmp_path / "src", tmp_path / "out"
    names = [f"{i:03d}" + "x" * 247 for i in range(300)]
    rng = np.random.default_rng(5)
    episodes = {f"ep{i}.npz": {n: rng.normal(size=(5,)).astype(np.float32) for n in names} for i in range(2)}
    save_episodes(src, episodes)
    manifest = convert_episode_tree(src, out)
    in_order = [episodes[e.source][names[7]] for e in sorted(manifest.splits["train"].episodes, key=lambda e: e.id)]
    got = np.concatenate([b.numpy() for b in readers.windows(str(out), length=5, batch_size=2, features=names[7])])
    np.testing.assert_array_equal(got[np.argsort(got[:, 0])], np.stack(sorted(in_order, key=lambda e: e[0])))


def test_resident_windows_refuse_a_corrupt_shard_of_the_manifest_size_naming_it(chunked, tmp_path):
    """A damaged byte inside a gzip shard (its size unchanged): ``DataLossError`` naming the shard and the fix, as
    TensorFlow's reader fails; the streamed reader fails too."""
    out = _copy(chunked, tmp_path)
    shard = readers.info(out).shard_paths("train")[2]
    with open(shard, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    fix = re.escape(f"; run `tfshard verify {out}`")
    with pytest.raises(tf.errors.DataLossError, match=re.escape(shard) + ".*" + fix):
        readers.windows(out, length=2, batch_size=2)
    with pytest.raises(tf.errors.OpError):
        list(readers.windows(out, length=2, batch_size=2, resident=False))


@pytest.mark.parametrize("read", [
    lambda out: readers.episodes(out),
    lambda out: readers.windows(out, length=2, batch_size=2),
    lambda out: readers.windows(out, length=2, batch_size=2, resident=False),
], ids=["episodes", "resident", "streamed"])
def test_missing_or_odd_shard_is_refused_before_reading(chunked, tmp_path, read):
    out = _copy(chunked, tmp_path)
    shards = readers.info(out).shard_paths("train")
    os.remove(shards[1])
    with pytest.raises(FileNotFoundError, match=re.escape(f"{shards[1]}: shard of split 'train' is missing")):
        read(out)
    os.mkfifo(shards[1])
    with pytest.raises(ValueError, match=re.escape(f"{shards[1]}: a FIFO, not a regular file")):
        read(out)
    os.remove(shards[1])
    with open(shards[1], "wb") as f:
        f.write(b"\0" * 10)
    with pytest.raises(ValueError, match=re.escape(f"{shards[1]}: shard of split 'train' is not the size the manifest "
                                                   "says (got 10 bytes")):
        read(out)


@pytest.mark.parametrize("resident", [True, False])
def test_fewer_windows_than_one_batch_with_drop_remainder_is_an_error_up_front(plain, resident):
    """2 windows of 49 steps in batches of 64 made an epoch of nothing."""
    assert readers.info(plain.out).num_windows("train", 49) == 2
    with pytest.raises(ValueError, match=re.escape(
            f"{plain.out}: split 'train' has 2 windows for this pipeline, fewer than batch_size=64 with "
            "drop_remainder=True, so an epoch would yield no batch; "
            "pass a smaller batch_size or drop_remainder=False")):
        readers.windows(plain.out, length=49, batch_size=64, resident=resident)
    kept = list(readers.windows(plain.out, length=49, batch_size=64, resident=resident, drop_remainder=False))
    assert [len(b["act"]) for b in kept] == [2]


def test_resident_windows_from_memory_with_fewer_windows_than_a_batch(plain):
    with pytest.raises(ValueError, match=r"resident_windows has 2 windows for this pipeline, fewer than batch_size=3"):
        readers.resident_windows(plain.episodes, length=49, batch_size=3)


# --- what a new user trips on -------------------------------------------------------------------------------------


def test_readers_episodes_refuses_an_image_dataset_too(photos):
    with pytest.raises(ValueError, match=re.escape(f"{photos}: an 'images' dataset, not episodes (got kind='images' "
                                                   "in dataset.json); read it with readers.images")):
        readers.episodes(photos)


def _pipeline_windows(data, length, shift, horizon=0, context=None) -> int:
    """Windows in this pipeline's shards, from the manifest (pipeline i of n reads every n-th shard from i)."""
    split = data.manifest.splits["train"]
    mine = set(range(len(split.shards)))
    if context is not None:
        mine = set(range(context.input_pipeline_id, len(split.shards), context.num_input_pipelines))
    lengths = [e.length for e in split.episodes if e.shard in mine]
    return sum((t - length - horizon) // shift + 1 for t in lengths if t >= length + horizon)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("fixture, pipelines, length, shift, targets, batch", [
    ("plain", 1, 4, 3, None, 4), ("chunked", 1, 4, 3, 2, 5), ("chunked", 2, 2, 1, None, 3)])
def test_streamed_batch_count_is_known_and_exact(request, fixture, pipelines, length, shift, targets, batch,
                                                 drop_remainder, shuffle):
    """Streamed windows had unknown cardinality, so Keras warned "Your input ran out of data" every epoch."""
    data = request.getfixturevalue(fixture)
    assert len(data.manifest.splits["train"].shards) >= pipelines
    for pipeline in range(pipelines):
        context = None if pipelines == 1 else tf.distribute.InputContext(pipelines, pipeline)
        ds = readers.windows(data.out, length=length, shift=shift, batch_size=batch, features="act", targets=targets,
                             resident=False, shuffle=shuffle, seed=0, shuffle_buffer=8, drop_remainder=drop_remainder,
                             input_context=context)
        count = _pipeline_windows(data, length, shift, targets or 0, context)
        expected = count // batch if drop_remainder else -(-count // batch)
        assert count % batch and expected > 1  # a partial batch to drop or keep
        assert len(ds) == int(ds.cardinality()) == expected
        assert len(list(ds)) == expected


def test_keras_fit_on_streamed_windows_does_not_warn_that_the_input_ran_out_of_data(plain, caplog):
    import logging
    import warnings

    import keras
    ds = readers.windows(plain.out, length=6, shift=2, batch_size=4, features="obs", targets="same", seed=0,
                         resident=False, shuffle_buffer=8)
    model = keras.Sequential([keras.Input((6, 2)), keras.layers.Flatten(), keras.layers.Dense(12),
                              keras.layers.Reshape((6, 2))])
    model.compile(optimizer="sgd", loss="mse")

    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(ds, epochs=2, verbose=0, shuffle=False)

    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "ran out of data" in m], said
    assert len(history.history["loss"]) == 2


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """One .npy file per episode: a one-feature dataset whose feature the converter names ``data`` (float32 [T, 2])."""
    src = tmp_path_factory.mktemp("npy-src")
    out = tmp_path_factory.mktemp("npy") / "out"
    written = {f"ep{i}.npy": e for i, e in enumerate(random_episodes([20, 9, 14], seed=4))}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, num_shards=2)
    listed = manifest.splits["train"].episodes
    order = [written[e.source] for e in sorted(listed, key=lambda e: e.id)]  # source order: resident, unshuffled
    return types.SimpleNamespace(out=str(out), manifest=manifest, episodes={"data": order})


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("targets", [None, "same", "data", 2])
def test_one_feature_dataset_gives_tensors_without_naming_it(npy, resident, targets):
    """A Keras Sequential could not take {'data': ...}; features=None on a one-feature dataset is features='data'."""
    options = {"length": 4, "shift": 2, "batch_size": 3, "targets": targets, "shuffle": False,
               "drop_remainder": False, "resident": resident}
    unnamed = readers.windows(npy.out, **options)
    named = readers.windows(npy.out, features="data", **options)

    assert unnamed.element_spec == named.element_spec
    spec = unnamed.element_spec if targets is None else unnamed.element_spec[0]
    assert isinstance(spec, tf.TensorSpec) and spec.shape.as_list()[1:] == [4, 2]
    for a, b in zip(unnamed, named, strict=True):
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    windows, futures = reference(npy.episodes["data"], 4, 2, targets if isinstance(targets, int) else 0)
    first = next(iter(unnamed))
    x, y = (first, None) if targets is None else first
    np.testing.assert_array_equal(x.numpy(), np.stack(windows[:3]))
    if targets is not None:
        np.testing.assert_array_equal(y.numpy(), np.stack(futures[:3]) if targets == 2 else x.numpy())
    # a list still asks for dicts
    assert isinstance(next(iter(readers.windows(npy.out, features=["data"], **options))), (dict, tuple))


def test_episodes_of_a_one_feature_dataset_stay_records_of_named_features(npy):
    assert set(next(iter(readers.episodes(npy.out)))) == {"data"}


def test_a_keras_sequential_trains_on_a_one_feature_dataset_as_is(npy):
    import keras
    ds = readers.windows(npy.out, length=4, shift=1, batch_size=4, targets=1, seed=0)
    model = keras.Sequential([keras.Input((4, 2)), keras.layers.Flatten(), keras.layers.Dense(2),
                              keras.layers.Reshape((1, 2))])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(ds, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])


# --- the dataset replaced under resident windows -----------------------------------------------------------------


def _two_runs(tmp_path) -> tuple[str, callable]:
    """OUT converted from episodes A, and the ``--overwrite`` of it from episodes B (same lengths, other values)."""
    for name, seed in (("a", 1), ("b", 2)):
        save_episodes(tmp_path / name, {f"e{i}.npy": e for i, e in enumerate(random_episodes([30, 40, 50], seed=seed))})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "a", out, num_shards=3)
    return out, lambda: convert_episode_tree(tmp_path / "b", out, num_shards=3, overwrite=True)


@pytest.mark.parametrize("repeat", [False, True])
def test_resident_windows_fail_the_epoch_after_an_overwrite_instead_of_serving_the_old_episodes(tmp_path, repeat):
    """The episodes were loaded into device memory once: without the epoch check every later epoch silently served
    the old ones."""
    out, overwrite = _two_runs(tmp_path)
    ds = readers.windows(out, length=8, shift=4, batch_size=4, seed=0, repeat=repeat)
    iterator = iter(ds)
    per_epoch = readers.info(out).num_windows("train", 8, 4) // 4
    for _ in range(per_epoch if repeat else len(ds)):  # one whole epoch
        next(iterator)
    overwrite()
    changed = re.escape(out) + r": the dataset changed since the pipeline reading it was built .*build the pipeline"
    with pytest.raises(tf.errors.InvalidArgumentError, match=changed):
        if repeat:
            for _ in range(2 * per_epoch):  # into the next epoch
                next(iterator)
        else:
            list(ds)
    assert len(list(readers.windows(out, length=8, shift=4, batch_size=4))) == per_epoch  # built again: B

# --- the window options of issue 22 (Targets, sampling_rate, time_range, padding/pad_value, labels) --------------
# The edges where the modes (resident, streamed, model_windows) or the manifest-only counts could disagree, and the
# arguments that must be refused up front with a message naming them. Tiny episodes only.


SHORT_LENGTHS = [5, 7, 9]


@pytest.fixture(scope="module")
def short_dtypes(tmp_path_factory):
    """Three episodes in source order (``seed=None``): ``x`` float64 [T, 2], ``u`` uint8 [T], ``b`` bool [T],
    cut into chunk records of a few steps."""
    root = tmp_path_factory.mktemp("options")
    rng = np.random.default_rng(0)
    episodes = {f"e{i}.npz": {"x": rng.standard_normal((t, 2)), "u": rng.integers(0, 200, t).astype(np.uint8),
                              "b": rng.integers(0, 2, t).astype(bool)} for i, t in enumerate(SHORT_LENGTHS)}
    save_episodes(root / "src", episodes)
    convert_episode_tree(root / "src", root / "out", seed=None, episode=EpisodeOptions(max_record_bytes=64))
    return str(root / "out"), [episodes[f"e{i}.npz"] for i in range(len(SHORT_LENGTHS))]


@pytest.fixture(scope="module")
def value_labelled(tmp_path_factory):
    """Four float32 episodes labelled with float values through a labels CSV, in source order."""
    root = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(1)
    save_episodes(root / "src", {f"ep{i}.npy": rng.standard_normal((t, 2)).astype(np.float32)
                                 for i, t in enumerate([6, 9, 4, 7])})
    labels = [0.5, -1.25, 3.0, 2.5]
    csv = root / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"ep{i}.npy,{v}\n" for i, v in enumerate(labels)))
    convert_episode_tree(root / "src", root / "out", seed=None, episode=EpisodeOptions(labels_file=str(csv)))
    return str(root / "out"), labels


def _first_inputs(ds):
    return next(iter(ds))["inputs"].numpy()


def test_streamed_pads_a_float64_feature_with_the_pad_value_resident_mode_pads(short_dtypes):
    """Attacks streamed padding: ``episode_windows`` builds the padding with ``tf.cast(pad_value, dtype)``, which
    first makes a float32 tensor of a Python float, so a float64 feature's pad_value=0.1 becomes
    0.10000000149011612 (and 1e300 becomes inf) while resident mode pads exactly 0.1 (1e300). pad_fill accepted
    both values as exactly held by float64; the two modes must then pad alike."""
    out, _ = short_dtypes
    for pad_value in (0.1, 1e300):
        options = dict(length=3, shift=1, batch_size=64, features="x", padding="start", pad_value=pad_value,
                       shuffle=False, drop_remainder=False)
        resident = _first_inputs(readers.windows(out, **options))
        streamed = _first_inputs(readers.windows(out, resident=False, **options))
        assert resident[0, 0, 0] == pad_value
        np.testing.assert_array_equal(streamed, resident, err_msg=f"pad_value={pad_value!r}")


def test_targets_of_a_non_name_is_a_message_not_a_python_error():
    """Attacks ``Targets(123)``: ``tuple(123)`` in ``__post_init__`` raises a bare "'int' object is not iterable";
    the frozen spec must name its field and the allowed values, as width and offset do."""
    with pytest.raises((TypeError, ValueError), match=r"Targets: features"):
        readers.Targets(123, width=1)


def test_an_int_time_range_past_any_episode_is_refused_in_both_modes(short_dtypes):
    """Attacks streamed ``time_range`` ints: ``(0, 2**63)`` is accepted (ints are cut to T) and resident mode gives
    every window, but the streamed graph makes ``tf.constant(2**63, tf.int64)`` of it and the read dies with a
    ResourceExhaustedError in a ``range`` op. Either refuse it up front naming time_range, or yield the same."""
    out, _ = short_dtypes
    options = dict(length=3, batch_size=4, features="x", shuffle=False, drop_remainder=False)
    for resident in (True, False):  # refused up front in both modes, naming it and the fix
        with pytest.raises(ValueError, match=r"time_range: steps must be at most 2147483647.*\(a, 1.0\)"):
            readers.windows(out, time_range=(0, 2**63), resident=resident, **options)


def test_num_windows_refuses_a_horizon_beside_targets(short_dtypes):
    """Attacks ``DatasetInfo.num_windows(split, length, shift, horizon, targets=...)``: given both, the horizon is
    silently dropped (``num_windows("train", 3, 1, 2, targets="same")`` counts windows of 3 steps, not 3 + 2).
    Two ways of saying the span must not disagree silently: refuse the pair, naming both."""
    out, _ = short_dtypes
    with pytest.raises(ValueError, match="horizon"):
        readers.info(out).num_windows("train", 3, 1, 2, targets="same")


def test_num_windows_of_label_targets_on_an_unlabelled_dataset_is_refused_as_the_reader_does(short_dtypes):
    """Attacks the "same arguments as readers.windows" promise of ``num_windows``: ``targets="label"`` on a dataset
    without labels is refused by the reader but counted (8 windows) from the manifest."""
    out, _ = short_dtypes
    with pytest.raises(ValueError, match="label"):
        readers.windows(out, length=3, batch_size=2, targets="label")
    with pytest.raises(ValueError, match="label"):
        readers.info(out).num_windows("train", 3, targets="label")


def test_the_padding_hint_is_given_only_when_padding_serves_the_short_episodes(short_dtypes, caplog):
    """Attacks the "padding='start' serves them" hint of ``tfshard info --length`` (``report.window_lines``) and of
    the reader's warning: it is printed whenever an episode is too short, but padding only adds windows whose span
    ends inside the episode: with a horizon of 9 after 3 steps, episodes of 5, 7 and 9 steps get none, padded or not
    (``too_short(..., padding="start")`` says so), and with shift > length - 1 padding adds no window at all."""
    from tfshard.tools.report import window_lines

    out, _ = short_dtypes
    info = readers.info(out)
    assert info.too_short("train", 3, 1, targets=9) == 3
    assert info.too_short("train", 3, 1, targets=9, padding="start") == 3  # padding serves none
    lines = window_lines(info.manifest, length=3, shift=1, horizon=9)
    assert not any("padding='start' serves" in line for line in lines), lines
    assert info.too_short("train", 6, 9) == 1 and info.too_short("train", 6, 9, padding="start") == 1
    with caplog.at_level("WARNING"):
        readers.windows(out, length=6, shift=9, batch_size=1, features="x")
    assert "padding='start' serves them too" not in caplog.text


def test_info_horizon_or_shift_without_length_is_an_error(short_dtypes, cli):
    """Attacks ``tfshard info OUT --horizon 3`` (and ``--shift 4``) without ``--length``: the options are
    documented "With --length" and are silently ignored (exit 0, no window lines); they must be a one-line error
    naming --length."""
    out, _ = short_dtypes
    for flag in (["--horizon", "3"], ["--shift", "4"]):
        result = cli("info", out, *flag)
        assert result.exit_code != 0, (flag, result.output)
        assert "--length" in result.output


def _windows_by_mode(path, **options):
    """``[(keys, element)]`` numpy batches of resident, streamed and model_windows for the same options."""
    out = {}
    for mode in ("resident", "streamed"):
        ds = readers.windows(path, with_keys=True, resident=mode == "resident", shuffle=False, drop_remainder=False,
                             **options)
        out[mode] = [tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds]
    mw = readers.model_windows(path, shuffle=False, drop_remainder=False, **options)
    out["model_windows"] = [tf.nest.map_structure(lambda t: t.numpy(), (mw.keys(s), mw.element(s)))
                            for s in mw.starts]
    return out


def _assert_same(batches):
    modes = list(batches)
    for mode in modes[1:]:
        assert len(batches[mode]) == len(batches[modes[0]]), mode
        for a, b in zip(batches[modes[0]], batches[mode]):
            tf.nest.assert_same_structure(a, b)
            for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
                np.testing.assert_array_equal(x, y, err_msg=mode)


@pytest.mark.parametrize("options", [
    dict(features=["x", "u"], targets=readers.Targets(["u", "b"], width=2, offset=3), sampling_rate=2,
         time_range=(0.2, 1.0), padding="start", pad_value=0),
    dict(features="x", targets=readers.Targets(width=3, offset=0), time_range=(1, 100), padding="start",
         pad_value=float("nan")),
    dict(features="u", targets=2, padding="start", pad_value=255, shift=2),
], ids=["dict-targets-rate-2-fraction-range-padded", "horizon-form-int-range-nan-pad", "uint8-padded-255-shift-2"])
def test_every_mode_gives_the_same_windows_in_the_same_order(short_dtypes, options):
    """Resident, streamed (source order: seed=None) and model_windows agree batch for batch, keys included, with
    dict targets of a feature both input and target beside target-only ones, a NaN pad, uint8 padded with 255,
    and the count is num_windows'."""
    out, _ = short_dtypes
    options = {"length": 3, "shift": 1, "batch_size": 3, **options}
    batches = _windows_by_mode(out, **options)
    _assert_same(batches)
    count_args = {k: options[k] for k in ("targets", "sampling_rate", "time_range", "padding") if k in options}
    total = readers.info(out).num_windows("train", 3, options["shift"], **count_args)
    assert sum(len(k["episode"]) for k, _ in batches["resident"]) == total
    assert len(readers.windows(out, shuffle=False, drop_remainder=False, **options)) == -(-total // 3)


def test_a_nan_pad_keeps_the_mask_and_the_real_points(short_dtypes):
    """pad_value=NaN on a float feature: the mask is where points are real, the real points are the episode's and
    only the padded ones are NaN."""
    out, episodes = short_dtypes
    ds = readers.windows(out, length=3, batch_size=64, features="x", padding="start", pad_value=float("nan"),
                         shuffle=False, drop_remainder=False, with_keys=True)
    for keys, x in ds:
        for e, s, window, mask in zip(keys["episode"].numpy(), keys["step"].numpy(), x["inputs"].numpy(),
                                      x["mask"].numpy()):
            points = s + np.arange(3)
            np.testing.assert_array_equal(mask, points >= 0)
            assert np.isnan(window[~mask]).all()
            np.testing.assert_array_equal(window[mask], episodes[e]["x"][points[mask]])


def test_pad_values_a_dtype_cannot_hold_are_refused_naming_the_feature(short_dtypes):
    """uint8 padded with 256 or -1, bool with 2, NaN for an int: refused before reading, naming feature and dtype."""
    out, _ = short_dtypes
    for feature, pad_value in (("u", 256), ("u", -1), ("b", 2), ("u", float("nan"))):
        with pytest.raises(ValueError, match=rf"pad_value=.* cannot be held by feature '{feature}'"):
            readers.windows(out, length=3, batch_size=2, features=feature, padding="start", pad_value=pad_value)


@pytest.mark.parametrize("time_range, match", [
    ((0.5,), "must be a pair"), ((True, 1), "not a mix"), ((0, 0.8), "not a mix"), ((0.8, 0.2), "0 <= a < b <= 1"),
    ((0.0, float("nan")), "0 <= a < b <= 1"), ((3, 3), "0 <= a < b"),
])
def test_bad_time_ranges_are_refused_naming_the_argument(short_dtypes, time_range, match):
    """Malformed time ranges are ValueErrors naming time_range, before anything is read."""
    out, _ = short_dtypes
    with pytest.raises(ValueError, match=rf"time_range: .*{match}"):
        readers.windows(out, length=3, batch_size=2, features="x", time_range=time_range)


def test_numpy_arguments_and_the_whole_range_are_the_plain_ones(short_dtypes):
    """sampling_rate=np.int64(2) is accepted and equals 2; time_range=(0.0, 1.0) is exactly no time_range."""
    out, _ = short_dtypes
    options = dict(length=3, batch_size=64, features="x", shuffle=False, drop_remainder=False)
    plain = next(iter(readers.windows(out, sampling_rate=2, **options))).numpy()
    np.testing.assert_array_equal(next(iter(readers.windows(out, sampling_rate=np.int64(2), **options))), plain)
    whole = next(iter(readers.windows(out, time_range=(0.0, 1.0), **options))).numpy()
    np.testing.assert_array_equal(whole, next(iter(readers.windows(out, **options))).numpy())


def test_value_labels_reach_each_replica_of_model_windows(value_labelled, strategies):
    """Float labels with padding gathered by model_windows inside a MirroredStrategy step: each replica's labels
    are its windows' episodes' labels (float32)."""
    out, labels = value_labelled
    strategy = strategies[2]
    mw = readers.model_windows(out, length=3, shift=1, batch_size=4, targets="label", padding="start",
                               pad_value=-1.0, shuffle=False, strategy=strategy)

    @tf.function
    def step(starts):
        return strategy.run(lambda s: (mw.keys(s)["episode"], mw.element(s)[1]), (starts,))

    checked = 0
    for starts in strategy.experimental_distribute_dataset(mw.starts):
        episodes, got = step(starts)
        for e, y in zip(strategy.experimental_local_results(episodes), strategy.experimental_local_results(got)):
            assert y.dtype == tf.float32
            np.testing.assert_array_equal(y.numpy(), np.asarray(labels, np.float32)[e.numpy()])
            checked += len(y)
    assert checked == readers.info(out).num_windows("train", 3, targets="label", padding="start") // 4 * 4


def test_a_manifest_label_that_disagrees_with_the_records_is_refused_in_every_mode(value_labelled, tmp_path):
    """Two episodes' labels swapped in the manifest: resident, model_windows, streamed and readers.episodes refuse
    (never yield the manifest's or the record's label silently)."""
    import shutil

    src, _ = value_labelled
    out = str(tmp_path / "tampered")
    shutil.copytree(src, out)

    def swap(raw):
        eps = raw["splits"]["train"]["episodes"]
        eps[0]["label"], eps[1]["label"] = eps[1]["label"], eps[0]["label"]

    edit_manifest(out, swap)
    options = dict(length=3, batch_size=2, targets="label", shuffle=False)
    with pytest.raises(ValueError, match="its records say label 0.5, the manifest says -1.25"):
        readers.windows(out, **options)
    with pytest.raises(ValueError, match="its records say label"):
        readers.model_windows(out, **options)
    with pytest.raises(tf.errors.InvalidArgumentError, match="has label"):
        list(readers.windows(out, resident=False, **options))
    with pytest.raises(tf.errors.InvalidArgumentError, match="has label"):
        list(readers.episodes(out))
