"""readers.windows(resident=False) on several paths (issue 32): each source its streamed pipeline, made endless, the
source of every window of an epoch chosen by ``readers/sampling`` (``readers/windows/streamed_mixture.py``), read
back from real converted datasets. (One streamed path: tests/test_reader_windows.py; resident mixtures:
tests/test_window_mixtures.py.)"""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import tensorflow as tf
from helpers import numbered_episodes, wide_episodes
from tfshard import readers
from tfshard.readers.files import split_info
from tfshard.readers.sampling.plan import StreamSpec, epoch_order, shares
from tfshard.readers.windows import streamed_mixture

# === mixtures of streamed windows ===================================================================================
# Episode datasets whose feature ``t`` numbers every step uniquely across all of them, so a window is known by its
# first step, ``t[0]``; windows of length 4, shift 2.

WINDOW = {"length": 4, "shift": 2, "features": "t", "resident": False, "shuffle_buffer": 8}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """``a``: 14 windows, ``b``: 6 (in 2 shards each), ``short``: one shard of 5 windows, one of none, ``wide``:
    ``obs`` float64 [T, 3], ``labelled``: two classes."""
    root = tmp_path_factory.mktemp("streamed-mixtures")
    return {"a": numbered_episodes(root, "a", [12, 10, 8, 6], 0),
            "b": numbered_episodes(root, "b", [8, 6, 4], 100_000),
            "short": numbered_episodes(root, "short", [12, 2], 300_000),
            "labelled": numbered_episodes(root, "labelled", [8, 8], 200_000, classes=["x", "y"]),
            "wide": wide_episodes(root)}


def _windows_of(path) -> list[int]:
    """Every window's first step, by today's resident reader."""
    ds = readers.windows(path, batch_size=64, shuffle=False, drop_remainder=False, length=4, shift=2, features="t")
    return [int(w[0]) for batch in ds for w in batch.numpy()]


def _keyed(ds) -> list[tuple[int, int]]:
    """``(first step, source)`` of every window of one epoch of a ``with_source=True`` dataset, in order; each window
    checked to be the steps its first one starts."""
    out = []
    for keys, batch in ds:
        batch = batch.numpy()
        np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(4))
        out.extend(zip(batch[:, 0].tolist(), keys["source"].numpy().tolist()))
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("weights, epoch_size", [(None, None), ([0.7, 0.3], 40), ([0.5, 0.5], 20)],
                         ids=["proportional", "two-passes", "b-repeats"])
def test_streamed_mixture_gives_exact_shares_and_each_window_once_a_pass(sets, weights, epoch_size, shuffle):
    a, b = _windows_of(sets["a"]), _windows_of(sets["b"])
    assert (len(a), len(b)) == (14, 6)
    ds = readers.windows([sets["a"], sets["b"]], batch_size=4, seed=5, weights=weights, epoch_size=epoch_size,
                         with_source=True, shuffle=shuffle, **WINDOW)
    size = epoch_size or 20
    share = shares(StreamSpec(sizes=(14, 6), weights=weights, epoch_size=size)).tolist()
    assert len(ds) == size // 4
    for _ in range(2):  # each iteration is the next epoch: exact shares every time
        got = _keyed(ds)
        assert collections.Counter(s for _, s in got) == {0: share[0], 1: share[1]}
        for source, windows in enumerate((a, b)):
            mine = [w for w, s in got if s == source]  # in the order the source's pipeline gave them
            passes = [mine[i:i + len(windows)] for i in range(0, len(mine), len(windows))]
            for part in passes:  # a full pass is every window once; the last, partial one, distinct windows of it
                assert len(set(part)) == len(part) and set(part) <= set(windows)
            assert len(passes[0]) < len(windows) or sorted(passes[0]) == sorted(windows)


@pytest.mark.parametrize("chunk", [None, 3], ids=["epoch-chunks", "small-chunks"])
def test_streamed_mixture_choice_is_the_order_sampling_predicts_and_seeded(sets, chunk, monkeypatch):
    if chunk is not None:  # the choices computed 3 at a time, as an epoch of more than CHUNK_ELEMENTS is
        monkeypatch.setattr(streamed_mixture, "CHUNK_ELEMENTS", chunk)
    options = dict(batch_size=4, seed=7, weights=[0.7, 0.3], epoch_size=20, with_source=True, **WINDOW)
    paths = [sets["a"], sets["b"]]
    ds = readers.windows(paths, **options)
    first, second = _keyed(ds), _keyed(readers.windows(paths, **options))
    spec = StreamSpec(sizes=(14, 6), weights=(0.7, 0.3), epoch_size=20, seed=7)
    assert [s for _, s in first] == [s for _, s in second] == epoch_order(spec, 0)[0].tolist()
    assert [s for _, s in _keyed(ds)] == epoch_order(spec, 1)[0].tolist()  # each iteration the next epoch
    # Which window a source gives comes from its shuffle buffer (files read in parallel): the same ones each pass.
    for source in (0, 1):
        assert sorted(w for w, s in first if s == source) == sorted(w for w, s in second if s == source)
    unshuffled = dict(options, shuffle=False)
    assert _keyed(readers.windows(paths, **unshuffled)) == _keyed(readers.windows(paths, **unshuffled))


def test_streamed_mixture_keys_hold_the_source_beside_episode_and_step(sets):
    ds = readers.windows([sets["a"], sets["b"]], batch_size=5, seed=1, with_source=True, with_keys=True,
                         drop_remainder=False, **WINDOW)
    assert len(ds) == 4
    seen = []
    for keys, batch in ds:
        assert set(keys) == {"episode", "step", "source"} and keys["source"].dtype == tf.int32
        base = np.where(keys["source"].numpy() == 0, 0, 100_000) + 1000 * keys["episode"].numpy()
        np.testing.assert_array_equal(batch.numpy()[:, 0], base + keys["step"].numpy())
        seen.extend(batch.numpy()[:, 0].tolist())
    assert sorted(seen) == sorted(_windows_of(sets["a"]) + _windows_of(sets["b"]))
    plain = next(iter(readers.windows([sets["a"], sets["b"]], batch_size=5, seed=1, **WINDOW)))
    assert isinstance(plain, tf.Tensor) and plain.shape == (5, 4)  # without with_source: today's elements


def test_streamed_mixture_reads_labels_as_one_path_does(sets):
    ds = readers.windows([sets["labelled"], sets["labelled"]], batch_size=2, seed=4, targets="label",
                         with_source=True, **WINDOW)
    got = collections.Counter()
    for keys, (x, y) in ds:
        for first, label, source in zip(x.numpy()[:, 0], y.numpy(), keys["source"].numpy()):
            got[(int(first) - 200_000) // 1000, int(label), int(source)] += 1  # episode e{i} is class i
    assert got == {(e, e, s): 3 for e in (0, 1) for s in (0, 1)}


def test_streamed_mixture_shares_per_input_pipeline(sets):
    paths, whole = [sets["a"], sets["b"]], collections.Counter()
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline)
        ds = readers.windows(paths, batch_size=1, seed=3, with_source=True, input_context=context, **WINDOW)
        got = _keyed(ds)
        assert len(ds) == len(got)
        whole.update(got)
    assert sorted(w for w, _ in whole.elements()) == sorted(_windows_of(sets["a"]) + _windows_of(sets["b"]))
    halves = [len(list(readers.windows(paths, batch_size=1, seed=3, epoch_size=11, input_context=context,
                                       **WINDOW))) for context in (tf.distribute.InputContext(2, p) for p in (0, 1))]
    assert halves == [6, 5]  # epoch_size is the whole epoch's: each pipeline its part


def test_streamed_mixture_under_a_mirrored_strategy(sets, strategies):
    strategy = strategies[2]
    ds = readers.windows([sets["a"], sets["b"]], batch_size=4, seed=2, with_source=True, strategy=strategy,
                         **WINDOW)
    sources = []
    for keys, _ in ds:
        sources.extend(s for part in strategy.experimental_local_results(keys["source"]) for s in part.numpy())
    assert collections.Counter(sources) == {0: 14, 1: 6}


@pytest.mark.parametrize("make, problem", [
    (lambda s: readers.windows([s["a"], s["wide"]], batch_size=2, length=4, shift=2, features="obs",
                               resident=False),
     "{a} + {wide}: the sources' features differ (got 'obs': float32 [2] in {a}, float64 [3] in {wide}); mix "
     "datasets converted with the same features"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, repeat=True, **WINDOW),
     "{a} + {b}: repeat= is for resident windows (got resident=False); a streamed epoch's shuffle buffer cannot be "
     "resumed exactly"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, repeat=True, start_step=3, seed=0, **WINDOW),
     "{a} + {b}: repeat= is for resident windows (got resident=False)"),
    (lambda s: readers.windows(s["labelled"], batch_size=2, balance="class", **WINDOW),
     "{labelled}: cannot mix streamed windows (resident=False) with balance='class': each class's windows would be "
     "a filtered stream of its own"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, service="grpc://localhost:5050", **WINDOW),
     "{a} + {b}: cannot mix streamed windows (resident=False) with service='grpc://localhost:5050'"),
    (lambda s: readers.windows([s["a"], s["short"]], batch_size=1, **WINDOW, input_context=tf.distribute.InputContext(
        2, next(e.shard for e in split_info(readers.info(s["short"]), "train").episodes if e.length == 2))),
     "{short}: split 'train' has no window in this input pipeline's shards (got shards ["),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=8, epoch_size=7, **WINDOW),
     "{a} + {b}: split 'train' has 7 windows for this pipeline, fewer than batch_size=8 with drop_remainder=True"),
    (lambda s: readers.windows([s["a"], s["b"]], batch_size=2, weights=[1.0], **WINDOW),
     "{a} + {b}: weights: must give one weight per source, 2 (got 1 weights"),
], ids=["features", "repeat", "start-step", "balance", "service", "no-window-in-pipeline", "empty-epoch",
        "weights-length"])
def test_streamed_mixture_refusals_are_one_line(sets, make, problem):
    with pytest.raises(ValueError, match=re.escape(problem.format(**sets))) as caught:
        make(sets)
    assert "\n" not in str(caught.value)
