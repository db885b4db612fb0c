"""The shard cache's fetch threads (``readers/shard_cache/ahead.py``): first in, first out; each result taken once,
by its owner and name; errors handed to the waiter; threads started only when none is free, and ended by close."""

from __future__ import annotations

import threading

import pytest
from tfshard.readers.shard_cache.ahead import FetchPool, UnknownTicket


def test_fetches_run_in_the_order_they_were_started_and_give_their_own_results():
    pool = FetchPool(1)
    order, gate = [], threading.Event()
    first = pool.start("p", "a", lambda: gate.wait(10) and order.append("a") or "A")
    tickets = [pool.start("p", name, lambda name=name: order.append(name) or name.upper()) for name in "bcd"]
    gate.set()
    assert [pool.result(t, "p", n) for t, n in zip(tickets, "bcd")] == ["B", "C", "D"]
    assert pool.result(first, "p", "a") == "A"
    assert order == ["a", "b", "c", "d"]
    pool.close()


def test_a_result_is_taken_once_and_only_by_its_owner_and_name():
    pool = FetchPool(2)
    ticket = pool.start("pipeline-1", "sha-a", lambda: "/cache/a")
    with pytest.raises(UnknownTicket):
        pool.result(ticket, "pipeline-2", "sha-a")  # a ticket restored in another pipeline is not another's fetch
    with pytest.raises(UnknownTicket):
        pool.result(ticket, "pipeline-1", "sha-b")
    assert pool.result(ticket, "pipeline-1", "sha-a") == "/cache/a"
    with pytest.raises(UnknownTicket):
        pool.result(ticket, "pipeline-1", "sha-a")
    pool.close()


def test_an_error_reaches_the_waiter_and_the_thread_serves_on():
    pool = FetchPool(1)

    def fail():
        raise OSError("disk full")

    bad, good = pool.start("p", "a", fail), pool.start("p", "b", lambda: "ok")
    with pytest.raises(OSError, match="disk full"):
        pool.result(bad, "p", "a")
    assert pool.result(good, "p", "b") == "ok"
    pool.close()


def test_forget_drops_untaken_tickets_of_one_owner():
    pool = FetchPool(2)
    mine, theirs = pool.start("gone", "a", lambda: 1), pool.start("live", "a", lambda: 2)
    pool.forget("gone")
    with pytest.raises(UnknownTicket):
        pool.result(mine, "gone", "a")
    assert pool.result(theirs, "live", "a") == 2
    pool.close()


def test_threads_start_only_when_none_is_free_and_close_ends_them():
    before = set(threading.enumerate())
    pool = FetchPool(4)
    for i in range(20):  # one after another: the one thread is free each time
        assert pool.result(pool.start("p", str(i), lambda i=i: i), "p", str(i)) == i
    assert len(set(threading.enumerate()) - before) == 1
    gate = threading.Event()
    held = [pool.start("p", f"h{i}", lambda: gate.wait(10)) for i in range(6)]  # more than 4 at once: capped
    ours = set(threading.enumerate()) - before
    assert 1 < len(ours) <= 4
    gate.set()
    assert all(pool.result(t, "p", f"h{i}") for i, t in enumerate(held))
    pool.close()
    for thread in ours:
        thread.join(10)
        assert not thread.is_alive()
    with pytest.raises(ValueError, match="at least 1"):
        FetchPool(0)
