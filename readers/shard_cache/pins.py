"""Pins: a live reader's hold on a shard copy, which an evictor skips. No TensorFlow here.

``pins/<sha256>.<pid>.<start>.<host>`` is written (and its mtime set to now) on every pin, and removed when this
process holds no more pins of the copy. Whether the process a pin names still holds it:

* a pin of this host: while that process runs (pid and start time, ``format/owners.py``, as the reader cache's
  owner records);
* a pin of another host (a cache folder on a disk that hosts share), which this host cannot look up: while its
  file's mtime is less than ``PIN_LEASE_S`` old, and not more than that ahead. A process renews its pins' mtimes
  from a thread of its own, every quarter lease while it holds any, so a live reader's pin never expires; one of a
  host that died expires within a lease and is then removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import time

from ...format.owners import process_start
from .folder import unlink

PIN_LEASE_S = 3600.0  # a pin of another host not renewed for this long is a dead process's
_PIN_NAME = re.compile(r"^([0-9a-f]{64})\.([0-9]+)\.([0-9]+)\.([0-9a-f]{8})\Z")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_folders: dict[str, FolderPins] = {}  # folder -> this process's pins in it
_folders_lock = threading.Lock()


def host_tag(host: str | None = None) -> str:
    return hashlib.sha256((host or socket.gethostname()).encode()).hexdigest()[:8]


def folder_pins(directory: str, lease_s: float = PIN_LEASE_S) -> FolderPins:
    """This process's pins in the cache folder ``directory`` (every store of the folder here shares them: a pin file
    names the process, not the store). The shortest ``lease_s`` asked for sets how often they are renewed."""
    with _folders_lock:
        pins = _folders.setdefault(directory, FolderPins(directory))
        pins.renew_s = min(pins.renew_s, lease_s / 4)
        return pins


class FolderPins:
    """The copies this process pins in ``directory/pins``, counted, and the thread that renews their files."""

    def __init__(self, directory: str):
        self.folder = os.path.join(directory, "pins")
        # Reentrant: a dropped pipeline's finalizer unpins, and the GC may run it inside this lock (on an allocation
        # made holding it).
        self.lock = threading.RLock()
        self.counts: dict[str, int] = {}
        self.renew_s = PIN_LEASE_S / 4
        self._me = (os.getpid(), process_start(os.getpid()) or "0", host_tag())
        self._renewer: threading.Thread | None = None

    def path(self, sha256: str) -> str:
        pid, start, host = self._me
        return os.path.join(self.folder, f"{sha256}.{pid}.{start}.{host}")

    def add(self, sha256: str) -> None:
        """Counts one more pin of ``sha256`` and writes its file now (the caller holds the folder lock)."""
        with self.lock:
            self.counts[sha256] = self.counts.get(sha256, 0) + 1
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(target=self._renew, name="tfshard-pin-renewer", daemon=True)
                self._renewer.start()
        try:
            _write(self.path(sha256))
        except BaseException:
            self.remove(sha256)
            raise

    def remove(self, sha256: str) -> None:
        """Counts one pin of ``sha256`` less; removes its file at the last one."""
        with self.lock:
            count = self.counts.get(sha256, 0) - 1
            if count > 0:
                self.counts[sha256] = count
                return
            self.counts.pop(sha256, None)
            if count < 0:
                return
        try:
            os.unlink(self.path(sha256))
        except FileNotFoundError:
            pass

    def _renew(self) -> None:
        """Sets the mtime of each pin file this process holds to now, every ``renew_s``; ends when it holds none."""
        while True:
            time.sleep(self.renew_s)
            with self.lock:
                held = list(self.counts)
                if not held:
                    self._renewer = None
                    return
            for sha in held:
                try:
                    os.utime(self.path(sha), follow_symlinks=False)
                except OSError:  # unpinned meanwhile, or the folder emptied: the next pin writes it again
                    pass


def live_pins(directory: str, lease_s: float = PIN_LEASE_S) -> set[str]:
    """The sha256s some live process pins in ``directory``; pins of processes that are gone are removed. The caller
    holds the folder lock."""
    pinned = set()
    folder = os.path.join(directory, "pins")
    now = time.time()
    for entry in os.scandir(folder):
        match = _PIN_NAME.match(entry.name)
        if match is None:
            continue
        sha, pid, start, host = match.groups()
        if host == host_tag():
            alive = process_start(int(pid)) == start
        else:
            try:
                # more than a lease ahead: no renewal set that (hosts' clocks are within minutes), it was planted
                alive = abs(now - entry.stat(follow_symlinks=False).st_mtime) < lease_s
            except FileNotFoundError:
                continue
        if alive:
            pinned.add(sha)
        else:
            unlink(entry.path)  # a folder planted under a dead pin's name too (an unlink alone would fail on it)
    return pinned


def _write(path: str) -> None:
    """Creates the pin file ``path`` (never through a symlink), or sets its mtime to now."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o644)
    try:
        os.utime(fd)
    finally:
        os.close(fd)
