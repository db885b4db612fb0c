"""Ctrl-C, SIGTERM and SIGHUP as a stop that is never lost: recorded when it arrives, raised where Python can.

A Python signal handler runs in the main thread, between two bytecodes, wherever that thread is. So the
``KeyboardInterrupt`` it raises can land in a ``__del__`` or a weakref callback (where Python prints "Exception
ignored" and goes on), in a broad ``except`` of a library, or nowhere for a while (the main thread waits in C
code, TensorFlow's or a lock's, while another thread took the signal). ``install()`` (the ``tfshard`` command
calls it first thing) puts handlers in that record the stop before they raise it, and the long-running loops
call ``check()`` at their commit points and between waits, so a stop that was swallowed is raised again there:
no shard is committed, no manifest written and no epoch timed after it. Embedded in another program (no
``install()``), ``check()`` does nothing and the caller's own handlers are left alone.

    stops.install()
    for shard in shards:
        stops.check()     # raises KeyboardInterrupt (Ctrl-C) or Terminated (SIGTERM) once either arrived
        commit(shard)

Pure Python: no TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_state = {"arrived": None, "deferring": 0}


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and ``kill`` send), raised in the main thread to stop like Ctrl-C."""


class HungUp(KeyboardInterrupt):
    """SIGHUP (the terminal was closed, an ssh session dropped), raised in the main thread to stop like Ctrl-C."""


def _exception(signum: int) -> KeyboardInterrupt:
    return {signal.SIGTERM: Terminated, signal.SIGHUP: HungUp}.get(signum, KeyboardInterrupt)()


def _on_stop(signum, frame) -> None:
    if _state["arrived"] is None:  # the first stop is the one reported (a second Ctrl-C still interrupts)
        _state["arrived"] = signum
    if not _state["deferring"]:
        raise _exception(signum)


def _quiet_when_recorded(previous):
    """A ``sys.unraisablehook`` that says nothing of a stop raised where Python could only print it (a
    ``__del__``): it is recorded, and ``check()`` raises it again where it can stop the command."""
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _state["arrived"] is not None:
            return
        previous(unraisable)

    hook.tfshard_stops = True
    return hook


def install() -> None:
    """Records and raises Ctrl-C (``KeyboardInterrupt``), SIGTERM (``Terminated``) and SIGHUP (``HungUp``) from now
    on, in this process; an ignored SIGHUP stays ignored (``nohup``). Call it from the main thread, before any work
    starts (a command-line entry point); elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _on_stop)
    if not getattr(sys.unraisablehook, "tfshard_stops", False):
        sys.unraisablehook = _quiet_when_recorded(sys.unraisablehook)


def installed() -> bool:
    """Whether ``install()``'s handlers (not a caller's own) handle Ctrl-C and SIGTERM right now."""
    return all(signal.getsignal(signum) is _on_stop for signum in (signal.SIGINT, signal.SIGTERM))


def requested() -> int | None:
    """The first stop signal that arrived since ``install()`` (``signal.SIGINT``, ``SIGTERM`` or ``SIGHUP``), or
    None."""
    return _state["arrived"]


def check() -> None:
    """Raises the stop that arrived (``KeyboardInterrupt`` for Ctrl-C, ``Terminated``, ``HungUp``), even when
    it was raised before and swallowed; does nothing when none did (or without ``install()``)."""
    if _state["arrived"] is not None:
        raise _exception(_state["arrived"])


def leaving(code: int) -> None:
    """The command is done, its last line printed: from now on a stop ends the process at once with ``code`` (stdout
    and stderr flushed first) instead of raising into the interpreter's shutdown, where it printed a traceback from
    whatever finalizer it landed in and exited 1 or by the signal (a second Ctrl-C after a stop's line, or one
    just after a summary). Only after ``install()``; a caller's own handlers are left alone."""
    def leave(signum, frame) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # closed, or a reader gone
                stream.flush()
        os._exit(code)

    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is _on_stop:
                signal.signal(signum, leave)


@contextlib.contextmanager
def deferred():
    """For the block, a stop is recorded but not raised; it is raised when the block ends (when the code inside
    must not be cut midway, such as starting a worker process). In the main thread only; a caller's own
    handlers (no ``install()``) are swapped out for the block and get the signal afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not installed():
        with _deferred_for_other_handlers():
            yield
        return
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        if not _state["deferring"]:
            check()


@contextlib.contextmanager
def _deferred_for_other_handlers():
    arrived = []

    def note(signum, frame) -> None:
        arrived.append(signum)

    handlers = {}
    try:
        for signum in STOP_SIGNALS:
            handlers[signum] = signal.signal(signum, note)
        yield
    finally:
        _restore(handlers)
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)  # to the handler it was meant for


def _restore(handlers: dict) -> None:
    """Puts every handler back, even when one of them raises midway (``signal.signal`` runs pending handlers
    before it installs, so a Ctrl-C restored first could leave SIGTERM's handler swapped out for good)."""
    stop = None
    while True:
        try:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            break
        except KeyboardInterrupt as e:
            stop = e
    if stop is not None:
        raise stop
