"""The time-series tasks of readers.windows beyond reconstruction: episode labels, options under strategies, exact
resume with the new options, and normalization layers for episodes."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard import readers

LENGTHS = [9, 14, 5, 20, 11, 8]


def episodes_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": [rng.standard_normal((t, 3)).astype(np.float32) for t in lengths],
            "action": [rng.standard_normal((t, 2)).astype(np.float32) for t in lengths]}


@pytest.mark.parametrize("labels, dtype", [([2, 0, 1, 1, 0, 2], tf.int64),
                                           ([0.5, -1.25, 3.0, 2.5, 0.0, 1e-3], tf.float32)])
def test_label_targets_are_each_windows_episode_label(labels, dtype):
    data = episodes_of(LENGTHS)
    ds = readers.resident_windows(data, length=4, shift=2, batch_size=5, features="obs", targets="label",
                                  labels=labels, shuffle=False, drop_remainder=False, with_keys=True)
    seen = 0
    for keys, (x, y) in ds:
        assert y.dtype == dtype and y.shape == x.shape[:1]
        for episode, step, window, label in zip(keys["episode"].numpy(), keys["step"].numpy(), x.numpy(),
                                                y.numpy()):
            np.testing.assert_array_equal(window, data["obs"][episode][step : step + 4])
            assert label == np.asarray(labels, dtype.as_numpy_dtype)[episode]
            seen += 1
    assert seen == sum((t - 4) // 2 + 1 for t in LENGTHS)


def test_label_targets_without_labels_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"targets='label' needs episode labels.*--labels FILE"):
        readers.resident_windows(episodes_of(LENGTHS), length=4, batch_size=2, targets="label")
    with pytest.raises(ValueError, match=r"labels: one per episode \(got 2 labels for 6 episodes\)"):
        readers.resident_windows(episodes_of(LENGTHS), length=4, batch_size=2, targets="label", labels=[0, 1])


def test_a_mirrored_strategy_splits_the_same_windows_with_labels_masks_and_sampling(strategies):
    strategy = strategies[2]
    data = episodes_of(LENGTHS)
    labels = [0, 1, 2, 3, 4, 5]
    options = dict(length=3, shift=1, batch_size=4, features="obs", targets="label", labels=labels,
                   sampling_rate=2, padding="start", pad_value=-1.0, seed=3, with_keys=True)
    ds = readers.resident_windows(data, strategy=strategy, **options)
    assert len(ds.resident_arrays) == 2 and all("episode/label" in arrays for arrays in ds.resident_arrays)
    seen = collections.Counter()
    for keys, (x, y) in ds:
        for local_keys, local_x, local_y in zip(strategy.experimental_local_results(keys),
                                                strategy.experimental_local_results(x),
                                                strategy.experimental_local_results(y)):
            for episode, step, inputs, mask, label in zip(local_keys["episode"].numpy(), local_keys["step"].numpy(),
                                                          local_x["inputs"].numpy(), local_x["mask"].numpy(),
                                                          local_y.numpy()):
                assert label == labels[episode]
                points = step + 2 * np.arange(3)
                np.testing.assert_array_equal(mask, points >= 0)
                for k, p in enumerate(points):
                    expected = data["obs"][episode][p] if p >= 0 else np.full(3, -1.0, np.float32)
                    np.testing.assert_array_equal(inputs[k], expected)
                seen[(int(episode), int(step))] += 1
    alone = readers.resident_windows(data, **options)
    total = sum(len(k["episode"]) for k, _ in alone)
    assert set(seen.values()) == {1}  # each window once over both replicas
    assert len(seen) == total // 4 * 4  # every full global batch


def _keys_of(ds, steps):
    out = []
    iterator = iter(ds)
    for _ in range(steps):
        keys, _ = next(iterator)
        out.append(list(zip(keys["episode"].numpy().tolist(), keys["step"].numpy().tolist())))
    return out, iterator


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory) -> str:
    """``episodes_of(LENGTHS)`` converted once, without labels; tests only read it."""
    root = tmp_path_factory.mktemp("unlabelled")
    save_episodes(root / "src", {f"e{i}.npz": {n: v[i] for n, v in episodes_of(LENGTHS).items()}
                                 for i in range(len(LENGTHS))})
    convert_episode_tree(root / "src", root / "out")
    return str(root / "out")


@pytest.mark.parametrize("mode", ["resident", "model_windows"])
def test_resume_is_exact_with_targets_sampling_time_range_and_padding(unlabelled, tmp_path, mode):
    out = unlabelled
    options = dict(length=3, shift=1, batch_size=4, features="obs", targets=readers.Targets("action", width=1,
                   offset=2), sampling_rate=2, time_range=(0.0, 0.8), padding="start", seed=5, repeat=True)
    if mode == "resident":
        whole, _ = _keys_of(readers.windows(out, with_keys=True, **options), 30)
        later, _ = _keys_of(readers.windows(out, with_keys=True, start_step=17, **options), 13)
        assert later == whole[17:]
        ds = readers.windows(out, with_keys=True, **options)
        first, iterator = _keys_of(ds, 11)
        saved = tf.train.Checkpoint(input=iterator).save(str(tmp_path / "ckpt" / "c"))
        restored = iter(ds)
        tf.train.Checkpoint(input=restored).restore(saved)
        again = [list(zip(k["episode"].numpy().tolist(), k["step"].numpy().tolist()))
                 for k, _ in (next(restored) for _ in range(19))]
        assert first + again == whole
    else:
        mw = readers.model_windows(out, **options)
        starts = [s.numpy() for s in mw.starts.take(30)]
        later = readers.model_windows(out, start_step=17, **options)
        np.testing.assert_array_equal(np.stack([s.numpy() for s in later.starts.take(13)]), np.stack(starts[17:]))
        keys = mw.keys(tf.constant(starts[0]))
        x, y = mw.element(tf.constant(starts[0]))
        assert x["inputs"].shape == [4, 3, 3] and x["mask"].shape == [4, 3] and y.shape == [4, 1, 2]
        assert keys["episode"].shape == [4]


def test_normalization_of_episode_features_uses_the_manifest_statistics(tmp_path):
    data = episodes_of(LENGTHS, seed=4)
    save_episodes(tmp_path / "src", {f"e{i}.npz": {n: v[i] * 5 + 2 for n, v in data.items()}
                                     for i in range(len(LENGTHS))})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    out = str(tmp_path / "out")
    layer = readers.normalization(out, features="obs")
    x = next(iter(readers.windows(out, length=5, batch_size=64, features="obs", drop_remainder=False)))
    every = np.concatenate([v * 5 + 2 for v in data["obs"]]).astype(np.float64)
    expected = (x.numpy() - every.mean(0)) / every.std(0)
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-4, atol=1e-4)
    both = readers.normalization(out, features=["obs", "action"])
    assert set(both) == {"obs", "action"}
    with pytest.raises(ValueError, match=r"no feature\(s\) \['nope'\]"):
        readers.normalization(out, features="nope")


def test_normalization_centres_a_feature_constant_to_float32_and_refuses_statistics_beyond_it(tmp_path):
    """A constant float feature's sums leave a std of rounding noise (~1e-8 of its mean): it is centred, not divided
    by it (which made 0.2 into 1e5). Statistics no float32 layer holds (a float64 feature around 1e100) are an
    error naming the feature, not a layer of NaNs."""
    save_episodes(tmp_path / "src", {f"e{i}.npz": {"flat": np.full((1500, 1), 0.1, np.float32),
                                                    "huge": np.full((1500, 1), 1e100 * (i + 1), np.float64)}
                                     for i in range(2)})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    out = str(tmp_path / "out")
    split = readers.info(out).manifest.splits["train"]
    assert 0 < split.feature_std["flat"][0] < 1e-6 * 0.1, split.feature_std  # rounding noise, not 0
    layer = readers.normalization(out, features="flat")
    np.testing.assert_allclose(layer(np.asarray([[[0.1], [0.2]]], np.float32)).numpy(), [[[0.0], [0.1]]], atol=1e-6)
    with pytest.raises(ValueError, match=r"split 'train''s feature 'huge' have mean 1\.5e\+100 and std 5e\+99 at "
                                         r"element 0, beyond the float32 a keras Normalization layer holds"):
        readers.normalization(out, features="huge")


# --- converted episode labels, read back in every mode --------------------------------------------------------------


def labelled_dataset(tmp_path, kind: str) -> tuple[str, dict, dict]:
    """Episodes converted with labels: class folders (``kind="class"``) or a CSV of float values; returns OUT,
    each source's episode and its expected label."""
    data = episodes_of(LENGTHS * 2, seed=7)
    classes = ["walk", "run", "sit"]
    rels = [f"{classes[i % 3]}/e{i:02d}.npz" if kind == "class" else f"e{i:02d}.npz" for i in range(len(LENGTHS) * 2)]
    save_episodes(tmp_path / "src", {rel: {n: v[i] for n, v in data.items()} for i, rel in enumerate(rels)})
    if kind == "class":
        expected = {rel: sorted(classes).index(rel.split("/")[0]) for rel in rels}
        episode = None
    else:
        from tfshard.ingest import EpisodeOptions

        expected = {rel: float(np.float32(0.25 * i - 1)) for i, rel in enumerate(rels)}
        csv = tmp_path / "labels.csv"
        csv.write_text("path,label\n" + "".join(f"{rel},{value!r}\n" for rel, value in expected.items()))
        episode = EpisodeOptions(labels_file=str(csv))
    convert_episode_tree(tmp_path / "src", tmp_path / "out", num_shards=3, episode=episode)
    episodes = {rel: {n: v[i] for n, v in data.items()} for i, rel in enumerate(rels)}
    return str(tmp_path / "out"), episodes, expected


def by_id(out: str, episodes: dict, expected: dict):
    """Episode id → (its arrays, its label), from the manifest's sources."""
    manifest = readers.info(out).manifest
    return {e.id: (episodes[e.source], expected[e.source]) for e in manifest.splits["train"].episodes}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """``labelled(kind)``: ``labelled_dataset`` converted once per kind for the module; tests only read it."""
    built = {}

    def get(kind: str):
        if kind not in built:
            built[kind] = labelled_dataset(tmp_path_factory.mktemp(f"labelled-{kind}"), kind)
        return built[kind]

    return get


@pytest.mark.parametrize("kind", ["class", "value"])
def test_converted_labels_round_trip_in_every_mode(labelled, kind):
    out, episodes, expected = labelled(kind)
    truth = by_id(out, episodes, expected)
    dtype = np.int64 if kind == "class" else np.float32
    info = readers.info(out)
    assert info.manifest.labels == kind
    options = dict(length=4, shift=3, batch_size=4, features="obs", targets="label", shuffle=False,
                   drop_remainder=False)
    total = info.num_windows("train", 4, 3)
    for mode in ("resident", "streamed", "model_windows"):
        if mode == "model_windows":
            mw = readers.model_windows(out, **options)
            batches = [(mw.keys(s), mw.element(s)) for s in mw.starts]
        else:
            batches = readers.windows(out, with_keys=True, resident=mode == "resident", **options)
        seen = 0
        for keys, (x, y) in batches:
            assert y.dtype == dtype, mode
            for episode, step, window, label in zip(keys["episode"].numpy(), keys["step"].numpy(), x.numpy(),
                                                    y.numpy()):
                arrays, want = truth[int(episode)]
                np.testing.assert_array_equal(window, arrays["obs"][step : step + 4])
                assert label == dtype(want), (mode, episode)
                seen += 1
        assert seen == total, mode
    for ep in readers.episodes(out):  # readers.episodes yields the label with each episode
        assert ep["label"].dtype == dtype


def test_converted_labels_under_a_mirrored_strategy(labelled, strategies):
    strategy = strategies[2]
    out, episodes, expected = labelled("class")
    truth = by_id(out, episodes, expected)
    for make in ("resident", "streamed"):
        ds = readers.windows(out, length=4, shift=2, batch_size=4, features="obs", targets="label", seed=1,
                             with_keys=True, strategy=strategy, resident=make == "resident")
        checked = 0
        for keys, (_, y) in ds:
            for k, label in zip(strategy.experimental_local_results(keys), strategy.experimental_local_results(y)):
                for episode, got in zip(k["episode"].numpy(), label.numpy()):
                    assert got == truth[int(episode)][1]
                    checked += 1
        assert checked > 0, make
    mw = readers.model_windows(out, length=4, shift=2, batch_size=4, features="obs", targets="label", seed=1,
                               strategy=strategy)
    labels = mw.layer._resident.episodes.labels  # mirrored: one copy on each replica's device
    assert len(strategy.experimental_local_results(labels)) == 2


def test_label_targets_on_an_unlabelled_dataset_are_refused(unlabelled):
    for make in (readers.windows, readers.model_windows):
        with pytest.raises(ValueError, match=r"targets='label' needs episode labels, and this data has none"):
            make(unlabelled, length=4, batch_size=2, targets="label")
