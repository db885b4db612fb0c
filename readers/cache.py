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

The folder is untrusted, as OUT is. TensorFlow trusts a complete cache's files
as it finds them: a FIFO hangs its read, a truncated one fails with an internal
error, and another pipeline's files renamed to this prefix are served as this
one's data. So the writer, once TensorFlow has completed the cache (at the end
of its first epoch), records beside it in ``{prefix}.complete`` what it was
written from (the identity's full hash) and its files as it left them (sizes,
and the index's sha256, which holds each tensor's CRC32C). A complete cache is
used only when its record says it is this pipeline's and its files are as
recorded (at build time with the index hashed, and by a stat at each epoch's
start); otherwise it is removed (logged) and written again, or, changed under
a running pipeline, the epoch fails naming it. Owner and record files are read
as small regular files only (a FIFO there would hang, ``/dev/zero`` never end).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import threading
import time
import weakref

import tensorflow as tf

from ..format.dataset import read_small_file
from ..format.json_checks import parse_json
from ..format.owners import is_alive, this_process
from ..format.storage import check_bucket, file_sha256, is_url, join, stat_regular, write_atomic
from .epoch_guard import python_step

log = logging.getLogger(__name__)

# prefix -> the cache dataset of the last pipeline of this process that claimed it to write. A dataset is alive
# while anything downstream of it is (each tf.data dataset holds its input, each iterator its dataset).
_writers: dict[str, weakref.ref] = {}
_writers_lock = threading.Lock()


def identity_digest(identity: dict) -> str:
    """The sha256 (hex) of everything in ``identity``: its first 20 digits name the cache, all 64 are recorded."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def cache_prefix(cache_dir: str, identity: dict) -> str:
    """``{cache_dir}/tfshard-{hash}``, where the hash covers everything in ``identity``."""
    return join(cache_dir, f"tfshard-{identity_digest(identity)[:20]}")


_UNREADABLE_OWNER_GRACE_S = 10.0  # a writer creates the owner file and fills it in one go
_OWNER_MAX_BYTES = 4096  # an owner record is ~80 bytes
_RECORD_MAX_BYTES = 2**20  # a complete cache's record names its index and data files: a few hundred bytes


class CacheFileError(ValueError):
    """A file under one of the cache's names that tfshard did not write: a FIFO, a folder, a file far too large."""


_UNREADABLE = object()  # what _read_json gives for a file that is not JSON


def _read_json(path: str, what: str, limit: int):
    """``path``'s JSON; None when nothing is there, ``_UNREADABLE`` when it is not JSON. Read only as a regular
    file of at most ``limit`` bytes.

    Raises:
      CacheFileError: not a regular file, or larger than ``limit`` (naming it and the fix).
    """
    try:
        raw = read_small_file(path, what, limit)
    except FileNotFoundError:
        return None
    except ValueError as e:  # a FIFO or folder under the name, or a file far larger than tfshard writes
        raise CacheFileError(f"{e}; remove it, or pass another cache folder") from e
    try:
        return parse_json(raw, path)
    except ValueError:  # not UTF-8 JSON, nested too deep (a RecursionError in ``json``), a key given twice
        return _UNREADABLE


def _read_owner(path: str) -> dict | None:
    """The owner record; an unreadable one older (or dated later) than a few seconds from now (its writer died
    mid-write) is removed.

    Raises:
      CacheFileError: a FIFO, folder or oversized file under the owner record's name.
    """
    owner = _read_json(path, "cache owner record", _OWNER_MAX_BYTES)
    if owner is None or isinstance(owner, dict):
        return owner
    try:  # not JSON, or JSON that is no record: its writer died mid-write
        age = time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
    except tf.errors.NotFoundError:
        return None
    if abs(age) < _UNREADABLE_OWNER_GRACE_S:  # dated further ahead, it was planted: never written "right now"
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


def claim(prefix: str, digest: str = "") -> bool:
    """Decides whether this process may use the cache at ``prefix`` (``digest``: its identity's full hash).

    Returns True to read a complete cache this pipeline's record vouches for, or to write a new one after removing
    a damaged or unvouched complete cache, or the lock and partial data of a writer that is gone; False when
    another live process owns it, in which case the caller reads without the cache.

    Raises:
      CacheFileError: a FIFO, folder or oversized file under the owner record's name, or a folder under one of a
        damaged cache's names.
    """
    folder = prefix.rsplit("/", 1)[0]
    check_bucket(folder)  # makedirs on a missing bucket would retry forever
    tf.io.gfile.makedirs(folder)
    owner_path = prefix + ".owner"
    me = this_process()
    if tf.io.gfile.exists(prefix + ".index"):
        problem = _complete_problem(prefix, digest, hash_index=True)
        if not problem:
            return True
        owner = _read_owner(owner_path)
        if problem is _UNRECORDED and owner is not None and (_writing_here(prefix) if owner == me else is_alive(owner)):
            log.warning("%s: cache is being completed by live pid %s on %s; this pipeline reads without the cache",
                        prefix, owner.get("pid"), owner.get("host"))
            return False
        log.warning("%s: %s; removing it and writing the cache again", prefix,
                    _UNRECORDED_SAID.format(record=prefix + RECORD) if problem is _UNRECORDED else problem)
        _remove_complete(prefix)
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


# --- a complete cache's record ------------------------------------------------------------------------------------

RECORD = ".complete"  # {prefix}.complete: what a complete cache was written from, and its files as its writer left them
_UNRECORDED = "unrecorded"  # _complete_problem: a complete cache without its record
_UNRECORDED_SAID = ("a complete cache without its record {record} (an older tfshard wrote it, or its writer died "
                    "completing it)")


def _complete_files(prefix: str) -> dict[str, str]:
    """The files of the complete cache at ``prefix`` as they are now: name -> path (the index and its data)."""
    paths = [prefix + ".index"] if tf.io.gfile.exists(prefix + ".index") else []
    return {posixpath.basename(p): p for p in [*paths, *tf.io.gfile.glob(prefix + ".data-*")]}


def _complete_problem(prefix: str, digest: str, hash_index: bool) -> str:
    """"" when the complete cache at ``prefix`` is the one its record describes, written from ``digest``'s data;
    ``_UNRECORDED`` when it has no record; else what is wrong. ``hash_index``: its index's sha256 too (else sizes
    only)."""
    path = prefix + RECORD
    try:
        record = _read_json(path, "cache record", _RECORD_MAX_BYTES)
    except CacheFileError as e:
        return str(e)
    if record is None:
        return _UNRECORDED
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not isinstance(record.get("index_sha256"), str):
        return f"{path}: not a cache record tfshard wrote"
    if record.get("identity") != digest:
        return f"{path}: the record of another pipeline's cache (other data, split or reader options)"
    found = _complete_files(prefix)
    if sorted(found) != sorted(files):
        return f"its files {sorted(found)} are not the ones {path} lists {sorted(files)}"
    for name, file in found.items():
        try:
            size, _ = stat_regular(file)
        except (OSError, ValueError) as e:  # a FIFO, folder or device under the name
            return str(e)
        if size != files[name]:
            return f"{file} has {size} bytes, not the {files[name]} its writer left"
    if hash_index and file_sha256(found[posixpath.basename(prefix) + ".index"])[0] != record["index_sha256"]:
        return f"its index {prefix}.index is not the one its writer left (sha256 {record['index_sha256'][:12]}...)"
    return ""


def _remove_complete(prefix: str) -> None:
    """Removes a complete cache's index, data and record (files under its names only, never through a link)."""
    for path in [*_complete_files(prefix).values(), *tf.io.gfile.glob(prefix + RECORD)]:
        try:
            tf.io.gfile.remove(path)
        except tf.errors.OpError as e:  # a folder planted under one of its names
            raise CacheFileError(f"{path}: cannot be removed ({e.message}); remove it, or pass another cache "
                                 "folder") from e


def _record_completed(prefix: str, digest: str) -> str:
    """Run after each pass over the cache: once TensorFlow has completed it (at the end of the first), its writer
    records it (the next pipeline finds it vouched for). Never fails the epoch: unrecorded, it is written again."""
    index = prefix + ".index"
    try:
        if not tf.io.gfile.exists(index) or tf.io.gfile.exists(prefix + RECORD):
            return ""
        if _read_owner(prefix + ".owner") != this_process():  # only its writer knows these are the files it left
            return ""
        files = _complete_files(prefix)
        record = {"v": 1, "identity": digest, "index_sha256": file_sha256(index)[0],
                  "files": {name: stat_regular(path)[0] for name, path in files.items()}}
        write_atomic(prefix + RECORD, json.dumps(record, sort_keys=True).encode())
    except (OSError, ValueError, tf.errors.OpError) as e:
        log.warning("%s: could not record the completed cache (%s); the next pipeline writes it again", prefix, e)
    return ""


def _unchanged_since_built(prefix: str, digest: str) -> str:
    """Run at each pass's start: "" unless the complete cache's files changed since its record (a FIFO put in their
    place would hang the read, a truncated file fail it with an internal error)."""
    if not tf.io.gfile.exists(prefix + ".index") or not tf.io.gfile.exists(prefix + RECORD):
        return ""  # being written by this pipeline, or not yet recorded
    problem = _complete_problem(prefix, digest, hash_index=False)
    if not problem:
        return ""
    return (f"{prefix}: the cache changed since this pipeline was built ({problem}); build the pipeline again: it "
            "removes the changed cache and writes it anew")


def _writing_here(prefix: str) -> bool:
    """Whether a pipeline of this process that claimed ``prefix`` to write it is still alive."""
    writer = _writers.get(prefix)
    return writer is not None and writer() is not None


def _claim_from_this_process(prefix: str) -> bool:
    """A cache this process claimed earlier and has not completed: usable only if its writer is gone."""
    if _writing_here(prefix) or tf.io.gfile.glob(prefix + "_*.lockfile"):
        log.warning(
            "%s: cache is being written by another pipeline of this process (pid %s); this pipeline reads "
            "without the cache", prefix, os.getpid(),
        )
        return False
    return True  # its pipeline is gone, and TensorFlow discarded the partial data it left


def cache_to_file(dataset: tf.data.Dataset, cache_dir: str, identity: dict) -> tf.data.Dataset:
    """``dataset.cache(cache_prefix(cache_dir, identity))`` when this pipeline may use the cache (see ``claim``),
    else ``dataset`` as it is. Each pass over the cache first checks its files are as recorded, and the pass that
    completes it records them (module docstring).

    Example:
      ds = cache_to_file(decoded, "/tmp/cache", {"data": "photos", "size": 224})
    """
    prefix, digest = cache_prefix(cache_dir, identity), identity_digest(identity)
    with _writers_lock:  # two threads building pipelines at once must not both claim one prefix
        if not claim(prefix, digest):
            return dataset
        cached = dataset.cache(prefix)
        if not tf.io.gfile.exists(prefix + ".index"):
            _writers[prefix] = weakref.ref(cached)
    recorded = python_step(cached, lambda: _record_completed(prefix, digest), after=True)
    return python_step(recorded, lambda: _unchanged_since_built(prefix, digest))
