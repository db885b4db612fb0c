"""A conversion as ``tfshard images`` and ``tfshard episodes`` run it: their flags as the converter's options and
runner, a line when it resumes (before the progress bar), and once it finishes the summary, what an append found
and where TFDS reads the dataset. The lines are ``tools/report.py``'s; the caller's ``say`` prints them (the library
itself never prints). Loads no TensorFlow.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable

from ..format import objects, stops
from ..format.names import MANIFEST_NAME, STATE_DIR
from ..ingest.holdout import Holdout
from ..ingest.options import ConvertOptions
from .report import append_lines, summary_lines

log = logging.getLogger(__name__)


def convert_options(shard_size: str, num_shards: int | None, min_shards: int, compression: str, seed: int,
                    shuffle: bool, on_error: str, index: bool, holdout: Holdout, **kind) -> ConvertOptions:
    """The ConvertOptions of the flags both commands share (``compression`` ``"none"`` is None, no ``shuffle`` keeps
    sorted order), plus the kind's own (``image=``, ``episode=``, ``dedupe=``).

    Example:
      convert_options("64MiB", None, 1, "gzip", 0, True, "skip", False, Holdout()).compression  # "gzip"
    """
    return ConvertOptions(shard_bytes=shard_size, num_shards=num_shards, min_shards=min_shards,
                          compression=None if compression == "none" else compression,
                          seed=seed if shuffle else None, on_error=on_error, index=index, holdout=holdout, **kind)


def runner(name: str, beam_options: str | None, debug: bool = False):
    """None for ``--runner local`` (worker processes here), else a BeamRunner running ``beam_options`` (default the
    DirectRunner); Beam's own logs are quiet unless ``debug`` or the library logs at INFO (-v).

    Raises:
      ValueError: ``beam_options`` without ``--runner beam``.
    """
    if name == "local":
        if beam_options:
            raise ValueError(f"--beam-options: only used with --runner beam (got {beam_options!r}); add --runner beam")
        return None
    from ..ingest.beam_runner import BeamRunner

    quiet = not (debug or logging.getLogger().isEnabledFor(logging.INFO))
    return BeamRunner(beam_options or "--runner=DirectRunner", quiet_logs=quiet)


def tfds_written(out: str, what: str, manifest) -> str:
    """The line after TFDS metadata (``what``) is written beside ``manifest``: how to open it and, after an append,
    how TFDS reads each whole split (each generation is a TFDS split of its own).

    Example:
      tfds_written("/data/out", "TFDS metadata", manifest)
      # "/data/out: wrote TFDS metadata; open it with tfds.builder_from_directory('/data/out')"
    """
    from ..format.tfds import tfds_read_splits

    whole = {split: names for split, names in tfds_read_splits(manifest).items() if "+" in names}
    return (f"{out}: wrote {what}; open it with tfds.builder_from_directory({out!r})"
            + "".join(f"; split={names!r} reads all of {split}" for split, names in whole.items()))


def convert_and_report(convert: Callable, src: str, out: str, options, say: Callable[[str], None],
                       quiet: bool = False, **run) -> None:
    """Runs ``convert(src, out, options, **run)`` with a progress bar; ``say``s when it resumes and, once it
    finishes, the summary lines (neither when ``quiet``). ``run["tfds"]``: it wrote TFDS metadata too.

    The library tells what it found in OUT through ``on_status`` (a ``RunStatus``).

    Example:
      convert_and_report(convert_images, "photos", "out", ConvertOptions(), print, workers=2)
      # out: 1,200 records in 2 shards ... (summary_lines)
    """
    if objects.uses_fsspec(out):
        _convert_to_store(convert, src, out, options, say, quiet, **run)
        return
    found = []

    def on_status(status) -> None:
        found.append(status)
        if status.resumed and not quiet:
            say(f"{out}: resumed: kept {status.kept_shards} of {status.total_shards} shards already committed")

    started = time.monotonic()
    manifest = convert(src, out, options, progress=not quiet, on_status=on_status, **run)
    stops.check()  # no summary after a stop, even one swallowed on its way
    if quiet:
        return
    status = found[0] if found else None
    for line in summary_lines(out, manifest, time.monotonic() - started, status):
        say(line)
    if status is not None and status.append is not None:
        for line in append_lines(out, status.append, status.complete):
            say(line)
    if run.get("tfds"):
        say(tfds_written(out, "TFDS metadata", manifest))


def staging_folder(url: str) -> str:
    """Where a conversion into the store folder ``url`` is staged: ``<default cache folder>/staging/<key>``, the
    key the sha256 of the URL (the same folder each time the same command runs, so a rerun resumes it)."""
    from ..readers.shard_cache.pipeline import default_folder

    return os.path.join(default_folder(), "staging", hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16])


def _convert_to_store(convert: Callable, src: str, url: str, options, say: Callable[[str], None], quiet: bool,
                      **run) -> None:
    """``tfshard images|episodes SRC s3://...``: converted into the URL's staging folder with all of a local
    conversion's resumable machinery, then pushed (``tools/push.py``); the same command resumes either."""
    from ..ingest.push import JOURNAL, push

    shown = objects.redact(url)
    if not objects.writes(url):
        raise ValueError(f"{shown}: tfshard writes datasets to s3://, az:// and abfs:// (got a "
                         f"{objects.scheme_of(url)}:// OUT); pass one of those, or a local folder")
    if run.get("append"):
        raise ValueError(f"{shown}: --append into an object store is not supported yet (got --append); append to the "
                         "local dataset, then `tfshard push OUT URL --overwrite`")
    if run.get("runner") is not None:
        raise ValueError(f"{shown}: --runner beam writes local and gs:// folders only (got an "
                         f"{objects.scheme_of(url)}:// OUT); use --runner local, or convert locally and "
                         "`tfshard push OUT URL`")
    staging = staging_folder(url)
    log.info("%s: staging the conversion in %s", shown, staging)
    if not quiet:
        say(f"{shown}: converting into the local staging folder {staging}, then uploading")
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    # a rerun of the conversion on a finished staging folder removes its state folder: the push journal is kept
    journal = os.path.join(staging, STATE_DIR, JOURNAL)
    kept = _read(journal) if os.path.isfile(journal) and not os.path.islink(journal) else None
    manifest_before = _sha256_of(os.path.join(staging, MANIFEST_NAME))
    convert_and_report(convert, src, staging, options, say, quiet, **run)
    if kept is not None and not os.path.exists(journal) and manifest_before == _sha256_of(
            os.path.join(staging, MANIFEST_NAME)):
        os.makedirs(os.path.dirname(journal), exist_ok=True)
        with open(journal, "wb") as f:
            f.write(kept)
    report = push(staging, url, overwrite=bool(run.get("overwrite")))
    if not quiet:
        for line in report.lines():
            say(line)


def _sha256_of(path: str) -> str | None:
    return hashlib.sha256(_read(path)).hexdigest() if os.path.isfile(path) else None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
