"""Converting a source folder: ``convert_images`` and ``convert_episodes``, the converter's two entry points.

Each scans its source into a job of its kind (``ingest/kinds/``) and hands it
to the engine (``ingest/engine.py``), which plans, writes, commits and resumes
alike for both, and with ``tfds=True`` adds the TFDS metadata (``ingest/tfds.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..format import objects
from .append import append_images
from .append_checks import check_append_request
from .duplicates import check_dedupe
from .engine import check_folders, run_job
from .kinds.episodes import EpisodeJob
from .kinds.images import ImageJob
from .options import (
    DEFAULT_MAX_EPISODE_BYTES,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_QUALITY,
    ConvertOptions,
    options_of,
)
from .plan import DEFAULT_SHARD_BYTES
from .push import PushReport
from .resume import RunStatus
from .summary import ConversionResult
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


def _converted(make_job, default_on_error: str, src: str, out: str, options: ConvertOptions, *,
               on_status: Callable[[RunStatus], None] | None, on_upload: Callable[[PushReport], None] | None,
               **run) -> ConversionResult:
    """``_convert`` timed, with what it found in OUT and its uploads kept for the result's summary."""
    options.image if make_job.kind == "images" else options.episode  # noqa: B018 (the kind's own checks, first)
    found, uploads = [], []

    def status(value: RunStatus) -> None:
        found.append(value)
        if on_status is not None:
            on_status(value)

    def upload(report: PushReport) -> None:
        uploads.append(report)
        if on_upload is not None:
            on_upload(report)

    started = time.monotonic()
    manifest = _convert(make_job, default_on_error, src, out, options, on_status=status, on_upload=upload, **run)
    tfds_folder = None
    if run["tfds"]:  # TFDS reads local and gs:// folders: a store's dataset through its staging copy
        from .to_store import staging_folder

        tfds_folder = staging_folder(out) if objects.uses_fsspec(out) else out
    return ConversionResult(out, manifest, found[0] if found else None, time.monotonic() - started, tfds_folder,
                            tuple(uploads))


def convert_images(
    src: str,
    out: str,
    options: ConvertOptions | None = None,
    *,
    shard_size: int | str = DEFAULT_SHARD_BYTES,
    num_shards: int | None = None,
    min_shards: int = 1,
    compression: str | None = None,
    seed: int | None = 0,
    shuffle: bool = True,
    quality: int = DEFAULT_QUALITY,
    rgb: bool = False,
    max_side: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    validate: bool = True,
    on_error: str | None = None,
    labels: str | None = None,
    label_kind: str | None = None,
    val_fraction: float = 0.0,
    test_fraction: float = 0.0,
    split_seed: int = 0,
    stratify: bool = False,
    index: bool = False,
    dedupe: bool = False,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    runner: Callable | None = None,
    on_status: Callable[[RunStatus], None] | None = None,
    tfds: bool = False,
    append: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    on_upload: Callable[[PushReport], None] | None = None,
) -> ConversionResult:
    """Converts ``src/<class>/<image>`` (or ``src/<split>/<class>/<image>``, or any layout with ``labels``) into
    sharded TFRecords in ``out``: what ``tfshard images SRC OUT`` does, with its flags as keyword arguments of the
    same names (``--val-fraction 0.1`` is ``val_fraction=0.1``).

    Args:
      src: source folder.
      out: output folder (local or any ``tf.io.gfile`` URL); created if missing. An ``s3://``, ``az://`` or
        ``abfs://`` folder: converted into a local staging folder (``ingest.to_store.staging_folder(out)``, kept),
        then uploaded as ``tfshard push`` uploads, ``dataset.json`` last; the same call resumes either after a kill.
      options: a ``ConvertOptions`` (kept for code that builds one); a keyword below given another value than its
        default wins over its field.
      shard_size, num_shards, min_shards, compression, seed, shuffle, quality, rgb, max_side, max_pixels, validate,
        on_error, labels, label_kind, val_fraction, test_fraction, split_seed, stratify, index, dedupe: what to
        write, as the flags of the same names; each is documented in ``ConvertOptions``. ``on_error`` None:
        ``"skip"`` (a bad image is recorded in the manifest, with its reason).
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
        leaving every existing shard as it is (``ingest/append.py``), and not with ``overwrite``. The dataset's own
        options are remembered: each option left at its default takes the dataset's value (shard size, seed,
        image options, held-out rule, labels kind), so pass only SRC and a labels file of the new images; another
        value than the dataset's is refused, naming it. With ``tfds`` the TFDS metadata is rewritten after it
        (each appended generation is a TFDS split of its own: ``train_g0001``). ``on_status`` then gets
        ``RunStatus.append``; nothing new is ``complete``. Into a store, the append starts from the dataset there
        (no old shard is downloaded), and only the new files are uploaded, then ``dataset.json`` over the old one.
      storage_options: fsspec's options (``endpoint_url``, ``key``, ``secret``...) for an ``s3://``, ``az://`` or
        ``abfs://`` ``out`` and the objects under it only, in this process; refused with a local or ``gs://`` one.
      on_upload: with a store ``out``, called with the upload's ``ingest.push.PushReport`` (``.lines()``).

    Returns:
      A ``ConversionResult``: ``.manifest`` (also written to ``out/dataset.json``), and ``summary()``, the text the
      CLI prints (counts, rejects with reasons, unlabelled files, duplicates).

    Raises:
      FileNotFoundError: ``src`` does not exist.
      OptionError: an option out of its range, named as passed (``val_fraction``); the CLI names its flag.
      InputError: bad layout, a bad file with ``on_error="fail"``, or too few images for the shards asked; with
        ``append``, no dataset in ``out``, one without ``inputs.json``, a stratified one, or options, labels or
        held-out splits other than the dataset's (the error names the option).
      OutputExistsError: ``out`` holds something else and ``overwrite`` is False, or a file at a name this run
        needs (or one ``overwrite`` would remove) that tfshard cannot prove it wrote; nothing is removed then.
      InputError: ``tfds`` and TFDS could not open the metadata (a class name it cannot hold), before any shard.
      TfdsMetadataError: ``tfds`` and the metadata could not be written (the dataset is converted and
        complete; the message says why, and that ``tfshard tfds OUT`` adds the metadata later).

    Example:
      result = convert_images("photos/", "photos-tfr/", labels="train.csv", val_fraction=0.1)
      print(result.summary())  #   train  3,303 records  1 shards ... / labels: 3,670 images labelled (class, ...
      result.manifest.splits["val"].records  # 367
    """
    flags = {name: value for name, value in locals().items() if name in _FLAGS}  # the signature's option keywords
    return _converted(ImageJob, "skip", src, out, options_of(options, **flags), workers=workers,
                      overwrite=overwrite, progress=progress, runner=runner, on_status=on_status, tfds=tfds,
                      append=append, storage_options=storage_options, on_upload=on_upload)


def convert_episodes(
    src: str,
    out: str,
    options: ConvertOptions | None = None,
    *,
    shard_size: int | str = DEFAULT_SHARD_BYTES,
    num_shards: int | None = None,
    min_shards: int = 1,
    compression: str | None = None,
    seed: int | None = 0,
    shuffle: bool = True,
    on_nan: str = "fail",
    max_record_bytes: int | str = DEFAULT_MAX_RECORD_BYTES,
    max_episode_bytes: int | str = DEFAULT_MAX_EPISODE_BYTES,
    on_error: str | None = None,
    labels: str | None = None,
    label_kind: str | None = None,
    class_folders: bool = True,
    val_fraction: float = 0.0,
    test_fraction: float = 0.0,
    split_seed: int = 0,
    stratify: bool = False,
    index: bool = False,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    runner: Callable | None = None,
    on_status: Callable[[RunStatus], None] | None = None,
    tfds: bool = False,
    append: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    on_upload: Callable[[PushReport], None] | None = None,
) -> ConversionResult:
    """Converts numpy episodes under ``src`` (``.npy``/``.npz``, time on axis 0, recursive) into sharded TFRecords:
    what ``tfshard episodes SRC OUT`` does, with its flags as keyword arguments of the same names.

    One record per episode, or per chunk of ``max_record_bytes`` for longer ones, with raw little-endian bytes per
    feature; the manifest holds each feature's dtype and trailing shape, per-feature mean/std, and every
    episode's id, source and length (so window counts need no data pass). Same plan, workers, atomic commits and
    resume as ``convert_images``. Episodes are labelled by class folders (``src/<class>/<episode>``) or by a
    labels CSV (``labels``).

    Args:
      src: source folder; ``src/<split>/...`` when every top-level folder is a split name.
      out: output folder (local, any ``tf.io.gfile`` URL, or a store's as for ``convert_images``).
      options: a ``ConvertOptions``, as for ``convert_images``.
      shard_size, num_shards, min_shards, compression, seed, shuffle, on_nan, max_record_bytes, max_episode_bytes,
        on_error, labels, label_kind, class_folders, val_fraction, test_fraction, split_seed, stratify, index: what
        to write, as the flags of the same names (``ConvertOptions``). ``on_error`` None means ``"fail"`` here: an
        unreadable or mismatched episode stops the run unless ``"skip"`` is asked (empty episodes are always
        skipped, with their reason recorded).
      workers, overwrite, progress, runner, on_status, tfds, storage_options, on_upload: as for
        ``convert_images``.
      append: refused for now (an ``InputError``): episode datasets cannot be appended to.

    Returns:
      A ``ConversionResult``, as for ``convert_images``.

    Raises:
      FileNotFoundError: ``src`` does not exist.
      OptionError: an option out of its range, named as passed (``on_nan``).
      InputError: no episodes, a bad episode (or labels row) with ``on_error="fail"``, a NaN with
        ``on_nan="fail"``, a bad labels file, a feature named ``label`` in a labelled dataset.
      OutputExistsError, TfdsMetadataError: as for ``convert_images``.

    Example:
      result = convert_episodes("runs/", "runs-tfr/", max_record_bytes="16MiB")
      result.manifest.splits["train"].episode_lengths[:3]  # [5120, 19876, 8003]
    """
    flags = {name: value for name, value in locals().items() if name in _FLAGS}  # the signature's option keywords
    return _converted(EpisodeJob, "fail", src, out, options_of(options, **flags), workers=workers,
                      overwrite=overwrite, progress=progress, runner=runner, on_status=on_status, tfds=tfds,
                      append=append, storage_options=storage_options, on_upload=on_upload)


_FLAGS = frozenset(field.name for field in dataclasses.fields(ConvertOptions))
