"""The upload of an ``--append`` into a store: the new files of a local dataset that extends the store's, then its
``dataset.json`` in one PUT over the old one (``ingest/to_store.py`` stages the append, ``ingest/push.py`` sends).

The store's dataset is the base: the local manifest must extend it (each split's shards first, as the store lists
them, and its appends record). The files the store's manifest lists are never sent: each must already be in the
store (its size, as the manifest says, for a shard), checked before anything is sent. The new shards and index
files go first, then ``inputs.json`` and TFDS metadata (rewritten by the append), then ``dataset.json`` replaces the
old manifest: a reader sees the old dataset or the new one, both complete. Nothing is removed. What landed is
journaled as a push journals it (``OUT/.tfshard-state/push.json``), so a rerun after a kill sends only the rest.

Example:
  push_append("/cache/staging/0123abcd", "s3://bucket/photos-tfr").lines()
  # ["s3://bucket/photos-tfr: uploaded 3 files (0.4 MB), kept 0 already there; dataset.json last"]
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
from collections.abc import Callable

from ..format import objects, untrusted
from ..format.dataset import load_manifest, read_small_file
from ..format.errors import InputError
from ..format.manifest import MANIFEST_NAME, Manifest
from .push import IN_FLIGHT_BYTES, UPLOADS, PushReport, _Budget, _Journal, _put, _send, _there, dataset_files

log = logging.getLogger(__name__)


def store_manifest(url: str) -> tuple[bytes, Manifest] | None:
    """The text and validated manifest of the dataset at ``url`` (read through the store, bounded), or None when no
    ``dataset.json`` is there."""
    path = f"{url.rstrip('/')}/{MANIFEST_NAME}"
    try:
        text = read_small_file(path, "manifest")
    except FileNotFoundError:
        return None
    return text, untrusted.from_json(text, objects.redact(path), True)


def extends(local: Manifest, base: Manifest) -> bool:
    """Whether ``local`` is ``base`` plus appends: the same kind, each split of ``base`` with its shards first and
    unchanged, and ``base``'s appends first in its own."""
    if local.kind != base.kind or list(local.appends[:len(base.appends)]) != list(base.appends):
        return False
    return all(split in local.splits and list(local.splits[split].shards[:len(info.shards)]) == list(info.shards)
               for split, info in base.splits.items())


def push_append(out: str, url: str, uploads: int = UPLOADS, on_file: Callable[[str], None] | None = None
                ) -> PushReport:
    """Uploads what the local dataset ``out`` (an append on top of the dataset at ``url``) adds, ``dataset.json``
    last in one PUT over the old one; a rerun after a kill sends only what had not landed.

    Args:
      out: the local dataset folder an append wrote (its manifest extends the store's).
      url: the store folder holding the dataset it was appended to.
      uploads: objects sent at once.
      on_file: called with each file's name once it landed (a progress hook).

    Returns:
      A PushReport (``uploaded`` 0 when the store already holds this manifest).

    Raises:
      InputError: no dataset at ``url``, or one ``out``'s does not extend (another append landed there since).
      ValueError: a file the store's manifest lists that is missing there or not its size; an object at a name
        the append writes that no manifest lists; a local file that does not match the manifest. Nothing is sent.
      OSError: the store still failed after its retries, or an object that did not land whole.
    """
    url = url.rstrip("/")
    manifest = load_manifest(out)
    text = read_small_file(os.path.join(out, MANIFEST_NAME), "manifest")
    journal = _Journal(out, url, hashlib.sha256(text).hexdigest())
    found = store_manifest(url)
    if found is None:
        raise InputError(f"{url}: --append: no dataset to append to (got no {MANIFEST_NAME} there); convert SRC into "
                         "it first (drop --append), or pass the dataset's URL")
    remote, base = found
    new = dataset_files(out, manifest, "run the same command again to convert it", _names(base))
    if remote == text:  # landed before (a kill after it at most left the journal)
        journal.finish()
        return PushReport(url, 0, len(new) + 1, 0, 0)
    if not extends(manifest, base):
        raise InputError(f"{url}: --append: its dataset changed since this append started from it (got a "
                         f"{MANIFEST_NAME} that {out}'s does not extend: another append landed there); run the same "
                         "command again: it starts from the dataset in the store")
    _check_old(url, base, uploads)
    shards = [f for f in new if f.sha256 is not None]
    taken = [f.name for f in shards if not journal.landed(f, out) and _there(f"{url}/{f.name}")]
    if taken:
        raise ValueError(f"{url}: holds {len(taken)} objects no manifest there lists under names this append writes "
                         f"(got {taken[:3]!r}): another append running, or one killed before its {MANIFEST_NAME} "
                         "landed; nothing was sent: finish that append (rerun it where it started), or remove them")
    journal.start([])
    budget = _Budget(IN_FLIGHT_BYTES)
    sent = 0
    todo = []
    for group in (shards, [f for f in new if f.sha256 is None]):  # shards before the metadata describing them
        group = [f for f in group if not journal.landed(f, out)]
        todo += group
        with concurrent.futures.ThreadPoolExecutor(max(1, min(uploads, len(group)))) as pool:
            for name, size in pool.map(lambda f: _send(out, url, f, journal, budget), group):
                sent += size
                if on_file is not None:
                    on_file(name)
    now = store_manifest(url)  # another append or push may have landed while this one sent: never replaced unseen
    if now is None or now[0] != remote:
        raise InputError(f"{url}: --append: its dataset changed while this append was uploading (got "
                         f"{'no' if now is None else 'another'} {MANIFEST_NAME} there: another append or push landed); "
                         "it was not replaced: run the same command again: it starts from the dataset in the store")
    _put(f"{url}/{MANIFEST_NAME}", text)  # over the old one: one PUT, never a moment without a manifest
    journal.finish()
    log.info("%s: appended: %d files uploaded, %d kept", url, len(todo), len(new) - len(todo))
    return PushReport(url, len(todo) + 1, len(new) - len(todo), 0, sent + len(text))


def _names(manifest: Manifest) -> set[str]:
    return {n for s in manifest.splits.values() for sh in s.shards for n in (sh.file, sh.index_file) if n}


def _check_old(url: str, base: Manifest, uploads: int) -> None:
    """Every shard (and index file) the store's manifest lists is there, each shard of the manifest's size.

    Raises:
      ValueError: the first that is not, naming its URL and the fix; nothing was sent.
    """
    wanted = [(sh.file, sh.bytes) for s in base.splits.values() for sh in s.shards]
    wanted += [(sh.index_file, None) for s in base.splits.values() for sh in s.shards if sh.index_file]

    def problem(item: tuple[str, int | None]) -> str | None:
        name, size = item
        try:
            found = objects.stat(f"{url}/{name}")
        except FileNotFoundError:
            found = None
        if found is None:
            return f"{url}/{name}: listed in the store's {MANIFEST_NAME} but not there (got no object"
        if size is not None and found[0] != size:
            return (f"{url}/{name}: listed in the store's {MANIFEST_NAME} with {size} bytes but not that size there "
                    f"(got {found[0]} bytes")
        return None

    with concurrent.futures.ThreadPoolExecutor(max(1, min(uploads, len(wanted)))) as pool:
        for found in pool.map(problem, wanted):
            if found is not None:
                raise ValueError(f"{objects.redact(found)}); the dataset there is damaged and nothing was appended: "
                                 "restore the object (push the full dataset again with --overwrite), or convert "
                                 "SRC in full into another URL")
