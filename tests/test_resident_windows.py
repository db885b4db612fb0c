"""resident_windows: exactly the numpy reference windows, never across an episode boundary; in-memory episodes of
every dtype against the step-id oracle (window_rows_helpers.py), and the arguments it refuses up front."""

import numpy as np
import pytest
from tfshard import readers
from tfshard.readers.windowing.starts import row_steps
from tfshard.readers.windows.resident import resident_windows
from window_rows_helpers import step_ids


def _episodes(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(t, 2)).astype(np.float32) for t in lengths]


def _reference(episodes, length, shift, horizon=0):
    windows, futures = [], []
    for episode in episodes:
        for start in range(0, len(episode) - length - horizon + 1, shift):
            windows.append(episode[start : start + length])
            futures.append(episode[start + length : start + length + horizon])
    return windows, futures


@pytest.mark.parametrize("length, shift", [(1, 1), (4, 1), (5, 3), (17, 16)])
def test_unshuffled_windows_equal_the_reference_in_order(length, shift):
    episodes = _episodes([30, 3, 0, 17, 50])
    ds = resident_windows({"x": episodes}, length=length, shift=shift, batch_size=7, shuffle=False,
                          drop_remainder=False)
    got = [w for batch in ds for w in batch["x"].numpy()]
    expected, _ = _reference(episodes, length, shift)
    assert len(got) == len(expected) == sum((t - length) // shift + 1 for t in [30, 3, 0, 17, 50] if t >= length)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_shuffled_windows_are_the_same_multiset_and_epochs_differ():
    episodes = _episodes([40, 25])
    ds = resident_windows({"x": episodes}, length=6, shift=2, batch_size=5, seed=3, drop_remainder=False)
    epochs = [[w.tobytes() for batch in ds for w in batch["x"].numpy()] for _ in range(2)]
    expected = sorted(w.tobytes() for w in _reference(episodes, 6, 2)[0])
    assert sorted(epochs[0]) == expected == sorted(epochs[1])
    assert epochs[0] != epochs[1]


def test_targets_same_and_horizon():
    episodes = _episodes([20, 12])
    same = next(iter(resident_windows({"x": episodes}, length=4, batch_size=3, targets="same", shuffle=False)))
    np.testing.assert_array_equal(same[0]["x"].numpy(), same[1]["x"].numpy())
    windows, targets = next(iter(resident_windows({"x": episodes}, length=4, shift=2, batch_size=50, targets=3,
                                                  shuffle=False, drop_remainder=False)))
    expected_w, expected_t = _reference(episodes, 4, 2, horizon=3)
    np.testing.assert_array_equal(windows["x"].numpy(), np.stack(expected_w))
    np.testing.assert_array_equal(targets["x"].numpy(), np.stack(expected_t))


def test_several_features_share_the_starts_and_disagreeing_lengths_are_refused():
    x, y = _episodes([10, 8]), [np.arange(10)[:, None], np.arange(8)[:, None]]
    batch = next(iter(resident_windows({"x": x, "t": y}, length=3, batch_size=4, shuffle=False)))
    np.testing.assert_array_equal(batch["t"].numpy()[:, :, 0], [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]])
    with pytest.raises(ValueError, match=r"episodes\['t'\]: episode lengths \[10, 7\]"):
        resident_windows({"x": x, "t": [y[0], y[1][:7]]}, length=3, batch_size=4)


# --- in memory: every dtype and shape, against the step-id oracle -----------------------------------------------------


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


def _first_inputs(ds):
    return next(iter(ds))["inputs"].numpy()


def test_targets_naming_no_feature_are_refused():
    """Attacks ``Targets(features=[])``: an empty list of target features is accepted and every element's targets
    are an empty dict ``{}`` (a model then has nothing to fit); it must be a ValueError naming ``features``."""
    episodes = {"x": [np.arange(20.0).reshape(10, 2)]}
    with pytest.raises(ValueError, match="features"):
        readers.resident_windows(episodes, length=3, batch_size=2, features="x",
                                 targets=readers.Targets([], width=1))


def test_a_numpy_bool_pad_value_is_a_number_for_a_bool_feature():
    """Attacks the pad_value type check: ``np.bool_(True)`` (what indexing a numpy bool array gives) is refused as
    "not a number" while ``True`` is accepted for the same bool feature; numpy scalars of the feature's own dtype
    must be accepted (np.integer and np.floating are)."""
    episodes = {"b": [np.array([True, False, True, True])]}
    options = dict(length=2, batch_size=8, features="b", padding="start", shuffle=False, drop_remainder=False)
    want = _first_inputs(readers.resident_windows(episodes, pad_value=True, **options))
    got = _first_inputs(readers.resident_windows(episodes, pad_value=np.bool_(True), **options))
    np.testing.assert_array_equal(got, want)


def test_a_sampling_rate_no_window_can_span_is_refused_up_front():
    """Attacks the unbounded ``sampling_rate`` (and offset): length and shift are capped at MAX_WINDOW_STEPS, but a
    span of ``(points - 1)·sampling_rate + 1`` steps is not, so with ``padding="start"`` (history padding of
    ``(length - 1)·sampling_rate`` steps per episode) sampling_rate=2**44 tries to allocate hundreds of TiB and
    dies with MemoryError. Arguments must be validated up front with a ValueError naming sampling_rate."""
    episodes = {"x": [np.zeros((10, 4), np.float64)]}
    with pytest.raises(ValueError, match="sampling_rate"):
        readers.resident_windows(episodes, length=2, batch_size=2, features="x", sampling_rate=2**44,
                                 padding="start")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.int8, np.uint16, np.float16, np.complex64])
def test_a_loaded_array_becomes_a_tensor_of_its_own_through_dlpack(dtype):
    """``host_tensor``: an aligned array is copied into a tensor TensorFlow owns (through a DLPack view, not its
    slow conversion), equal to it and independent of it, so a sparse read of the variable made from it (the windows'
    gather, or a user's ``tf.gather``) never copies it again; an unaligned, strided or empty array, or a dtype DLPack
    does not carry, is handed back for TensorFlow to convert."""
    import tensorflow as tf
    from tfshard.readers.windows.index import _gather_rows
    from tfshard.readers.windows.layout import ALIGNMENT, aligned_empty
    from tfshard.readers.windows.resident import host_tensor

    array = aligned_empty((1000, 3), dtype)
    assert array.ctypes.data % ALIGNMENT == 0 and array.flags.c_contiguous
    array[:] = np.arange(3000).reshape(1000, 3)
    tensor = host_tensor(array)
    assert isinstance(tensor, tf.Tensor) and tensor.dtype == tf.as_dtype(dtype)
    with tf.device("/CPU:0"):
        variable = tf.Variable(tensor, trainable=False)
    del tensor
    gather = tf.function(lambda rows: _gather_rows(variable, rows))
    np.testing.assert_array_equal(gather(tf.constant([7, 0])).numpy(), array[[7, 0]])
    array[7, 1] = 99  # the variable's buffer is its own: what the array does later never reaches it
    assert gather(tf.constant([7])).numpy()[0, 1] == variable.numpy()[7, 1] == 7 * 3 + 1
    unaligned = aligned_empty((3001,), dtype)[1:].reshape(1000, 3)
    for refused in (unaligned, array[:, :2], array[:0], aligned_empty((4,), bool)):
        assert host_tensor(refused) is refused
