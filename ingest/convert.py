"""The conversion engine, shared by every kind of input: plan, prepare in parallel, write, commit.

``convert_images`` and ``convert_episodes`` scan their source into a job
(``ingest/jobs.py``); everything after the scan is this one loop.

Resumable (``ingest/resume.py``): a rerun of the same command keeps every
committed shard and ends byte-identical to an uninterrupted run. The manifest is
written last; the state folder is removed after it. What a run found in OUT
(already complete, or how many shards it kept) goes to its ``on_status``
callback as a ``RunStatus`` (and to the log at INFO); the return value stays the manifest.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import time
from typing import Any, Callable, Iterable, Iterator

import tqdm

from ..format import manifest as manifest_lib
from .errors import InputError
from .episodes import EpisodeOptions
from .images import ImageOptions
from .kind import Kind
from .parallel import default_workers, ordered_map
from ..format.names import COMPRESSIONS, STATE_DIR, index_file_name
from .plan import DEFAULT_SHARD_BYTES, ShardSpec, parse_size, plan_split, shuffled_order
from .resume import (RunStatus, ShardResult, committed_results, complete_dataset, prepare_output,  # noqa: F401
                     record_commit)  # (RunStatus: part of this module's API)
from .scan import Rejection

log = logging.getLogger(__name__)

ON_ERROR = (None, "skip", "fail")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides what a conversion writes.

    Attributes:
      shard_bytes: target shard size in bytes (planned from input file sizes), or a size such as ``"64MiB"``.
      num_shards: exact shards per split; wins over ``shard_bytes``.
      min_shards: at least this many shards per split (one per reader worker).
      compression: None or ``"gzip"``.
      seed: seed of the write-time shuffle of record order; None keeps sorted order.
      on_error: ``"skip"`` records a bad file in the manifest and goes on;
        ``"fail"`` stops at the first; None: the kind's default (images skip,
        episodes fail). Not part of the output's identity.
      index: also write DALI ``tfrecord2idx`` index files.
      image: how images are validated and converted (image datasets).
      episode: how episodes are checked and cut into records (episode datasets).
    """

    shard_bytes: int = DEFAULT_SHARD_BYTES
    num_shards: int | None = None
    min_shards: int = 1
    compression: str | None = None
    seed: int | None = 0
    on_error: str | None = None
    index: bool = False
    image: ImageOptions = ImageOptions()
    episode: EpisodeOptions = EpisodeOptions()

    def __post_init__(self):
        object.__setattr__(self, "shard_bytes", parse_size(self.shard_bytes, "shard_bytes"))  # "64MiB" as the CLI takes
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"num_shards: must be at least 1 (got {self.num_shards!r}); or leave it unset")
        if self.min_shards < 1:
            raise ValueError(f"min_shards: must be at least 1 (got {self.min_shards!r})")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression: must be one of {COMPRESSIONS} (got {self.compression!r})")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error: must be one of {ON_ERROR} (got {self.on_error!r})")
        if self.index and self.compression is not None:
            raise ValueError(
                f"index: DALI index files need uncompressed shards (got compression={self.compression!r}); "
                "drop --index or --compression"
            )

    def identity(self, kind: str) -> dict:
        """The options that change the written bytes of a ``kind`` dataset (``on_error`` never does)."""
        other_kind = {"images": "episode", "episodes": "image"}[kind]
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("on_error", other_kind)}


def _plan(job: Kind, options: ConvertOptions) -> tuple[dict[str, list], list[ShardSpec]]:
    ordered, specs = {}, []
    for split, items in job.items.items():
        if not items:
            log.warning("%s: split %r has no usable inputs; it is left out", job.src, split)
            continue
        ordered[split] = [items[i] for i in shuffled_order(len(items), options.seed)]
        try:
            specs += plan_split(
                split,
                [job.size_of(item) for item in ordered[split]],
                target_bytes=options.shard_bytes,
                num_shards=options.num_shards,
                min_shards=options.min_shards,
                compression=options.compression,
            )
        except ValueError as e:
            found, asked = len(ordered[split]), max(options.num_shards or 0, options.min_shards)
            if asked <= found:
                raise InputError(f"{job.src}: split {split!r}: {e}") from e
            raise InputError(
                f"{job.src}: split {split!r}: {asked} shards asked for (got num_shards={options.num_shards!r}, "
                f"min_shards={options.min_shards!r}) but only {found} {job.unit} inputs were found, counted before "
                f"validation (the scan rejected {len(job.rejected)} in all); ask for at most {found} shards, fewer "
                "if some inputs are rejected"
            ) from e
    if not specs:
        raise InputError(f"{job.src}: {job.nothing_found}")
    return ordered, specs


def _fingerprint(job: Kind, ordered: dict[str, list], options: ConvertOptions) -> str:
    return manifest_lib.fingerprint(
        {
            "kind": job.kind,
            "options": options.identity(job.kind),
            "inputs": job.identity(),
            "sources": {s: [job.source_key(item) for item in items] for s, items in ordered.items()},
        }
    )


def write_shard(job: Kind, out: str, spec: ShardSpec, prepared: Iterable[tuple[Any, Any]], options: ConvertOptions,
                on_item: Callable[[Any], None] = lambda item: None) -> ShardResult:
    """Writes one planned shard from its ``(item, EncodedItem | Rejection)`` pairs in plan order; commits it atomically.

    The one place records reach a shard, for the local process pool and the Beam runner alike: the workers
    made and framed the records, so this appends their bytes and adds up their statistics.
    """
    from .write import ShardWriter

    stats, rejected = job.new_stats(), []
    with ShardWriter(out, spec.file_name, options.compression, options.index) as writer:
        for item, result in prepared:
            if isinstance(result, Rejection):
                if options.on_error == "fail" and not result.chosen:
                    raise InputError(
                        f"{os.path.join(job.src, result.relpath)}: {result.reason}; "
                        "or pass --on-error skip to leave bad files out"
                    )
                rejected.append({"path": result.relpath, "reason": result.reason})
            else:
                writer.append(result.data, result.record_sizes)
                job.count(result.stats, stats)
            on_item(item)
    return ShardResult(writer.info, stats, rejected)


def _write_shards(
    job: Kind, out: str, todo: list[ShardSpec], ordered: dict[str, list], options: ConvertOptions, workers: int,
    progress: bool,
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
                yield spec, write_shard(job, out, spec, pairs, options, on_item)
        finally:
            results.close()


def _assemble(
    job: Kind, specs: list[ShardSpec], results: dict[str, ShardResult], options: ConvertOptions, fingerprint: str
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
        ignored=job.ignored,
        ignored_files=job.ignored_files,
    )


def _check_folders(src: str, out: str) -> None:
    if not out:
        raise InputError(f"output folder: an empty path (got {out!r}); pass the folder to write (created if missing)")
    if "://" not in out and "://" not in src:
        src_real, out_real = os.path.realpath(src), os.path.realpath(out)
        if out_real == src_real or out_real.startswith(src_real + os.sep):
            raise InputError(f"{out}: output folder is inside the source folder {src}; choose a folder outside it")


def run_job(job: Kind, out: str, options: ConvertOptions, *, workers: int | None, overwrite: bool, progress: bool,
            runner: Callable | None = None, on_status: Callable[[RunStatus], None] | None = None):
    """Plans, writes and commits the shards of a scanned job, then its manifest; resumes where a run died.

    Holds ``OUT/.tfshard-lock`` throughout, so a second conversion into the same OUT fails at once.
    ``runner`` (e.g. ``ingest.beam_runner.BeamRunner``) writes the shards still to do elsewhere;
    planning, resume and the manifest stay here, so both produce the same files. ``on_status`` is
    called once with a ``RunStatus`` before any shard is written.

    Raises:
      OutputLockedError: another conversion is writing into ``out``.
      OSError: ``errno.ENOSPC`` when the disk fills up (committed shards are kept for the rerun).
    """
    import tensorflow as tf

    from .lock import output_lock
    from ..format.dataset import check_output_folder
    from ..format.storage import check_bucket

    from ..format.tfrecord import SLOW_CRC32C

    if SLOW_CRC32C:
        log.warning("google-crc32c has no compiled extension on this platform; framing records will be slow "
                    "(pip install --force-reinstall google-crc32c, or use a platform it ships wheels for)")
    workers = default_workers() if workers is None else workers
    ordered, specs = _plan(job, options)
    fingerprint = _fingerprint(job, ordered, options)
    check_output_folder(out)
    check_bucket(out)
    if not overwrite:  # found without the lock, which a read-only OUT could not give
        existing = complete_dataset(out, fingerprint)
        if existing is not None:
            return _already_complete(out, existing, on_status or (lambda status: None))
    tf.io.gfile.makedirs(out)
    try:
        with output_lock(out):
            return _run_locked(job, out, options, ordered, specs, fingerprint, workers=workers, overwrite=overwrite,
                               progress=progress, runner=runner, on_status=on_status or (lambda status: None))
    except tf.errors.ResourceExhaustedError as e:
        raise _no_space(out) from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _no_space(out) from e
        raise


def _no_space(out: str) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"{out}: no space left on the device; free space (or choose a folder on a larger disk) and run the same "
        "command again: committed shards are kept",
    )


def _run_locked(job: Kind, out, options, ordered, specs, fingerprint, *, workers, overwrite, progress, runner, on_status):
    import tensorflow as tf

    from ..format.storage import join

    from ..format.names import TEMP_PREFIX

    from .renumber import undo_unfinished_renumbering
    from .write import remove_if_exists, write_text_atomic

    planned = [s.file_name for s in specs]
    if options.index:
        planned += [index_file_name(n) for n in planned]
    existing = prepare_output(out, fingerprint, overwrite, planned + [manifest_lib.MANIFEST_NAME])
    if existing is not None:
        return _already_complete(out, existing, on_status)
    undo_unfinished_renumbering(out)  # before plan.json forgets the renamed files' names
    state = join(out, STATE_DIR)
    write_text_atomic(join(state, "plan.json"), json.dumps({"fingerprint": fingerprint, "files": planned}))
    for name in planned + [manifest_lib.MANIFEST_NAME]:  # temporaries of a run that died mid-write
        remove_if_exists(join(out, TEMP_PREFIX + name))
    results = committed_results(out, specs, options.index, job)
    if results:
        log.info("%s: resuming; %d of %d shards already committed", out, len(results), len(specs))
    on_status(RunStatus(False, len(results), len(specs), sum(r.info.records for r in results.values()),
                        sum(r.info.bytes for r in results.values())))
    todo = [s for s in specs if s.file_name not in results]
    if runner is None:
        for spec, result in _write_shards(job, out, todo, ordered, options, workers, progress):
            record_commit(out, spec, result)
            results[spec.file_name] = result
    elif todo:
        runner(job, out, todo, ordered, options)  # commits each shard and its record from the workers
        results = committed_results(out, specs, options.index, job)
        missing = [s.file_name for s in specs if s.file_name not in results]
        if missing:
            raise RuntimeError(
                f"{out}: the runner finished without committing {len(missing)} shard(s), e.g. {missing[0]}"
            )
    specs, results = _close_gaps(job, out, specs, results, options, fingerprint, planned)
    manifest = _assemble(job, specs, results, options, fingerprint)
    write_text_atomic(join(out, manifest_lib.MANIFEST_NAME), manifest_lib.to_json(manifest))
    tf.io.gfile.rmtree(state)
    return manifest


def _already_complete(out: str, existing: manifest_lib.Manifest, on_status) -> manifest_lib.Manifest:
    log.info("%s: already complete for these inputs and options; nothing to do", out)
    shards = sum(len(split.shards) for split in existing.splits.values())
    on_status(RunStatus(True, shards, shards, existing.total_records, existing.total_bytes))
    return existing


def _close_gaps(job: Kind, out: str, specs: list[ShardSpec], results: dict[str, ShardResult], options,
                fingerprint: str, planned: list[str]) -> tuple[list[ShardSpec], dict[str, ShardResult]]:
    """Drops shards that hold no record (every input rejected) and renumbers the rest (``ingest/renumber.py``)."""
    from .renumber import apply_renumbering, check_requested_shards, plan_renumbering

    records = {name: result.info.records for name, result in results.items()}
    renumbering = plan_renumbering(specs, records, compression=options.compression, index=options.index)
    if not renumbering.dropped:
        return specs, results
    check_requested_shards(job.src, renumbering, specs, records, num_shards=options.num_shards,
                           min_shards=options.min_shards, unit=job.unit)
    if not renumbering.specs:
        first = next(r for result in results.values() for r in result.rejected)
        raise InputError(f"{job.src}: every input was rejected, e.g. {first['path']}: {first['reason']}; "
                         "no dataset is written")
    for split in dict.fromkeys(s.split for s in specs):
        if not any(s.split == split for s in renumbering.specs):
            log.warning("%s: split %r: every input was rejected; it is left out", job.src, split)
    apply_renumbering(out, renumbering, fingerprint, planned)
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


def _convert(make_job, default_on_error: str, src: str, out: str, options: ConvertOptions, **run):
    """Checks the folders, settles the kind's ``on_error`` default, scans ``src`` into a job and runs it."""
    _check_folders(src, out)
    if options.on_error is None:
        options = dataclasses.replace(options, on_error=default_on_error)
    return run_job(make_job(src, options), out, options, **run)


def convert_images(
    src: str,
    out: str,
    options: ConvertOptions = ConvertOptions(),
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    runner: Callable | None = None,
    on_status: Callable[[RunStatus], None] | None = None,
) -> manifest_lib.Manifest:
    """Converts ``src/<class>/<image>`` (or ``src/<split>/<class>/<image>``) into sharded TFRecords in ``out``.

    Args:
      src: source folder.
      out: output folder (local or any ``tf.io.gfile`` URL); created if missing.
      options: what to write; see ``ConvertOptions``.
      workers: worker processes for decoding (default: all usable CPUs; 0 runs in-process).
      overwrite: replace a dataset in ``out`` that was made from other inputs or options.
      progress: show a tqdm progress bar.
      runner: None writes with local worker processes; ``ingest.beam_runner.BeamRunner(args)``
        writes the shards on Apache Beam (same files; planning, resume and the manifest stay here).
      on_status: called once, before any shard is written, with a ``RunStatus``: whether ``out``
        already held this dataset (nothing is converted) or how many committed shards a rerun keeps.

    Returns:
      The manifest, also written to ``out/dataset.json``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      InputError: bad layout, a bad file with ``on_error="fail"``, or too few images for the shards asked.
      OutputExistsError: ``out`` holds something else and ``overwrite`` is False.

    Example:
      m = convert_images("flowers/", "flowers-tfr/")
      m.splits["train"].records, [s.file for s in m.splits["train"].shards]  # 3670, ['train-00000-of-00002...
    """
    from .jobs import ImageJob

    return _convert(ImageJob, "skip", src, out, options, workers=workers, overwrite=overwrite, progress=progress,
                    runner=runner, on_status=on_status)


def convert_episodes(
    src: str,
    out: str,
    options: ConvertOptions = ConvertOptions(),
    *,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    runner: Callable | None = None,
    on_status: Callable[[RunStatus], None] | None = None,
) -> manifest_lib.Manifest:
    """Converts numpy episodes under ``src`` (``.npy``/``.npz``, time on axis 0, recursive) into sharded TFRecords.

    One record per episode, or per chunk of ``options.episode.max_record_bytes``
    for longer ones, with raw little-endian bytes per feature; the manifest holds
    each feature's dtype and trailing shape, per-feature mean/std, and every
    episode's id, source and length (so window counts need no data pass). Same
    plan, workers, atomic commits and resume as ``convert_images``.

    Args:
      src: source folder; ``src/<split>/...`` when every top-level folder is a split name.
      out: output folder (local or any ``tf.io.gfile`` URL); created if missing.
      options: what to write; ``options.episode`` sets the NaN policy and chunk size.
        ``on_error=None`` means ``"fail"`` here: an unreadable or mismatched
        episode stops the run unless ``"skip"`` is asked (empty episodes are
        always skipped, with their reason recorded).
      workers, overwrite, progress, runner, on_status: as for ``convert_images``.

    Returns:
      The manifest, also written to ``out/dataset.json``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      InputError: no episodes, a bad episode with ``on_error="fail"``, a NaN with ``on_nan="fail"``.
      OutputExistsError: ``out`` holds something else and ``overwrite`` is False.

    Example:
      m = convert_episodes("runs/", "runs-tfr/")
      m.splits["train"].episode_lengths[:3]  # [5120, 19876, 8003]
    """
    from .jobs import EpisodeJob

    return _convert(EpisodeJob, "fail", src, out, options, workers=workers, overwrite=overwrite, progress=progress,
                    runner=runner, on_status=on_status)
