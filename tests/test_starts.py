"""Window-start arithmetic against an oracle: numpy's sliding_window_view per episode, stepped by the shift."""

import itertools

import numpy as np
import pytest
from tfshard.readers.windowing.starts import episode_offsets, row_steps, window_count, window_starts


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


def test_starts_in_rows_are_the_same_windows_in_the_padded_layout():
    """In rows of g steps (episodes padded to whole rows), each window is span/g whole rows of its episode."""
    for lengths in itertools.chain.from_iterable(itertools.product([0, 4, 7, 12, 13], repeat=n) for n in range(1, 4)):
        for length, shift, horizon in itertools.product([2, 4, 6], [2, 4], [0, 2]):
            span = length + horizon
            for row in (g for g in (1, 2, 4) if shift % g == 0 and span % g == 0):
                offsets = episode_offsets(list(lengths), row)
                assert all(o % row == 0 for o in offsets)
                by_step = window_starts(list(lengths), length, shift, horizon)
                by_row = window_starts(list(lengths), length, shift, horizon, row=row)
                # the same windows: episode e's k-th window starts row·r = its step start, moved by the padding
                plain = episode_offsets(list(lengths))
                moved = [s - plain[np.searchsorted(plain, s, "right") - 1] + offsets[np.searchsorted(plain, s, "right")
                                                                                    - 1] for s in by_step]
                assert [r * row for r in by_row] == moved, (lengths, length, shift, horizon, row)


def test_row_steps_is_the_largest_divisor_within_the_padding_budget():
    assert row_steps([4096] * 3, 256, 16) == 16
    assert row_steps([4096] * 3, 256, 16, horizon=8) == 8  # gcd(264, 16)
    assert row_steps([4100] * 3, 256, 16) == 16  # 12 of 12,300 steps padded: under 1/64
    assert row_steps([20, 36], 16, 16) == 4  # rows of 16 would pad 24 of 56, of 8 pad 8: over 1/64; 4 pads 0
    assert row_steps([17, 33], 16, 16) == 1  # any row pads: 1 never does
    assert row_steps([100], 7, 1) == 1


def test_rows_that_do_not_divide_the_shift_and_span_are_refused():
    with pytest.raises(ValueError, match=r"row: must divide shift=4 and length \+ horizon=6"):
        window_starts([10], 6, 4, row=4)
