"""The ordered, memory-bounded process map the converter runs its workers through."""

import itertools

import pytest

from tfshard.ingest.parallel import ordered_map


def _square(x):
    return x * x


def test_results_come_back_in_input_order_from_several_processes():
    assert list(ordered_map(_square, range(200), workers=2, chunk_items=3)) == [x * x for x in range(200)]


def test_in_process_mode_matches():
    assert list(ordered_map(_square, range(10), workers=0)) == [x * x for x in range(10)]


def test_input_is_consumed_lazily_within_the_byte_budget():
    pulled = []

    def items():
        for i in itertools.count():
            pulled.append(i)
            yield i

    results = ordered_map(_square, items(), workers=2, size_of=lambda _: 100, max_pending_bytes=1000, chunk_items=2)
    assert [next(results) for _ in range(5)] == [0, 1, 4, 9, 16]
    # 1000 bytes of budget = 10 items in flight, plus the chunk being filled and the ones already yielded.
    assert len(pulled) <= 5 + 10 + 2
    results.close()


def test_negative_workers_is_refused():
    with pytest.raises(ValueError, match="workers"):
        list(ordered_map(_square, [1], workers=-1))
