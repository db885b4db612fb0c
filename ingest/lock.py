"""One conversion at a time per output folder: ``OUT/.tfshard-lock``.

Two conversions writing one OUT at once would interleave shards and commit
records and could leave a manifest whose sizes and hashes describe the other
run's bytes. On local disks the lock is a kernel ``flock`` on the lock file: it
is released when the process dies, however it dies, so a ``kill -9`` never
leaves a lock behind. On object stores (``gs://``), which have no locks through
``tf.io.gfile``, the lock is an owner record (host, pid, process start time)
created if absent and read back; a record whose process is gone from this host
is taken over, and one from another host is reported with the command to clear it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Iterator

import tensorflow as tf

from ..format.errors import OutputExistsError, OutputLockedError
from ..format.names import LOCK_NAME
from ..format.owners import is_alive, this_process
from ..format.storage import is_url, join

log = logging.getLogger(__name__)

_OWNER_LIMIT = 4096


def _describe(owner: dict | None) -> str:
    if not owner:
        return "another process"
    return f"pid {owner.get('pid')!r} on {owner.get('host')!r}"


def _parse_owner(text: bytes) -> dict | None:
    try:
        owner = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return owner if isinstance(owner, dict) else None


def _locked_error(out: str, path: str, owner: dict | None) -> OutputLockedError:
    return OutputLockedError(
        f"{out}: locked by {_describe(owner)}, a conversion writing into it ({path}); wait for it to finish, or "
        f"choose another folder (if no conversion is running, remove {path})"
    )


def _read_holder(fd: int) -> dict | None:
    """The holder's owner record; it writes it just after taking the lock, so wait a moment for it."""
    deadline = time.monotonic() + 1.0
    while True:
        owner = _parse_owner(os.pread(fd, _OWNER_LIMIT, 0))
        if owner is not None or time.monotonic() > deadline:
            return owner
        time.sleep(0.01)


@contextlib.contextmanager
def _local_lock(out: str, path: str) -> Iterator[None]:
    while True:
        try:  # O_NONBLOCK: a FIFO planted under the lock's name must not block the open
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                         0o644)
        except OSError as e:
            if not os.path.lexists(path):  # nothing planted: the folder itself refuses a new file
                raise OutputExistsError(
                    f"{out}: cannot write into the output folder ({e.strerror}); a conversion writes its shards and "
                    "its lock there: make the folder writable, or choose another folder") from None
            raise OutputExistsError(
                f"{path}: cannot be the lock file ({e.strerror}: a symlink, folder or FIFO is there); remove it and "
                "run again") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a hard link would have us write someone's file
                kind = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
                raise OutputExistsError(f"{path}: not a lock file of tfshard's ({kind}); remove it and run again")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _locked_error(out, path, _read_holder(fd)) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file between our open and our flock: lock the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(this_process()).encode(), 0)
            break
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # before the unlock, so a waiter that opened the old file sees it is gone
        os.close(fd)


@contextlib.contextmanager
def _object_store_lock(out: str, path: str) -> Iterator[None]:
    me = json.dumps({**this_process(), "token": os.urandom(8).hex()})
    for _ in range(3):
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path, "rb") as f:
                owner = _parse_owner(f.read(_OWNER_LIMIT))
            if owner is not None and is_alive(owner):
                raise _locked_error(out, path, owner)
            log.warning("%s: taking over the lock of %s, which is gone", out, _describe(owner))
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(me)
        time.sleep(0.2)  # a racing writer's record lands within this; read back who won
        with tf.io.gfile.GFile(path, "rb") as f:
            if f.read(_OWNER_LIMIT).decode("utf-8", "replace") == me:
                break
    else:
        raise _locked_error(out, path, None)
    try:
        yield
    finally:
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.remove(path)


def output_lock(out: str):
    """Holds ``OUT/.tfshard-lock`` for the ``with`` block; ``out`` must exist.

    Raises:
      OutputLockedError: another live conversion holds it; the message names its pid and host.
    """
    path = join(out, LOCK_NAME)
    return _object_store_lock(out, path) if is_url(out) else _local_lock(out, path)
