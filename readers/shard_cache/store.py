"""A folder of verified shard copies on local disk, bounded, shared by the processes of one host. No TensorFlow here.

The folder's layout is in ``folder.py``: complete copies keyed by sha256, downloads reserved at their full size
before the first byte (so the folder never holds more than the limit), ``flock`` locks (``locks.py``) and the
pins of live readers (``pins.py``). What fits and what is evicted is ``budget.py``'s arithmetic; what is
wrong with a copy, ``verified.py``'s. This module carries them out: reserve, evict, download, check, rename.

Nothing is trusted: a symlink, FIFO, folder or a file of the wrong size or content under a shard's name is never
read; it is logged and replaced. A copy whose bytes do hash to its name is never removed because a manifest gives
its sha256 another size: that manifest is wrong, and its shard is read remotely. A copy is hashed once per process
(or again when its identity changes), and read only through a name that held a verified regular file when it was
checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...format.objects import redact
from ...format.storage import open_for_reading
from . import budget
from .folder import (
    CHUNK,
    LOCK_NAME,
    LOCKS,
    NOFOLLOW,
    PART_NAME,
    PARTS,
    SHA,
    SHARD_NAME,
    SHARDS,
    checked_directory,
    entries,
    held_bytes,
    touch,
    unlink,
)
from .locks import CacheBusyError, CacheFolderError, Stopped, check_stop, flock, pause, remove_if_free
from .pins import PIN_LEASE_S, folder_pins, live_pins
from .pins import host_tag as _host_tag  # noqa: F401 (the tests name a pin of this host with it)
from .verified import VerifiedCopies

__all__ = ["CacheBusyError", "CacheFolderError", "Shard", "ShardStore", "Stopped"]

log = logging.getLogger(__name__)

DEFAULT_ATTEMPTS = 3
DEFAULT_WAIT_S = 600.0  # for another process's download of the same shard, or its hold of the folder lock


@dataclasses.dataclass(frozen=True)
class Shard:
    """A shard to cache: its sha256 and size from the manifest, and where it lives (``gs://...`` or a local path)."""

    sha256: str
    size: int
    remote: str


class ShardStore:
    """The cache folder ``directory``, holding at most ``limit`` bytes of shard copies and downloads.

    ``fetch(shard)`` returns the path of a verified local copy (downloading it first if need be), or None when the
    shard is to be read remotely (no room: every copy is pinned by a live reader; or the download failed or did not
    match, ``attempts`` times). ``pin``/``unpin`` keep a copy from eviction while a reader uses it. ``wait_s``
    bounds each wait for another process (its download of the same shard; its hold of the folder lock);
    ``pin_lease_s``: how long a pin of another host counts unless renewed (``pins.py``).

    Example:
      store = ShardStore("/mnt/ssd/tfshard-cache", 200 * 10**9)
      local = store.fetch(Shard(sha256, size, "gs://bucket/ds/train-00000-of-00064.tfrecord"))
    """

    def __init__(self, directory: str, limit: int, *, attempts: int = DEFAULT_ATTEMPTS,
                 wait_s: float = DEFAULT_WAIT_S, pin_lease_s: float = PIN_LEASE_S,
                 open_remote: Callable = open_for_reading):
        self.directory = checked_directory(directory)
        self.limit, self.attempts, self.wait_s, self._open_remote = limit, attempts, wait_s, open_remote
        self.pin_lease_s = pin_lease_s
        self._verified = VerifiedCopies()  # the copies this process hashed
        # A pin file names the process, not the store, so every store of the folder in this process shares the
        # count (readers of other limits have other stores).
        self._pins = folder_pins(self.directory, pin_lease_s)
        self._lock = self._pins.lock
        self._mismatched: set[str] = set()  # remote bytes that did not match the manifest: not downloaded again
        self.downloaded_bytes = 0  # by this process, for benchmarks and logs

    # --- names ---------------------------------------------------------------------------------------------------

    def path(self, sha256: str) -> str:
        return os.path.join(self.directory, SHARDS, f"{sha256}.tfrecord")

    def _part(self, sha256: str) -> str:
        return os.path.join(self.directory, PARTS, f"{sha256}.part")

    def _shard_lock(self, sha256: str) -> str:
        return os.path.join(self.directory, LOCKS, f"{sha256}.lock")

    @contextmanager
    def _folder_lock(self, stop: threading.Event | None = None) -> Iterator[None]:
        """Holds ``locks/folder.lock``, waiting at most ``wait_s`` for another process (it holds it for moments).

        Raises:
          CacheBusyError: another process held it all that time.
        """
        path = os.path.join(self.directory, LOCKS, "folder.lock")
        with flock(path, wait_s=self.wait_s, stop=stop) as locked:
            if not locked:
                raise CacheBusyError(
                    f"{path}: another process has held the shard cache's folder lock for over {self.wait_s:.0f} s "
                    "(it is held for moments only: that process is stopped, stuck or on a hung disk); find it with "
                    f"`fuser {path}` and end it, or pass another shard_cache folder")
            yield

    # --- pins ----------------------------------------------------------------------------------------------------

    def pin(self, sha256: str, stop: threading.Event | None = None) -> None:
        """Keeps the copy of ``sha256`` from eviction until ``unpin`` (or this process ends; ``pins.py``).

        The pin file is written on every pin, not only the first: one removed meanwhile (the folder emptied while a
        pipeline holds its copies) is back once the copy is fetched again."""
        with self._folder_lock(stop):  # an evictor holds it while it reads the pins and removes copies
            self._pins.add(sha256)

    def unpin(self, sha256: str) -> None:
        self._pins.remove(sha256)

    def _pinned(self) -> set[str]:
        """The sha256s some live process pins; pins of processes that are gone are removed. Folder lock held."""
        return live_pins(self.directory, self.pin_lease_s)

    # --- what is on disk -----------------------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes the cache holds now: copies and downloads (reserved at their full size)."""
        return held_bytes(self.directory)

    def _clear_stale_parts(self) -> None:
        """Removes downloads whose downloader is gone (its shard lock is free), and lock files no one holds (one
        left by an older version, say). Folder lock held."""
        for sha, path, _ in entries(self.directory, PARTS, PART_NAME):
            with flock(self._shard_lock(sha), wait_s=0, remove=True) as free:
                if free:
                    log.info("%s: removing a partial download left by a process that is gone", path)
                    unlink(path)
        for _, path, st in entries(self.directory, LOCKS, LOCK_NAME):
            if stat.S_ISREG(st.st_mode):  # anything else under a lock's name is named by the fetch that meets it
                remove_if_free(path)

    def _reserve(self, shard: Shard, stop: threading.Event | None) -> int | None:
        """Creates the shard's part file at its full size if that fits under the limit, evicting the least recently
        used copies no live reader pins, and returns it open for writing; None when it cannot fit. The caller holds
        the shard's lock."""
        part = self._part(shard.sha256)
        with self._folder_lock(stop):
            self._clear_stale_parts()
            if unlink(part):  # the caller holds the shard's lock: a part of it is a dead download's, not counted
                log.info("%s: removing a partial download left by a process that is gone", part)
            usage = self.usage()
            if not budget.room(usage, shard.size, self.limit):
                copies = [budget.Copy(sha, path, st.st_size, st.st_atime_ns)
                          for sha, path, st in entries(self.directory, SHARDS, SHARD_NAME)]
                victims = budget.eviction_order(copies, self._pinned() | {shard.sha256})
                while not budget.room(usage, shard.size, self.limit) and victims:
                    victim = victims.pop(0)
                    log.info("%s: evicting the least recently used shard copy to make room", victim.path)
                    if unlink(victim.path):
                        usage -= victim.size
                    self._verified.forget(victim.sha256)
                if not budget.room(usage, shard.size, self.limit):
                    return None
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
            try:
                os.ftruncate(fd, shard.size)
            except BaseException:
                os.close(fd)
                raise
            return fd

    # --- copies --------------------------------------------------------------------------------------------------

    def problem(self, shard: Shard) -> str | None:
        """None when the copy of ``shard`` is a verified regular file; "missing" when there is none; else what is
        wrong with it (``verified.py``)."""
        return self._verified.problem(self.path(shard.sha256), shard.sha256, shard.size)

    def fetch(self, shard: Shard, stop: threading.Event | None = None) -> str | None:
        """The path of a verified local copy of ``shard``, pinned (``unpin`` when done); None: read it remotely.

        Every wait (for a lock, between retries) and every download looks at ``stop`` in short slices: once it is
        set, the fetch raises ``Stopped``, leaving no pin, download or lock behind.
        """
        if not SHA.match(shard.sha256):
            raise ValueError(f"{shard.remote}: not a sha256 (got {shard.sha256!r}); the manifest is damaged")
        check_stop(stop)
        checked_directory(self.directory)  # made again if it was removed while a job runs (a few lstats a shard)
        self.pin(shard.sha256, stop)  # before the check: an evictor cannot take a copy once it is pinned
        try:
            found = self._fetch_pinned(shard, stop)
        except BaseException:
            self.unpin(shard.sha256)
            raise
        if found is None:
            self.unpin(shard.sha256)
        return found

    def _fetch_pinned(self, shard: Shard, stop: threading.Event | None) -> str | None:
        path = self.path(shard.sha256)
        problem = self.problem(shard)
        if problem is None:
            touch(path)
            return path
        with flock(self._shard_lock(shard.sha256), wait_s=self.wait_s, stop=stop, remove=True) as locked:
            if not locked:
                log.warning("%s: another process has been downloading it for over %.0f s; reading it remotely",
                            shard.remote, self.wait_s)
                return None
            problem = self.problem(shard)  # another process may have fetched it while we waited
            if problem is None:
                touch(path)
                return path
            if shard.sha256 in self._mismatched:  # warned once: the remote file is not the manifest's
                return None
            if problem != "missing":
                # a lying manifest never removes a good copy (others may read it)
                if self._verified.genuine(path, shard.sha256):
                    log.warning("%s: the manifest gives sha256 %s... %d bytes, but the cached copy %s of that sha256 "
                                "is verified at %d bytes; the manifest is wrong (the copy is kept, and this shard "
                                "read remotely); check the dataset with `tfshard verify`", shard.remote,
                                shard.sha256[:12], shard.size, path, os.lstat(path).st_size)
                    return None
                log.warning("%s: the cached copy %s; replacing it", path, problem)
                unlink(path)
                self._verified.forget(shard.sha256)
            part = self._reserve(shard, stop)
            if part is None:
                log.info("%s: the shard cache is full of shards live readers use (limit %d bytes); reading it "
                         "remotely", shard.remote, self.limit)
                return None
            return self._download(shard, part, stop)

    def _download(self, shard: Shard, fd: int, stop: threading.Event | None) -> str | None:
        """Copies the shard into its reserved part file (open as ``fd``, which it closes), checks sha256 and size,
        renames it into place. Shard lock held. Retries ``attempts`` times (not a failed write into the part: a full
        disk fails every retry alike, each after downloading as much again); None (part removed) when no attempt
        gave the manifest's bytes. Stopped (``stop``) or failed otherwise, it removes the part and raises.

        Every attempt writes through ``fd``, never through the part's name: a file put in its place meanwhile (a
        hard link to one outside the folder, say) is never written, and is not renamed in as the copy."""
        part = self._part(shard.sha256)
        try:
            found, error, tried, mismatches = self._attempts(shard, fd, stop)
        except BaseException:
            unlink(part)
            raise
        finally:
            os.close(fd)
        if found is not None:
            return found
        unlink(part)
        if mismatches == self.attempts:  # the same wrong bytes every time: a changed file, not a bad connection
            self._mismatched.add(shard.sha256)
        log.warning("%s: could not cache it after %d attempt%s (%s); reading it remotely", shard.remote,
                    tried, "" if tried == 1 else "s", error)
        return None

    def _attempts(self, shard: Shard, fd: int, stop: threading.Event | None) -> tuple[str | None, str, int, int]:
        """``_download``'s attempts: the copy's path (or None), the last error, attempts made, and mismatches."""
        part, path = self._part(shard.sha256), self.path(shard.sha256)
        error, mismatches, tried = "", 0, 0
        for attempt in range(self.attempts):
            if attempt:
                pause(min(2.0, 0.1 * 2**attempt), stop)
            tried += 1
            try:
                digest, size = self._copy(shard, fd, stop)
            except Stopped:
                raise
            except _LocalWriteError as e:  # the cache's disk (full, say), not the connection: a retry fails alike
                return None, f"writing {part}: {type(e.__cause__).__name__}: {e.__cause__}", tried, mismatches
            except Exception as e:  # noqa: BLE001 (any failure of the remote read is retried, then read remotely)
                error = redact(f"{type(e).__name__}: {e}")  # a library's error may quote what it was given
                continue
            if (digest, size) == (shard.sha256, shard.size):
                with self._folder_lock(stop):  # no usage() count sees the copy both as a part and as a copy
                    os.replace(part, path)
                st, ours = os.lstat(path), os.fstat(fd)
                if (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino):
                    self._verified.remember(shard.sha256, st)
                    return path, "", tried, mismatches
                unlink(path)
                return None, f"{part} was replaced by another file while it downloaded", tried, mismatches
            error = (f"got {size} bytes with sha256 {digest[:12]}..., the manifest says {shard.size} bytes with "
                     f"{shard.sha256[:12]}...")
            mismatches += 1
        return None, error, tried, mismatches

    def _copy(self, shard: Shard, fd: int, stop: threading.Event | None) -> tuple[str, int]:
        """Reads the remote shard into the part file ``fd`` from its start (at most its size + 1 bytes); returns the
        sha256 and bytes read. Raises ``Stopped`` between two chunks once ``stop`` is set."""
        digest, size = hashlib.sha256(), 0
        os.lseek(fd, 0, os.SEEK_SET)
        with self._open_remote(shard.remote) as source:
            while size <= shard.size:
                check_stop(stop)
                chunk = source.read(min(CHUNK, shard.size + 1 - size))
                if not chunk:
                    break
                with self._lock:  # fetches run in threads; a bare += could lose one's count
                    self.downloaded_bytes += len(chunk)  # downloaded, whether or not its write below succeeds
                digest.update(chunk)
                if size + len(chunk) <= shard.size:  # a longer remote file is a mismatch: its tail is not kept
                    try:
                        _write_all(fd, chunk)
                    except OSError as e:
                        raise _LocalWriteError from e
                size += len(chunk)
        return digest.hexdigest(), size


class _LocalWriteError(Exception):
    """A download's write into its part file failed (its cause says why): not retried, unlike a remote read."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
