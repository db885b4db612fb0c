"""The conversion engine, shared by every kind of input: plan, prepare in parallel, write, commit, manifest.

``convert_images`` and ``convert_episodes`` (``ingest/convert.py``) scan their
source into a job (``ingest/kinds/``), planned once (``ingest/job_plan.py``); everything after is ``run_job``.

Resumable (``ingest/resume.py``): a rerun of the same command keeps every
committed shard and ends byte-identical to an uninterrupted run. Shards that came
out empty are dropped and the rest renumbered (``ingest/renumber.py``). The
manifest is written last; the state folder is removed after it. What a run found
in OUT (already complete, or how many shards it kept) goes to its ``on_status``
callback as a ``RunStatus`` (and to the log at INFO); the return value is the manifest.
With ``tfds=True`` the TFDS metadata (``ingest/tfds.py``) follows the manifest, under the same lock, also
when OUT was found complete; the same for every runner, since the manifest is always written here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator

import tensorflow as tf  # OUT is read and written through tf.io.gfile (local or gs://); workers never import this
import tqdm

from ..format import inputs as inputs_lib
from ..format import manifest as manifest_lib
from ..format import stops
from ..format.dataset import check_output_folder
from ..format.errors import InputError
from ..format.names import INPUTS_NAME, TEMP_PREFIX
from ..format.storage import check_bucket, is_url, join
from ..format.tfrecord import SLOW_CRC32C
from . import duplicates
from .append_checks import new_inputs
from .job_plan import JobPlan, plan_job
from .kinds.protocol import Kind
from .lock import output_lock
from .options import ConvertOptions
from .parallel import default_workers, ordered_map
from .plan import ShardSpec
from .renumber import close_gaps, undo_unfinished_renumbering
from .resume import RunStatus, committed_results, complete_dataset, prepare_output
from .state import record_commit, remove_state_folder, state_file, write_plan
from .tfds import check_tfds_up_front, write_tfds_after_conversion
from .write import ShardResult, remove_if_exists, write_shard, write_text_atomic

log = logging.getLogger(__name__)


def _write_shards(
    job: Kind, out: str, todo: list[ShardSpec], ordered: dict[str, list], options: ConvertOptions, workers: int,
    progress: bool, deduper: duplicates.Deduper | None = None,
) -> Iterator[tuple[ShardSpec, ShardResult]]:
    tasks = (ordered[s.split][i] for s in todo for i in range(s.start, s.stop))
    results = ordered_map(
        job.prepare,
        tasks,
        workers=workers,
        size_of=job.size_of,
        max_pending_bytes=max(workers, 1) * options.shard_bytes,
    )
    started = time.monotonic()
    done_bytes = 0
    total = sum(s.num_records for s in todo)
    with tqdm.tqdm(total=total, unit=job.unit, disable=not progress, dynamic_ncols=True, desc=job.kind) as bar:

        def on_item(item) -> None:
            nonlocal done_bytes
            done_bytes += job.size_of(item)
            bar.update(1)
            elapsed = time.monotonic() - started
            if elapsed > 0:
                bar.set_postfix_str(f"{done_bytes / elapsed / 1e6:.1f} MB/s", refresh=False)

        try:
            for spec in todo:
                pairs = ((item, next(results)) for item in ordered[spec.split][spec.start : spec.stop])
                screen = None if deduper is None else deduper.screen_for(spec)
                commit = functools.partial(record_commit, out, spec)  # no commit after a stop (state.py)
                yield spec, write_shard(job, out, spec, pairs, options, on_item, screen, commit)
        finally:
            results.close()


def _assemble(
    job: Kind, specs: list[ShardSpec], results: dict[str, ShardResult], options: ConvertOptions, fingerprint: str,
    found_duplicates: dict | None = None,
) -> manifest_lib.Manifest:
    splits = {}
    rejected = [{"path": r.relpath, "reason": r.reason} for r in job.rejected]
    for split in dict.fromkeys(s.split for s in specs):
        parts = [results[s.file_name] for s in specs if s.split == split]
        splits[split] = manifest_lib.SPLIT_TYPES[job.kind](
            shards=[p.info for p in parts],
            records=sum(p.info.records for p in parts),
            bytes=sum(p.info.bytes for p in parts),
            **job.split_fields([p.stats for p in parts]),
        )
        rejected += [r for p in parts for r in p.rejected]
    return manifest_lib.Manifest(
        kind=job.kind,
        fingerprint=fingerprint,
        compression=options.compression,
        features=job.features,
        class_names=job.class_names,
        splits=splits,
        options={**options.identity(job.kind), **job.summary([r.stats for r in results.values()])},
        rejected=sorted(rejected, key=lambda r: r["path"]),
        rejected_unlisted=job.rejected_unlisted,
        ignored=job.ignored,
        ignored_files=job.ignored_files,
        labels=job.labels,
        label_columns=list(job.label_columns),
        split_rule=job.split_rule,
        duplicates=found_duplicates,
    )


def check_folders(src: str, out: str) -> None:
    if not out:
        raise InputError(f"output folder: an empty path (got {out!r}); pass the folder to write (created if missing)")
    if not is_url(out) and not is_url(src):
        src_real, out_real = os.path.realpath(src), os.path.realpath(out)
        if out_real == src_real or out_real.startswith(src_real + os.sep):
            raise InputError(f"{out}: output folder is inside the source folder {src}; choose a folder outside it")


def run_job(job: Kind, out: str, options: ConvertOptions, *, workers: int | None, overwrite: bool, progress: bool,
            runner: Callable | None = None, on_status: Callable[[RunStatus], None] | None = None,
            tfds: bool = False):
    """Plans, writes and commits the shards of a scanned job, then its manifest; resumes where a run died.

    Holds ``OUT/.tfshard-lock`` throughout, so a second conversion into the same OUT fails at once.
    ``runner`` (e.g. ``ingest.beam_runner.BeamRunner``) writes the shards still to do elsewhere;
    planning, resume and the manifest stay here, so both produce the same files. ``on_status`` is
    called once with a ``RunStatus`` before any shard is written. ``tfds`` writes the TFDS metadata
    after the manifest, still under the lock (``ingest/tfds.py``).

    Raises:
      OutputLockedError: another conversion is writing into ``out``.
      OSError: ``errno.ENOSPC`` when the disk fills up (committed shards are kept for the rerun).
      InputError: ``tfds`` and TFDS could not open the metadata (a class name it cannot hold, a dtype it cannot
        decode), found before any shard is written.
      TfdsMetadataError: ``tfds`` and the metadata could not be written; the dataset is complete.
    """
    if SLOW_CRC32C:
        log.warning("google-crc32c has no compiled extension on this platform; framing records will be slow "
                    "(pip install --force-reinstall google-crc32c, or use a platform it ships wheels for)")
    workers = default_workers() if workers is None else workers
    duplicates.check_dedupe(job.kind, options.dedupe, runner)
    plan = plan_job(job, options)
    fingerprint = plan.fingerprint
    check_output_folder(out)
    check_bucket(out)
    # Found complete without the lock, which a read-only OUT could not give; --tfds writes into OUT anyway, so it
    # takes the lock and finds the dataset complete there.
    if not overwrite and not tfds:
        existing = complete_dataset(out, fingerprint)
        if existing is not None:
            return _already_complete(out, existing, on_status or (lambda status: None))
    created = _missing_folders(out)
    tf.io.gfile.makedirs(out)
    try:
        with output_lock(out):
            if tfds:  # refused before any shard is written, never found once the dataset is
                check_tfds_up_front(out, _bare_manifest(job, options, fingerprint), plan.specs)
            manifest = _run_locked(job, out, options, plan, workers=workers,
                                   overwrite=overwrite, progress=progress, runner=runner,
                                   on_status=on_status or (lambda status: None))
            if tfds:  # after dataset.json, under the same lock: no other conversion comes between
                write_tfds_after_conversion(out)
            return manifest
    except tf.errors.ResourceExhaustedError as e:
        raise _no_space(out) from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _no_space(out) from e
        raise
    finally:
        for folder in created:  # a run refused before writing anything leaves no folder it made
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only ever an empty folder


def _missing_folders(out: str) -> list[str]:
    """The local folders ``makedirs(out)`` is about to create, deepest first."""
    missing = []
    folder = os.path.abspath(out)
    while not is_url(out) and not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _bare_manifest(job: Kind, options: ConvertOptions, fingerprint: str) -> manifest_lib.Manifest:
    """What a run's manifest holds before any shard is written: everything but its splits."""
    return manifest_lib.Manifest(kind=job.kind, fingerprint=fingerprint, compression=options.compression,
                                 features=job.features, class_names=job.class_names, splits={}, options={},
                                 rejected=[], ignored={}, labels=job.labels, label_columns=list(job.label_columns))


def _no_space(out: str) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"{out}: no space left on the device; free space (or choose a folder on a larger disk) and run the same "
        "command again: committed shards are kept",
    )


def _run_locked(job: Kind, out, options, plan: JobPlan, *, workers, overwrite, progress, runner, on_status):
    fingerprint = plan.fingerprint
    existing = prepare_output(out, fingerprint, overwrite, plan.planned + [manifest_lib.MANIFEST_NAME],
                              functools.partial(new_inputs, out, job=job, options=options))
    if existing is not None:
        return _already_complete(out, existing, on_status)
    done = commit_shards(job, out, options, plan, workers=workers, progress=progress, runner=runner,
                         on_status=on_status)
    manifest = _assemble(job, done.specs, done.results, options, fingerprint, done.duplicates)
    stops.check()  # nothing more is written after a stop, even one swallowed on its way
    if done.read is not None:  # before the manifest: a dataset.json is never without its inputs file
        sums = {split: job.pixel_sums([done.results[s.file_name].stats for s in done.specs if s.split == split])
                for split in manifest.splits}
        text = inputs_lib.to_json(inputs_lib.Inputs(fingerprint, sums, done.read))
        write_text_atomic(state_file(out, INPUTS_NAME), text)  # staged: what proves the one in OUT to a rerun
        write_text_atomic(join(out, INPUTS_NAME), text)
        manifest = dataclasses.replace(manifest, inputs_sha256=inputs_lib.text_sha256(text))  # what --append believes
    write_text_atomic(join(out, manifest_lib.MANIFEST_NAME), manifest_lib.to_json(manifest))
    remove_state_folder(out)
    return manifest


@dataclasses.dataclass
class Committed:
    """Every planned shard committed: the final specs and results (empty shards dropped, the rest renumbered),
    the duplicates found, the inputs read (images; None for episodes) and every rejection of the planned shards."""

    specs: list[ShardSpec]
    results: dict[str, ShardResult]
    duplicates: dict | None
    read: list | None
    rejected: list[dict[str, str]]


def commit_shards(job: Kind, out: str, options: ConvertOptions, plan: JobPlan, *, workers: int, progress: bool,
                  runner: Callable | None,
                  on_status: Callable[[RunStatus], None], existing: dict | None = None, earlier: dict | None = None,
                  earlier_dropped: int = 0, appending: bool = False) -> Committed:
    """Writes and commits the shards of ``plan`` into the state folder ``prepare_output`` (or an append) made, keeping
    those a killed run committed; for a conversion and an append alike. ``plan.fingerprint`` is what the state
    folder and the commit records are kept under.

    ``existing``, ``earlier``, ``earlier_dropped``: an append's images already in the dataset, for ``--dedupe``
    (``duplicates.Deduper``) and the duplicates report. ``appending``: an append, whose every new input may be
    rejected (no shard is then committed; a conversion stops with an error).
    """
    ordered, specs, fingerprint, planned = plan.ordered, plan.specs, plan.fingerprint, plan.planned
    undo_unfinished_renumbering(out)  # before plan.json forgets the renamed files' names
    write_plan(out, fingerprint, planned)
    for name in planned + [manifest_lib.MANIFEST_NAME]:  # temporaries of a run that died mid-write
        remove_if_exists(join(out, TEMP_PREFIX + name))
    results = committed_results(out, specs, options.index, job)
    if results:
        log.info("%s: resuming; %d of %d shards already committed", out, len(results), len(specs))
    on_status(RunStatus(False, len(results), len(specs), sum(r.info.records for r in results.values()),
                        sum(r.info.bytes for r in results.values())))
    todo = [s for s in specs if s.file_name not in results]
    if runner is None:
        deduper = duplicates.Deduper(specs, results, existing) if options.dedupe else None
        for spec, result in _write_shards(job, out, todo, ordered, options, workers, progress, deduper):
            results[spec.file_name] = result  # its commit record was written before its rename
    elif todo:
        runner(job, out, todo, ordered, options)  # commits each shard and its record from the workers
        results = committed_results(out, specs, options.index, job)
        missing = [s.file_name for s in specs if s.file_name not in results]
        if missing:
            raise RuntimeError(
                f"{out}: the runner finished without committing {len(missing)} shard(s), e.g. {missing[0]}"
            )
    images = job.kind == "images"
    found = duplicates.report(specs, results, earlier, earlier_dropped) if images else None  # before empty shards go
    read = job.input_records(specs, ordered, results) if images else None
    rejected = [r for s in specs for r in results[s.file_name].rejected]
    stops.check()  # before any renumbering: a stop leaves the committed shards as they are, for the rerun
    specs, results = close_gaps(job, out, specs, results, options, fingerprint, planned, appending)
    return Committed(specs, results, found, read, rejected)


def _already_complete(out: str, existing: manifest_lib.Manifest, on_status) -> manifest_lib.Manifest:
    log.info("%s: already complete for these inputs and options; nothing to do", out)
    shards = sum(len(split.shards) for split in existing.splits.values())
    on_status(RunStatus(True, shards, shards, existing.total_records, existing.total_bytes))
    return existing
