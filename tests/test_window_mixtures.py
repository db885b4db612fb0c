"""readers.windows and readers.model_windows on the index-driven stream (issue 32): mixtures of episode datasets,
class balance by episode label and elastic resume, read back from real converted datasets and checked against what
``readers/sampling`` predicts. (readers.images and readers.episodes on the stream: tests/test_mixtures.py.)"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, numbered_episodes, save_episodes, wide_episodes, write_text
from tfshard import readers
from tfshard.ingest import EpisodeOptions
from tfshard.readers.indexed import stream as stream_lib
from tfshard.readers.sampling.plan import StreamSpec, epoch_order

# === windows (readers.windows, readers.model_windows) ===============================================================
# Episode datasets whose feature ``t`` numbers every step uniquely across all of them, so a window is known by its
# first step, ``t[0]``; windows of length 4, shift 2.

WINDOW = {"length": 4, "shift": 2, "features": "t"}


@pytest.fixture(scope="module")
def episode_sets(tmp_path_factory):
    """``a``: 14 windows, ``b``: 6 (so 70/30 of 20 is one pass of each), ``tilted``: classes big (20 windows) and
    small (2), ``wide``: ``a``'s lengths with ``obs`` float64 [T, 3]."""
    root = tmp_path_factory.mktemp("episode-mixtures")
    return {"a": numbered_episodes(root, "a", [12, 10, 8, 6], 0),
            "b": numbered_episodes(root, "b", [8, 6, 4], 100_000),
            "tilted": numbered_episodes(root, "tilted", [12, 12, 12, 12, 6], 200_000,
                                        classes=["big"] * 4 + ["small"]),
            "wide": wide_episodes(root)}


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


@pytest.mark.parametrize("chunk", [None, 4], ids=["epoch-chunks", "small-chunks"])
def test_windows_mixture_is_the_order_sampling_predicts_and_model_windows_reads_it_too(episode_sets, chunk,
                                                                                       monkeypatch):
    if chunk is not None:  # an epoch read in chunks of one step, as one of more than CHUNK_ELEMENTS is
        monkeypatch.setattr(stream_lib, "CHUNK_ELEMENTS", chunk)
    a, b = _windows_of(episode_sets["a"]), _windows_of(episode_sets["b"])
    paths = [episode_sets["a"], episode_sets["b"]]
    options = dict(batch_size=4, seed=7, weights=[0.7, 0.3], epoch_size=20, with_source=True, **WINDOW)
    ds = readers.windows(paths, **options)
    got = _keyed(ds)
    spec = StreamSpec(sizes=(14, 6), weights=(0.7, 0.3), epoch_size=20, seed=7)
    for epoch, epoch_got in enumerate([got, _keyed(ds)]):  # each iteration the next epoch
        sources, records = epoch_order(spec, epoch)
        assert epoch_got == [((a, b)[s][r], s) for s, r in zip(sources.tolist(), records.tolist())]
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
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=64, epoch_size=20, **WINDOW),
     "{a} + {b}: the stream gives 20 windows an epoch, fewer than one global batch of 64"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, input_context=tf.distribute.InputContext(2, 0, 2),
                               **WINDOW),
     "{a} + {b}: the stream read by several workers or input pipelines needs one order for all, so a seed (got "
     "seed=None under "
     "input_context of 2 input pipelines); pass seed=<int>, the same on every worker"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, seed=0,
                               strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), **WINDOW),
     "{a} + {b}: the stream (mixtures, balance, elastic resume) holds every window on every replica and supports "
     "MirroredStrategy and MultiWorkerMirroredStrategy (got OneDeviceStrategy)"),
], ids=["features", "unlabelled", "negative-weight", "weights-length", "empty-epoch", "unseeded-workers",
        "one-device"])
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
