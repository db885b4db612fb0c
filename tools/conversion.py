"""A conversion as ``tfshard images`` and ``tfshard episodes`` run it: their flags as the converter's options and
runner, a line when it resumes (before the progress bar), and once it finishes the summary, what an append found
and where TFDS reads the dataset. The lines are ``tools/report.py``'s; the caller's ``say`` prints them (the library
itself never prints). Loads no TensorFlow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..format import objects, stops
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
    shown, staging, uploads = objects.redact(out), None, []
    if objects.uses_fsspec(out):  # converted in a local staging folder, then uploaded (ingest/to_store.py)
        from ..ingest.to_store import staging_folder

        staging = staging_folder(out)
        if not quiet:
            say(f"{shown}: converting into the local staging folder {staging}, then uploading")
        run["on_upload"] = uploads.append
    found = []

    def on_status(status) -> None:
        found.append(status)
        if status.resumed and not quiet:
            say(f"{shown}: resumed: kept {status.kept_shards} of {status.total_shards} shards already committed")

    started = time.monotonic()
    manifest = convert(src, out, options, progress=not quiet, on_status=on_status, **run)
    stops.check()  # no summary after a stop, even one swallowed on its way
    if quiet:
        return
    status = found[0] if found else None
    for line in summary_lines(shown, manifest, time.monotonic() - started, status):
        say(line)
    if status is not None and status.append is not None:
        for line in append_lines(shown, status.append, status.complete):
            say(line)
    if run.get("tfds"):  # TFDS reads local and gs:// folders: a store's dataset through its staging copy
        say(tfds_written(staging or out, "TFDS metadata", manifest))
    for report in uploads:
        for line in report.lines():
            say(line)
