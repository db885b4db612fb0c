"""``tfshard push OUT URL``: a finished local dataset uploaded to an object store (``s3://``, ``az://``, ``abfs://``),
so that a reader never sees a manifest whose files are missing.

Every file the dataset holds (its shards and index files, ``inputs.json``, TFDS metadata) is sent first, each checked
as it is sent (the sha256 of the bytes sent against the manifest's, for shards and index files) and once it landed
(the object's size, and on S3 its ETag: the MD5 of what was sent, or of its parts); ``dataset.json`` goes last. What
landed verified is journaled in ``OUT/.tfshard-state/push.json``, so a rerun after a kill uploads only the rest; the
journal goes once the manifest landed.

A destination holding another dataset or other objects is refused. ``--overwrite`` replaces a dataset there: its
``dataset.json`` is removed first (a reader then finds no dataset rather than one whose shards are being replaced),
then the new files go up, the new manifest, and last the objects the old manifest listed that the new one does not;
anything else there is refused, overwrite or not. No TensorFlow here.

Example:
  push("/data/photos-tfr", "s3://bucket/photos-tfr").lines()
  # ["s3://bucket/photos-tfr: uploaded 5 files (1.2 MB), kept 0 already there; dataset.json last"]
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable

from ..format import objects
from ..format.dataset import load_manifest, read_small_file
from ..format.manifest import MANIFEST_NAME, Manifest
from ..format.names import INPUTS_NAME, STATE_DIR, TFDS_FILES, index_file_name, is_output_name
from ..format.storage import write_atomic

log = logging.getLogger(__name__)

JOURNAL = "push.json"
UPLOADS = 64  # files sent at once (as many as the S3 client's connections), as long as their bytes fit IN_FLIGHT_BYTES
# the bytes of the files being sent (each is held whole while it goes): a folder of 128 MiB shards goes up 4 at a
# time, one of 2 MB shards 16 at a time; a file larger than this goes alone. With 4 files at once whatever their size,
# a dataset of 2 MB shards went up at 0.46x s3fs's own `put` (benchmarks/network.py --only s3)
IN_FLIGHT_BYTES = 512 * 2**20
_S3_ETAG = re.compile(r"^[0-9a-f]{32}(-\d+)?$")  # an MD5, or a multipart upload's (MD5 of the parts' MD5s)-N


@dataclasses.dataclass(frozen=True)
class _File:
    name: str
    sha256: str | None  # the manifest's, for shards and index files; None: hashed as sent, recorded
    size: int | None


@dataclasses.dataclass(frozen=True)
class PushReport:
    """What a push did: the files sent, those a killed run had already landed, the old objects removed."""

    url: str
    uploaded: int
    kept: int
    removed: int
    sent_bytes: int

    def lines(self) -> list[str]:
        """One line for the command to print."""
        removed = f", removed {self.removed} objects of the old dataset" if self.removed else ""
        if not self.uploaded:
            return [f"{self.url}: already holds this dataset ({self.kept} files); nothing to upload{removed}"]
        return [f"{self.url}: uploaded {self.uploaded} files ({self.sent_bytes / 1e6:.1f} MB), kept {self.kept} "
                f"already there{removed}; {MANIFEST_NAME} last"]


def push(out: str, url: str, overwrite: bool = False, uploads: int = UPLOADS,
         on_file: Callable[[str], None] | None = None) -> PushReport:
    """Uploads the finished dataset in the local folder ``out`` to ``url`` (``s3://``, ``az://``, ``abfs://``),
    ``dataset.json`` last; a rerun after a kill sends only what had not landed.

    Args:
      out: a local dataset folder (its manifest loads and validates).
      url: the store folder to write; empty, or holding this very dataset (a push that did not finish), or with
        ``overwrite`` a dataset tfshard wrote.
      overwrite: replace the dataset at ``url``, removing only the objects its manifest lists.
      uploads: objects sent at once (at most ``IN_FLIGHT_BYTES`` of them held in memory).
      on_file: called with each file's name once it landed (a progress hook).

    Returns:
      A PushReport.

    Raises:
      ValueError: ``out`` not local, ``url`` not a store tfshard writes, a file that does not match the manifest, a
        destination holding other objects or (without ``overwrite``) another dataset.
      OSError: the store still failed after its retries, or an object that did not land whole.
    """
    if "://" in out:
        raise ValueError(f"{out}: push uploads a local dataset folder (got a URL); pass the local OUT of a conversion")
    if not objects.writes(url):
        raise ValueError(f"{objects.redact(url)}: tfshard writes datasets to s3://, az:// and abfs:// (got "
                         f"{objects.scheme_of(url)!r}); pass one of those (gs://: convert into it directly)")
    if uploads < 1:
        raise ValueError(f"uploads: at least 1 object at a time (got {uploads!r}); pass 1 or more")
    check_folder_url(url)
    url = url.rstrip("/")
    manifest = load_manifest(out)
    text = read_small_file(os.path.join(out, MANIFEST_NAME), "manifest")
    files = dataset_files(out, manifest, "convert again (rerun the conversion) before pushing")
    ours = {f.name for f in files} | {MANIFEST_NAME}
    journal = _Journal(out, url, hashlib.sha256(text).hexdigest())

    present = objects.list_objects(url)
    old_names: set[str] = set(journal.old)
    if MANIFEST_NAME in present:
        remote = objects.read_bytes(f"{url}/{MANIFEST_NAME}", len(text) + 1)
        if remote == text:  # landed whole before: a kill after it left the journal, and old objects to remove
            removed = [n for n in journal.old if n not in ours and n in present]
            for name in removed:
                objects.delete(f"{url}/{name}")
            journal.finish()
            return PushReport(url, 0, len(files) + 1, len(removed), 0)
        if not overwrite:
            raise ValueError(f"{url}: holds another dataset (got a {MANIFEST_NAME} that differs from {out}'s); pass "
                             "--overwrite to replace it (only the objects its manifest lists are removed), or choose "
                             "another URL")
        old_names |= _listed(load_manifest(url))
    if overwrite:
        old_names |= journal.earlier  # objects a push of another dataset to this URL landed
    # Like a local OUT: without --overwrite only this very push's objects may be there; with it, others stay
    # beside the dataset untouched, unless the dataset would replace one of them.
    foreign = [n for n in present if n not in old_names and not (journal.mine and n in ours)
               and (not overwrite or n in ours)]
    if foreign:
        shown = foreign[:3] + ([f"... {len(foreign) - 3} more"] if len(foreign) > 3 else [])
        if overwrite:
            raise ValueError(f"{url}: holds {len(foreign)} objects no manifest there lists under names this dataset "
                             f"writes (got {shown!r}); nothing was replaced: remove them yourself, or choose another "
                             "URL")
        raise ValueError(f"{url}: not an empty folder (got {len(foreign)} objects: {shown!r}); pass --overwrite to "
                         "write the dataset beside them (no object of theirs is removed or replaced), or choose "
                         "another URL")

    journal.start(sorted((old_names & set(present)) - ours))
    if MANIFEST_NAME in present:  # first, so no reader meets the old manifest while its files are replaced
        objects.delete(f"{url}/{MANIFEST_NAME}")
    todo = [f for f in files if not journal.landed(f, out)]
    budget = _Budget(IN_FLIGHT_BYTES)
    sent = 0
    def landed(name_size: tuple[str, int]) -> None:
        nonlocal sent
        sent += name_size[1]
        if on_file is not None:
            on_file(name_size[0])

    if uploads == 1:  # one at a time, here: no thread
        for file in todo:
            landed(_send(out, url, file, journal, budget))
    else:
        with concurrent.futures.ThreadPoolExecutor(min(uploads, max(1, len(todo)))) as pool:
            for done in pool.map(lambda f: _send(out, url, f, journal, budget), todo):
                landed(done)
    if _there(f"{url}/{MANIFEST_NAME}"):  # another writer's landed while this push sent: never replaced unseen
        raise ValueError(f"{url}: another {MANIFEST_NAME} landed there while this push ran (got one it did not "
                         "write); it was not replaced: make sure no one else writes to this URL, then run the same "
                         "command again (with --overwrite to replace that dataset)")
    _put(f"{url}/{MANIFEST_NAME}", text)
    removed = [n for n in journal.old if n not in ours]
    for name in removed:
        objects.delete(f"{url}/{name}")
    journal.finish()
    log.info("%s: %d files uploaded, %d kept, %d old objects removed", url, len(todo), len(files) - len(todo),
             len(removed))
    return PushReport(url, len(todo) + 1, len(files) - len(todo), len(removed), sent + len(text))


def check_folder_url(url: str) -> None:
    """A store folder tfshard writes to: its scheme's library installed, no query (the store would take it as part
    of the objects' names, and a SAS token there would be shown), no empty, ``.`` or ``..`` part (kept literally in
    the objects' names by S3, where other tools read them as another folder).

    Raises:
      ValueError: the first problem, the URL shown without its query.
    """
    objects.check_scheme(url)
    parts = url.split("://", 1)[1].rstrip("/").split("/")
    odd = [p for p in parts[1:] if p in ("", ".", "..")]
    if "?" in url or odd:
        got = "a query: ?***" if "?" in url else f"a {odd[0]!r} part" if odd[0] else "an empty part: //"
        raise ValueError(f"{objects.redact(url.split('?', 1)[0])}: not a folder URL tfshard writes to (got {got}); "
                         "pass the folder's plain URL (s3://bucket/folder/name), credentials in --storage-option or "
                         "the environment")


def dataset_files(out: str, manifest: Manifest, fix: str, skip: frozenset[str] | set[str] = frozenset()
                  ) -> list[_File]:
    """What the dataset in ``out`` holds besides its manifest: every shard and index file it lists but those named in
    ``skip`` (each must be there; ``fix`` ends the error when one is not), then ``inputs.json`` and TFDS metadata when
    present, none of them a symlink (``_no_links``)."""
    found = []
    for split in manifest.splits.values():
        for shard in split.shards:
            if shard.file not in skip:
                found.append(_File(shard.file, shard.sha256, shard.bytes))
            if shard.index_file is not None and shard.index_file not in skip:
                found.append(_File(shard.index_file, shard.index_sha256, None))
    for file in found:
        if not os.path.isfile(os.path.join(out, file.name)):
            raise FileNotFoundError(f"{os.path.join(out, file.name)}: listed in {MANIFEST_NAME} but missing (got no "
                                    f"file); {fix}")
    found += [_File(n, None, None) for n in (INPUTS_NAME, *TFDS_FILES) if os.path.lexists(os.path.join(out, n))]
    _no_links(out, found)
    return found


def _no_links(out: str, files: list[_File]) -> None:
    """Every file to upload is a regular file in ``out``, not a symlink: ``inputs.json`` and TFDS metadata are sent
    unhashed, so a link planted under their name would upload whatever it points to (a credentials file).

    Raises:
      ValueError: the first that is a symlink or not a regular file; nothing was sent.
    """
    for file in files:
        path = os.path.join(out, file.name)
        if os.path.islink(path) or not os.path.isfile(path):
            got = "a symlink" if os.path.islink(path) else "not a regular file"
            raise ValueError(f"{path}: not a file tfshard wrote (got {got}); nothing was uploaded: remove it and "
                             "convert again (tfshard writes regular files)")


def _there(url: str) -> bool:
    try:
        return objects.stat(url) is not None
    except FileNotFoundError:
        return False


def _listed(manifest: Manifest) -> set[str]:
    """Every object name a dataset's manifest accounts for: its shards, their index files, the manifest, the inputs
    file and TFDS metadata (what --overwrite may remove)."""
    names = {MANIFEST_NAME, INPUTS_NAME, *TFDS_FILES}
    for split in manifest.splits.values():
        for shard in split.shards:
            names |= {shard.file, index_file_name(shard.file)}
    return names


def _send(out: str, url: str, file: _File, journal: _Journal, budget: _Budget) -> tuple[str, int]:
    """Reads the file once, checks it against the manifest, uploads those very bytes and journals them."""
    path = os.path.join(out, file.name)
    with budget.held(os.path.getsize(path)):
        with open(path, "rb") as f:
            data = f.read()
        sha256 = hashlib.sha256(data).hexdigest()
        if file.sha256 is not None and (sha256 != file.sha256 or (file.size is not None and len(data) != file.size)):
            raise ValueError(f"{path}: does not match {MANIFEST_NAME} (got sha256 {sha256[:12]}..., {len(data)} "
                             f"bytes; the manifest says {file.sha256[:12]}...); nothing of it was uploaded: convert "
                             "again")
        etag = _put(f"{url}/{file.name}", data)
    journal.add(file.name, len(data), sha256, etag)
    return file.name, len(data)


class _Budget:
    """Bytes the uploads may hold at once: ``held(n)`` waits until ``n`` more fit (or nothing else is held, for a
    file larger than the whole budget)."""

    def __init__(self, limit: int):
        self._limit, self._used = limit, 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, size: int):
        with self._changed:
            self._changed.wait_for(lambda: self._used == 0 or self._used + size <= self._limit)
            self._used += size
        try:
            yield
        finally:
            with self._changed:
                self._used -= size
                self._changed.notify_all()


def _put(target: str, data: bytes) -> str:
    """Uploads ``data`` and checks it landed whole: on S3 by the ETag the store computed (the MD5 of what it received,
    or of its parts: the one a one-request upload is answered with, else the object's), on Azure by the blob's
    Content-MD5, else by the object's size (``objects.landed_tag``). Returns the tag."""
    answered = objects.put_bytes(target, data)
    if answered is not None and objects.scheme_of(target) == "s3":  # a one-request upload: S3 answered its ETag
        etag = answered.strip('"').lower()
        if etag == objects.s3_etag(data):
            return etag
    found = objects.stat(target)
    etag = (found[2] if found else "").strip('"').lower()
    want = objects.landed_tag(target, data) if _S3_ETAG.match(etag) else etag
    if found is None or found[0] != len(data) or etag != want:
        got = "nothing" if found is None else f"{found[0]} bytes, ETag {etag!r}"
        raise OSError(f"{objects.redact(target)}: did not land whole (got {got}; sent {len(data)} bytes, ETag "
                      f"{want!r}); run the same command again")
    return etag


class _Journal:
    """``OUT/.tfshard-state/push.json``: the URL, the manifest's sha256, the objects an --overwrite removes last, and
    each file that landed verified (size, sha256, ETag). One for another URL or manifest is set aside."""

    def __init__(self, out: str, url: str, manifest_sha256: str):
        self._folder = os.path.join(out, STATE_DIR)
        self._path = os.path.join(self._folder, JOURNAL)
        self._url, self._sha256 = url, manifest_sha256
        self._lock = threading.Lock()
        raw = self._read()
        same_url = raw.get("url") == url
        self.mine = same_url and raw.get("manifest") == manifest_sha256
        landed = raw.get("landed") if isinstance(raw.get("landed"), dict) else {}
        old = raw.get("old") if isinstance(raw.get("old"), list) else []
        # a push of another dataset to this URL, not finished: the objects it landed may go with --overwrite
        # names only tfshard writes: a journal never makes push remove or keep anything else
        landed = {n: e for n, e in landed.items() if is_output_name(n)}
        old = [n for n in old if is_output_name(n)]
        self.earlier: set[str] = set(landed) | set(old) | {MANIFEST_NAME} if same_url and not self.mine else set()
        self.old: list[str] = old if self.mine else []
        self._landed: dict[str, dict] = landed if self.mine else {}

    def _read(self) -> dict:
        if os.path.islink(self._folder) or os.path.islink(self._path) or not os.path.isfile(self._path):
            return {}
        try:
            raw = json.loads(read_small_file(self._path, "push journal"))
        except ValueError as e:
            log.warning("%s: not a push journal tfshard wrote (%s); uploading every file", self._path, e)
            return {}
        return raw if isinstance(raw, dict) else {}

    def landed(self, file: _File, out: str) -> bool:
        """Whether ``file`` landed verified in an earlier run: journaled, unchanged here, and in the store as then."""
        entry = self._landed.get(file.name)
        if not isinstance(entry, dict) or os.path.getsize(os.path.join(out, file.name)) != entry.get("bytes"):
            return False
        if file.sha256 is not None and entry.get("sha256") != file.sha256:
            return False
        try:
            found = objects.stat(f"{self._url}/{file.name}")
        except FileNotFoundError:
            return False
        return found is not None and found[0] == entry["bytes"] and found[2].strip('"').lower() == entry.get("etag")

    def start(self, old: list[str]) -> None:
        if not self.mine:
            self.old = old
        self._write()

    def add(self, name: str, size: int, sha256: str, etag: str) -> None:
        with self._lock:
            self._landed[name] = {"bytes": size, "sha256": sha256, "etag": etag}
            self._write()

    def _write(self) -> None:
        if os.path.islink(self._folder):
            raise ValueError(f"{self._folder}: a symlink, not a folder tfshard made (got a link); remove it and run "
                             "again")
        os.makedirs(self._folder, exist_ok=True)
        write_atomic(self._path, json.dumps({"url": self._url, "manifest": self._sha256, "old": self.old,
                                             "landed": self._landed}).encode())

    def finish(self) -> None:
        """The manifest landed: the journal goes, and the state folder with it when nothing else is in it."""
        if os.path.isfile(self._path):
            os.remove(self._path)
        if os.path.isdir(self._folder) and not os.listdir(self._folder):
            os.rmdir(self._folder)
