"""The shard cache's locks: ``flock`` on files under ``locks/``, waited for in short slices that a stop ends, with a
bound, and removed by their holder when done. No TensorFlow here.

A lock file is removed only by a process that holds its lock (a download's, when the download is over; any free
one, by the next reservation). Whoever takes a lock then checks that the lock's name still names the file it
locked; when it does not (removed, or replaced, while it waited), it locks the file the name holds now. So two
processes never both hold a lock, and ``locks/`` holds a file only per download in flight, not one per shard ever
cached.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ...format.storage import file_kind

POLL_S = 0.05  # how often a wait tries the lock again and looks at its stop event
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class CacheFolderError(ValueError):
    """The cache folder cannot be used: a URL, a symlink, not a folder, or not writable."""


class CacheBusyError(TimeoutError):
    """Another process has held the cache's folder lock for longer than a fetch waits."""


class Stopped(Exception):
    """A wait or a download of the shard cache ended because its stop event was set (Ctrl-C, SIGTERM)."""


def check_stop(stop: threading.Event | None) -> None:
    """Raises ``Stopped`` once ``stop`` is set."""
    if stop is not None and stop.is_set():
        raise Stopped("the shard cache's work was stopped")


def pause(seconds: float, stop: threading.Event | None) -> None:
    """Sleeps ``seconds``, or less: raises ``Stopped`` as soon as ``stop`` is set."""
    if stop is None:
        time.sleep(seconds)
    elif stop.wait(seconds):
        raise Stopped("the shard cache's work was stopped")


@contextmanager
def flock(path: str, *, wait_s: float | None = None, stop: threading.Event | None = None,
          remove: bool = False) -> Iterator[bool]:
    """Holds an exclusive ``flock`` on ``path`` (created if missing, never through a symlink) while the block runs;
    yields False when another process held it for all of ``wait_s`` seconds (0: one try; None: no bound).

    The wait tries again every ``POLL_S`` and raises ``Stopped`` once ``stop`` is set. ``remove``: the file is
    removed before the lock is let go (a waiter on it then finds its name gone and locks a new file).

    Raises:
      CacheFolderError: a symlink, folder or other non-regular file under the lock's name.
      Stopped: ``stop`` was set while it waited.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    fd = _locked(path, deadline, stop)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        try:
            if remove:
                _unlink_held(path)
        finally:
            os.close(fd)  # drops the lock


def remove_if_free(path: str) -> None:
    """Removes the lock file ``path`` if no one holds it now (a waiter on it locks a new file instead)."""
    with flock(path, wait_s=0, remove=True):
        pass


def _locked(path: str, deadline: float | None, stop: threading.Event | None) -> int | None:
    """A descriptor of the file ``path`` names, locked; None when the deadline passed first."""
    while True:
        fd = _open(path)
        try:
            if not _acquire(fd, deadline, stop):
                os.close(fd)
                return None
            if _names(path, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it while this waited: lock the file the name holds now


def _open(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW, 0o644)
    except OSError as e:  # a symlink (ELOOP) or a folder planted under the lock's name
        if e.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        what = "a symlink" if e.errno == errno.ELOOP else "a folder"
        raise CacheFolderError(f"{path}: {what}, not a lock file; remove it") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CacheFolderError(f"{path}: {file_kind(mode)}, not a lock file; remove it")
    return fd


def _acquire(fd: int, deadline: float | None, stop: threading.Event | None) -> bool:
    while True:
        check_stop(stop)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
        pause(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic())), stop)


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    ours = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino)


def _unlink_held(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
