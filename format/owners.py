"""Owner records: which process holds a lock or writes a cache, and whether it still runs.

A record is ``{"host", "pid", "start"}``; ``start`` (the process's start time in
clock ticks since boot) tells a reused pid apart from the process that wrote it.
"""

from __future__ import annotations

import os
import socket


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (tells a reused pid apart), or None if it is gone.

    A killed process its parent has not reaped yet (state Z) counts as gone.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    return None if not fields or fields[0] in ("Z", "X") else fields[19]


def this_process() -> dict:
    """The owner record of this process: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def is_alive(owner: dict) -> bool:
    """Whether the process an owner record names still runs; one on another host is assumed to."""
    if owner.get("host") != socket.gethostname():
        return True
    pid = owner.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    start = process_start(pid)
    return start is not None and start == owner.get("start")


