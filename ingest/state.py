"""The state folder ``OUT/.tfshard-state/``: what a run records before it acts, read back as untrusted input.

A conversion or an append writes here, under OUT's lock, before each step a kill could cut short:

- ``plan.json``: the run's fingerprint (what a rerun must match to resume) and its planned file names. The names
  only say what the run meant to write; they prove nothing (``ingest/proof.py``).
- ``<shard>.json``: a shard's commit record (``record_commit``), with its size and sha256, written before the shard
  (and its index file) is renamed to its final name, so every file a killed run leaves under a final name has one.
- ``removing.json``: the files an ``--overwrite`` removes, each with its size and sha256 (``ingest/proof.py``).
- ``renumber.json``: the renames that drop empty shards (``ingest/renumber.py``).
- ``append.json`` and the staged ``inputs.json`` of an append (``ingest/append.py``).

Everything here is untrusted: the folder must be a real folder (``check_state_folder``), a state file is never read
through a symlink and is size-capped before it is read (``read_state``), and the folder is removed without ever
following a link out of it (``remove_state_folder``).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format import stops, untrusted
from ..format.dataset import read_small_file
from ..format.errors import OutputExistsError
from ..format.json_checks import REWRITE
from ..format.names import STATE_DIR
from ..format.storage import is_url, join
from .plan import ShardSpec
from .write import ShardResult, write_text_atomic

PLAN = "plan.json"
REMOVING = "removing.json"  # what an --overwrite is removing, written before it removes anything
RENUMBER = "renumber.json"
APPEND = "append.json"  # an append's {"base", "target"}: the dataset's fingerprints before and after it


def state_file(out: str, name: str) -> str:
    """The path of a state file: ``OUT/.tfshard-state/<name>``."""
    return join(join(out, STATE_DIR), name)


def exists(path: str) -> bool:
    """Something is at ``path``, a dangling symlink included (``tf.io.gfile.exists`` follows links)."""
    return tf.io.gfile.exists(path) if is_url(path) else os.path.lexists(path)


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
    """A state file's JSON: a regular file of ours (never through a symlink), size-capped, parsed untrusted.

    Raises:
      ManifestError: naming the file and the problem, with the fix that works: not ``--overwrite``, which reads the
        state folder too, but removing it.
    """
    if not is_url(path) and os.path.islink(path):
        raise manifest_lib.ManifestError(f"{path}: a symlink, not a state file tfshard wrote; remove it and run again")
    try:
        return untrusted.parse_json(read_small_file(path, "state file"), path)
    except ValueError as e:  # not a regular file, too large, not UTF-8 JSON, nested too deep, a key given twice
        problem = str(e).removeprefix(f"{path}: ").removesuffix(f"; {REWRITE}")
        raise manifest_lib.ManifestError(f"{path}: {problem}; not a state file tfshard wrote: remove "
                                         f"{path.rsplit('/', 1)[0]} (or OUT) and run again") from None


def remove_state_folder(out: str) -> None:
    """Removes the state folder and what is in it. Locally with ``shutil.rmtree``, which removes a symlink found
    inside rather than following it (``tf.io.gfile.rmtree`` empties the folder a planted link points to)."""
    state = join(out, STATE_DIR)
    if is_url(out):
        if tf.io.gfile.exists(state):
            tf.io.gfile.rmtree(state)
        return
    check_state_folder(out)
    if os.path.isdir(state):
        shutil.rmtree(state)


def fresh_state_folder(out: str) -> None:
    """An empty state folder: whatever state was there goes first."""
    remove_state_folder(out)
    tf.io.gfile.makedirs(join(out, STATE_DIR))


def write_plan(out: str, fingerprint: str, files: list[str]) -> None:
    """``plan.json``: the run's fingerprint and the names it plans to write (names only: they prove nothing)."""
    write_text_atomic(state_file(out, PLAN), json.dumps({"fingerprint": fingerprint, "files": files}))


def plan_fingerprint(out: str) -> str | None:
    """The fingerprint of the unfinished run whose ``plan.json`` is in the state folder; None when there is none.

    Raises:
      OutputExistsError: a ``plan.json`` that is not one tfshard writes.
    """
    path = state_file(out, PLAN)
    if not exists(path):
        return None
    raw = read_state(path)
    files = raw.get("files") if isinstance(raw, dict) else None
    fingerprint = raw.get("fingerprint") if isinstance(raw, dict) else None
    if not (isinstance(fingerprint, str) and isinstance(files, list)
            and all(manifest_lib.is_output_name(name) for name in files)):
        bad = next((n for n in files if not manifest_lib.is_output_name(n)), files) if isinstance(files, list) else raw
        raise OutputExistsError(f"{path}: not a plan tfshard wrote (got {str(bad)[:80]!r}); remove "
                                f"{join(out, STATE_DIR)} (or OUT) and run again")
    return fingerprint


def record_commit(out: str, spec: ShardSpec, result: ShardResult) -> None:
    """Notes a shard in the state folder, with its size and sha256, before it is renamed to its final name: a rerun
    keeps it, and may remove or replace it, only while its bytes are these. Not after a Ctrl-C or SIGTERM
    (``stops.check``, which also raises a stop that was raised before and swallowed on its way, by a finalizer or by
    a Beam step): the shard is then not committed, for the local engine and the Beam runner alike."""
    stops.check()
    write_text_atomic(state_file(out, spec.file_name + ".json"), result.to_json())


def read_renames(out: str) -> list[tuple[str, str]]:
    """The ``(planned name, final name)`` pairs of ``renumber.json``; empty when there is none.

    Raises:
      OutputExistsError: a ``renumber.json`` that is not one tfshard writes.
    """
    path = state_file(out, RENUMBER)
    if not exists(path):
        return []
    raw = read_state(path)
    renames = raw.get("renames") if isinstance(raw, dict) else None
    if not isinstance(renames, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(manifest_lib.is_output_name(n) for n in pair)
        for pair in renames
    ):
        raise OutputExistsError(f"{path}: not a renumbering record tfshard wrote; remove {join(out, STATE_DIR)} (or "
                                "OUT) and run again")
    return [(old, new) for old, new in renames]
