"""Another process using a shard cache folder (tests/test_shard_cache*.py run it).

    python shard_cache_child.py pin DIR LIMIT SHA...              pins the copies, prints "ready", then sleeps
    python shard_cache_child.py fetch DIR LIMIT SHA:SIZE:PATH...  fetches the shards from a remote that trickles
                                                                  their bytes; prints the bytes it downloaded and
                                                                  the copies it got
    python shard_cache_child.py slow DIR LIMIT SHA:SIZE:PATH      the same, slower, printing "ready" first (to be
                                                                  killed while it writes the part file)
    python shard_cache_child.py hold DIR LIMIT NAME...             holds the locks NAME (a sha256, or "folder") as a
                                                                  downloader does, prints "ready", then sleeps

The store is plain Python (``readers/shard_cache/store.py``), so this loads it without ``tfshard.readers``, whose
import loads TensorFlow (seconds per child on a small machine).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
import types

import tfshard

for _name in ("tfshard.readers", "tfshard.readers.shard_cache"):
    _package = types.ModuleType(_name)
    _package.__path__ = [os.path.join(os.path.dirname(tfshard.__file__), *_name.split(".")[1:])]
    sys.modules[_name] = _package

from tfshard.readers.shard_cache.store import Shard, ShardStore  # noqa: E402


class Trickle:
    """A remote file read 64 bytes at a time, ``delay_s`` apart: downloads of two processes overlap, and one is
    still writing its part file when it is killed."""

    def __init__(self, path: str, delay_s: float):
        self._file, self._delay_s = open(path, "rb"), delay_s

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        time.sleep(self._delay_s)
        return self._file.read(min(64, size))


def _shards(args) -> list[Shard]:
    return [Shard(sha, int(size), path) for sha, size, path in (arg.split(":", 2) for arg in args)]


def main(mode: str, directory: str, limit: str, *args: str) -> None:
    if mode == "pin":
        store = ShardStore(directory, int(limit))
        for sha in args:
            store.pin(sha)
        print("ready", flush=True)
        time.sleep(600)
    elif mode == "fetch":
        store = ShardStore(directory, int(limit), open_remote=lambda path: Trickle(path, 0.005))
        found = [store.fetch(shard) for shard in _shards(args)]
        print(store.downloaded_bytes, sum(path is not None for path in found), flush=True)
    elif mode == "slow":
        store = ShardStore(directory, int(limit), open_remote=lambda path: Trickle(path, 0.05))
        print("ready", flush=True)
        store.fetch(_shards(args)[0])
    elif mode == "hold":
        ShardStore(directory, int(limit))  # makes the folder's own folders
        held = [os.open(os.path.join(directory, "locks", f"{name}.lock"), os.O_RDWR | os.O_CREAT) for name in args]
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_EX)
        print("ready", flush=True)
        time.sleep(600)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
