"""The ``tfshard`` command, stopped by a signal that arrives while its main thread runs a finalizer.

    python finalizer_stop.py WATCH[@FUNCTION] SIGNAL [tfshard arguments...]

Once a file matching the glob WATCH exists (and, with @FUNCTION, as a function of that name returns: a point
the test chooses, where nothing holds a stop back on purpose), the main thread drops the last reference to an
object whose ``__del__`` raises SIGNAL (``SIGINT`` or ``SIGTERM``) in this process. Python runs the signal handler right
there, inside the finalizer, where an exception can only be printed ("Exception ignored in ...") and the
program goes on: what happens when a Ctrl-C lands in one of TensorFlow's many ``__del__`` methods, or in a
weakref callback, on a busy machine (tests/test_resume.py and tests/test_cli.py run this).
"""

from __future__ import annotations

import glob
import signal
import sys
import threading
import time


class RaisesWhenCollected:
    def __init__(self, signum: int):
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


def main(watch: str, signal_name: str, args: list[str]) -> None:
    from tfshard import cli

    watch, _, function = watch.partition("@")
    held = [RaisesWhenCollected(getattr(signal, signal_name))]

    def drop(frame, event, arg) -> None:
        if not held or frame.f_code is arm.__code__:
            return
        if function and (event != "return" or frame.f_code.co_name != function or not glob.glob(watch)):
            return
        sys.setprofile(None)
        held.pop()  # the finalizer runs here, on the main thread, between two calls of the command

    def arm(signum, frame) -> None:
        sys.setprofile(drop)  # the main thread's next call or return (after this handler's own) drops it

    if function:  # the file and the return must meet: look at every return of the function
        sys.setprofile(drop)
    else:  # a profile function on every call from the start would slow the command (TensorFlow's import) manyfold
        signal.signal(signal.SIGUSR1, arm)
        threading.Thread(target=_when_found, args=(watch,), daemon=True).start()
    cli.main(args)


def _when_found(watch: str) -> None:
    """Sends the main thread SIGUSR1 once a file matching ``watch`` exists (looked for every 5 ms)."""
    while not glob.glob(watch):
        time.sleep(0.005)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
