"""Resuming a conversion: what OUT holds, what a rerun keeps, and ``--overwrite`` that finishes what it starts.

Every committed shard leaves a small commit record in ``OUT/.tfshard-state/`` (``ingest/state.py``), written
before the shard gets its final name. A rerun of the same command (same inputs, same output-affecting options)
keeps each committed shard whose bytes still hash to its record and writes the rest, so the files end
byte-identical to an uninterrupted run. A file in OUT is only ever removed or replaced on proof that tfshard wrote
it (``ingest/proof.py``): anything else at a name the run needs, a shard changed since its record included, is
refused, naming it. ``--overwrite`` records the old dataset's files (with their sizes and sha256) before removing
any, so a run killed midway finishes the removal when run again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format.dataset import load_manifest
from ..format.errors import InputsGrownError, OutputExistsError
from ..format.json_checks import REWRITE
from ..format.names import INPUTS_NAME, LOCK_NAME, STATE_DIR, index_file_name, is_shard_name
from ..format.storage import NotRegularFileError, join, stat_regular
from .plan import ShardSpec
from .proof import (
    Recorded,
    as_it_is,
    by_manifest,
    by_state,
    finish_pending_removal,
    inputs_fingerprint,
    present,
    prove,
    remove_proven,
)
from .state import (
    APPEND,
    check_state_folder,
    exists,
    fresh_state_folder,
    plan_fingerprint,
    read_state,
    remove_state_folder,
    state_file,
)
from .tfds import written_for
from .write import ShardResult

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """What a conversion found in OUT before writing anything; given to the ``on_status`` callback once.

    Attributes:
      complete: OUT already holds this very dataset (same inputs and options): nothing is converted.
      kept_shards: shards already committed, kept as they are (every shard when ``complete``).
      total_shards: shards of the whole dataset.
      kept_records, kept_bytes: what the kept shards hold, so a rate can count only this run's work.
      append: for an append, what it found in SRC (``ingest.append.AppendFound``); None for a conversion.

    Example:
      convert_images("photos/", "out/", on_status=print)  # after a Ctrl-C: RunStatus(complete=False, kept_shards=3,
      # total_shards=8, ...); once more: RunStatus(complete=True, kept_shards=8, total_shards=8, ...)
    """

    complete: bool
    kept_shards: int
    total_shards: int
    kept_records: int = 0
    kept_bytes: int = 0
    append: Any = None  # an append's ``AppendFound`` (ingest/append.py): what is new, changed and deleted

    @property
    def resumed(self) -> bool:
        """An unfinished conversion was picked up: some shards kept, the rest to write."""
        return not self.complete and self.kept_shards > 0


def damaged_files(out: str, manifest: manifest_lib.Manifest) -> list[str]:
    """Listed shards and index files that are missing, not regular files, or not their recorded size (no read)."""
    damaged = []
    for split in manifest.splits.values():
        for shard in split.shards:
            for name, size in ((shard.file, shard.bytes), (shard.index_file, None)):
                if name is None:
                    continue
                try:
                    found, _ = stat_regular(join(out, name))
                except (FileNotFoundError, NotRegularFileError):
                    found = -1
                if found < 0 or (size is not None and found != size):
                    damaged.append(name)
    return damaged


def complete_dataset(out: str, fingerprint: str) -> manifest_lib.Manifest | None:
    """The manifest when OUT already holds this very dataset, intact, with no conversion state or lock; else None.

    Reads only, so a finished dataset on a read-only folder is found complete without taking the lock.
    """
    try:
        # A state folder or a lock file left by a killed run: the locked path finishes and removes them.
        if any(tf.io.gfile.exists(join(out, name)) for name in (STATE_DIR, LOCK_NAME)) or not tf.io.gfile.exists(
                join(out, manifest_lib.MANIFEST_NAME)):
            return None
        manifest = load_manifest(out)
    except (OSError, ValueError, tf.errors.OpError):
        return None  # the locked path looks again and says what is wrong
    return manifest if manifest.fingerprint == fingerprint and not damaged_files(out, manifest) else None


def prepare_output(out: str, fingerprint: str, overwrite: bool, planned: list[str],
                   new_inputs: Callable[[manifest_lib.Manifest], int] | None = None) -> manifest_lib.Manifest | None:
    """Checks OUT (which exists, and is locked) against this run; returns the existing manifest when the work is done.

    ``--overwrite`` removes only the files of a tfshard dataset and of an unfinished run there that tfshard can
    prove it wrote (``ingest/proof.py``: those its manifest or its commit records list with the size and sha256
    they still have, the manifest, the inputs file and TFDS metadata written for it), and never removes or replaces
    anything else: a file there that its record does not prove, or a ``planned`` output name that no record
    proves, is refused with or without ``--overwrite``, before anything is removed. ``new_inputs``: how many inputs
    of this run a dataset in OUT of other inputs has not read, when ``--append`` could add them (said in the
    refusal).
    """
    manifest_path = join(out, manifest_lib.MANIFEST_NAME)
    check_state_folder(out)
    finish_pending_removal(out)
    if tf.io.gfile.exists(manifest_path):
        try:
            old = load_manifest(out, consistency=False)  # totals that lie must not stop --overwrite
        except ValueError as e:  # the loader's own fix (--overwrite) is this very command: not repeated
            raise OutputExistsError(
                f"{out}: output folder holds a {manifest_lib.MANIFEST_NAME} tfshard cannot read "
                f"({str(e).removesuffix('; ' + REWRITE)}); nothing was removed: remove OUT yourself, or choose "
                "another folder"
            ) from e
        if old.fingerprint == fingerprint and not overwrite:
            damaged = damaged_files(out, old)
            if not damaged:
                if not exists(state_file(out, APPEND)):  # an unfinished append's records prove its shards: kept
                    remove_state_folder(out)
                return old
            # Finished once, since damaged: convert again (same plan, same bytes). The manifest goes first,
            # so a crash from here on leaves an unfinished conversion, never a manifest that lies.
            log.warning("%s: %d file(s) missing or resized since the conversion finished (e.g. %s); converting again",
                        out, len(damaged), damaged[0])
            _replace(out, old, planned, tfds=False)  # the same dataset again: its TFDS metadata stays true
            return None
        if not overwrite:
            grown = new_inputs(old) if new_inputs is not None else 0
            if grown:
                raise InputsGrownError(
                    "{out}: output folder holds a dataset made from other inputs; SRC has {grown:,} it has not read: "
                    "pass {append:set} to add them as new shards (every shard written is kept, the dataset's options "
                    "remembered), {overwrite:set} to rebuild it from SRC as it is now, or choose another folder",
                    out=out, grown=grown)
            raise OutputExistsError(f"{out}: output folder holds a dataset made from other inputs or options; pass "
                                    "--overwrite to replace it, or choose another folder")
        _replace(out, old, planned)
        return None
    unfinished = plan_fingerprint(out)
    if unfinished == fingerprint:  # this very conversion, killed: what it left is kept or replaced only on proof
        records = by_state(out)
        # the small files now, the shards as they are kept (committed_results): each read once
        prove(out, [records[n] for n in refuse_unrecorded(out, planned, records) if not is_shard_name(n)])
        return None
    if unfinished is not None:
        if not overwrite:
            raise OutputExistsError(f"{out}: output folder holds an unfinished conversion of other inputs or options; "
                                    "pass --overwrite to replace it, or choose another folder")
        _replace(out, None, planned)
        return None
    leftovers = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(out))
    leftovers = [n for n in leftovers if n not in (STATE_DIR, LOCK_NAME)]
    refuse_unrecorded(out, planned, {})
    if leftovers and not overwrite:
        raise OutputExistsError(
            f"{out}: output folder holds {len(leftovers)} files that tfshard did not write "
            f"(e.g. {leftovers[0]!r}); "
            "pass --overwrite to write the dataset beside them (no file of theirs is removed or replaced), "
            "or choose another folder"
        )
    fresh_state_folder(out)
    return None


def _old_files(out: str, old: manifest_lib.Manifest | None, tfds: bool = True) -> list[Recorded]:
    """The records of every file of the dataset in OUT (``old``; the manifest first, so a run killed while removing
    them leaves an unfinished conversion, never a manifest that lies) and of any unfinished run in the state folder
    (a killed conversion or append): what ``--overwrite`` removes, on proof."""
    records = []
    if old is not None:
        manifest_path = join(out, manifest_lib.MANIFEST_NAME)
        records.append(as_it_is(out, manifest_lib.MANIFEST_NAME, f"{manifest_path} as tfshard loaded it"))
        records += by_manifest(out, old)
        # TFDS metadata describes the old shards: it goes with them
        if tfds:
            records += [as_it_is(out, name, f"{join(out, name)} as written for it") for name in written_for(out, old)]
        if inputs_fingerprint(out) == old.fingerprint:  # the inputs file of this very dataset: ours
            records.append(as_it_is(out, INPUTS_NAME, f"{join(out, INPUTS_NAME)} as tfshard wrote it"))
    return records + list(by_state(out).values())


def _replace(out: str, old: manifest_lib.Manifest | None, planned: list[str], tfds: bool = True) -> None:
    """--overwrite (or a repair): removes the files of the dataset in OUT (its TFDS metadata with ``tfds``) and of an
    unfinished run there, once every one is proved and no planned name is taken by a file none of them is; then a
    fresh state folder."""
    records = _old_files(out, old, tfds)
    refuse_unrecorded(out, planned, {r.name: r for r in records})
    log.info("%s: --overwrite: removing the files of the previous dataset", out)
    remove_proven(out, records)
    fresh_state_folder(out)


def refuse_unrecorded(out: str, planned: list[str], records: dict[str, Recorded]) -> list[str]:
    """The files of ``planned`` already in OUT, once each has a record (``records``) to prove it by; a file no record
    names is refused (another tool's dataset, say TFDS's ``train-00000-of-00001.tfrecord``, is never replaced, with
    or without --overwrite).

    Raises:
      OutputExistsError: naming the files, before anything is removed or replaced.
    """
    there = present(out, planned)
    taken = sorted(name for name in there if name not in records)
    if taken:
        shown = taken[:3] + ([f"... {len(taken) - 3} more"] if len(taken) > 3 else [])
        raise OutputExistsError(
            f"{out}: holds {len(taken)} file(s) named like this run's outputs that tfshard did not write or cannot "
            f"prove it wrote (got {shown!r}); no record of tfshard's holds their size and sha256, so nothing was "
            "removed or replaced, even with --overwrite: move those files out of OUT (or remove them), then run "
            "again, or choose another folder"
        )
    return there


def committed_results(out: str, specs: list[ShardSpec], index: bool, job) -> dict[str, ShardResult]:
    """The commit records of shards that are committed and still hash to what was recorded (each read once).

    A planned shard or index file in OUT that its record does not prove is refused, naming it (a user's file, or a
    shard damaged since it was committed: tfshard cannot tell them apart); a record that proves its shard's bytes
    but is otherwise not what tfshard writes only means the shard is written again.
    """
    recorded = by_state(out)
    kept = {}
    for spec in specs:
        names = [spec.file_name] + ([index_file_name(spec.file_name)] if index else [])
        there = refuse_unrecorded(out, names, recorded)
        prove(out, [recorded[name] for name in there])
        if len(there) < len(names):
            continue  # written again (its index file too): proved, so it may be replaced
        record = state_file(out, spec.file_name + ".json")
        try:
            kept[spec.file_name] = ShardResult.from_dict(read_state(record), job, record, spec.file_name)
        except ValueError as e:
            message = str(e) if str(e).startswith(record) else f"{record}: {e}"
            log.warning("%s; rewriting its shard", message)
    return kept
