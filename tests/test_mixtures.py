"""readers.images, readers.windows and readers.model_windows on the index-driven stream (issue 32): mixtures of
datasets, class balance, a global shuffle and elastic resume, read back from real converted datasets and checked
against what ``readers/sampling`` predicts."""

from __future__ import annotations

import collections
import hashlib
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, convert_image_tree, flat_jpegs, make_tree, save_episodes, write_text
from tfshard import readers
from tfshard.ingest import EpisodeOptions, ImageOptions
from tfshard.readers.sampling import classes as sampling_classes
from tfshard.readers.sampling.plan import StreamSpec, epoch_order, shares

SIZE = 16


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Three converted datasets: ``a`` (cat 7, dog 7; 3 shards, located by scanning the framing), ``b`` (dog 3,
    emu 3; one shard with a DALI index file), ``tilted`` (big 20, small 2: 10:1)."""
    root = tmp_path_factory.mktemp("mixtures")
    make_tree(root / "a", classes=("cat", "dog"), per_class=7)
    make_tree(root / "b", classes=("dog", "emu"), per_class=3, seed=100)
    make_tree(root / "t", classes=("big",), per_class=20, seed=200)
    make_tree(root / "t", classes=("small",), per_class=2, seed=300)
    convert_image_tree(root / "a", root / "A", num_shards=3)
    convert_image_tree(root / "b", root / "B", index=True)
    convert_image_tree(root / "t", root / "T", num_shards=2)
    return {"a": str(root / "A"), "b": str(root / "B"), "tilted": str(root / "T")}


def _digest(image) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:16]


def _records(path) -> list[str]:
    """Each record's identity (its centre crop's hash), in record order, by today's reader."""
    return [digest for digest, _ in _labelled(path)]


def _labelled(path) -> list[tuple[str, int]]:
    """``(identity, label)`` of each record, in record order, by today's reader."""
    ds = readers.images(path, batch_size=64, image_size=SIZE, training=False, num_parallel_reads=1)  # shard order
    return [(_digest(image), int(label)) for images, labels in ds for image, label in zip(images.numpy(),
                                                                                        labels.numpy())]


def _read(ds, steps=None) -> list[tuple[str, int, int]]:
    """``(image hash, label, source)`` of every element of a ``with_source=True`` dataset, in order."""
    out = []
    for images, labels in ds.take(steps) if steps is not None else ds:
        for image, label, source in zip(images.numpy(), labels["label"].numpy(), labels["source"].numpy()):
            out.append((_digest(image), int(label), int(source)))
    return out


# --- mixtures ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch_size", [20, 40])
def test_mixture_gives_each_source_its_share_and_every_record_once_a_pass(sets, epoch_size):
    a, b = _records(sets["a"]), _records(sets["b"])
    ds = readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, training=False, shuffle="global",
                        seed=5, weights=[0.7, 0.3], epoch_size=epoch_size, with_source=True)
    assert len(ds) == epoch_size // 4
    got = _read(ds)
    counts = collections.Counter(source for _, _, source in got)
    assert [counts[0], counts[1]] == list(shares(StreamSpec(sizes=(14, 6), weights=(0.7, 0.3),
                                                            epoch_size=epoch_size)))
    passes = epoch_size // 20  # both shares are whole passes here: 14·k and 6·k
    assert collections.Counter(h for h, _, s in got if s == 0) == collections.Counter(a * passes)
    assert collections.Counter(h for h, _, s in got if s == 1) == collections.Counter(b * passes)


def test_mixture_merges_class_names_by_name(sets):
    got = _read(readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, training=False, seed=0,
                               weights=[1, 1], epoch_size=12, with_source=True))
    # merged names: cat 0, dog 1, emu 2; b's dog (its 0) is 1, its emu (its 1) is 2
    b_labels = {digest: [1, 2][label] for digest, label in _labelled(sets["b"])}
    a_labels = dict(_labelled(sets["a"]))
    for digest, label, source in got:
        assert label == (a_labels if source == 0 else b_labels)[digest]


def test_mixture_is_seeded(sets):
    def run(seed):
        ds = readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, seed=seed, weights=[0.7, 0.3],
                            with_source=True)
        return _read(ds)

    first = run(3)
    assert run(3) == first
    assert run(4) != first


# --- class balance -------------------------------------------------------------------------------------------------


def test_balance_gives_every_class_an_equal_share_each_epoch(sets):
    ds = readers.images(sets["tilted"], batch_size=2, image_size=SIZE, seed=1, balance="class", repeat=True)
    labels = [int(x) for _, batch in ds.take(3 * 22 // 2) for x in batch.numpy()]
    for epoch in range(3):
        counts = collections.Counter(labels[epoch * 22:(epoch + 1) * 22])
        assert abs(counts[0] - counts[1]) <= 1 and sum(counts.values()) == 22


# --- global shuffle ------------------------------------------------------------------------------------------------


def test_global_shuffle_is_the_permutation_sampling_predicts(sets):
    records = _records(sets["a"])
    ds = readers.images(sets["a"], batch_size=2, image_size=SIZE, training=False, shuffle="global", seed=9,
                        repeat=True, with_source=True)
    got = [h for h, _, _ in _read(ds, steps=14)]
    spec = StreamSpec(sizes=(14,), shuffle=True, seed=9)
    for epoch in range(2):
        epoch_got = got[epoch * 14:(epoch + 1) * 14]
        assert sorted(epoch_got) == sorted(records)
        assert epoch_got == [records[r] for r in epoch_order(spec, epoch)[1]]
    assert got[:14] != got[14:]


def test_balance_is_the_order_sampling_predicts(sets):
    records, ids = zip(*_labelled(sets["tilted"]))
    ids = np.array(ids)
    spec, members = sampling_classes.balanced(ids, 2, shuffle=False, seed=4)  # training=False: in stream order
    ds = readers.images(sets["tilted"], batch_size=2, image_size=SIZE, training=False, balance="class", seed=4,
                        with_source=True)
    assert [h for h, _, _ in _read(ds)] == [records[r] for r in members.record(*epoch_order(spec, 0))]


# --- elastic resume -------------------------------------------------------------------------------------------------


def _stream(path, replicas, start, steps, global_batch=6, **kwargs):
    """The global batches of steps ``[start, start + steps)`` read by ``replicas`` plain input pipelines (each its
    slice, concatenated in replica order)."""
    batches = []
    for r in range(replicas):
        context = tf.distribute.InputContext(replicas, r, replicas)
        ds = readers.images(path, batch_size=global_batch // replicas, image_size=SIZE, seed=2, repeat=True,
                            start_step=start, input_context=context, shuffle="global", **kwargs)
        batches.append([images.numpy() for images, _ in ds.take(steps)])
    return [np.concatenate([b[s] for b in batches]) for s in range(steps)]


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1), (2, 3)])
@pytest.mark.parametrize("mixture", [False, True], ids=["one", "mixture"])
def test_elastic_resume_on_another_replica_count_reads_the_same_batches(sets, before, after, mixture):
    path = [sets["a"], sets["b"]] if mixture else sets["a"]
    kwargs = {"weights": [0.7, 0.3]} if mixture else {}
    whole = _stream(path, 1, 0, 8, **kwargs)
    resumed = _stream(path, before, 0, 3, **kwargs) + _stream(path, after, 3, 5, **kwargs)
    for step, (one, other) in enumerate(zip(whole, resumed)):
        np.testing.assert_array_equal(one, other, err_msg=f"step {step}")


def test_elastic_resume_under_mirrored_strategies(sets, strategies):
    whole = _stream(sets["a"], 1, 0, 6)

    def run(strategy, start, steps, from_function):
        def make(context=None):
            batch = 6 if context is None else context.get_per_replica_batch_size(6)
            return readers.images(sets["a"], batch_size=batch, image_size=SIZE, seed=2, repeat=True,
                                  start_step=start, input_context=context, shuffle="global")

        ds = strategy.distribute_datasets_from_function(make) if from_function else \
            strategy.experimental_distribute_dataset(make())
        out, it = [], iter(ds)
        for _ in range(steps):
            images, _ = next(it)
            out.append(np.concatenate([t.numpy() for t in strategy.experimental_local_results(images)]))
        return out

    for from_function in (True, False):
        resumed = run(strategies[2], 0, 2, from_function) + run(strategies[3], 2, 4, from_function)
        for step, (one, other) in enumerate(zip(whole, resumed)):
            np.testing.assert_array_equal(one, other, err_msg=f"step {step}, from_function={from_function}")


# --- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights, problem", [
    ([1.0], "weights: must give one weight per source, 2 (got 1 weights"),
    ([0.7, -0.3], "weights: must be positive finite numbers (got weights=[0.7, -0.3])"),
    ([0.7, float("nan")], "weights: must be positive finite numbers (got weights=[0.7, nan])"),
], ids=["length", "negative", "nan"])
def test_bad_weights_are_one_line(sets, weights, problem):
    with pytest.raises(ValueError, match=re.escape(f"{sets['a']} + {sets['b']}: {problem}")) as caught:
        readers.images([sets["a"], sets["b"]], batch_size=2, weights=weights)
    assert "\n" not in str(caught.value)


def test_balance_on_value_labels_is_refused(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, ["a", "b", "c"])
    rows = "path,age\na.jpg,1.5\nb.jpg,2\nc.jpg,3\n"
    convert_image_tree(src, out, image=ImageOptions(labels_file=write_text(tmp_path / "l.csv", rows)), seed=None)
    with pytest.raises(ValueError, match=re.escape(f"{out}: balance='class' needs one class per image (got 'value' "
                                                   "labels)")):
        readers.images(str(out), batch_size=1, balance="class")


def test_mixture_of_label_kinds_is_refused_naming_both(sets, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, ["a", "b"])
    rows = write_text(tmp_path / "l.csv", "path,age\na.jpg,1.5\nb.jpg,2.5\n")
    convert_image_tree(src, out, image=ImageOptions(labels_file=rows), seed=None)
    with pytest.raises(ValueError, match=re.escape(f"{out}: its labels are not {sets['a']}'s")):
        readers.images([sets["a"], str(out)], batch_size=1)


def test_remote_with_index_files_reads_the_same_stream(sets):
    bucket = "ram://mixtures-indexed"  # stands in for gs://: records read one FixedLengthRecordDataset each
    tf.io.gfile.makedirs(bucket)
    try:
        for name in tf.io.gfile.listdir(sets["b"]):
            if not tf.io.gfile.isdir(f"{sets['b']}/{name}"):
                tf.io.gfile.copy(f"{sets['b']}/{name}", f"{bucket}/{name}", overwrite=True)
        arguments = {"batch_size": 2, "image_size": SIZE, "seed": 1, "with_source": True, "shuffle": "global"}
        assert _read(readers.images(bucket, **arguments)) == _read(readers.images(sets["b"], **arguments))
    finally:
        tf.io.gfile.rmtree(bucket)


def test_remote_without_index_or_shard_cache_is_refused(sets):
    bucket = "ram://mixtures-remote"
    tf.io.gfile.makedirs(bucket)
    try:
        for name in tf.io.gfile.listdir(sets["a"]):
            if not tf.io.gfile.isdir(f"{sets['a']}/{name}"):
                tf.io.gfile.copy(f"{sets['a']}/{name}", f"{bucket}/{name}", overwrite=True)
        with pytest.raises(ValueError, match="a remote shard without an index file cannot be read by record position "
                                             r".*convert with --index .*or pass shard_cache=DIR"):
            readers.images(bucket, batch_size=1, shuffle="global")
    finally:
        tf.io.gfile.rmtree(bucket)


@pytest.mark.parametrize("arguments, problem", [
    ({"cache": "memory"}, "cache='memory': each epoch reads its records by position"),
    ({"ignore_errors": True}, "ignore_errors=True: a skipped record would shift"),
    ({"deterministic": False}, "deterministic=False: the order is the point"),
    ({"weights": [1, 1], "balance": "class"}, "balance='class' gives every class an equal share"),
    ({"shuffle": "files"}, "shuffle must be one of (None, 'global')"),
])
def test_stream_refuses_what_it_cannot_honour(sets, arguments, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        readers.images([sets["a"], sets["b"]], batch_size=2, **arguments)


# === windows (readers.windows, readers.model_windows) ===============================================================
# Episode datasets whose feature ``t`` numbers every step uniquely across all of them, so a window is known by its
# first step, ``t[0]``; windows of length 4, shift 2.

WINDOW = {"length": 4, "shift": 2, "features": "t"}


def _episodes(root, name, lengths, base, classes=None, **options) -> str:
    """Episodes ``e{i}`` of ``lengths`` (under class folders ``classes[i]`` when given): ``t`` int64 [T] counting
    from ``base + 1000·i``, ``obs`` float32 [T, 2]; converted into 2 shards; returns the output folder."""
    src, out = root / f"{name}-src", root / name
    save_episodes(src, {(f"{classes[i]}/" if classes else "") + f"e{i}.npz": {
        "t": np.arange(base + 1000 * i, base + 1000 * i + t, dtype=np.int64),
        "obs": np.full((t, 2), i, np.float32)} for i, t in enumerate(lengths)})
    convert_episode_tree(src, out, num_shards=2, **options)
    return str(out)


@pytest.fixture(scope="module")
def episode_sets(tmp_path_factory):
    """``a``: 14 windows, ``b``: 6 (so 70/30 of 20 is one pass of each), ``tilted``: classes big (20 windows) and
    small (2), ``wide``: ``a``'s lengths with ``obs`` float64 [T, 3]."""
    root = tmp_path_factory.mktemp("episode-mixtures")
    wide_src = root / "wide-src"
    save_episodes(wide_src, {f"e{i}.npz": {"t": np.arange(t, dtype=np.int64), "obs": np.zeros((t, 3))}
                             for i, t in enumerate([12, 10])})
    convert_episode_tree(wide_src, root / "wide", num_shards=1)
    return {"a": _episodes(root, "a", [12, 10, 8, 6], 0), "b": _episodes(root, "b", [8, 6, 4], 100_000),
            "tilted": _episodes(root, "tilted", [12, 12, 12, 12, 6], 200_000,
                                classes=["big"] * 4 + ["small"]),
            "wide": str(root / "wide")}


def _windows_of(path) -> list[int]:
    """Every window's first step, in source order, by today's reader."""
    ds = readers.windows(path, batch_size=64, shuffle=False, drop_remainder=False, **WINDOW)
    return [int(w[0]) for batch in ds for w in batch.numpy()]


def _keyed(ds, steps=None) -> list[tuple[int, int]]:
    """``(first step, source)`` of every window of a ``with_source=True`` dataset, in order; each window checked to
    be the steps its first one starts."""
    out = []
    for keys, batch in ds.take(steps) if steps is not None else ds:
        batch = batch.numpy()
        np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(4))
        out.extend(zip(batch[:, 0].tolist(), keys["source"].numpy().tolist()))
    return out


@pytest.mark.parametrize("epoch_size", [20, 40])
def test_windows_mixture_gives_each_source_its_share_and_every_window_once_a_pass(episode_sets, epoch_size):
    a, b = _windows_of(episode_sets["a"]), _windows_of(episode_sets["b"])
    assert (len(a), len(b)) == (14, 6)
    ds = readers.windows([episode_sets["a"], episode_sets["b"]], batch_size=4, seed=5, weights=[0.7, 0.3],
                         epoch_size=epoch_size, with_source=True, **WINDOW)
    assert len(ds) == epoch_size // 4
    passes = epoch_size // 20
    for _ in range(2):  # each iteration is the next epoch
        got = _keyed(ds)
        assert collections.Counter(s for _, s in got) == {0: 14 * passes, 1: 6 * passes}
        assert collections.Counter(w for w, s in got if s == 0) == collections.Counter(a * passes)
        assert collections.Counter(w for w, s in got if s == 1) == collections.Counter(b * passes)


def test_windows_mixture_subsampled_walks_through_every_window_before_any_again(episode_sets):
    a, b = _windows_of(episode_sets["a"]), _windows_of(episode_sets["b"])
    ds = readers.windows([episode_sets["a"], episode_sets["b"]], batch_size=5, seed=2, weights=[0.7, 0.3],
                         epoch_size=10, with_source=True, repeat=True, **WINDOW)
    got = _keyed(ds, steps=4)  # two epochs of 7 + 3: one pass of each source
    assert sorted(w for w, s in got if s == 0) == sorted(a)
    assert sorted(w for w, s in got if s == 1) == sorted(b)


def test_windows_mixture_is_the_order_sampling_predicts_and_model_windows_reads_it_too(episode_sets):
    a, b = _windows_of(episode_sets["a"]), _windows_of(episode_sets["b"])
    paths = [episode_sets["a"], episode_sets["b"]]
    options = dict(batch_size=4, seed=7, weights=[0.7, 0.3], epoch_size=20, with_source=True, **WINDOW)
    got = _keyed(readers.windows(paths, **options))
    spec = StreamSpec(sizes=(14, 6), weights=(0.7, 0.3), epoch_size=20, seed=7)
    sources, records = epoch_order(spec, 0)
    assert got == [((a, b)[s][r], s) for s, r in zip(sources.tolist(), records.tolist())]
    windows = readers.model_windows(paths, **options)
    assert len(windows.starts) == 5
    in_model = [(int(w[0]), int(s)) for starts in windows.starts
                for w, s in zip(windows.element(starts).numpy(), windows.keys(starts)["source"].numpy())]
    assert in_model == got


def test_windows_balance_gives_every_episode_class_an_equal_share_each_epoch(episode_sets):
    windows = _windows_of(episode_sets["tilted"])
    assert len(windows) == 22  # big 4 × 5 windows, small 2
    ds = readers.windows(episode_sets["tilted"], batch_size=2, seed=1, balance="class", targets="label",
                         repeat=True, **WINDOW)
    labels = [int(x) for _, batch in ds.take(3 * 22 // 2) for x in batch.numpy()]
    for epoch in range(3):
        counts = collections.Counter(labels[epoch * 22:(epoch + 1) * 22])
        assert abs(counts[0] - counts[1]) <= 1 and sum(counts.values()) == 22


def test_windows_balance_with_an_odd_epoch_size_is_within_one(episode_sets):
    ds = readers.windows(episode_sets["tilted"], batch_size=1, seed=3, balance="class", epoch_size=9,
                         targets="label", **WINDOW)
    assert len(ds) == 9
    counts = collections.Counter(int(label[0]) for _, label in ds)
    assert sorted(counts.values()) == [4, 5]


def _window_steps(strategy, paths, start, steps, global_batch=6, **kwargs) -> list[list[int]]:
    """The global batches (first steps, replicas' slices concatenated in replica order) of global steps ``[start,
    start + steps)``: one pipeline of global batches (``strategy`` None) or one per replica."""
    ds = readers.windows(paths, batch_size=global_batch, seed=2, repeat=True, start_step=start, strategy=strategy,
                         weights=[0.7, 0.3], **WINDOW, **kwargs)
    it = iter(ds)
    out = []
    for _ in range(steps):
        batch = next(it)
        parts = [batch] if strategy is None else strategy.experimental_local_results(batch)
        out.append([int(w[0]) for part in parts for w in part.numpy()])
    return out


def _context_steps(replicas, paths, start, steps, global_batch=6) -> list[list[int]]:
    """The same, read by ``replicas`` plain input pipelines (``input_context``), each its slice."""
    parts = []
    for r in range(replicas):
        context = tf.distribute.InputContext(replicas, r, replicas)
        ds = readers.windows(paths, batch_size=global_batch // replicas, seed=2, repeat=True, start_step=start,
                             input_context=context, weights=[0.7, 0.3], **WINDOW)
        parts.append([[int(w[0]) for w in batch.numpy()] for batch in ds.take(steps)])
    return [sum((p[s] for p in parts), []) for s in range(steps)]


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1), (2, 3)])
def test_windows_elastic_resume_on_another_replica_count_reads_the_same_batches(episode_sets, before, after):
    paths = [episode_sets["a"], episode_sets["b"]]
    whole = _context_steps(1, paths, 0, 8)  # 48 windows: across two epochs of 20 and into a third
    assert whole == _window_steps(None, paths, 0, 8)
    assert _context_steps(before, paths, 0, 3) + _context_steps(after, paths, 3, 5) == whole


def test_windows_elastic_resume_under_mirrored_strategies(episode_sets, strategies):
    paths = [episode_sets["a"], episode_sets["b"]]
    whole = _window_steps(None, paths, 0, 7)
    assert _window_steps(strategies[2], paths, 0, 3) + _window_steps(strategies[3], paths, 3, 4) == whole

    def model_steps(strategy, start, steps):  # model_windows' global batches, split by the strategy
        windows = readers.model_windows(paths, batch_size=6, seed=2, repeat=True, start_step=start,
                                        weights=[0.7, 0.3], **WINDOW)
        it = iter(strategy.experimental_distribute_dataset(windows.starts))
        out = []
        for _ in range(steps):
            starts = np.concatenate([s.numpy() for s in strategy.experimental_local_results(next(it))])
            out.append([int(w[0]) for w in windows.element(tf.constant(starts)).numpy()])
        return out

    assert model_steps(strategies[3], 0, 2) + model_steps(strategies[2], 2, 5) == whole


def test_windows_stream_far_into_the_run_costs_one_epoch(episode_sets):
    paths = [episode_sets["a"], episode_sets["b"]]
    far = 10**9  # 6·10**9 windows in: one epoch's order, not the ones before it
    whole = _window_steps(None, paths, far - 1, 3)
    assert _window_steps(None, paths, far, 2) == whole[1:]


@pytest.mark.parametrize("make, problem", [
    (lambda s: readers.windows([s["a"], s["wide"]], batch_size=2, length=4, shift=2, features="obs"),
     "{a} + {wide}: the sources' features differ (got 'obs': float32 [2] in {a}, float64 [3] in {wide}); mix "
     "datasets converted with the same features"),
    (lambda s: readers.windows(s["a"], batch_size=2, balance="class", **WINDOW),
     "{a}: balance='class' needs one class per episode (got no labels)"),
    (lambda s: readers.model_windows([s["a"], s["b"]], batch_size=2, weights=[0.7, -0.3], **WINDOW),
     "{a} + {b}: weights: must be positive finite numbers (got weights=[0.7, -0.3])"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, weights=[1.0], **WINDOW),
     "{a} + {b}: weights: must give one weight per source, 2 (got 1 weights"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, resident=False, **WINDOW),
     "{a} + {b}: cannot read the index-driven stream (mixtures, balance, elastic resume) with resident=False"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=64, epoch_size=20, **WINDOW),
     "{a} + {b}: the stream gives 20 windows an epoch, fewer than one global batch of 64"),
], ids=["features", "unlabelled", "negative-weight", "weights-length", "streamed", "empty-epoch"])
def test_windows_stream_refusals_are_one_line(episode_sets, make, problem):
    with pytest.raises(ValueError, match=re.escape(problem.format(**episode_sets))) as caught:
        make(episode_sets)
    assert "\n" not in str(caught.value)


def test_windows_balance_on_value_labels_is_refused(tmp_path):
    src = tmp_path / "src"
    save_episodes(src, {f"e{i}.npy": np.zeros((6, 2), np.float32) for i in range(2)})
    labels = write_text(tmp_path / "labels.csv", "path,label\ne0.npy,0.5\ne1.npy,1.5\n")
    convert_episode_tree(src, tmp_path / "out", episode=EpisodeOptions(labels_file=labels))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'out'}: balance='class' needs one class per "
                                                   "episode (got 'value' labels)")):
        readers.windows(str(tmp_path / "out"), batch_size=1, length=2, balance="class")
