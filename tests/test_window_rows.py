"""The row layout and window keys of readers.windows, against a numpy slicing oracle (window_rows_helpers.py).

Bugs the attack found (fixed) keep a test each: dtypes, shapes, empty input and zero-width features.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard import readers
from tfshard.ingest import EpisodeOptions
from tfshard.readers.windowing.starts import row_steps
from window_rows_helpers import (
    MW,
    RICH,
    check_against_oracle,
    collect,
    convert,
    ids_only,
    oracle,
    rich_dataset,
    rich_episode,
)


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    """Chunk records of 20 steps (35 bytes a step) over 3 gzip shards, written in shuffled order."""
    return rich_dataset(tmp_path_factory)


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


@pytest.fixture(scope="module")
def zero_width(tmp_path_factory) -> str:
    """One episode with a feature of no values a step (``x``, float32 [10, 0]) beside ``y``, converted once."""
    root = tmp_path_factory.mktemp("zero-width")
    save_episodes(root / "src", {"a.npz": {"x": np.zeros((10, 0), np.float32), "y": np.arange(10, dtype=np.float32)}})
    convert_episode_tree(root / "src", root / "out")
    return str(root / "out")


@pytest.mark.parametrize("resident", [True, False])
def test_a_zero_width_feature_written_by_the_converter(zero_width, resident):
    batch = next(iter(readers.windows(zero_width, length=2, batch_size=2, shuffle=False, resident=resident,
                                      features=["x", "y"])))
    assert batch["x"].shape == (2, 2, 0)


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
