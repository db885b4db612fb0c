"""readers.model_windows(): start rows in the pipeline, the gather in the model's step, on the arrays' device.

Also the row layout (windows as runs of whole rows) and window keys, shared with readers.windows.
"""

from __future__ import annotations

import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard import readers
from tfshard.readers.windowing.starts import row_steps
from tfshard.readers.windows.index import gather_windows
from window_rows_helpers import MW, oracle, rich_dataset

LENGTHS = [1000, 777, 2049, 300, 64]  # rows of 16 steps pad 8+7+15+4+0 = 34 steps: under 1/64 of 4190
LENGTH, SHIFT = 64, 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``t``: int64 [T], a unique id per step (1000·episode + step + 1, never 0: padding is 0); ``obs``: float32."""
    src = tmp_path_factory.mktemp("mw-src")
    out = tmp_path_factory.mktemp("mw") / "out"
    rng = np.random.default_rng(5)
    written = {f"e{i}.npz": {"t": 1_000_000 * (i + 1) + np.arange(1, t + 1, dtype=np.int64),
                             "obs": rng.normal(size=(t, 2)).astype(np.float32)} for i, t in enumerate(LENGTHS)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, num_shards=2)
    by_id = sorted(manifest.splits["train"].episodes, key=lambda e: e.id)
    return types.SimpleNamespace(out=str(out), episodes=[written[e.source] for e in by_id])


def reference(episodes, name, length, shift, horizon=0):
    """Every window (and the ``horizon`` steps after it), episode by episode in source order, by slicing."""
    return [(e[name][s : s + length], e[name][s + length : s + length + horizon])
            for e in episodes for s in range(0, len(e[name]) - length - horizon + 1, shift)]


def test_rows_of_the_gcd_of_span_and_shift_within_the_padding_budget():
    assert row_steps(LENGTHS, LENGTH, SHIFT) == 16
    assert row_steps(LENGTHS, LENGTH, SHIFT, horizon=8) == 8  # gcd(72, 16)
    assert row_steps(LENGTHS, LENGTH, 1) == 1
    assert row_steps([17, 33], 16, 16) == 1  # rows of 16 would pad 30 steps of 50


def test_windows_from_rows_are_the_reference_in_source_order_with_keys(data):
    ds = readers.windows(data.out, length=LENGTH, shift=SHIFT, batch_size=7, features="t", shuffle=False,
                         drop_remainder=False, with_keys=True)
    (variable,) = ds.resident_arrays[0].values()
    assert variable.shape[1] == 16  # rows of 16 steps; padding ≤ 1/64 of the data
    assert variable.shape[0] * 16 - sum(LENGTHS) <= sum(LENGTHS) / 64
    flat = variable.numpy().reshape(-1)  # each episode in source order, then zeros up to its next row
    expected = np.concatenate([np.pad(e["t"], (0, -len(e["t"]) % 16)) for e in data.episodes])
    np.testing.assert_array_equal(flat, expected)
    got, episodes, steps = [], [], []
    for keys, windows in ds:
        got += list(windows.numpy())
        episodes += keys["episode"].numpy().tolist()
        steps += keys["step"].numpy().tolist()
    expected = reference(data.episodes, "t", LENGTH, SHIFT)
    np.testing.assert_array_equal(np.stack(got), np.stack([w for w, _ in expected]))
    for window, episode, step in zip(got, episodes, steps):  # the keys name where each window came from
        np.testing.assert_array_equal(window, data.episodes[episode]["t"][step : step + LENGTH])


@pytest.mark.parametrize("resident", [True, False])
def test_shuffled_keys_match_their_windows_in_both_modes(data, resident):
    ds = readers.windows(data.out, length=LENGTH, shift=SHIFT, batch_size=8, features="obs", seed=3,
                         resident=resident, with_keys=True, targets=4)
    count = 0
    for keys, (past, future) in ds:
        for e, s, x, y in zip(keys["episode"].numpy(), keys["step"].numpy(), past.numpy(), future.numpy()):
            np.testing.assert_array_equal(x, data.episodes[e]["obs"][s : s + LENGTH])
            np.testing.assert_array_equal(y, data.episodes[e]["obs"][s + LENGTH : s + LENGTH + 4])
            count += 1
    assert count == len(reference(data.episodes, "obs", LENGTH, SHIFT, 4)) // 8 * 8


@pytest.mark.parametrize("shuffle", [False, True])
def test_model_windows_gathers_what_readers_windows_yields(data, shuffle):
    options = dict(length=LENGTH, shift=SHIFT, batch_size=8, features="obs", targets="same", seed=1,
                   shuffle=shuffle)
    mw = readers.model_windows(data.out, **options)
    pipeline = readers.windows(data.out, **options)
    assert len(mw.starts) == len(pipeline) > 10
    for starts, (x, y) in zip(mw.starts, pipeline):
        assert starts.dtype == tf.int32 and starts.shape == (8,)  # 4 bytes a window cross to the model
        gx = mw.layer(starts)
        gx2, gy = mw.element(starts)
        np.testing.assert_array_equal(gx.numpy(), x.numpy())
        np.testing.assert_array_equal(gx2.numpy(), x.numpy())
        np.testing.assert_array_equal(gy.numpy(), y.numpy())


def _autoencoder():
    return keras.Sequential([keras.Input((LENGTH, 2)), keras.layers.Flatten(), keras.layers.Dense(4),
                             keras.layers.Dense(LENGTH * 2), keras.layers.Reshape((LENGTH, 2))])


def _gathers(concrete) -> list:
    """The ResourceGather ops of a traced function, its nested function bodies included."""
    graphs, found = [concrete.graph], []
    while graphs:
        graph = graphs.pop()
        for op in graph.get_operations():
            if op.type == "ResourceGather":
                found.append(op)
        graphs += [f.graph for f in getattr(graph, "_functions", {}).values() if hasattr(f, "graph")]
    return found


def test_fit_trains_an_autoencoder_with_one_gather_a_step_for_inputs_and_targets(data):
    mw = readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=16, features="obs",
                               targets="same", seed=0)
    model = mw.wrap(_autoencoder())
    model.compile(keras.optimizers.Adam(0.01), "mse")
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(mw.starts, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, model.trainable_weights))
    step = tf.function(model.train_step).get_concrete_function(tf.TensorSpec([16], tf.int32))
    assert len(_gathers(step)) == 1  # the targets reuse the inputs' gather
    assert model.evaluate(mw.starts, verbose=0) > 0


def test_the_data_is_not_a_weight_of_the_model(data, tmp_path):
    """Saving the model saves its weights only: the resident arrays are no Keras or checkpoint variable."""
    mw = readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=16, features="obs",
                               targets="same")
    inner = _autoencoder()
    model = mw.wrap(inner)
    model(next(iter(mw.starts)))
    assert {id(w) for w in model.weights} == {id(w) for w in inner.weights}
    saved = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(saved)
    stored = sum(np.prod(shape) for shape in reader.get_variable_to_shape_map().values())
    assert stored < sum(LENGTHS) * 2  # far less than the data's values: only the dense layers' weights


def test_device_places_the_arrays_and_the_gather(data):
    mw = readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=8, features="obs",
                               device="/CPU:1")
    assert mw.arrays["obs"].device.endswith("CPU:1")
    traced = tf.function(mw.layer.call).get_concrete_function(tf.TensorSpec([8], tf.int32))
    (gather,) = _gathers(traced)
    assert gather.device.endswith("CPU:1")


def test_gather_windows_runs_on_the_device_of_the_arrays():
    with tf.device("/CPU:2"):
        rows = tf.Variable(np.arange(48, dtype=np.float32).reshape(12, 4))  # 12 rows of 4 steps
    traced = tf.function(lambda s: gather_windows({"x": rows}, s, {"x": (0, 8)})["x"]).get_concrete_function(
        tf.TensorSpec([2], tf.int32))
    (gather,) = _gathers(traced)
    assert gather.device.endswith("CPU:2")
    np.testing.assert_array_equal(traced(tf.constant([0, 5], tf.int32)).numpy(),
                                  [np.arange(0, 8), np.arange(20, 28)])
    # Only the rows holding points [5, 11) of each span: rows 1-2 past each start, cut to the points.
    part = gather_windows({"x": rows}, tf.constant([0, 5], tf.int32), {"x": (5, 6)})["x"]
    np.testing.assert_array_equal(part.numpy(), [np.arange(5, 11), np.arange(25, 31)])


def test_an_input_only_feature_gathers_only_the_inputs_rows(tmp_path):
    """Forecasting another feature: obs gathers L steps and action only its W target steps, nothing sliced off."""
    episodes = {"obs": [np.arange(64, dtype=np.float32)[:, None]], "action": [np.arange(64, dtype=np.float32)]}
    layout = readers.resident_windows(episodes, length=8, shift=4, batch_size=2, features="obs",
                                      targets=readers.Targets("action", width=2, offset=4))
    x, y = next(iter(layout))
    assert x.shape == (2, 8, 1) and y.shape == (2, 2)
    np.testing.assert_array_equal(y.numpy() - x.numpy()[:, 0, 0:1], [[10, 11], [10, 11]])


@pytest.fixture
def mirrored(strategies):
    return strategies[2]


def test_under_a_mirrored_strategy_each_replica_gathers_from_its_own_copy(data, mirrored):
    with mirrored.scope():
        mw = readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=8, features="obs")
    copies = mirrored.experimental_local_results(mw.arrays["obs"])
    assert [c.device[-5:] for c in copies] == ["CPU:0", "CPU:1"]
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), copies[0].numpy())

    @tf.function
    def step(starts):
        return mirrored.run(mw.layer, args=(starts,))

    starts = next(iter(mirrored.experimental_distribute_dataset(mw.starts)))
    traced = step.get_concrete_function(starts)
    captured = {id(internal): external for external, internal in traced.graph.captures}
    placed = []
    for op in _gathers(traced):  # one gather per replica, on its device, reading that device's copy (its handle)
        handle = captured[id(op.inputs[0])]
        placed.append((op.device[-5:], handle.device[-5:]))
    assert sorted(placed) == [("CPU:0", "CPU:0"), ("CPU:1", "CPU:1")], placed
    parts = mirrored.experimental_local_results(step(starts))
    assert len(parts) == 2 and all(p.shape == (4, LENGTH, 2) for p in parts)


def test_fit_under_a_mirrored_strategy(data, mirrored):
    with mirrored.scope():
        mw = readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=8, features="obs",
                                   targets="same", seed=0)
        model = mw.wrap(_autoencoder())
        model.compile(keras.optimizers.Adam(0.01), "mse")
    history = model.fit(mw.starts, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_a_batch_that_does_not_divide_over_the_replicas_is_refused(data, mirrored):
    with pytest.raises(ValueError, match=r"batch_size=7 is the global batch .* 2 replicas; pass a multiple of 2"):
        readers.model_windows(data.out, length=LENGTH, shift=SHIFT, batch_size=7, strategy=mirrored)


def test_episodes_with_keys_name_each_episode(data):
    seen = {}
    for keys, episode in readers.episodes(data.out, features="t", with_keys=True):
        seen[int(keys["episode"])] = episode["t"].numpy()
    assert sorted(seen) == list(range(len(LENGTHS)))
    for i, e in enumerate(data.episodes):
        np.testing.assert_array_equal(seen[i], e["t"])


def test_the_epoch_after_an_overwrite_fails_naming_the_dataset(tmp_path):
    """The arrays were loaded once: every later epoch of the starts must check OUT still holds what was loaded."""
    for name, seed in (("a", 1), ("b", 2)):
        save_episodes(tmp_path / name, {f"e{i}.npz": {"obs": np.random.default_rng(seed + i).normal(size=(t, 2))}
                                        for i, t in enumerate([70, 90])})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "a", out, num_shards=2)
    mw = readers.model_windows(out, length=LENGTH, shift=SHIFT, batch_size=2, features="obs")
    assert len(list(mw.starts)) == len(list(mw.starts)) > 0
    convert_episode_tree(tmp_path / "b", out, num_shards=2, overwrite=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{out}: the dataset changed since the pipeline"):
        list(mw.starts)


# --- model_windows on the rich dataset (against the step-id oracle) ------------------------------------------------


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    """Chunk records of 20 steps (35 bytes a step) over 3 gzip shards (window_rows_helpers.py), shared."""
    return rich_dataset(tmp_path_factory)


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
