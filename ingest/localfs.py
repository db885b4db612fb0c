"""Opening local input files safely, without TensorFlow (this runs in the conversion's worker processes).

Only regular files are read: a FIFO named ``x.jpg`` would block a reader forever
and a link to ``/dev/zero`` would read until memory runs out. The check is made on
the open descriptor, so a file swapped for a FIFO after the scan is refused too.
"""

from __future__ import annotations

import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(ValueError):
    """A path that must be a regular file is a folder, FIFO, device or socket (reading it could hang or never end)."""


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str):
    """Opens a local regular file for binary reading without ever blocking (a FIFO swapped in is refused).

    Raises:
      NotRegularFileError: not a regular file at the moment it is opened.
      OSError: cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(f"{path}: {file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


