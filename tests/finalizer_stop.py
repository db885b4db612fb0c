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
    last_look = [0.0]

    def watching(frame, event, arg) -> None:
        if function and (event != "return" or frame.f_code.co_name != function):
            return
        now = time.monotonic()
        if not held or (not function and now - last_look[0] < 0.005):
            return
        last_look[0] = now
        if glob.glob(watch):
            sys.setprofile(None)
            held.pop()  # the finalizer runs here, on the main thread, between two calls of the command

    sys.setprofile(watching)
    cli.main(args)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
