"""The ordered, memory-bounded process map the converter runs its workers through."""

import functools
import gc
import itertools
import multiprocessing.queues
import os
import signal
import struct
import threading
import time

import pytest
from tfshard.format import stops
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


@pytest.mark.slow
def test_workers_never_run_a_calling_script_that_imports_tensorflow(tmp_path):
    """multiprocessing imports the caller's script in every worker; one that imports TensorFlow at its top (and has
    no ``if __name__ == "__main__"`` guard) would load it in each worker and convert again from each. The workers
    start with the script hidden: they hold no TensorFlow, and the conversion runs once."""
    import os
    import subprocess
    import sys

    (tmp_path / "probe.py").write_text("import sys\n\ndef has_tensorflow(_):\n    return 'tensorflow' in sys.modules\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "import tensorflow as tf\n"
        "import numpy as np\n"
        "from PIL import Image\n"
        "from probe import has_tensorflow\n"
        "from tfshard.ingest import convert_images\n"
        "from tfshard.ingest.parallel import ordered_map\n"
        f"src, out = {str(tmp_path / 'src')!r}, {str(tmp_path / 'out')!r}\n"
        "for i in range(4):\n"
        "    os.makedirs(os.path.join(src, f'c{i % 2}'), exist_ok=True)\n"
        "    Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(os.path.join(src, f'c{i % 2}', f'{i}.jpg'))\n"
        "print('workers with TensorFlow:', sum(ordered_map(has_tensorflow, range(8), workers=2, chunk_items=1)))\n"
        "print('records:', convert_images(src, out, workers=2, progress=False).total_records)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["workers with TensorFlow: 0", "records: 4"], done.stdout


def test_a_callers_own_handlers_get_the_stops_that_arrive_while_workers_start():
    """Embedded in a program with handlers of its own (no ``stops.install()``), a Ctrl-C and a SIGTERM that arrive
    while a worker starts are held back, then reach those handlers, which are all back in place."""
    got = []

    def handler(signum, frame):
        got.append(signum)

    previous = {signum: signal.signal(signum, handler) for signum in stops.STOP_SIGNALS}
    try:
        with stops.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            assert got == []
        assert sorted(got) == [signal.SIGINT, signal.SIGTERM]
        assert all(signal.getsignal(signum) is handler for signum in stops.STOP_SIGNALS)
        assert list(ordered_map(_square, range(3), workers=1)) == [0, 1, 4]
    finally:
        for signum, was in previous.items():
            signal.signal(signum, was)


def _held_until(release: str, x: int) -> int:
    """Item 0 at once; any other waits until the file ``release`` exists (a chunk still decoding)."""
    while x and not os.path.exists(release):
        time.sleep(0.01)
    return x


def test_a_consumer_that_stops_early_does_not_wait_for_the_chunks_in_flight(tmp_path):
    """The consumer takes one result and stops (Ctrl-C lands in the engine, or --on-error fail) while the other
    worker is still busy: the map ends without waiting for that chunk, whose result would be thrown away. It waited
    for every chunk in flight (a conversion of large JPEGs went on 6-13 s after Ctrl-C on a busy machine); here, where
    the chunk never finishes, it never ended. The release comes only after the close, or after a bound so a failing
    run ends. Nothing fails on the pool's thread either (Python 3.11's pool failed a cancelled chunk there with
    InvalidStateError and printed a traceback, as a stopped conversion did under load)."""
    release, raised = str(tmp_path / "release"), []
    results = ordered_map(functools.partial(_held_until, release), range(8), workers=2, chunk_items=1)
    assert next(results) == 0
    hook, threading.excepthook = threading.excepthook, raised.append  # the pool's own thread, failing queued chunks
    try:
        closing = threading.Thread(target=results.close)
        closing.start()
        closing.join(120)
        closed_first = not closing.is_alive()
        open(release, "w").close()
        closing.join()
    finally:
        threading.excepthook = hook
    assert closed_first, "closing the map waited for a chunk whose result nobody takes"
    assert [args.exc_type for args in raised] == []


def _half_a_result(release: str, x: int) -> int:
    """Item 0 at once; any other, once item 0 was taken (``release.took``), writes the start of a result message into
    the pool's result pipe, as a worker killed while it sends its result leaves it, says so (``release.sent``), then
    waits until ``release`` exists."""
    if x:
        while not os.path.exists(release + ".took"):  # else item 0's result would follow the half message
            time.sleep(0.01)
        (results,) = [o for o in gc.get_objects() if isinstance(o, multiprocessing.queues.SimpleQueue)]
        with results._wlock:  # a header that promises 1000 bytes, and 10 of them
            results._writer._send(struct.pack("!i", 1000) + b"0123456789")
        open(release + ".sent", "w").close()
        while not os.path.exists(release):
            time.sleep(0.01)
    return x


def test_a_worker_ended_halfway_through_sending_its_result_does_not_hang_the_stop(tmp_path):
    """What is left in the result pipe by a worker killed as it sent its result: the pool's thread waited for the rest
    of the message for ever (this process holds the pipe's other end), and the stop of an append hung there."""
    release = str(tmp_path / "release")
    results = ordered_map(functools.partial(_half_a_result, release), range(2), workers=2, chunk_items=1)
    assert next(results) == 0
    open(release + ".took", "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(release + ".sent") and time.monotonic() < deadline:
        time.sleep(0.01)
    closing = threading.Thread(target=results.close)
    closing.start()
    closing.join(120)
    closed_first = not closing.is_alive()
    open(release, "w").close()
    closing.join(120)
    assert os.path.exists(release + ".sent") and closed_first, "closing the map waited for the rest of a result"
