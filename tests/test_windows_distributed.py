"""Windows under a real tf.distribute.MirroredStrategy over logical CPU devices (made in conftest.py).

Every step, each replica gets batch_size // replicas windows from its own device; over an epoch the
replicas' shares are disjoint and equal, so at most replicas - 1 windows sit out.
"""

from __future__ import annotations

import collections
import itertools
import types

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard import readers
from tfshard.ingest import EpisodeOptions

LENGTHS = [40, 25, 7, 33, 4, 19, 8]  # 59 windows of 4 (shift 2): 59 % 2 and 59 % 3 are not 0
WIDTH = 3


def _write(tmp_path_factory, name, num_shards):
    """``t``: int64 [T], a unique id per step (a window's identity); ``obs``: float32 [T, 3]."""
    src = tmp_path_factory.mktemp(f"{name}-src")
    out = tmp_path_factory.mktemp(name) / "out"
    rng = np.random.default_rng(2)
    counter = itertools.count()
    written = {f"e{i}.npz": {"t": np.array([next(counter) for _ in range(t)], np.int64),
                             "obs": rng.normal(size=(t, WIDTH)).astype(np.float32)} for i, t in enumerate(LENGTHS)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, num_shards=num_shards, episode=EpisodeOptions(max_record_bytes=200))
    listed = manifest.splits["train"].episodes
    order = [written[e.source] for e in sorted(listed, key=lambda e: e.id)]  # source order: resident, unshuffled
    in_manifest = [written[e.source] for e in listed]  # streamed, unshuffled
    episodes = {feature: [e[feature] for e in order] for feature in ("t", "obs")}
    manifest_order = {feature: [e[feature] for e in in_manifest] for feature in ("t", "obs")}
    return types.SimpleNamespace(out=str(out), manifest=manifest, episodes=episodes, manifest_order=manifest_order)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _write(tmp_path_factory, "four-shards", num_shards=4)


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    return _write(tmp_path_factory, "one-shard", num_shards=1)


def reference(episodes, length, shift):
    """numpy's windows per episode, stepped by ``shift``, in manifest episode order."""
    windows = []
    for episode in episodes:
        if len(episode) >= length:
            view = np.lib.stride_tricks.sliding_window_view(episode, length, axis=0)[::shift]
            windows.extend(np.moveaxis(view, -1, 1))
    return windows


def one_epoch(strategy, dataset):
    """Per replica: the windows it got over one epoch (in order), and every (device, per-replica batch size)."""
    windows = [[] for _ in range(strategy.num_replicas_in_sync)]
    seen = []
    for element in dataset:
        parts = strategy.experimental_local_results(element)
        assert len(parts) == strategy.num_replicas_in_sync
        for i, part in enumerate(parts):
            windows[i].extend(part.numpy())
            seen.append((i, part.device, part.shape[0]))
    return windows, seen


def as_ids(windows) -> list[tuple]:
    return [tuple(w.tolist()) for w in windows]


def resident(strategy, data, api, **options):
    """The same resident windows through readers.windows (from the shards) or resident_windows (from memory)."""
    options = {"length": 4, "shift": 2, "batch_size": 6, "features": "t", **options}
    if api == "windows":
        return readers.windows(data.out, strategy=strategy, **options)
    return readers.resident_windows(data.episodes, strategy=strategy, **options)


# --- resident mode ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["windows", "resident_windows"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_get_disjoint_equal_shares_from_their_own_devices(strategies, data, replicas, shuffle, api):
    strategy = strategies[replicas]
    expected = as_ids(reference(data.episodes["t"], 4, 2))
    share = len(expected) // replicas
    assert len(expected) % replicas  # so the test sees windows sit out

    dataset = resident(strategy, data, api, shuffle=shuffle, seed=5, drop_remainder=False)

    assert isinstance(dataset, tf.distribute.DistributedDataset)
    windows, seen = one_epoch(strategy, dataset)
    per_replica = 6 // replicas
    for i, device, size in seen:
        assert device.endswith(f"CPU:{i}"), (i, device)
        assert 0 < size <= per_replica
    sizes = collections.Counter({per_replica: replicas * (share // per_replica)})
    sizes[share % per_replica] += replicas * bool(share % per_replica)
    assert collections.Counter(size for _, _, size in seen) == +sizes
    shares = [as_ids(w) for w in windows]
    assert [len(s) for s in shares] == [share] * replicas
    union = set().union(*map(set, shares))
    assert len(union) == share * replicas  # disjoint
    assert union <= set(expected) and len(expected) - len(union) <= replicas - 1
    if not shuffle:  # replica i takes every replicas-th window from the i-th, in order
        assert shares == [expected[i : share * replicas : replicas] for i in range(replicas)]


def test_windows_are_the_reference_values_on_each_replica(strategies, data):
    strategy = strategies[2]
    dataset = readers.windows(data.out, length=5, shift=3, batch_size=4, features=["obs", "t"], targets=2,
                              shuffle=False, strategy=strategy)
    x, y = next(iter(dataset))
    windows = reference(data.episodes["obs"], 7, 3)  # the window and its 2-step horizon
    for i, (obs, t, future) in enumerate(zip(*(strategy.experimental_local_results(v) for v in (x["obs"], x["t"],
                                                                                                   y["obs"])))):
        np.testing.assert_array_equal(obs.numpy(), np.stack(windows[i : 4 : 2])[:, :5])
        np.testing.assert_array_equal(future.numpy(), np.stack(windows[i : 4 : 2])[:, 5:])
        assert t.dtype == tf.int64 and obs.device.endswith(f"CPU:{i}") and future.device.endswith(f"CPU:{i}")


@pytest.mark.parametrize("resident", [True, False])
def test_keys_name_each_replicas_windows(strategies, data, resident):
    strategy = strategies[2]
    dataset = readers.windows(data.out, length=5, shift=3, batch_size=4, features="t", seed=2, with_keys=True,
                              resident=resident, strategy=strategy)
    checked = 0
    for keys, windows in dataset:
        for part_keys, part in zip(strategy.experimental_local_results(keys),
                                   strategy.experimental_local_results(windows)):
            for episode, step, window in zip(part_keys["episode"].numpy(), part_keys["step"].numpy(), part.numpy()):
                np.testing.assert_array_equal(window, data.episodes["t"][episode][step : step + 5])
                checked += 1
    assert checked == 36  # 37 windows of 5 (shift 3), in global batches of 4


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_drop_remainder_keeps_only_full_per_replica_batches(strategies, data, drop_remainder):
    strategy = strategies[3]
    total = len(reference(data.episodes["t"], 4, 2))
    windows, seen = one_epoch(strategy, resident(strategy, data, "windows", batch_size=9, shuffle=False,
                                                   drop_remainder=drop_remainder))
    share = total // 3
    kept = share // 3 * 3 if drop_remainder else share
    assert share % 3  # a partial per-replica batch exists to be dropped or kept
    assert [len(w) for w in windows] == [kept] * 3
    assert [size for _, _, size in seen] == [3] * (share // 3 * 3) + ([] if drop_remainder else [share % 3] * 3)


def test_shuffled_shares_change_every_epoch_and_the_seed_repeats_them(strategies, data):
    strategy = strategies[2]
    dataset = resident(strategy, data, "windows", seed=9, drop_remainder=False)
    epochs = [[as_ids(w) for w in one_epoch(strategy, dataset)[0]] for _ in range(2)]
    for shares in epochs:
        assert not set(shares[0]) & set(shares[1])
    assert set(epochs[0][0]) != set(epochs[1][0])
    again = resident(strategy, data, "windows", seed=9, drop_remainder=False)
    assert [as_ids(w) for w in one_epoch(strategy, again)[0]] == epochs[0]


def test_each_replica_holds_its_own_copy_of_the_arrays_on_its_device(strategies, data):
    strategy = strategies[3]
    ds = readers.windows(data.out, length=4, batch_size=3, features="obs", strategy=strategy)

    created = [arrays["obs"] for arrays in ds.resident_arrays]
    devices = [v.device for v in created]
    assert len(created) == 3 and [d[-5:] for d in devices] == ["CPU:0", "CPU:1", "CPU:2"], devices
    everything = np.concatenate(data.episodes["obs"])  # source order; shift 1 makes rows of 1 step: no padding
    for variable in created:
        assert variable.shape == (len(everything), 1, WIDTH)
        np.testing.assert_array_equal(variable.numpy()[:, 0], everything)


def test_values_from_distribute_values_from_function_alone_stay_on_the_host(strategies):
    # The measurement behind the design: a value made per replica by the strategy, without a device scope, is
    # placed on the host (CPU:0) for every replica, so a gather from it would not read the replica's own memory.
    strategy = strategies[3]
    values = strategy.experimental_distribute_values_from_function(lambda ctx: tf.constant([1.0, 2.0]))
    assert [v.device[-5:] for v in strategy.experimental_local_results(values)] == ["CPU:0"] * 3


@pytest.mark.parametrize("api", ["windows", "resident_windows"])
def test_batch_size_must_divide_over_the_replicas(strategies, data, api):
    with pytest.raises(ValueError, match=r"batch_size=7 is the global batch and must divide evenly over the "
                                         r"strategy's 3 replicas; pass a multiple of 3"):
        resident(strategies[3], data, api, batch_size=7)


@pytest.mark.parametrize("api", ["windows", "resident_windows"])
def test_the_strategy_of_the_enclosing_scope_is_picked_up(strategies, data, api):
    strategy = strategies[2]
    with strategy.scope():
        dataset = resident(None, data, api, shuffle=False, drop_remainder=False)
    assert isinstance(dataset, tf.distribute.DistributedDataset)
    windows, seen = one_epoch(strategy, dataset)
    expected = as_ids(reference(data.episodes["t"], 4, 2))
    assert [as_ids(w) for w in windows] == [expected[i : len(expected) // 2 * 2 : 2] for i in range(2)]
    assert {device[-5:] for _, device, _ in seen} == {"CPU:0", "CPU:1"}


@pytest.mark.parametrize("api", ["windows", "resident_windows"])
def test_fewer_windows_per_replica_than_a_per_replica_batch_is_an_error_up_front(strategies, data, api):
    """Under a strategy: 59 windows over 2 replicas are 29 each, one short of a per-replica batch of 30."""
    assert len(reference(data.episodes["t"], 4, 2)) == 59
    with pytest.raises(ValueError, match=r"has 29 windows per replica \(59 over 2 replicas\), fewer than the "
                                         r"per-replica batch of 30 \(batch_size=60 over 2 replicas\) with "
                                         r"drop_remainder=True, so an epoch would yield no batch"):
        resident(strategies[2], data, api, batch_size=60)
    windows, _ = one_epoch(strategies[2], resident(strategies[2], data, api, batch_size=58))
    assert [len(w) for w in windows] == [29, 29]


# --- training -----------------------------------------------------------------------------------------------------


def test_custom_training_step_in_a_tf_function(strategies, data):
    import keras
    strategy = strategies[2]
    length, batch_size = 4, 6
    with strategy.scope():
        weights = tf.Variable(tf.zeros([length * WIDTH, WIDTH]))
        optimizer = keras.optimizers.SGD(0.01)
    dataset = readers.windows(data.out, length=length, shift=2, batch_size=batch_size, features="obs", targets=1,
                              shuffle=False, strategy=strategy)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            prediction = tf.reshape(x, [-1, length * WIDTH]) @ weights
            loss = tf.reduce_sum(tf.square(prediction - y[:, 0])) / batch_size
        optimizer.apply_gradients(zip(tape.gradient(loss, [weights]), [weights]))
        return tf.shape(x)[0], tf.reduce_sum(tf.cast(x, tf.float64))

    @tf.function
    def train_step(iterator):
        count, total = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce("SUM", count, axis=None), strategy.reduce("SUM", total, axis=None)

    windows = reference(data.episodes["obs"], length + 1, 2)  # each with its 1-step target
    steps = len(windows) // 2 // (batch_size // 2)
    iterator = iter(dataset)
    counts, totals = zip(*(train_step(iterator) for _ in range(steps)))

    assert [int(c) for c in counts] == [batch_size] * steps
    used = np.stack(windows[: steps * batch_size])[:, :length].astype(np.float64)
    np.testing.assert_allclose(sum(float(t) for t in totals), used.sum(), rtol=1e-6)
    first, second = (v.numpy() for v in strategy.experimental_local_results(weights))
    assert np.abs(first).sum() > 0
    np.testing.assert_array_equal(first, second)  # the mirrored copies stayed in sync


def test_keras_fit_under_the_strategy_scope(strategies, data):
    import keras
    strategy = strategies[2]
    with strategy.scope():
        model = keras.Sequential([keras.Input((6, WIDTH)), keras.layers.Flatten(), keras.layers.Dense(2 * WIDTH),
                                  keras.layers.Reshape((2, WIDTH))])
        model.compile(optimizer="sgd", loss="mse")
        dataset = readers.windows(data.out, length=6, shift=1, batch_size=8, features="obs", targets=2, seed=0)

    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(batch))

    history = model.fit(dataset, epochs=2, verbose=0, shuffle=False, callbacks=[counter])

    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
    steps = len(reference(data.episodes["obs"], 8, 1)) // 2 // 4  # per replica: its share in batches of 4
    assert batches == list(range(steps)) * 2


# --- streamed mode ------------------------------------------------------------------------------------------------
# These use fresh strategies: a MirroredStrategy that has served a PER_REPLICA dataset (every resident call does)
# keeps one input pipeline per replica for every later distribute_datasets_from_function call (TF 2.21,
# MirroredExtended._input_workers_with_options stores the per-replica devices), and streamed mode reads differently.


def fresh(replicas: int) -> tf.distribute.MirroredStrategy:
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def streamed(strategy, data, **options):
    options = {"length": 3, "shift": 2, "batch_size": 6, "features": "t", "shuffle": False, "seed": 1,
               "shuffle_buffer": 8, "drop_remainder": False, **options}
    return readers.windows(data.out, resident=False, strategy=strategy, **options)


def window_counts(strategy, dataset) -> collections.Counter:
    windows, seen = one_epoch(strategy, dataset)
    assert all(device.endswith(f"CPU:{i}") for i, device, _ in seen)
    return collections.Counter(w for replica in windows for w in as_ids(replica))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("replicas", [2, 3])
def test_streamed_every_window_once_across_replicas(data, replicas, shuffle):
    strategy = fresh(replicas)
    assert len(data.manifest.splits["train"].shards) == 4

    dataset = streamed(strategy, data, shuffle=shuffle)

    assert isinstance(dataset, tf.distribute.DistributedDataset)
    windows, seen = one_epoch(strategy, dataset)
    assert all(device.endswith(f"CPU:{i}") and size <= 6 // replicas for i, device, size in seen)
    counts = collections.Counter(w for replica in windows for w in as_ids(replica))
    assert sorted(counts) == sorted(as_ids(reference(data.episodes["t"], 3, 2)))
    assert set(counts.values()) == {1}


@pytest.mark.parametrize("replicas", [2, 3])
def test_streamed_drop_remainder_drops_less_than_a_global_batch(data, replicas):
    strategy = fresh(replicas)
    total = len(reference(data.episodes["t"], 3, 2))
    counts = window_counts(strategy, streamed(strategy, data, drop_remainder=True))
    assert set(counts.values()) == {1} and total - 6 < sum(counts.values()) <= total


def test_streamed_with_one_shard_on_a_fresh_strategy_reads_every_window_once(one_shard):
    # A fresh MirroredStrategy has one input pipeline (one worker) feeding all its replicas: one shard is enough.
    strategy = fresh(2)
    counts = window_counts(strategy, streamed(strategy, one_shard))
    assert sorted(counts) == sorted(as_ids(reference(one_shard.episodes["t"], 3, 2))) and set(counts.values()) == {1}


def test_resident_windows_leave_the_strategys_own_input_pipelines_alone(one_shard, data):
    # TF 2.21 keeps per-replica input pipelines on a MirroredStrategy once asked for them; readers.windows puts the
    # strategy back, so a later dataset (here one shard, streamed) still gets the one pipeline that reads it all.
    strategy = fresh(2)
    readers.windows(data.out, length=3, batch_size=2, strategy=strategy)
    counts = window_counts(strategy, streamed(strategy, one_shard))
    assert sorted(counts) == sorted(as_ids(reference(one_shard.episodes["t"], 3, 2))) and set(counts.values()) == {1}


def test_streamed_after_resident_on_the_same_strategy_still_reads_the_epoch(data):
    strategy = fresh(3)
    readers.windows(data.out, length=3, batch_size=6, strategy=strategy)  # e.g. the training set, resident

    counts = window_counts(strategy, streamed(strategy, data, drop_remainder=True))

    total = len(reference(data.episodes["t"], 3, 2))
    assert total - 6 < sum(counts.values()) <= total


def test_streamed_with_fewer_windows_than_one_step_takes_is_an_error_up_front(data):
    total = len(reference(data.episodes["t"], 3, 2))
    strategy = fresh(2)
    # One input pipeline feeds both replicas: a step takes a per-replica batch for each, 2 * 32 > 63 windows.
    assert total == 63
    with pytest.raises(ValueError, match=r"split 'train' has 63 windows for this pipeline, fewer than the 64 a step "
                                         r"takes from it \(a batch of 32 for each of the 2 replicas it feeds; "
                                         r"batch_size=64 over 2 replicas\) with drop_remainder=True"):
        streamed(strategy, data, batch_size=64, drop_remainder=True)
    counts = window_counts(strategy, streamed(strategy, data, batch_size=60, drop_remainder=True))
    assert sum(counts.values()) == 60  # one step: a batch of 30 for each replica


def _steps_by_shard(data, steps_per_record=10) -> list[set]:
    """The step ids each shard holds, from the manifest: episodes in record order, ceil(T / 10) records each."""
    shards, found = data.manifest.splits["train"].shards, []
    episodes = iter(zip(data.manifest.splits["train"].episodes, data.manifest_order["t"]))
    for shard in shards:
        records, steps = 0, set()
        while records < shard.records:
            entry, t = next(episodes)
            records += -(-entry.length // steps_per_record)
            steps |= set(t.tolist())
        assert records == shard.records
        found.append(steps)
    return found


def test_input_context_shards_the_files_and_names_min_shards(one_shard, data):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match=r"split 'train' has 1 shards, fewer than the 2 input pipelines.*"
                                         r"`tfshard episodes \.\.\. --min-shards 2`"):
        readers.windows(one_shard.out, length=3, batch_size=2, resident=False, input_context=context)
    with pytest.raises(ValueError, match=r"input_context is for resident=False"):
        readers.windows(data.out, length=3, batch_size=2, input_context=context)

    # with enough shards, pipeline 1 of 2 reads shards 1 and 3 (20 bytes a step, 200-byte records: 10 steps each)
    mine = readers.windows(data.out, length=1, batch_size=1, features="t", resident=False, shuffle=False,
                           input_context=context)
    by_shard = _steps_by_shard(data)
    assert sorted(int(w[0, 0]) for w in mine) == sorted(by_shard[1] | by_shard[3])
    assert by_shard[1] and by_shard[3]


# --- a one-feature dataset gives tensors unasked --------------------------------------------------------------


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """One .npy file per episode (the converter names the feature ``data``), in 4 shards: a step id per row."""
    src = tmp_path_factory.mktemp("npy-src")
    out = tmp_path_factory.mktemp("npy") / "out"
    counter = itertools.count()
    written = {f"e{i}.npy": np.array([[next(counter)] for _ in range(t)], np.int64) for i, t in enumerate(LENGTHS)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, num_shards=4)
    listed = manifest.splits["train"].episodes
    order = [written[e.source] for e in sorted(listed, key=lambda e: e.id)]  # source order: resident, unshuffled
    return types.SimpleNamespace(out=str(out), episodes=order)


@pytest.mark.parametrize("resident", [True, False])
def test_one_feature_dataset_gives_per_replica_tensors_without_naming_it(npy, resident):
    strategy = fresh(2)
    dataset = readers.windows(npy.out, length=4, shift=2, batch_size=6, targets="same", shuffle=False,
                              drop_remainder=False, resident=resident, strategy=strategy)
    seen = []
    for x, y in dataset:
        for i, (part, target) in enumerate(zip(strategy.experimental_local_results(x),
                                               strategy.experimental_local_results(y))):
            assert isinstance(part, tf.Tensor) and part.device.endswith(f"CPU:{i}")
            np.testing.assert_array_equal(part.numpy(), target.numpy())
            seen.extend(as_ids(part.numpy()[..., 0]))  # [B, L, 1] -> a window's step ids
    expected = as_ids([w[:, 0] for w in reference(npy.episodes, 4, 2)])
    assert set(seen) <= set(expected) and len(seen) == len(set(seen)) >= len(expected) - 1


def test_resident_windows_under_a_strategy_fail_the_epoch_after_an_overwrite(strategies, tmp_path):
    """Each replica holds the episodes in its device memory: each replica's next epoch checks OUT first."""
    for name, seed in (("a", 1), ("b", 2)):
        save_episodes(tmp_path / name, {f"e{i}.npz": {"t": np.random.default_rng(seed + i).integers(0, 9, size=t)}
                                        for i, t in enumerate(LENGTHS)})
    out = str(tmp_path / "out")
    convert_episode_tree(tmp_path / "a", out, num_shards=4)
    strategy = strategies[2]
    dataset = readers.windows(out, length=4, shift=2, batch_size=6, features="t", strategy=strategy)
    assert one_epoch(strategy, dataset)[1] == one_epoch(strategy, dataset)[1]
    convert_episode_tree(tmp_path / "b", out, num_shards=4, overwrite=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{out}: the dataset changed since the pipeline"):
        one_epoch(strategy, dataset)
