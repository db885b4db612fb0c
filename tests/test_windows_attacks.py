"""Attacks on the row layout, window keys and readers.model_windows, against a numpy slicing oracle.

Every step of every episode carries a unique nonzero id (``t``: 100000·(episode + 1) + step + 1), so a window
that crossed an episode boundary or reached into the zero padding of the row layout shows as a gap or a zero.
Bugs the attack found (fixed) keep a test each: dtypes, shapes, empty input and zero-width features.
"""

from __future__ import annotations

import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard import readers
from tfshard.ingest import EpisodeOptions
from tfshard.readers.windowing.starts import row_steps


def step_ids(i: int, t: int) -> np.ndarray:
    return 100_000 * (i + 1) + np.arange(1, t + 1, dtype=np.int64)


def rich_episode(i: int, t: int) -> dict:
    """Several features of several dtypes and shapes, each a function of the step id (nonzero everywhere)."""
    ids = step_ids(i, t)
    return {
        "t": ids,                                                                   # int64 [T]
        "m": (ids[:, None, None] * 8 + np.arange(6).reshape(3, 2)).astype(np.float32),  # float32 [T, 3, 2], exact
        "u": (ids % 251 + 1).astype(np.uint8),                                      # uint8 [T]
        "b": np.stack([np.ones(t, bool), ids % 2 == 0], axis=1),                     # bool [T, 2]
    }


def convert(tmp_path_factory, name: str, lengths, make=rich_episode, **options) -> types.SimpleNamespace:
    src = tmp_path_factory.mktemp(f"{name}-src")
    out = tmp_path_factory.mktemp(name) / "out"
    written = {f"e{i:03d}.npz": make(i, t) for i, t in enumerate(lengths)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, **options)
    listed = manifest.splits["train"].episodes
    return types.SimpleNamespace(
        out=str(out), manifest=manifest, lengths=list(lengths),
        by_id={e.id: written[e.source] for e in listed},
        source_order=sorted(e.id for e in listed),      # resident, unshuffled
        manifest_order=[e.id for e in listed],          # streamed, unshuffled
    )


RICH = [300, 40, 256, 17, 513, 1, 64, 129, 96]  # sum 1416: 1/64 of it is 22 steps of padding


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    """Chunk records of 20 steps (35 bytes a step) over 3 gzip shards, written in shuffled order."""
    return convert(tmp_path_factory, "rich", RICH, num_shards=3, compression="gzip",
                   episode=EpisodeOptions(max_record_bytes=35 * 20))


def oracle(data, order, length: int, shift: int, horizon: int = 0) -> list[tuple[int, int]]:
    """(episode id, start step) of every window, episode after episode in ``order``, by start step."""
    return [(e, s) for e in order for s in range(0, len(data.by_id[e]["t"]) - length - horizon + 1, shift)]


def as_dict(value, name):
    return value if isinstance(value, dict) else {name: value}


def collect(ds, features, single_name=None, horizon=0, with_targets=False):
    """One epoch of a (keys, element) dataset → list of (episode, step, {name: window}, {name: future or target})."""
    rows, sizes = [], []
    for keys, element in ds:
        inputs, targets = element if (horizon or with_targets) else (element, None)
        inputs = as_dict(inputs, single_name)
        if targets is not None and not isinstance(targets, dict):
            targets = {single_name if horizon else "__target__": targets}
        episodes, steps = keys["episode"].numpy(), keys["step"].numpy()
        assert keys["episode"].dtype == tf.int64 and keys["step"].dtype == tf.int64
        sizes.append(len(episodes))
        values = {n: v.numpy() for n, v in inputs.items()}
        futures = {n: v.numpy() for n, v in targets.items()} if targets is not None else {}
        for j in range(len(episodes)):
            rows.append((int(episodes[j]), int(steps[j]), {n: v[j] for n, v in values.items()},
                         {n: v[j] for n, v in futures.items()}))
    return rows, sizes


def check_against_oracle(data, rows, length, horizon, names):
    for episode, step, window, future in rows:
        source = data.by_id[episode]
        for name in names:
            np.testing.assert_array_equal(window[name], source[name][step : step + length])
            assert window[name].dtype == source[name].dtype
            if horizon:
                np.testing.assert_array_equal(future[name], source[name][step + length : step + length + horizon])
        ids = window.get("t")
        if ids is not None:  # inside one episode, no padding: consecutive nonzero ids
            assert (ids > 0).all() and (np.diff(ids) == 1).all()
            if horizon:
                assert (np.diff(np.concatenate([ids, future["t"]])) == 1).all()


CONFIGS = [  # (length, shift, horizon, rows of g steps on RICH)
    (64, 64, 0, 4), (48, 16, 16, 4), (24, 12, 8, 4), (3, 6, 0, 3), (100, 4, 0, 4), (5, 5, 3, 1),
    (22, 16, 10, 4),  # the horizon splits a row: past and future share the row at step 20..23
]


@pytest.mark.parametrize("length, shift, horizon, g", CONFIGS)
def test_row_steps_picked_on_the_rich_dataset(length, shift, horizon, g):
    assert row_steps(RICH, length, shift, horizon) == g


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("length, shift, horizon, g", CONFIGS)
def test_every_window_of_every_dtype_is_the_oracle_with_its_keys(rich, length, shift, horizon, g, resident, shuffle):
    names = ["t", "m", "u", "b"]
    ds = readers.windows(rich.out, length=length, shift=shift, batch_size=7, targets=horizon or None,
                         shuffle=shuffle, seed=3, drop_remainder=False, resident=resident, with_keys=True,
                         shuffle_buffer=64)
    if resident:
        arrays = ds.resident_arrays[0]
        assert {n: v.shape[1] for n, v in arrays.items()} == {n: g for n in names}
        assert arrays["m"].shape[2:] == (3, 2) and arrays["b"].dtype == tf.bool and arrays["u"].dtype == tf.uint8
    rows, sizes = collect(ds, names, horizon=horizon)
    check_against_oracle(rich, rows, length, horizon, names)
    keys = [(e, s) for e, s, _, _ in rows]
    expected = oracle(rich, rich.source_order if resident else rich.manifest_order, length, shift, horizon)
    assert sorted(keys) == sorted(expected) and len(set(keys)) == len(keys)
    if not shuffle:  # resident: source (episode id) order; streamed: the manifest's order
        assert keys == expected
    assert len(ds) == len(sizes) == -(-len(expected) // 7)
    assert all(s == 7 for s in sizes[:-1]) and 0 < sizes[-1] <= 7


@pytest.mark.parametrize("length, shift, horizon, g", CONFIGS[:4])
def test_resident_arrays_are_the_padded_concatenation_in_id_order(rich, length, shift, horizon, g):
    ds = readers.windows(rich.out, length=length, shift=shift, batch_size=2, targets=horizon or None,
                         features=["t", "m"], shuffle=False)
    arrays = ds.resident_arrays[0]
    for name in ("t", "m"):
        parts = []
        for e in rich.source_order:
            v = rich.by_id[e][name]
            parts += [v, np.zeros((-len(v) % g, *v.shape[1:]), v.dtype)]
        np.testing.assert_array_equal(arrays[name].numpy().reshape(-1, *arrays[name].shape[2:]), np.concatenate(parts))


@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("resident", [True, False])
def test_a_target_feature_is_the_aligned_window_of_that_feature(rich, resident, drop_remainder):
    ds = readers.windows(rich.out, length=32, shift=16, batch_size=5, features="m", targets="u", seed=1,
                         resident=resident, with_keys=True, drop_remainder=drop_remainder, shuffle_buffer=32)
    rows = []
    for keys, (x, y) in ds:
        assert isinstance(x, tf.Tensor) and x.dtype == tf.float32 and y.dtype == tf.uint8
        for e, s, xw, yw in zip(keys["episode"].numpy(), keys["step"].numpy(), x.numpy(), y.numpy()):
            np.testing.assert_array_equal(xw, rich.by_id[e]["m"][s : s + 32])
            np.testing.assert_array_equal(yw, rich.by_id[e]["u"][s : s + 32])
            rows.append((e, s))
    count = len(oracle(rich, rich.source_order, 32, 16))
    assert len(rows) == (count // 5 * 5 if drop_remainder else count) and len(set(rows)) == len(rows)
    assert len(ds) == (count // 5 if drop_remainder else -(-count // 5))


# --- large rows, short episodes, episodes of exactly one span, one episode ------------------------------------------


def ids_only(i, t):
    return {"t": step_ids(i, t)}


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    """Long episodes: rows of 128 steps (126 steps of padding, under 1/64 of 15,466)."""
    return convert(tmp_path_factory, "long", [4100, 2176, 8190, 1000], make=ids_only, num_shards=2,
                   episode=EpisodeOptions(max_record_bytes=8 * 300))


@pytest.mark.parametrize("length, shift, horizon", [(128, 128, 0), (96, 128, 32), (100, 128, 28), (256, 128, 0),
                                                    (128, 384, 0)])
@pytest.mark.parametrize("resident", [True, False])
def test_large_rows_give_the_oracle(long, length, shift, horizon, resident):
    assert row_steps(long.lengths, length, shift, horizon) == 128
    ds = readers.windows(long.out, length=length, shift=shift, batch_size=4, features="t", targets=horizon or None,
                         shuffle=False, drop_remainder=False, resident=resident, with_keys=True)
    if resident:
        assert ds.resident_arrays[0]["t"].shape[1] == 128
    rows, sizes = collect(ds, ["t"], single_name="t", horizon=horizon)
    check_against_oracle(long, rows, length, horizon, ["t"])
    expected = oracle(long, long.source_order if resident else long.manifest_order, length, shift, horizon)
    assert [(e, s) for e, s, _, _ in rows] == expected
    assert len(ds) == len(sizes)


EDGES = [48, 16, 96, 48, 32, 112]  # span 48 (40 + 8), shift 16: rows of 16, no padding; 16 and 32 below the span


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    return convert(tmp_path_factory, "edges", EDGES, num_shards=2)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("resident", [True, False])
def test_short_and_exactly_one_span_episodes_with_rows_of_16(edges, resident, shuffle):
    assert row_steps(EDGES, 40, 16, 8) == 16
    ds = readers.windows(edges.out, length=40, shift=16, batch_size=3, targets=8, shuffle=shuffle, seed=0,
                         drop_remainder=False, resident=resident, with_keys=True)
    rows, _ = collect(ds, ["t", "m", "u", "b"], horizon=8)
    check_against_oracle(edges, rows, 40, 8, ["t", "m", "u", "b"])
    expected = oracle(edges, edges.source_order if resident else edges.manifest_order, 40, 16, 8)
    assert len(expected) == 1 + 4 + 1 + 5
    keys = [(e, s) for e, s, _, _ in rows]
    assert sorted(keys) == sorted(expected) and (shuffle or keys == expected)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return convert(tmp_path_factory, "single", [48], num_shards=1)


@pytest.mark.parametrize("resident", [True, False])
def test_a_single_episode_of_exactly_one_span(single, resident):
    ds = readers.windows(single.out, length=40, shift=16, batch_size=1, targets=8, features=["t", "u"],
                         resident=resident, with_keys=True, seed=0)
    rows, sizes = collect(ds, ["t", "u"], horizon=8)
    assert sizes == [1] and len(ds) == 1
    check_against_oracle(single, rows, 40, 8, ["t", "u"])
    assert [(e, s) for e, s, _, _ in rows] == [(0, 0)]
    if resident:
        assert ds.resident_arrays[0]["t"].shape == (3, 16)
    mw = readers.model_windows(single.out, length=40, shift=16, batch_size=1, targets=8, features="t")
    (starts,) = list(mw.starts)
    x, y = mw.element(starts)
    np.testing.assert_array_equal(x.numpy()[0], single.by_id[0]["t"][:40])
    np.testing.assert_array_equal(y.numpy()[0], single.by_id[0]["t"][40:])


TINY = [4, 8, 12, 4, 4, 8] * 30 + [1, 3, 5, 2, 7, 9, 4]  # 187 tiny episodes; the odd ones pad 13 steps of 1,231


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return convert(tmp_path_factory, "tiny", TINY, make=ids_only, num_shards=4)


@pytest.mark.parametrize("resident", [True, False])
def test_very_many_tiny_episodes(tiny, resident):
    assert row_steps(TINY, 4, 4) == 4
    ds = readers.windows(tiny.out, length=4, shift=4, batch_size=16, features="t", resident=resident, seed=5,
                         drop_remainder=False, with_keys=True, shuffle_buffer=100)
    rows, sizes = collect(ds, ["t"], single_name="t")
    check_against_oracle(tiny, rows, 4, 0, ["t"])
    expected = oracle(tiny, tiny.source_order, 4, 4)
    assert sorted((e, s) for e, s, _, _ in rows) == sorted(expected)
    assert len(ds) == len(sizes) == -(-len(expected) // 16)


def test_row_steps_is_the_brute_force_largest_divisor_within_budget():
    rng = np.random.default_rng(3)
    for _ in range(300):
        lengths = rng.integers(0, 200, size=rng.integers(1, 8)).tolist()
        if rng.random() < 0.5:
            lengths = [t - t % 16 for t in lengths]
        length, shift, horizon = int(rng.integers(1, 65)), int(rng.integers(1, 65)), int(rng.integers(0, 17))
        common = np.gcd(length + horizon, shift)
        fits = [d for d in range(1, common + 1) if common % d == 0
                and (d == 1 or sum(-t % d for t in lengths) <= sum(lengths) / 64)]
        assert row_steps(lengths, length, shift, horizon) == max(fits), (lengths, length, shift, horizon)


def test_fuzz_resident_windows_in_memory_against_the_oracle():
    """Random episodes, lengths, shifts and horizons; every window and key checked, shuffled and not."""
    rng = np.random.default_rng(12)
    checked = 0
    for trial in range(24):
        quantum = int(rng.choice([1, 4, 8, 16]))
        lengths = [int(rng.integers(0, 120)) // quantum * quantum + int(rng.random() < 0.2)
                   for _ in range(int(rng.integers(1, 9)))]
        length, horizon = int(rng.choice([1, 4, 8, 12, 16, 24])), int(rng.choice([0, 0, 4, 8]))
        shift = int(rng.choice([1, 2, 4, 8, 16, 32]))
        expected = [(e, s) for e, t in enumerate(lengths) for s in range(0, t - length - horizon + 1, shift)]
        if not expected:
            continue
        episodes = {"t": [step_ids(i, t) for i, t in enumerate(lengths)],
                    "v": [np.stack([step_ids(i, t), -step_ids(i, t)], 1).astype(np.float64) for i, t in
                          enumerate(lengths)]}
        shuffle = bool(trial % 2)
        ds = readers.resident_windows(episodes, length=length, shift=shift, batch_size=int(rng.integers(1, 9)),
                                      targets=horizon or None, shuffle=shuffle, seed=trial, drop_remainder=False,
                                      with_keys=True)
        g = ds.resident_arrays[0]["t"].shape[1]
        assert g == row_steps(lengths, length, shift, horizon)
        got = []
        for keys, element in ds:
            x, y = element if horizon else (element, None)
            for j, (e, s) in enumerate(zip(keys["episode"].numpy(), keys["step"].numpy())):
                for n in ("t", "v"):
                    np.testing.assert_array_equal(x[n].numpy()[j], episodes[n][e][s : s + length])
                    if horizon:
                        np.testing.assert_array_equal(y[n].numpy()[j],
                                                      episodes[n][e][s + length : s + length + horizon])
                got.append((int(e), int(s)))
        assert sorted(got) == expected and (shuffle or got == expected), (lengths, length, shift, horizon, g)
        checked += len(got)
    assert checked > 100


# --- resident_windows in memory ------------------------------------------------------------------------------------


def test_resident_windows_in_memory_with_features_of_different_dtypes_and_shapes():
    rng = np.random.default_rng(0)
    lengths = [33, 7, 64, 0, 20, 48]
    episodes = {
        "a": [rng.normal(size=t) for t in lengths],                                     # float64 [T]
        "b": [rng.integers(-999, 999, size=(t, 2)).astype(np.int16) for t in lengths],  # int16 [T, 2]
        "c": [rng.integers(1, 255, size=(t, 1, 1)).astype(np.uint8) for t in lengths],   # uint8 [T, 1, 1]
        "d": [rng.random(t) < 0.5 for t in lengths],                                    # bool [T]
        "t": [step_ids(i, t) for i, t in enumerate(lengths)],
    }
    for shuffle in (False, True):
        ds = readers.resident_windows(episodes, length=12, shift=4, batch_size=5, targets=4, shuffle=shuffle,
                                      seed=2, drop_remainder=False, with_keys=True)
        assert ds.resident_arrays[0]["b"].shape[1] == 2  # rows of 4 would pad 4 steps of 172 (over 1/64), of 2 pad 2
        rows = []
        for keys, (x, y) in ds:
            for j, (e, s) in enumerate(zip(keys["episode"].numpy(), keys["step"].numpy())):
                for n in episodes:
                    np.testing.assert_array_equal(x[n].numpy()[j], episodes[n][e][s : s + 12])
                    np.testing.assert_array_equal(y[n].numpy()[j], episodes[n][e][s + 12 : s + 16])
                    assert x[n].dtype.as_numpy_dtype == episodes[n][e].dtype
                rows.append((int(e), int(s)))
        expected = [(e, s) for e, t in enumerate(lengths) for s in range(0, t - 16 + 1, 4)]
        assert sorted(rows) == expected and (shuffle or rows == expected)


@pytest.mark.parametrize("episodes, features, targets, match", [
    ({"x": [np.zeros(5)], "y": [np.zeros(6)]}, None, None, r"episodes\['y'\]: episode lengths \[6\] differ"),
    ({"x": [np.zeros(5)], "y": [np.zeros(6)]}, "x", "y", r"episodes\['y'\]: episode lengths \[6\] differ"),
    ({"x": [np.zeros(5)], "y": [np.zeros(5), np.zeros(3)]}, None, None, r"episode lengths \[5, 3\] differ"),
    ({"x": [np.zeros(5)], "y": [np.zeros(5)]}, "z", None, r"no feature\(s\) \['z'\]"),
])
def test_resident_windows_refuses_mismatched_features_clearly(episodes, features, targets, match):
    with pytest.raises(ValueError, match=match):
        readers.resident_windows(episodes, length=2, batch_size=1, features=features, targets=targets)


def test_resident_windows_ignores_lengths_of_features_it_does_not_gather():
    episodes = {"x": [np.arange(1, 6, dtype=np.float32)], "junk": [np.zeros(9)]}
    (x,) = list(readers.resident_windows(episodes, length=5, batch_size=1, features="x"))
    np.testing.assert_array_equal(x.numpy(), [[1, 2, 3, 4, 5]])


def test_episodes_of_one_feature_with_different_dtypes_are_promoted_as_concatenate_would():
    episodes = {"x": [np.arange(1, 9, dtype=np.uint8), np.full(8, 0.5, np.float32)]}
    x = next(iter(readers.resident_windows(episodes, length=8, batch_size=2, shuffle=False)))["x"].numpy()
    assert x.dtype == np.float32  # np.result_type(uint8, float32), not the first episode's uint8
    np.testing.assert_array_equal(x, [np.arange(1, 9), np.full(8, 0.5)])


def test_episodes_of_one_feature_with_different_trailing_shapes_are_refused():
    episodes = {"x": [np.ones((8, 3), np.float32), np.arange(8, dtype=np.float32)[:, None]]}
    with pytest.raises(ValueError, match=r"episodes\['x'\]: every episode of a feature must have the same shape "
                                         r"after its time axis \(got \[\(1,\), \(3,\)\]\)"):
        list(readers.resident_windows(episodes, length=8, batch_size=2, shuffle=False))


def test_no_episodes_at_all_is_a_clear_error():
    with pytest.raises(ValueError, match=r"episodes\['x'\] holds no episode; pass at least one array"):
        readers.resident_windows({"x": []}, length=2, batch_size=2, drop_remainder=False)


def test_a_zero_width_feature_in_memory():
    episodes = {"x": [np.zeros((10, 0), np.float32)], "y": [np.arange(10, dtype=np.float32)]}
    batch = next(iter(readers.resident_windows(episodes, length=2, batch_size=2, shuffle=False)))
    assert batch["x"].shape == (2, 2, 0)
    np.testing.assert_array_equal(batch["y"].numpy(), [[0, 1], [1, 2]])


@pytest.mark.parametrize("resident", [True, False])
def test_a_zero_width_feature_written_by_the_converter(tmp_path, resident):
    save_episodes(tmp_path / "src", {"a.npz": {"x": np.zeros((10, 0), np.float32),
                                               "y": np.arange(10, dtype=np.float32)}})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    batch = next(iter(readers.windows(str(tmp_path / "out"), length=2, batch_size=2, shuffle=False,
                                      resident=resident, features=["x", "y"])))
    assert batch["x"].shape == (2, 2, 0)


# --- readers.model_windows ----------------------------------------------------------------------------------------

MW = {"length": 24, "shift": 8, "targets": 8}  # span 32, shift 8: rows of 4 on RICH; 153 windows


def test_model_windows_layer_is_readers_windows_for_the_same_seed_over_two_epochs(rich):
    options = dict(batch_size=6, features=["t", "m", "b"], seed=7, **MW)
    mw = readers.model_windows(rich.out, **options)
    assert mw.row == 4 and mw.arrays["m"].shape[1:] == (4, 3, 2)
    pipeline = readers.windows(rich.out, **options)
    assert len(mw.starts) == len(pipeline)
    epochs = []
    for _ in range(2):
        order = []
        for starts, (x, y) in zip(mw.starts, pipeline, strict=True):
            gx = mw.layer(starts)
            ex, ey = mw.element(starts)
            for n in options["features"]:
                np.testing.assert_array_equal(gx[n].numpy(), x[n].numpy())
                np.testing.assert_array_equal(ex[n].numpy(), x[n].numpy())
                np.testing.assert_array_equal(ey[n].numpy(), y[n].numpy())
            order += x["t"].numpy()[:, 0].tolist()
        epochs.append(order)
    assert epochs[0] != epochs[1]  # a new permutation each epoch, the same in both


def _exact_forecaster(length, horizon):
    """Predicts the next ``horizon`` step ids and ``m`` values exactly when the window is one run of consecutive
    steps; any gap (a crossed boundary, padding) adds to the prediction, so the loss is 0 only for right windows."""
    t_in = keras.Input((length,), dtype="int64", name="t")
    m_in = keras.Input((length, 3, 2), name="m")

    class Forecast(keras.layers.Layer):
        def build(self, *shapes):
            self.w = self.add_weight(shape=(), initializer="zeros")

        def call(self, t, m):
            t = tf.cast(t, tf.float32)
            gaps = tf.reduce_sum(tf.abs(t[:, 1:] - t[:, :-1] - 1.0), axis=1, keepdims=True)
            k = tf.range(1, horizon + 1, dtype=tf.float32)[None]
            return {"t": t[:, -1:] + k + gaps + self.w, "m": m[:, -1:] + 8 * k[:, :, None, None] + self.w}

    return keras.Model({"t": t_in, "m": m_in}, Forecast()(t_in, m_in))


def _compile(model):
    model.compile(keras.optimizers.SGD(1e-12), loss={"t": "mae", "m": "mae"}, metrics={"m": ["mae"]})
    return model


def test_model_windows_fit_evaluate_predict_with_a_horizon_target_and_dict_features(rich):
    mw = readers.model_windows(rich.out, batch_size=8, features=["t", "m"], seed=0, drop_remainder=False, **MW)
    model = _compile(mw.wrap(_exact_forecaster(24, 8)))
    history = model.fit(mw.starts, epochs=2, verbose=0)
    assert history.history["loss"] == [0.0, 0.0]  # targets gathered with the inputs, every window inside its episode
    assert model.evaluate(mw.starts, verbose=0, return_dict=True)["loss"] == 0.0
    count = len(oracle(rich, rich.source_order, 24, 8, 8))
    predicted = model.predict(mw.starts, verbose=0)
    assert predicted["t"].shape == (count, 8) and predicted["m"].shape == (count, 8, 3, 2)


def test_model_windows_predict_is_in_source_order_unshuffled(rich):
    mw = readers.model_windows(rich.out, batch_size=8, features="m", targets="same", shuffle=False,
                               drop_remainder=False, length=24, shift=12)
    model = mw.wrap(keras.Sequential([keras.Input((24, 3, 2)), keras.layers.Identity()]))
    predicted = model.predict(mw.starts, verbose=0)
    expected = [rich.by_id[e]["m"][s : s + 24] for e, s in oracle(rich, rich.source_order, 24, 12)]
    np.testing.assert_array_equal(predicted, np.stack(expected))


def test_model_windows_functional_model_on_start_rows(rich):
    mw = readers.model_windows(rich.out, batch_size=5, features=["t", "u"], shuffle=False, drop_remainder=False,
                               length=8, shift=4)
    starts = keras.Input((), dtype="int32")
    x = mw.layer(starts)
    model = keras.Model(starts, {"t": x["t"], "u": keras.ops.cast(x["u"], "int32")})
    out = model.predict(mw.starts, verbose=0)
    expected = oracle(rich, rich.source_order, 8, 4)
    np.testing.assert_array_equal(out["t"], np.stack([rich.by_id[e]["t"][s : s + 8] for e, s in expected]))
    np.testing.assert_array_equal(out["u"], np.stack([rich.by_id[e]["u"][s : s + 8] for e, s in expected]))


def test_model_windows_fit_under_a_mirrored_strategy_with_a_horizon(rich, strategies):
    strategy = strategies[2]
    with strategy.scope():
        mw = readers.model_windows(rich.out, batch_size=8, features=["t", "m"], seed=4, drop_remainder=False, **MW)
        model = _compile(mw.wrap(_exact_forecaster(24, 8)))
    for variable in mw.arrays.values():
        copies = strategy.experimental_local_results(variable)
        assert [c.device[-5:] for c in copies] == ["CPU:0", "CPU:1"]
        for copy in copies:
            np.testing.assert_array_equal(copy.numpy(), copies[0].numpy())
    assert len(mw.starts) == -(-len(oracle(rich, rich.source_order, 24, 8, 8)) // 8)
    assert [len(s) for s in mw.starts][-1] == 1  # a last batch of 1: one replica gets no window at all
    history = model.fit(mw.starts, epochs=1, verbose=0)
    assert history.history["loss"] == [0.0]
    assert model.evaluate(mw.starts, verbose=0, return_dict=True)["loss"] == 0.0
    predicted = model.predict(mw.starts, verbose=0)
    assert predicted["t"].shape[0] == len(oracle(rich, rich.source_order, 24, 8, 8))


@pytest.mark.parametrize("resident", [True, False])
def test_keys_under_a_mirrored_strategy_with_a_horizon(rich, strategies, resident):
    strategy = strategies[2]
    ds = readers.windows(rich.out, batch_size=6, features=["t", "u"], seed=1, with_keys=True, resident=resident,
                         strategy=strategy, shuffle_buffer=50, **MW)
    seen = []
    for keys, (x, y) in ds:
        for k, xp, yp in zip(*(strategy.experimental_local_results(v) for v in (keys, x, y))):
            for j, (e, s) in enumerate(zip(k["episode"].numpy(), k["step"].numpy())):
                for n in ("t", "u"):
                    np.testing.assert_array_equal(xp[n].numpy()[j], rich.by_id[e][n][s : s + 24])
                    np.testing.assert_array_equal(yp[n].numpy()[j], rich.by_id[e][n][s + 24 : s + 32])
                seen.append((e, s))
    assert len(set(seen)) == len(seen) > 100


@pytest.mark.parametrize("compile_options", [{"jit_compile": True}, {"steps_per_execution": 3}])
def test_model_windows_fit_jit_compiled_or_several_steps_per_call(rich, compile_options):
    """XLA (Keras' default on a GPU) and steps in a while loop: the targets' gather cache meets other graphs."""
    mw = readers.model_windows(rich.out, batch_size=8, features=["t", "m"], seed=0, drop_remainder=False, **MW)
    model = mw.wrap(_exact_forecaster(24, 8))
    model.compile(keras.optimizers.SGD(1e-12), loss={"t": "mae", "m": "mae"}, **compile_options)
    assert model.fit(mw.starts, epochs=2, verbose=0).history["loss"] == [0.0, 0.0]
    assert model.evaluate(mw.starts, verbose=0) == [0.0, 0.0, 0.0]


def test_model_windows_predict_under_a_mirrored_strategy_is_in_source_order(rich, strategies):
    strategy = strategies[2]
    with strategy.scope():
        mw = readers.model_windows(rich.out, batch_size=8, features="t", shuffle=False, drop_remainder=False,
                                   length=32, shift=8)
        model = mw.wrap(keras.Sequential([keras.Input((32,), dtype="int64"), keras.layers.Identity()]))
    expected = oracle(rich, rich.source_order, 32, 8)
    assert len(expected) % 8 % 2  # an odd last batch, split unevenly over the replicas
    np.testing.assert_array_equal(model.predict(mw.starts, verbose=0),
                                  np.stack([rich.by_id[e]["t"][s : s + 32] for e, s in expected]))


# --- a split whose episode ids are not 0..n-1 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    src = tmp_path_factory.mktemp("splits-src")
    out = tmp_path_factory.mktemp("splits") / "out"
    lengths = [40, 64, 33, 80, 16, 56, 72, 48, 24, 96, 40, 64]
    written = {f"{'val' if i % 3 == 0 else 'train'}/e{i:02d}.npz": rich_episode(i, t) for i, t in enumerate(lengths)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, num_shards=2, episode=EpisodeOptions(max_record_bytes=35 * 9))
    listed = manifest.splits["val"].episodes
    by_id = {e.id: written[e.source if e.source.startswith("val/") else f"val/{e.source}"] for e in listed}
    return types.SimpleNamespace(out=str(out), by_id=by_id, source_order=sorted(by_id),
                                 manifest_order=[e.id for e in listed])


@pytest.mark.parametrize("resident", [True, False])
def test_keys_of_a_split_name_the_global_episode_ids(splits, resident):
    assert splits.source_order != list(range(len(splits.source_order)))  # ids are positions in every source file
    ds = readers.windows(splits.out, "val", length=12, shift=8, batch_size=3, targets=4, seed=2, resident=resident,
                         with_keys=True, drop_remainder=False, shuffle_buffer=20)
    if resident:
        assert ds.resident_arrays[0]["t"].shape[1] == 8  # 40, 64, 80, 48 steps (t): rows of gcd(16, 8)
    rows, _ = collect(ds, ["t", "m", "u", "b"], horizon=4)
    check_against_oracle(splits, rows, 12, 4, ["t", "m", "u", "b"])
    assert sorted((e, s) for e, s, _, _ in rows) == sorted(oracle(splits, splits.source_order, 12, 8, 4))


def test_episodes_with_keys_shuffled_files_name_each_episode(rich):
    seen = {}
    for keys, episode in readers.episodes(rich.out, with_keys=True, shuffle_files=True, seed=1):
        e = int(keys["episode"])
        for name, value in episode.items():
            np.testing.assert_array_equal(value.numpy(), rich.by_id[e][name])
        seen[e] = True
    assert sorted(seen) == rich.source_order
