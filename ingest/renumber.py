"""Shards whose every input was rejected: dropped, and the rest of their split renumbered before the manifest.

The plan counts inputs before the workers validate them (planning on validated
inputs would need a second decode of every image), so with rejected inputs a
planned shard can come out holding no record. An empty shard would give a
multi-worker reader an empty share of the split, so once every shard is
committed, empty ones are removed and the others renamed to close the gaps
(``train-00005-of-00021`` → ``train-00004-of-00017``). A shard's bytes hold no
name, so a rename is all it takes and every sha256 stays.

Crash safety: the renames are recorded first (``renumber.json`` in the state
folder; with the commit records it proves a renamed shard's bytes under its new
name, so an ``--overwrite`` of the unfinished conversion removes it). A rerun puts
the renamed shards back under their planned names before anything else (each only
on that proof), finds every shard committed, and renumbers again: the same files
as an uninterrupted run. ``close_gaps`` is what the engine calls once every planned shard is committed.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format.errors import InputError
from ..format.names import index_file_name, shard_file_name, shard_generation
from ..format.storage import join
from .kinds.protocol import Kind
from .plan import ShardSpec
from .proof import by_state, present, prove, refusal
from .state import RENUMBER, exists, read_renames, state_file, write_plan
from .write import ShardResult, remove_if_exists, write_text_atomic

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Renumbering:
    """What closing the gaps left by empty shards takes.

    Attributes:
      dropped: the empty shards' files (and index files), removed.
      renames: ``(planned name, final name)`` of every other shard (and index file) whose name changes.
      specs: the final shard specs, in split order, with their new index, count and file name.
      planned_names: final file name → the planned one it was written under.
    """

    dropped: list[str]
    renames: list[tuple[str, str]]
    specs: list[ShardSpec]
    planned_names: dict[str, str]


def plan_renumbering(specs: list[ShardSpec], records: dict[str, int], *, compression: str | None,
                     index: bool) -> Renumbering:
    """Which shards to drop (0 records) and how to rename the rest, from every shard's record count. Pure.

    >>> specs = plan_split("val", [1, 1, 1], num_shards=3)   # the middle shard's input was rejected
    >>> plan_renumbering(specs, {s.file_name: r for s, r in zip(specs, [1, 0, 1])}, compression=None,
    ...                  index=False).renames
    [('val-00000-of-00003.tfrecord', 'val-00000-of-00002.tfrecord'), ('val-00002-of-00003.tfrecord', ...)]
    """
    dropped, renames, final, planned_names = [], [], [], {}
    for split in dict.fromkeys(s.split for s in specs):
        mine = [s for s in specs if s.split == split]
        kept = [s for s in mine if records[s.file_name] > 0]
        for spec in mine:
            if records[spec.file_name] == 0:
                dropped += [spec.file_name] + ([index_file_name(spec.file_name)] if index else [])
        for i, spec in enumerate(kept):
            name = shard_file_name(split, i, len(kept), compression, shard_generation(spec.file_name))
            final.append(dataclasses.replace(spec, index=i, num_shards=len(kept), file_name=name))
            planned_names[name] = spec.file_name
            if name != spec.file_name:
                renames.append((spec.file_name, name))
                if index:
                    renames.append((index_file_name(spec.file_name), index_file_name(name)))
    return Renumbering(dropped, renames, final, planned_names)


def check_requested_shards(src: str, renumbering: Renumbering, specs: list[ShardSpec], records: dict[str, int],
                           *, num_shards: int | None, min_shards: int, unit: str) -> None:
    """An explicit ``num_shards`` (or ``min_shards``) is a promise to the readers: fewer shards is an error.

    Raises:
      InputError: naming the split, its good records and the fix.
    """
    for split in dict.fromkeys(s.split for s in specs):
        planned = sum(s.split == split for s in specs)
        kept = sum(s.split == split for s in renumbering.specs)
        asked = num_shards if num_shards is not None else min_shards
        if kept == 0 or kept >= asked or kept == planned:  # a split with no good record at all is left out
            continue
        good = sum(records[s.file_name] for s in specs if s.split == split)
        flag = "--num-shards" if num_shards is not None else "--min-shards"
        raise InputError(
            f"{src}: split {split!r}: {planned - kept} of its {planned} planned shards held only rejected inputs, "
            f"leaving {kept} shards of {good} good {unit} records where {flag} {asked} was asked (got "
            f"{flag.lstrip('-').replace('-', '_')}={asked}); fix or remove the rejected inputs (dataset.json is not "
            f"written: the conversion stops here), or pass {flag} {kept} or fewer with --overwrite"
        )


def apply_renumbering(out: str, renumbering: Renumbering, fingerprint: str, planned: list[str]) -> None:
    """Removes the empty shards and renames the rest, after recording both (see the module docstring).

    Raises:
      OutputExistsError: a file is already at a new name (none of this run's: the new names have fewer shards);
        nothing is removed or renamed.
    """
    finals = [new for _, new in renumbering.renames]
    taken = present(out, finals)
    if taken:
        raise refusal(join(out, taken[0]), "named like a renumbered shard of this run, which it would replace "
                                           f"({len(taken)} such file(s))")
    write_plan(out, fingerprint, planned + finals)
    write_text_atomic(state_file(out, RENUMBER), json.dumps({"renames": renumbering.renames}))
    log.warning("%s: %d planned shard(s) held only rejected inputs; dropped, and the rest renumbered (e.g. %s)",
                out, len([n for n in renumbering.dropped if manifest_lib.is_shard_name(n)]),
                renumbering.renames[0][1] if renumbering.renames else renumbering.dropped[0])
    for name in renumbering.dropped:  # this run's own shards, just committed and proved by its records
        remove_if_exists(join(out, name))
    for old, new in renumbering.renames:
        tf.io.gfile.rename(join(out, old), join(out, new), overwrite=False)


def undo_unfinished_renumbering(out: str) -> None:
    """A run killed while renumbering: its renamed shards go back under their planned names (committed, kept), each
    only while its commit record proves it.

    Raises:
      OutputExistsError: a renumbering record that is not one tfshard writes, or a renamed file it does not prove.
    """
    if not exists(state_file(out, RENUMBER)):
        return
    renames = read_renames(out)
    back = [(old, new) for old, new in renames if present(out, [new]) and not present(out, [old])]
    recorded = by_state(out)
    unrecorded = [new for _, new in back if new not in recorded]
    if unrecorded:
        raise refusal(join(out, unrecorded[0]), "named like a renumbered shard, but no commit record proves it")
    prove(out, [recorded[new] for _, new in back])
    for old, new in back:
        tf.io.gfile.rename(join(out, new), join(out, old), overwrite=False)
    tf.io.gfile.remove(state_file(out, RENUMBER))


def close_gaps(job: Kind, out: str, specs: list[ShardSpec], results: dict[str, ShardResult], options,
                fingerprint: str, planned: list[str], appending: bool = False
                ) -> tuple[list[ShardSpec], dict[str, ShardResult]]:
    """Drops shards that hold no record (every input rejected) and renumbers the rest; returns the final specs and
    results (renamed, with the dropped shards' rejections kept).

    ``appending``: an append's shards are one more generation, so the shards asked for were met already, and every
    new input may be rejected (no shard then). A conversion with every input rejected is an InputError.
    """
    records = {name: result.info.records for name, result in results.items()}
    renumbering = plan_renumbering(specs, records, compression=options.compression, index=options.index)
    if not renumbering.dropped:
        return specs, results
    if not appending:  # an append's shards are one more generation: the shards asked for were met already
        check_requested_shards(job.src, renumbering, specs, records, num_shards=options.num_shards,
                               min_shards=options.min_shards, unit=job.unit)
    if not renumbering.specs and not appending:
        first = next(r for result in results.values() for r in result.rejected)
        raise InputError(f"{job.src}: every input was rejected, e.g. {first['path']}: {first['reason']}; "
                         "no dataset is written")
    for split in dict.fromkeys(s.split for s in specs):
        if not any(s.split == split for s in renumbering.specs):
            log.warning("%s: split %r: every input was rejected; it is left out", job.src, split)
    apply_renumbering(out, renumbering, fingerprint, planned)
    if not renumbering.specs:
        return [], {}
    renamed = {}
    for spec in renumbering.specs:
        result = results[renumbering.planned_names[spec.file_name]]
        index_name = index_file_name(spec.file_name) if result.info.index_file else None
        info = dataclasses.replace(result.info, file=spec.file_name, index_file=index_name)
        renamed[spec.file_name] = dataclasses.replace(result, info=info)
    # The dropped shards' rejections still belong in the manifest.
    kept = set(renumbering.planned_names.values())
    lost = [r for name, result in results.items() if name not in kept for r in result.rejected]
    if lost:
        first = renumbering.specs[0].file_name
        renamed[first] = dataclasses.replace(renamed[first], rejected=renamed[first].rejected + lost)
    return renumbering.specs, renamed
