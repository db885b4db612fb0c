"""Paths and reads of a dataset folder, local or ``gs://``: regular files only, sizes checked before reading.

Everything goes through ``tf.io.gfile`` for URLs, so ``gs://`` works like a local
folder; local files are opened so that a FIFO or a device is refused rather than
read (a FIFO named like a shard would block, ``/dev/zero`` would never end).
TensorFlow is imported only by the functions that need it, so the converter's
worker processes use ``open_regular`` without loading it.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat

_CHUNK = 4 * 2**20
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFileError(ValueError):
    """A path that must be a regular file is a folder, FIFO, device or socket (reading it could hang or never end)."""


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words: "a FIFO", "a character device", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def join(folder: str, name: str) -> str:
    """Joins a folder (local path or URL such as ``gs://b/x``) and a file name."""
    return posixpath.join(folder, name) if "://" in folder else os.path.join(folder, name)


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


def open_for_reading(path: str):
    """A binary file object for a regular file, local (``open_regular``) or a URL (``tf.io.gfile``)."""
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb")
    return open_regular(path)


def stat_regular(path: str) -> tuple[int, int]:
    """Size in bytes and mtime (ns) of a regular file, following symlinks.

    Raises:
      FileNotFoundError: nothing is there.
      NotRegularFileError: a folder, FIFO, device or socket.
    """
    if "://" in path:
        import tensorflow as tf

        try:
            st = tf.io.gfile.stat(path)
        except tf.errors.NotFoundError as e:
            raise FileNotFoundError(f"{path}: no such file") from e
        if st.is_directory:
            raise NotRegularFileError(f"{path}: a folder, not a file")
        return int(st.length), int(st.mtime_nsec)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: {file_kind(st.st_mode)}, not a regular file")
    return st.st_size, st.st_mtime_ns


def file_identity(path: str) -> tuple:
    """What tells this file apart from one put in its place: size and mtime, and locally the inode and ctime
    (a rename or rewrite changes them; gs:// gives size and mtime only). Follows symlinks.

    Raises:
      FileNotFoundError: nothing is there.
      NotRegularFileError: a folder, FIFO, device or socket.
    """
    if "://" in path:
        return stat_regular(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: {file_kind(st.st_mode)}, not a regular file")
    return st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, st.st_ctime_ns


def file_sha256(path: str, max_bytes: int | None = None) -> tuple[str, int]:
    """Returns the sha256 hex digest and the size in bytes of a regular file.

    ``max_bytes``: stop after this many bytes plus one, so a file longer than expected costs
    no more than the expected read (the size returned is then ``max_bytes + 1``).

    Raises:
      NotRegularFileError: not a regular file.
    """
    stat_regular(path)
    digest = hashlib.sha256()
    size = 0
    limit = None if max_bytes is None else max_bytes + 1
    with open_for_reading(path) as f:
        while chunk := f.read(_CHUNK if limit is None else min(_CHUNK, limit - size)):
            digest.update(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
    return digest.hexdigest(), size


def check_bucket(path: str) -> None:
    """For an object-store URL, fails fast when its bucket is missing or invisible.

    TensorFlow's recursive ``makedirs`` on a missing gs:// bucket retries forever
    (hundreds of requests a second, no error), so check the bucket root first.
    """
    if "://" not in path:
        return
    import tensorflow as tf

    scheme, rest = path.split("://", 1)
    root = f"{scheme}://{rest.split('/', 1)[0]}"
    if scheme in ("gs", "s3") and not tf.io.gfile.exists(root):
        raise FileNotFoundError(
            f"{path}: bucket {root} does not exist or is not visible with these credentials; create it or fix the name"
        )
