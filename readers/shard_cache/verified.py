"""What is wrong with a shard copy, hashed once per process (or again when its identity changes). No TensorFlow here.

A copy is read only through a name that held a verified regular file when it was checked: a symlink, FIFO, folder,
or a file of the wrong size or content under a shard's name is reported, never read.

    copies = VerifiedCopies()
    copies.problem("/cache/shards/<sha>.tfrecord", sha, 1234)  # None, "missing", or what is wrong with it
"""

from __future__ import annotations

import os
import stat

from ...format.storage import file_kind
from .folder import copy_identity, hash_local


class VerifiedCopies:
    """The copies this process has hashed, each with the identity (size, mtime, inode) it had then."""

    def __init__(self):
        self._identities: dict[str, tuple] = {}  # sha256 -> identity of the copy this process hashed

    def remember(self, sha256: str, st: os.stat_result) -> None:
        """The copy of ``sha256`` (``lstat`` ``st``) is verified: it was hashed, or downloaded and checked."""
        self._identities[sha256] = copy_identity(st)

    def forget(self, sha256: str) -> None:
        self._identities.pop(sha256, None)

    def problem(self, path: str, sha256: str, size: int) -> str | None:
        """None when the copy at ``path`` is a verified regular file of ``sha256`` and ``size``; "missing" when there
        is none; else what is wrong with it. Hashes a copy this process has not verified (or whose identity changed
        since)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return "missing"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            return f"is {'a symlink' if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)}, not a regular file"
        if st.st_size != size:
            return f"has {st.st_size} bytes, not the manifest's {size}"
        identity = copy_identity(st)
        if self._identities.get(sha256) == identity:
            return None
        try:
            digest, read, identity = hash_local(path, size)
        except (OSError, ValueError) as e:
            return f"cannot be read ({e})"
        if (digest, read) != (sha256, size):
            return "does not have the manifest's sha256 (corrupt or replaced)"
        self._identities[sha256] = identity
        return None

    def genuine(self, path: str, sha256: str) -> bool:
        """Whether the copy named ``sha256`` is a regular file whose bytes, all of them, hash to its name (whatever
        size a manifest gives it). Hashes it unless this process verified it as it is."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        if self._identities.get(sha256) == copy_identity(st):
            return True
        try:
            digest, size, identity = hash_local(path, st.st_size)
        except (OSError, ValueError):
            return False
        if (digest, size) != (sha256, st.st_size):
            return False
        self._identities[sha256] = identity
        return True
