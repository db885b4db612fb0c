"""The shard cache folder on disk: its names, its own folders checked, what it holds, and files handled without
following a link. No TensorFlow here.

Layout of the cache folder ``DIR`` (every name is ours; anything else in it is left alone):

* ``shards/<sha256>.tfrecord``: a complete copy whose bytes had the manifest's sha256 and size when it was
  renamed here. A copy is keyed by its content, so a re-converted dataset never gets an old shard and two
  datasets that share a shard share its copy.
* ``parts/<sha256>.part``: a download in progress. It is created at the shard's full size before the first byte
  arrives (the *reservation*), so the folder never holds more than the limit, temporary files included.
* ``locks/<sha256>.lock``: one process downloads a shard at a time; ``locks/folder.lock`` guards reservations,
  evictions and pins. Both are ``flock`` locks (``locks.py``), which the kernel drops when their process dies, so
  a killed downloader never blocks anyone: the next one finds its part file stale and starts over. A shard's lock
  file is removed when its download is over. Every wait is bounded (``wait_s``) and ends at once on a stop.
* ``pins/<sha256>.<pid>.<start>.<host>``: a live reader uses the copy; an evictor skips it (``pins.py``: a pin of
  a process that is gone, or of another host not renewed within its lease, is removed).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time

from ...format.storage import file_kind
from .locks import CacheFolderError

SHARDS, PARTS, LOCKS, PINS = "shards", "parts", "locks", "pins"
SHA = re.compile(r"^[0-9a-f]{64}\Z")
SHARD_NAME = re.compile(r"^([0-9a-f]{64})\.tfrecord\Z")
PART_NAME = re.compile(r"^([0-9a-f]{64})\.part\Z")
LOCK_NAME = re.compile(r"^([0-9a-f]{64})\.lock\Z")
CHUNK = 2**20  # per read of a download or a hash: each in flight holds ~2 chunks (TF's string, Python's bytes)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def checked_directory(directory: str) -> str:
    """The absolute path of the cache folder ``directory`` with its own folders, made if missing.

    Raises:
      CacheFolderError: a URL, or a symlink or other file where a folder should be.
    """
    if "://" in directory:
        raise CacheFolderError(f"{directory}: the shard cache is a local folder (got a URL); pass a path on "
                               "this host's disk, such as /mnt/ssd/tfshard-cache")
    directory = os.path.abspath(directory)
    for folder in (directory, *(os.path.join(directory, f) for f in (SHARDS, PARTS, LOCKS, PINS))):
        _check_folder(folder)
    return directory


def _check_folder(path: str) -> None:
    """``path`` must be a real folder (not a symlink to one: the cache's contents are untrusted) that this process
    may write: every fetch writes a pin and a lock there (on a read-only disk each read failed mid-epoch with a
    traceback)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise CacheFolderError(f"{path}: cannot be made ({e.strerror}); {_WRITABLE}") from e
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a regular file" if stat.S_ISREG(st.st_mode)
                else file_kind(st.st_mode))
        raise CacheFolderError(f"{path}: {what}, not a folder; the shard cache keeps only its own folders here. "
                               "Remove it, or pass another shard_cache folder")
    if not os.access(path, os.W_OK | os.X_OK):  # EROFS on a read-only mount, even for root
        raise CacheFolderError(f"{path}: not writable (a read-only disk, or its permissions); {_WRITABLE}")


_WRITABLE = ("the shard cache writes its copies, locks and pins there: pass a shard_cache folder on a writable "
             "local disk")


def entries(directory: str, folder: str, pattern: re.Pattern) -> list[tuple[str, str, os.stat_result]]:
    """``(sha256, path, lstat)`` of our names in ``directory/folder`` (planted names that are not ours are
    ignored)."""
    found = []
    for entry in os.scandir(os.path.join(directory, folder)):
        match = pattern.match(entry.name)
        if match is None:
            continue
        try:
            found.append((match.group(1), entry.path, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return found


def held_bytes(directory: str) -> int:
    """Bytes the cache folder holds: copies and downloads (reserved at their full size)."""
    # Downloads first: one renamed into shards/ between the two listings is then counted twice, never missed.
    parts = entries(directory, PARTS, PART_NAME)
    return sum(st.st_size for _, _, st in parts + entries(directory, SHARDS, SHARD_NAME))


def copy_identity(st: os.stat_result) -> tuple:
    """What tells a copy apart from one put in its place (not ctime: touching the access time changes it)."""
    return st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino


def hash_local(path: str, size: int) -> tuple[str, int, tuple]:
    """sha256, bytes read (at most ``size`` + 1) and identity of a local regular file, opened without following a
    symlink or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{file_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        digest, read = hashlib.sha256(), 0
        while read <= size and (chunk := f.read(min(CHUNK, size + 1 - read))):
            digest.update(chunk)
            read += len(chunk)
    return digest.hexdigest(), read, copy_identity(st)


def touch(path: str) -> None:
    """Marks a copy used now (its access time orders eviction; its mtime, part of its identity, stays)."""
    try:
        st = os.lstat(path)
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
    except OSError:
        pass


def unlink(path: str) -> bool:
    """Removes a file (a symlink itself, never its target), or a folder planted under one of our names (which would
    block the rename of a copy into place); False if nothing was there."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.EPERM) or not stat.S_ISDIR(os.lstat(path).st_mode):
            raise
    shutil.rmtree(path)  # never follows a symlink, at the top or inside
    return True
