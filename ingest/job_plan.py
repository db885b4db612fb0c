"""A scanned job planned once: each split's record order, its shard specs, the files it writes, and the fingerprint.

``plan_job`` is the one place a run's fingerprint is computed (the kind, its options, the kind-wide facts and every
input in write order; an append's also names the dataset it extends and its generation). The engine, resume and
``--append`` carry the ``JobPlan`` it returns instead of recomputing any of it. Pure: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging

from ..format import manifest as manifest_lib
from ..format.errors import InputError, OptionError
from ..format.names import INPUTS_NAME, index_file_name
from . import duplicates
from .kinds.protocol import Kind
from .options import ConvertOptions
from .plan import ShardSpec, plan_split, shuffled_order

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """What a run writes, decided before anything is written.

    Attributes:
      ordered: per split, its items in record order (after the write-time shuffle); splits with no item left out.
      specs: the shard specs of every split, in write order.
      fingerprint: what identifies the output (``dataset.json``'s ``fingerprint``, the state folder's plan).
      planned: the files the run writes besides the manifest: its shards, their index files, the inputs file
        (images); none when there is no shard to write (an append with nothing new).
    """

    ordered: dict[str, list]
    specs: list[ShardSpec]
    fingerprint: str
    planned: list[str]


def plan_job(job: Kind, options: ConvertOptions, generation: int = 0, base: str | None = None) -> JobPlan:
    """The record order of each split, its shard specs, the planned files and the fingerprint.

    An append's (``generation`` > 0) split of fewer new inputs than ``num_shards``/``min_shards`` gets one shard
    per input: its options cannot change. ``base``: an append's, the fingerprint of the dataset it extends; its
    fingerprint then names that dataset, the generation and the new inputs. An append may find nothing new (an
    empty plan); a conversion that finds nothing is an error.

    Raises:
      InputError: a conversion with no usable input, or more shards asked for than a split has inputs.
    """
    ordered, specs = {}, []
    splits = duplicates.write_order(job.items) if options.dedupe else list(job.items)  # held-out splits first
    for split, items in ((split, job.items[split]) for split in splits):
        if not items:
            log.warning("%s: split %r has no usable inputs; it is left out", job.src, split)
            continue
        ordered[split] = [items[i] for i in shuffled_order(len(items), options.seed)]
        specs += _plan_split(job, split, ordered[split], options, generation)
    if not specs and not generation:
        raise InputError(f"{job.src}: {job.nothing_found}")
    fingerprint = _fingerprint(job, ordered, options)
    if base is not None:
        fingerprint = manifest_lib.fingerprint({"base": base, "generation": generation, "append": fingerprint})
    return JobPlan(ordered, specs, fingerprint, _planned_files(job, specs, options) if specs else [])


def _plan_split(job: Kind, split: str, ordered: list, options: ConvertOptions, generation: int) -> list[ShardSpec]:
    num_shards, min_shards = options.num_shards, options.min_shards
    if generation:
        num_shards = None if num_shards is None else min(num_shards, len(ordered))
        min_shards = min(min_shards, len(ordered))
    try:
        return plan_split(
            split,
            [job.size_of(item) for item in ordered],
            target_bytes=options.shard_bytes,
            num_shards=num_shards,
            min_shards=min_shards,
            compression=options.compression,
            generation=generation,
        )
    except ValueError as e:
        found, asked = len(ordered), max(options.num_shards or 0, options.min_shards)
        if asked <= found:
            raise InputError(f"{job.src}: split {split!r}: {e}") from e
        raise OptionError(
            "{src}: split {split!r}: {asked} shards asked for (got {num_shards}={n!r}, {min_shards}={m!r}) but only "
            "{found} {unit} inputs were found, counted before validation (the scan rejected {rejected} in all); ask "
            "for at most {found} shards, fewer if some inputs are rejected", src=job.src, split=split, asked=asked,
            n=options.num_shards, m=options.min_shards, found=found, unit=job.unit, rejected=len(job.rejected)
        ) from e


def _fingerprint(job: Kind, ordered: dict[str, list], options: ConvertOptions) -> str:
    """What identifies a run's output: the kind, its options, the kind-wide facts and every input in write order."""
    return manifest_lib.fingerprint(
        {
            "kind": job.kind,
            "options": options.identity(job.kind),
            "inputs": job.identity(),
            "sources": {s: [job.source_key(item) for item in items] for s, items in ordered.items()},
        }
    )


def _planned_files(job: Kind, specs: list[ShardSpec], options: ConvertOptions) -> list[str]:
    """The files a run plans to write besides the manifest: its shards, their index files, the inputs file."""
    planned = [s.file_name for s in specs]
    if options.index:
        planned += [index_file_name(n) for n in planned]
    if job.kind == "images":
        planned.append(INPUTS_NAME)
    return planned
