"""What tfshard may remove or replace in OUT: only a file it can prove it wrote.

A proof is a record tfshard made, naming a file and its bytes (size and sha256), that the file at that name still
matches: a regular file (never a symlink, FIFO or folder), of that size, whose bytes hash to that sha256. Records
are a shard's commit record in the state folder (written before the shard gets its final name, so every file a
killed run leaves has one), the renames of ``renumber.json`` (a renamed shard is proved by its commit record),
the removal record ``removing.json`` (an ``--overwrite`` in progress), and a finished dataset's ``dataset.json``,
whose shards and index files it lists with their sha256. Files that identify themselves are proved by their
content: ``dataset.json`` by loading as a tfshard manifest, ``inputs.json`` and TFDS metadata by naming its
fingerprint (and ``inputs.json`` in a run's state folder by its staged copy there).

A file at a name tfshard wants that no record proves (a user's ``train-00000-of-00001.tfrecord``, a shard damaged
since it was recorded, a record that lies) is refused, naming it, before anything is removed or replaced.

Why the bytes and not only the name: every state file and manifest is untrusted, and a name proves nothing (a
``plan.json`` copied or edited to list a user's file would otherwise have it removed). What a record cannot prove is
who wrote it: whoever can read a file and write OUT can record its real sha256. But they could remove it from OUT
themselves; what the proof stops is tfshard being the one to do it on a stale, copied or mistaken record.
Removing a file only ever unlinks its name in OUT: a hard link elsewhere keeps its bytes, a symlink's target is
never touched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
from collections.abc import Iterable

import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format import untrusted
from ..format.dataset import read_small_file
from ..format.errors import OutputExistsError
from ..format.names import INPUTS_NAME, STATE_DIR, TEMP_PREFIX, is_shard_name
from ..format.storage import NotRegularFileError, file_kind, file_sha256, is_url, join, stat_regular
from .state import REMOVING, exists, read_renames, read_state, remove_state_folder, state_file
from .write import write_text_atomic

log = logging.getLogger(__name__)

_INDEX_LINE_BYTES = 64  # an index line ("offset size\n") is shorter: what an index file of n records may hold
_FIX = ("tfshard removes or replaces only a file it can prove it wrote (a name, size and sha256 it recorded): move "
        "that file out of OUT, or remove it if it is a damaged file of tfshard's, then run again")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A file tfshard recorded writing: its plain name in OUT, its sha256, its size, and where the record is.

    ``size`` None: an index file, whose size no record holds; it is then read to at most ``limit`` bytes.
    """

    name: str
    sha256: str
    size: int | None
    where: str
    limit: int | None = None

    def __post_init__(self):
        if not manifest_lib.is_output_name(self.name):  # validated before: a path here would be a bug
            raise ValueError(f"{self.where}: {self.name!r} is not a file name tfshard writes in OUT")


def problem(out: str, record: Recorded) -> str | None:
    """Why the file at ``record.name`` is not the one recorded, or None: it is, or nothing is there."""
    path = join(out, record.name)
    try:
        if is_url(out):
            size, _ = stat_regular(path)
        else:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                return f"does not match {record.where} (got a symlink; tfshard writes regular files)"
            if not stat.S_ISREG(st.st_mode):
                return f"does not match {record.where} (got {file_kind(st.st_mode)}; tfshard writes regular files)"
            size = st.st_size
        if record.size is not None and size != record.size:
            return f"does not match {record.where} (got {size:,} bytes, recorded {record.size:,})"
        sha256, size = file_sha256(path, record.size if record.size is not None else record.limit)
    except FileNotFoundError:
        return None
    except NotRegularFileError as e:  # swapped in between, or a folder on gs://
        return f"does not match {record.where} (got {str(e).removeprefix(path + ': ')})"
    if record.limit is not None and size > record.limit:
        return f"does not match {record.where} (got over {record.limit:,} bytes)"
    if sha256 != record.sha256:
        return f"does not match {record.where} (got sha256 {sha256[:12]}…, recorded {record.sha256[:12]}…)"
    return None


def refusal(path: str, why: str) -> OutputExistsError:
    """The one-line error for a file tfshard will not remove or replace."""
    return OutputExistsError(f"{path}: {why}; {_FIX}")


def prove(out: str, records: Iterable[Recorded]) -> list[Recorded]:
    """The record that proves each file there is in OUT, in the order given; a name with several records (a manifest
    and a commit record, say) is proved by any one of them. Files that are not there are left out.

    Raises:
      OutputExistsError: naming the first file no record of it proves, and how many more.
    """
    candidates: dict[str, list[Recorded]] = {}
    for record in records:
        candidates.setdefault(record.name, []).append(record)
    proven, bad = [], []
    for name, options in candidates.items():
        why = None
        for record in options:
            why = problem(out, record)
            if why is None:
                if exists(join(out, name)):
                    proven.append(record)
                break
        else:
            bad.append((name, why))
    if bad:
        more = f" ({len(bad) - 1} more file(s) too, e.g. {bad[1][0]})" if len(bad) > 1 else ""
        raise refusal(join(out, bad[0][0]), bad[0][1] + more)
    return proven


def present(out: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` with something at them in OUT (a dangling symlink too)."""
    return [name for name in names if exists(join(out, name))]


def as_it_is(out: str, name: str, why: str) -> Recorded:
    """A record of a file as it is now, for a file whose content proved it (``why``), so that the removal record
    names its bytes."""
    sha256, size = file_sha256(join(out, name))
    return Recorded(name, sha256, size, why)


def inputs_fingerprint(out: str) -> str | None:
    """The fingerprint ``OUT/inputs.json`` names (the dataset it lists the inputs of), or None when there is no
    regular file there or it is no inputs file: what proves an inputs file tfshard wrote for that dataset, even
    beside a manifest whose other fields lie."""
    path = join(out, INPUTS_NAME)
    if not is_url(out) and os.path.islink(path):
        return None
    try:
        raw = untrusted.parse_json(read_small_file(path, "inputs file"), path)
    except (ValueError, OSError):
        return None
    found = raw.get("fingerprint") if isinstance(raw, dict) else None
    return found if isinstance(found, str) else None


def by_manifest(out: str, manifest: manifest_lib.Manifest) -> list[Recorded]:
    """The shards and index files a manifest lists, with the size and sha256 it records for each."""
    where = join(out, manifest_lib.MANIFEST_NAME)
    found = []
    for split in manifest.splits.values():
        for shard in split.shards:
            found.append(Recorded(shard.file, shard.sha256, shard.bytes, where))
            if shard.index_file is not None:
                found.append(Recorded(shard.index_file, shard.index_sha256, None, where,
                                      _INDEX_LINE_BYTES * (shard.records + 1)))
    return found


def by_state(out: str) -> dict[str, Recorded]:
    """The files the state folder's commit records prove, under their final names (``renumber.json``'s renames
    too). A commit record that is not what tfshard writes proves nothing (and is logged)."""
    state = join(out, STATE_DIR)
    if not tf.io.gfile.isdir(state):
        return {}
    found: dict[str, Recorded] = {}
    for entry in sorted(tf.io.gfile.listdir(state)):
        name = entry.rstrip("/").removesuffix(".json")
        if not (entry.endswith(".json") and is_shard_name(name)):
            continue
        path = join(state, entry)
        try:
            raw = read_state(path)
            info = untrusted.shard_from_dict(raw.get("info") if isinstance(raw, dict) else None, path, "info",
                                             expected_file=name)
        except (ValueError, NotRegularFileError, OSError) as e:
            log.warning("%s: not a commit record tfshard wrote (%s); it proves nothing", path, e)
            continue
        where = f"its commit record {path}"
        found[info.file] = Recorded(info.file, info.sha256, info.bytes, where)
        if info.index_file is not None:
            found[info.index_file] = Recorded(info.index_file, info.index_sha256, None, where,
                                              _INDEX_LINE_BYTES * (info.records + 1))
    for old, new in read_renames(out):
        if old in found:
            found[new] = dataclasses.replace(found[old], name=new)
    staged = join(state, INPUTS_NAME)  # the inputs file, staged before it is put in OUT
    if exists(staged) and not (not is_url(out) and os.path.islink(staged)):
        try:
            sha256, size = file_sha256(staged)
            found[INPUTS_NAME] = Recorded(INPUTS_NAME, sha256, size, f"its staged copy {staged}")
        except (NotRegularFileError, OSError) as e:
            log.warning("%s: not an inputs file tfshard staged (%s); it proves nothing", staged, e)
    return found


def remove_proven(out: str, records: list[Recorded], journal: bool = True) -> None:
    """Removes the recorded files there are, in this order, once every one of them is proved (``prove``). With
    ``journal``, records them in ``removing.json`` first, so a run killed midway removes the rest when run again
    (``finish_pending_removal``); without, the records themselves must stay until the last is removed.

    Raises:
      OutputExistsError: a file no record of it proves; nothing is removed.
    """
    proven = prove(out, records)
    if journal:
        tf.io.gfile.makedirs(join(out, STATE_DIR))
        entries = [{"name": r.name, "bytes": r.size, "sha256": r.sha256, "limit": r.limit} for r in proven]
        write_text_atomic(state_file(out, REMOVING), json.dumps({"files": entries}))
    _remove(out, [r.name for r in proven])


def _remove(out: str, names: list[str]) -> None:
    for name in names:
        for path in (join(out, name), join(out, TEMP_PREFIX + name)):
            if exists(path):
                tf.io.gfile.remove(path)


def _journal(out: str, path: str) -> list[Recorded]:
    """The entries of ``removing.json``, each checked before any is used."""
    raw = read_state(path)
    files = raw.get("files") if isinstance(raw, dict) else None
    records = []
    for i, entry in enumerate(files if isinstance(files, list) else [raw]):
        try:
            size, limit = entry["bytes"], entry["limit"]
            if not (manifest_lib.is_output_name(entry["name"]) and isinstance(entry["sha256"], str)
                    and (manifest_lib.is_count(size) or (size is None and manifest_lib.is_count(limit)))):
                raise ValueError
            records.append(Recorded(entry["name"], entry["sha256"], size, f"the removal record {path}", limit))
        except (TypeError, KeyError, AttributeError, ValueError):
            raise OutputExistsError(
                f"{path}: entry {i} is not a file tfshard recorded removing (got {str(entry)[:100]!r}); nothing was "
                f"removed on its word: remove {join(out, STATE_DIR)} and run again (files of the old dataset it "
                "names may remain: remove those yourself)") from None
    return records


def finish_pending_removal(out: str) -> None:
    """An ``--overwrite`` killed while removing the old dataset: remove the rest of what it recorded, each file
    only while it still matches the size and sha256 recorded; then the state folder goes.

    Raises:
      OutputExistsError: a record that is not one tfshard writes, or a file that does not match it.
    """
    path = state_file(out, REMOVING)
    if not exists(path):
        return
    proven = prove(out, _journal(out, path))
    log.warning("%s: finishing an interrupted --overwrite: removing %d files of the previous dataset", out,
                len(proven))
    _remove(out, [r.name for r in proven])
    remove_state_folder(out)
