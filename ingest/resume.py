"""Resuming a conversion: what OUT holds, what a rerun keeps, and ``--overwrite`` that finishes what it starts.

Every committed shard leaves a small commit record in ``OUT/.tfshard-state/``.
A rerun of the same command (same inputs, same output-affecting options) keeps
each committed shard whose bytes still hash to its record and rewrites the rest,
so the files end byte-identical to an uninterrupted run. Everything read here is
untrusted: state files are size-capped and validated, every file name in them
must be a plain name tfshard writes, and the state folder must be a real folder.
``--overwrite`` records the old dataset's files before removing any, so a run
killed midway finishes the removal when run again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format import untrusted
from ..format.dataset import load_manifest, read_small_file
from ..format.names import INPUTS_NAME, LOCK_NAME, STATE_DIR, TEMP_PREFIX, TFDS_FILES
from ..format.storage import NotRegularFileError, file_sha256, is_url, join, stat_regular
from .errors import OutputExistsError
from .plan import ShardSpec
from .write import ShardResult, remove_if_exists, write_text_atomic

log = logging.getLogger(__name__)

REMOVING = "removing.json"  # what an --overwrite is removing, written before it removes anything


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


def check_state_folder(out: str) -> None:
    """The state folder must be a real folder of ours: through a symlink, state would be written (and later
    removed) somewhere else."""
    state = join(out, STATE_DIR)
    if not is_url(out) and (os.path.islink(state) or (os.path.lexists(state) and not os.path.isdir(state))):
        raise OutputExistsError(
            f"{state}: not a folder tfshard made (a symlink or a file); remove it (nothing of the dataset is in it) "
            "and run again"
        )


def read_state(path: str) -> Any:
    """A state file's JSON: a regular file of ours (never through a symlink), size-capped, parsed untrusted."""
    if not is_url(path) and os.path.islink(path):
        raise manifest_lib.ManifestError(f"{path}: a symlink, not a state file tfshard wrote; remove it and run again")
    return untrusted.parse_json(read_small_file(path, "state file"), path)


def files_to_remove(raw: Any, path: str) -> list[str]:
    """The ``files`` list of a plan or removal record: plain output file names only, checked before any use."""
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, list) or not all(manifest_lib.is_output_name(name) for name in files):
        bad = files
        if isinstance(files, list):
            bad = next((n for n in files if not manifest_lib.is_output_name(n)), files)
        raise OutputExistsError(
            f"{path}: lists {bad!r}, not a file tfshard writes in OUT; remove {path} (or OUT) and run again"
        )
    return files


def remove_outputs(out: str, names: list[str]) -> None:
    for name in names:
        remove_if_exists(join(out, name))
        remove_if_exists(join(out, TEMP_PREFIX + name))


def finish_pending_removal(out: str) -> None:
    """An ``--overwrite`` killed while removing the old dataset: remove the rest of what it recorded."""
    record = join(join(out, STATE_DIR), REMOVING)
    if not tf.io.gfile.exists(record):
        return
    names = files_to_remove(read_state(record), record)
    log.warning("%s: finishing an interrupted --overwrite: removing %d files of the previous dataset", out, len(names))
    remove_outputs(out, names)
    tf.io.gfile.rmtree(join(out, STATE_DIR))


def _ours_tfds_files(out: str, manifest: manifest_lib.Manifest) -> list[str]:
    """TFDS metadata beside a dataset that ``tfshard tfds`` (or ``--tfds``) wrote for it (its description names the
    dataset's fingerprint); metadata of anything else is not ours to remove."""
    try:
        info = untrusted.parse_json(read_small_file(join(out, TFDS_FILES[0]), "TFDS metadata"), TFDS_FILES[0])
        ours = isinstance(info, dict) and manifest.fingerprint in str(info.get("description", ""))
    except (OSError, ValueError):
        return []
    if not ours:
        return []
    present = {n.rstrip("/") for n in tf.io.gfile.listdir(out)}
    return [name for name in TFDS_FILES if name in present]


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


def prepare_output(out: str, fingerprint: str, overwrite: bool, planned: list[str]) -> manifest_lib.Manifest | None:
    """Checks OUT (which exists, and is locked) against this run; returns the existing manifest when the work is done.

    ``--overwrite`` removes only the files of a tfshard dataset (those its manifest or its unfinished plan lists,
    and TFDS metadata written for it) and never replaces a file tfshard did not write: a ``planned`` output name
    that exists in OUT and belongs to no tfshard dataset is refused, with or without ``--overwrite``.
    """
    manifest_path = join(out, manifest_lib.MANIFEST_NAME)
    state_path = join(out, STATE_DIR)
    plan_path = join(state_path, "plan.json")
    check_state_folder(out)
    finish_pending_removal(out)
    old_files: list[str] = []
    if tf.io.gfile.exists(manifest_path):
        try:
            old = load_manifest(out, consistency=False)  # totals that lie must not stop --overwrite
        except ValueError as e:
            raise OutputExistsError(
                f"{out}: output folder holds a {manifest_lib.MANIFEST_NAME} tfshard cannot read ({e}); "
                "nothing was removed: remove OUT yourself, or choose another folder"
            ) from e
        if old.fingerprint == fingerprint and not overwrite:
            damaged = damaged_files(out, old)
            if not damaged:
                if tf.io.gfile.exists(state_path):
                    tf.io.gfile.rmtree(state_path)
                return old
            # Finished once, since damaged: convert again (same plan, same bytes). The manifest goes first,
            # so a crash from here on leaves an unfinished conversion, never a manifest that lies.
            log.warning("%s: %d file(s) missing or resized since the conversion finished (e.g. %s); converting again",
                        out, len(damaged), damaged[0])
            tf.io.gfile.remove(manifest_path)
            tf.io.gfile.makedirs(state_path)
            return None
        what = "a dataset made from other inputs or options"
        old_files = [manifest_lib.MANIFEST_NAME] + [
            name
            for split in old.splits.values()
            for shard in split.shards
            for name in (shard.file, shard.index_file)
            if name is not None
        ]
        old_files += _ours_tfds_files(out, old)  # they describe the old shards: they go with them
        if old.kind == "images" and tf.io.gfile.exists(join(out, INPUTS_NAME)):
            old_files.append(INPUTS_NAME)  # beside an image dataset's manifest, ours
    elif tf.io.gfile.exists(plan_path):
        old_plan = read_state(plan_path)
        old_files = files_to_remove(old_plan, plan_path)
        if old_plan.get("fingerprint") == fingerprint:
            return None
        what = "an unfinished conversion of other inputs or options"
    else:
        leftovers = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(out))
        leftovers = [n for n in leftovers if n not in (STATE_DIR, LOCK_NAME)]
        refuse_taken_names(out, planned, leftovers, old_files)
        if leftovers and not overwrite:
            raise OutputExistsError(
                f"{out}: output folder holds {len(leftovers)} files that tfshard did not write "
                f"(e.g. {leftovers[0]!r}); "
                "pass --overwrite to write the dataset beside them (no file of theirs is removed or replaced), "
                "or choose another folder"
            )
        tf.io.gfile.makedirs(state_path)
        return None
    if not overwrite:
        raise OutputExistsError(
            f"{out}: output folder holds {what}; pass --overwrite to replace it, or choose another folder"
        )
    refuse_taken_names(out, planned, sorted(n.rstrip("/") for n in tf.io.gfile.listdir(out)), old_files)
    # Record what goes before removing anything: a run killed midway finishes the removal when rerun.
    log.info("%s: --overwrite: removing %d files of the previous dataset", out, len(old_files))
    tf.io.gfile.makedirs(state_path)
    write_text_atomic(join(state_path, REMOVING), json.dumps({"files": old_files}))
    remove_outputs(out, old_files)
    tf.io.gfile.rmtree(state_path)
    tf.io.gfile.makedirs(state_path)
    return None


def refuse_taken_names(out: str, planned: list[str], present: list[str], ours: list[str]) -> None:
    """A file this run would write exists in OUT and is no file of a tfshard dataset there: refused, so another
    tool's dataset (say TFDS's ``train-00000-of-00001.tfrecord``) is never replaced, with or without --overwrite."""
    taken = sorted(set(planned) & set(present) - set(ours))
    if taken:
        shown = taken[:3] + ([f"... {len(taken) - 3} more"] if len(taken) > 3 else [])
        raise OutputExistsError(
            f"{out}: holds {len(taken)} file(s) named like this dataset's outputs that tfshard did not write "
            f"(got {shown!r}); nothing was removed or replaced, even with --overwrite: choose another folder, "
            "or move those files away"
        )


def committed_results(out: str, specs: list[ShardSpec], index: bool, job) -> dict[str, ShardResult]:
    """The state records of shards that are committed and still hash to what was recorded.

    A record that is unreadable or not what tfshard writes only means its shard is written again.
    """
    kept = {}
    for spec in specs:
        record = join(join(out, STATE_DIR), spec.file_name + ".json")
        path = join(out, spec.file_name)
        if not (tf.io.gfile.exists(record) and tf.io.gfile.exists(path)):
            continue
        try:
            result = ShardResult.from_dict(read_state(record), job, record, spec.file_name)
            if index and not (result.info.index_file and tf.io.gfile.exists(join(out, result.info.index_file))):
                continue
            index_ok = not index or file_sha256(join(out, result.info.index_file))[0] == result.info.index_sha256
            matches = index_ok and file_sha256(path, result.info.bytes) == (result.info.sha256, result.info.bytes)
        except (ValueError, NotRegularFileError) as e:
            message = str(e) if str(e).startswith(record) else f"{record}: {e}"
            log.warning("%s; rewriting its shard", message)
            continue
        if matches:
            kept[spec.file_name] = result
        else:
            log.warning("%s: does not match its commit record; rewriting it", path)
    return kept


def record_commit(out: str, spec: ShardSpec, result: ShardResult) -> None:
    """Notes a committed shard in the state folder, so a rerun keeps it."""
    write_text_atomic(join(join(out, STATE_DIR), spec.file_name + ".json"), result.to_json())


