"""Window-start arithmetic against an oracle: numpy's sliding_window_view per episode, stepped by the shift."""

import itertools

import numpy as np
import pytest

from tfshard.readers.starts import episode_offsets, window_count, window_starts


def _oracle(lengths, length, shift, horizon=0):
    """Windows of the concatenation, built per episode the slow, obvious way."""
    data = np.arange(sum(lengths))
    windows = []
    for offset, t in zip(episode_offsets(lengths), lengths):
        episode = data[offset : offset + t]
        if t >= length + horizon:
            view = np.lib.stride_tricks.sliding_window_view(episode[: t - horizon] if horizon else episode, length)
            windows.extend(view[::shift])
    return windows


def test_exhaustive_small_products_match_the_oracle():
    for lengths in itertools.chain.from_iterable(itertools.product([0, 1, 3, 4, 9], repeat=n) for n in range(1, 4)):
        for length, shift, horizon in itertools.product([1, 2, 4], [1, 2, 3], [0, 2]):
            starts = window_starts(list(lengths), length, shift, horizon)
            gathered = [np.arange(sum(lengths))[s : s + length] for s in starts]
            expected = _oracle(list(lengths), length, shift, horizon)
            assert len(starts) == len(expected) == window_count(lengths, length, shift, horizon)
            assert all(np.array_equal(a, b) for a, b in zip(gathered, expected)), (lengths, length, shift, horizon)


def test_count_formula_golden():
    # sum over episodes with T >= L of floor((T - L) / S) + 1
    assert window_count([5000, 20000, 100], length=256, shift=16) == (5000 - 256) // 16 + 1 + (20000 - 256) // 16 + 1


def test_index_memory_is_four_bytes_per_window_below_2_31_samples():
    assert window_starts([10, 10], 3).dtype == np.int32
    assert window_starts([2**31], 2**31 - 4, shift=2).dtype == np.int64


@pytest.mark.parametrize("kwargs, match", [({"length": 0}, "length"), ({"length": 2, "shift": 0}, "shift"),
                                           ({"length": 2, "horizon": -1}, "horizon")])
def test_bad_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        window_starts([10], **kwargs)
