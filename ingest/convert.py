"""Converting a source folder: ``convert_images`` and ``convert_episodes``, the converter's two entry points.

Each scans its source into a job of its kind (``ingest/kinds/``) and hands it
to the engine (``ingest/engine.py``), which plans, writes, commits and resumes
alike for both, and with ``tfds=True`` adds the TFDS metadata (``ingest/tfds.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from ..format import manifest as manifest_lib
from ..format import objects
from .append import append_images
from .append_checks import check_append_request
from .duplicates import check_dedupe
from .engine import check_folders, run_job
from .kinds.episodes import EpisodeJob
from .kinds.images import ImageJob
from .options import ConvertOptions
from .push import PushReport
from .resume import RunStatus
from .tfds import check_tfds_request


def _convert(make_job, default_on_error: str, src: str, out: str, options: ConvertOptions, *, tfds: bool,
             append: bool, storage_options: Mapping[str, Any] | None = None,
             on_upload: Callable[[PushReport], None] | None = None, **run):
    """Checks the folders (and a ``tfds`` or ``append`` request), settles the kind's ``on_error`` default, scans
    ``src`` into a job and runs it (or appends its new inputs, ``ingest/append.py``); into a store's URL, the same
    staged locally, then uploaded (``ingest/to_store.py``)."""
    if append:
        check_append_request(make_job.kind, run["overwrite"])
    if tfds:
        check_tfds_request(options.compression)
    objects.use_storage_options(out, storage_options)  # for this URL alone; refused with a local or gs:// OUT
    if objects.uses_fsspec(out):
        from .to_store import convert_to_store

        check_folders(src, out)
        local = functools.partial(_convert, make_job, default_on_error)
        return convert_to_store(local, src, out, options, tfds=tfds, append=append, on_upload=on_upload, **run)
    check_folders(src, out)
    check_dedupe(make_job.kind, options.dedupe, run.get("runner"))  # before the scan
    if options.on_error is None:
        options = dataclasses.replace(options, on_error=default_on_error)
    if append:
        run.pop("overwrite")
        return append_images(src, out, options, tfds=tfds, **run)
    return run_job(make_job(src, options), out, options, tfds=tfds, **run)


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
    tfds: bool = False,
    append: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    on_upload: Callable[[PushReport], None] | None = None,
) -> manifest_lib.Manifest:
    """Converts ``src/<class>/<image>`` (or ``src/<split>/<class>/<image>``) into sharded TFRecords in ``out``.

    Args:
      src: source folder.
      out: output folder (local or any ``tf.io.gfile`` URL); created if missing. An ``s3://``, ``az://`` or
        ``abfs://`` folder: converted into a local staging folder (``ingest.to_store.staging_folder(out)``, kept),
        then uploaded as ``tfshard push`` uploads, ``dataset.json`` last; the same call resumes either after a kill.
      options: what to write; see ``ConvertOptions``.
      workers: worker processes for decoding (default: all usable CPUs; 0 runs in-process).
      overwrite: replace a dataset in ``out`` that was made from other inputs or options. Only files tfshard can
        prove it wrote (their recorded size and sha256) are removed or replaced, never anything else.
      progress: show a tqdm progress bar.
      runner: None writes with local worker processes; ``ingest.beam_runner.BeamRunner(args)``
        writes the shards on Apache Beam (same files; planning, resume and the manifest stay here).
      on_status: called once, before any shard is written, with a ``RunStatus``: whether ``out``
        already held this dataset (nothing is converted) or how many committed shards a rerun keeps.
      tfds: also write TFDS metadata beside ``dataset.json`` once it is written (also when ``out`` already
        held this dataset), the files ``tfshard tfds OUT`` writes, so ``tfds.builder_from_directory(out)``
        opens it. Needs the ``tfds`` extra and uncompressed shards (checked before any work); what TFDS could not
        open is refused before any shard is written.
      append: convert only the images not yet in the dataset in ``out`` into new shards of its next generation,
        leaving every existing shard as it is (``ingest/append.py``); with the dataset's own options, and not with
        ``overwrite``. With ``tfds`` the TFDS metadata is rewritten after it (each appended generation is a TFDS
        split of its own: ``train_g0001``). ``on_status`` then gets ``RunStatus.append``; nothing new is
        ``complete``. Into a store, the append starts from the dataset there (no old shard is downloaded), and
        only the new files are uploaded, then ``dataset.json`` over the old one.
      storage_options: fsspec's options (``endpoint_url``, ``key``, ``secret``...) for an ``s3://``, ``az://`` or
        ``abfs://`` ``out`` and the objects under it only, in this process; refused with a local or ``gs://`` one.
      on_upload: with a store ``out``, called with the upload's ``ingest.push.PushReport`` (``.lines()``).

    Returns:
      The manifest, also written to ``out/dataset.json``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      InputError: bad layout, a bad file with ``on_error="fail"``, or too few images for the shards asked; with
        ``append``, no dataset in ``out``, one without ``inputs.json``, a stratified one, or options, labels or
        held-out splits other than the dataset's (the error names the option).
      OutputExistsError: ``out`` holds something else and ``overwrite`` is False, or a file at a name this run
        needs (or one ``overwrite`` would remove) that tfshard cannot prove it wrote; nothing is removed then.
      InputError: ``tfds`` and TFDS could not open the metadata (a class name it cannot hold), before any shard.
      TfdsMetadataError: ``tfds`` and the metadata could not be written (the dataset is converted and
        complete; the message says why, and that ``tfshard tfds OUT`` adds the metadata later).

    Example:
      m = convert_images("flowers/", "flowers-tfr/")
      m.splits["train"].records, [s.file for s in m.splits["train"].shards]  # 3670, ['train-00000-of-00002...
      convert_images("flowers/", "s3://bucket/flowers-tfr", storage_options={"endpoint_url": "http://minio:9000"})
    """
    return _convert(ImageJob, "skip", src, out, options, workers=workers, overwrite=overwrite, progress=progress,
                    runner=runner, on_status=on_status, tfds=tfds, append=append,
                    storage_options=storage_options, on_upload=on_upload)


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
    tfds: bool = False,
    append: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    on_upload: Callable[[PushReport], None] | None = None,
) -> manifest_lib.Manifest:
    """Converts numpy episodes under ``src`` (``.npy``/``.npz``, time on axis 0, recursive) into sharded TFRecords.

    One record per episode, or per chunk of ``options.episode.max_record_bytes``
    for longer ones, with raw little-endian bytes per feature; the manifest holds
    each feature's dtype and trailing shape, per-feature mean/std, and every
    episode's id, source and length (so window counts need no data pass). Same
    plan, workers, atomic commits and resume as ``convert_images``. Episodes are
    labelled by class folders (``src/<class>/<episode>``) or by a labels CSV
    (``options.episode.labels_file``); see ``EpisodeOptions``.

    Args:
      src: source folder; ``src/<split>/...`` when every top-level folder is a split name.
      out: output folder (local, any ``tf.io.gfile`` URL, or a store's as for ``convert_images``).
      options: what to write; ``options.episode`` sets the NaN policy and chunk size.
        ``on_error=None`` means ``"fail"`` here: an unreadable or mismatched
        episode stops the run unless ``"skip"`` is asked (empty episodes are
        always skipped, with their reason recorded).
      workers, overwrite, progress, runner, on_status, tfds, storage_options, on_upload: as for
        ``convert_images``.
      append: refused for now (an ``InputError``): episode datasets cannot be appended to.

    Returns:
      The manifest, also written to ``out/dataset.json``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      InputError: no episodes, a bad episode (or labels row) with ``on_error="fail"``, a NaN with
        ``on_nan="fail"``, a bad labels file, a feature named ``label`` in a labelled dataset.
      OutputExistsError, TfdsMetadataError: as for ``convert_images``.

    Example:
      m = convert_episodes("runs/", "runs-tfr/")
      m.splits["train"].episode_lengths[:3]  # [5120, 19876, 8003]
    """
    return _convert(EpisodeJob, "fail", src, out, options, workers=workers, overwrite=overwrite, progress=progress,
                    runner=runner, on_status=on_status, tfds=tfds, append=append,
                    storage_options=storage_options, on_upload=on_upload)
