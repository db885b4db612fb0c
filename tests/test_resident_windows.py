"""resident_windows: exactly the numpy reference windows, never across an episode boundary."""

import numpy as np
import pytest
from tfshard.readers.windows.resident import resident_windows


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
