"""Paths, reads and atomic writes of a dataset folder, local or a URL: regular files only, sizes checked first.

``gs://`` goes through ``tf.io.gfile``, so it works like a local folder; the schemes TensorFlow does not know
(``s3://``, ``az://``, ``abfs://``, ``https://``) are read, not written, through fsspec (``objects.py``), imported
only when such a URL comes. Local files are opened so that a FIFO or a device is refused rather than read (a FIFO
named like a shard would block, ``/dev/zero`` would never end). TensorFlow is imported only by the functions that
need it, so the converter's worker processes use ``open_regular`` without loading it.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import tempfile

from . import objects
from .errors import NotRegularFileError

_CHUNK = 4 * 2**20
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words: "a FIFO", "a character device", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def gfile():
    """``tf.io.gfile``, TensorFlow's file API (local paths and ``gs://`` alike), imported on first use: the
    converter's worker processes read through this module and never load TensorFlow (~500 MB, seconds)."""
    import tensorflow as tf

    return tf.io.gfile


def default_cache_folder() -> str:
    """tfshard's own folder for local copies: ``$TFSHARD_CACHE``, else ``$XDG_CACHE_HOME/tfshard``, else
    ``~/.cache/tfshard`` (the shard cache's default folder, and the staging of conversions into a store)."""
    if os.environ.get("TFSHARD_CACHE"):
        return os.path.abspath(os.path.expanduser(os.environ["TFSHARD_CACHE"]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "tfshard"))


def is_url(path: str) -> bool:
    """A URL (``gs://bucket/x``, ``s3://...``), not a local path."""
    return "://" in path


def _fsspec(path: str) -> bool:
    """Whether ``path`` goes through fsspec (``objects.py``) rather than ``tf.io.gfile``; a URL of a scheme neither
    reads is refused here, in one line listing the ones that work.

    Raises:
      objects.UnsupportedSchemeError: ``ftp://``, say, or ``s3://`` without the ``cloud`` extra.
    """
    if not is_url(path):
        return False
    objects.check_scheme(path)
    return objects.uses_fsspec(path)


def exists(path: str) -> bool:
    """Whether a file or folder is at ``path`` (local, or any URL; over HTTP only a file is seen)."""
    if not is_url(path):  # as tf.io.gfile answers it, without loading TensorFlow (`tfshard info` needs none)
        return os.path.exists(path)
    return objects.exists(path) if _fsspec(path) else gfile().exists(path)


def isdir(path: str) -> bool:
    """Whether ``path`` is a folder (on an object store: a prefix holding objects; never over HTTP)."""
    if not is_url(path):
        return os.path.isdir(path)
    return objects.isdir(path) if _fsspec(path) else gfile().isdir(path)


def can_list(path: str) -> bool:
    """Whether the folder ``path`` can be listed (all but an HTTP server's)."""
    return not objects.uses_fsspec(path) or objects.lists(path)


def listdir(path: str) -> list[str]:
    """The names in the folder ``path``, without a trailing slash (``tf.io.gfile.listdir``'s, or the store's).

    Raises:
      ValueError: an HTTP URL (``can_list`` says so first).
    """
    if not is_url(path):
        return os.listdir(path)
    if _fsspec(path):
        return objects.listdir(path)
    return [name.rstrip("/") for name in gfile().listdir(path)]


def join(folder: str, name: str) -> str:
    """Joins a folder (local path or URL such as ``gs://b/x``) and a file name."""
    return posixpath.join(folder, name) if is_url(folder) else os.path.join(folder, name)


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
    """A binary file object for a regular file, local (``open_regular``) or a URL (``tf.io.gfile``, or fsspec for
    the schemes of ``objects.py``)."""
    if _fsspec(path):
        return objects.open_for_reading(path)
    if is_url(path):
        return gfile().GFile(path, "rb")
    return open_regular(path)


def stat_regular(path: str) -> tuple[int, int]:
    """Size in bytes and mtime (ns) of a regular file, following symlinks.

    Raises:
      FileNotFoundError: nothing is there.
      NotRegularFileError: a folder, FIFO, device or socket.
    """
    if _fsspec(path):
        found = objects.stat(path)
        if found is None:
            raise NotRegularFileError(f"{path}: a folder, not a file")
        return found[0], found[1]
    if is_url(path):
        import tensorflow as tf  # for its error type; gfile() has imported it

        try:
            st = gfile().stat(path)
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
    (a rename or rewrite changes them; gs:// gives size and mtime only, the fsspec stores size, mtime and ETag).
    Follows symlinks.

    Raises:
      FileNotFoundError: nothing is there.
      NotRegularFileError: a folder, FIFO, device or socket.
    """
    if _fsspec(path):
        found = objects.stat(path)
        if found is None:
            raise NotRegularFileError(f"{path}: a folder, not a file")
        return found
    if is_url(path):
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


def create_new(path: str, mode: int = 0o666) -> int:
    """A new local file at ``path``, open for writing (a file descriptor): whatever was there goes first.

    What a killed run left under a temporary name is unlinked, never written through: opened in place, a hard link
    planted there would have its other name (a file outside OUT) truncated and overwritten, and a symlink followed.
    ``O_EXCL`` then refuses anything put there in between.
    """
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):  # a folder: O_EXCL refuses it
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, mode)


def write_atomic(path: str, data: bytes, temp_name: str | None = None) -> None:
    """Writes ``data`` to ``path`` under a temporary name, then renames it: no partial file under the final name.

    ``temp_name``: the temporary file's name beside ``path`` (a converter uses a fixed one, so a rerun finds and
    removes what a killed run left); None: a fresh name (``mkstemp``), for folders that are not ours. Locally the
    temporary file is created new, never opened through a symlink planted under its name.
    """
    folder, name = (posixpath.split(path) if is_url(path) else os.path.split(path))
    if is_url(path):
        temp = join(folder, temp_name or f".tmp-{os.urandom(8).hex()}-{name}")
        with gfile().GFile(temp, "wb") as f:
            f.write(data)
        gfile().rename(temp, path, overwrite=True)
        return
    folder = folder or "."
    if temp_name is None:
        handle, temp = tempfile.mkstemp(prefix=".tmp-", suffix=f"-{name}", dir=folder)
    else:
        temp = os.path.join(folder, temp_name)
        handle = create_new(temp, 0o644)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        if os.path.lexists(temp):
            os.remove(temp)


GCS_BLOCK_MB = "8"


def prefer_small_gcs_blocks() -> None:
    """Sets ``GCS_READ_CACHE_BLOCK_SIZE_MB=8`` unless the environment has a value: TensorFlow's GCS client gives
    every open gs:// file a 64 MiB read-ahead, and 8 MiB blocks read 16 shards at once 2.6x faster
    (``benchmarks/network.py``). TensorFlow reads it when its GCS file system starts, so only before that helps."""
    os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", GCS_BLOCK_MB)


def check_bucket(path: str) -> None:
    """For an object-store URL, fails fast when its bucket is missing or invisible.

    TensorFlow's recursive ``makedirs`` on a missing gs:// bucket retries forever
    (hundreds of requests a second, no error), so check the bucket root first.
    """
    if not is_url(path):
        return
    if _fsspec(path):
        raise ValueError(f"{objects.redact(path)}: the converter writes local and gs:// folders (got a "
                         f"{objects.scheme_of(path)}:// folder to write); convert into a local folder, then "
                         "upload it with tfshard.tools.push.push (`tfshard images|episodes SRC URL` does both)")
    scheme, rest = path.split("://", 1)
    root = f"{scheme}://{rest.split('/', 1)[0]}"
    if scheme in ("gs", "s3") and not gfile().exists(root):
        raise FileNotFoundError(
            f"{path}: bucket {root} does not exist or is not visible with these credentials; create it or fix the name"
        )
