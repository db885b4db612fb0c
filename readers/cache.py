"""Cache-to-file that is never stale, never partial, and never trips over a dead process's lock.

``tf.data.Dataset.cache(filename)`` writes ``{prefix}_{i}.data...`` and a
``{prefix}_{i}.lockfile`` while the first epoch runs, and ``{prefix}.index``
once it has run to the end; a partially written cache is discarded by
TensorFlow. Three things it leaves to the user (tensorflow/tensorflow#28798,
#60174) are handled here:

* the prefix is a hash of the dataset's fingerprint and every option that
  changes the cached bytes, so changed data or options never reuse an old cache;
* a lockfile left by a killed process blocks every later run: we record the
  writer's host, pid and process start time next to it, and clear the lock and
  its partial data when that process is gone;
* a second process pointed at a cache another live process is writing reads
  without the cache instead of crashing; so does a second pipeline of the same
  process built while the first may still be writing it (TensorFlow's lockfile
  refuses a second writer with ``AlreadyExistsError`` either way).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import weakref

import tensorflow as tf

from ..format.owners import is_alive, this_process
from ..format.storage import check_bucket, is_url, join

log = logging.getLogger(__name__)

# prefix -> the cache dataset of the last pipeline of this process that claimed it to write. A dataset is alive
# while anything downstream of it is (each tf.data dataset holds its input, each iterator its dataset).
_writers: dict[str, weakref.ref] = {}
_writers_lock = threading.Lock()


def cache_prefix(cache_dir: str, identity: dict) -> str:
    """``{cache_dir}/tfshard-{hash}``, where the hash covers everything in ``identity``."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return join(cache_dir, f"tfshard-{digest}")


_UNREADABLE_OWNER_GRACE_S = 10.0  # a writer creates the owner file and fills it in one go


def _read_owner(path: str) -> dict | None:
    """The owner record; an unreadable one older than a few seconds (its writer died mid-write) is removed."""
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.loads(f.read())
    except tf.errors.NotFoundError:
        return None
    except ValueError:
        age = time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
        if age < _UNREADABLE_OWNER_GRACE_S:
            return {"host": "?", "pid": -1, "unreadable": True}  # being written right now: treat as live
        log.warning("%s: unreadable cache owner record (its writer died mid-write); removing it", path)
        tf.io.gfile.remove(path)
        return None


def _create_exclusively(path: str, text: str) -> bool:
    """Creates ``path`` only if it does not exist (atomic on local disks; best effort on object stores)."""
    if is_url(path):
        if tf.io.gfile.exists(path):
            return False
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def claim(prefix: str) -> bool:
    """Decides whether this process may use the cache at ``prefix``.

    Returns True to read a complete cache, or to write a new one after removing
    the lock and partial data of a writer that is gone; False when another live
    process owns it, in which case the caller reads without the cache.
    """
    folder = prefix.rsplit("/", 1)[0]
    check_bucket(folder)  # makedirs on a missing bucket would retry forever
    tf.io.gfile.makedirs(folder)
    if tf.io.gfile.exists(prefix + ".index"):
        return True
    owner_path = prefix + ".owner"
    me = this_process()
    for _ in range(2):  # a second pass after clearing a dead owner
        owner = _read_owner(owner_path)
        if owner is None:
            if _create_exclusively(owner_path, json.dumps(me)):
                break
            continue  # another process created it between our read and our create
        if owner == me:
            return _claim_from_this_process(prefix)
        if is_alive(owner):
            log.warning(
                "%s: cache is owned by live pid %s on %s; this pipeline reads without the cache",
                prefix, owner.get("pid"), owner.get("host"),
            )
            return False
        tf.io.gfile.remove(owner_path)
    else:
        log.warning("%s: could not claim the cache owner record; this pipeline reads without the cache", prefix)
        return False
    for stale in tf.io.gfile.glob(prefix + "_*"):  # lock and partial data of a writer that is gone
        log.info("%s: removing a partial cache file left by a process that is gone", stale)
        tf.io.gfile.remove(stale)
    return True


def _claim_from_this_process(prefix: str) -> bool:
    """A cache this process claimed earlier and has not completed: usable only if its writer is gone."""
    writer = _writers.get(prefix)
    if (writer is not None and writer() is not None) or tf.io.gfile.glob(prefix + "_*.lockfile"):
        log.warning(
            "%s: cache is being written by another pipeline of this process (pid %s); this pipeline reads "
            "without the cache", prefix, os.getpid(),
        )
        return False
    return True  # its pipeline is gone, and TensorFlow discarded the partial data it left


def cache_to_file(dataset: tf.data.Dataset, prefix: str) -> tf.data.Dataset:
    """``dataset.cache(prefix)`` when this pipeline may use the cache (see ``claim``), else ``dataset`` as it is.

    Example:
      ds = cache_to_file(decoded, cache_prefix("/tmp/cache", {"data": "photos", "size": 224}))
    """
    with _writers_lock:  # two threads building pipelines at once must not both claim one prefix
        if not claim(prefix):
            return dataset
        cached = dataset.cache(prefix)
        if not tf.io.gfile.exists(prefix + ".index"):
            _writers[prefix] = weakref.ref(cached)
        return cached
