"""A conversion as ``tfshard images`` and ``tfshard episodes`` run it: the runner of their flags, a line when it
resumes (before the progress bar), and once it finishes the result's summary (``ingest/summary.py``), the caller's
``say`` prints them (the library itself never prints). Their options go to the converter under the flags' own
names. Loads no TensorFlow.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

from ..format import objects, stops

log = logging.getLogger(__name__)


CLI_ONLY = ("src", "out", "quiet", "runner", "beam_options", "storage_option")  # what the CLI itself handles


def keywords(flags: dict[str, Any]) -> dict[str, Any]:
    """The converter's keyword arguments of a conversion command's flags (its parameters, by name): the same names
    (so a flag the converter does not take fails at once), a choice as its value (``--compression none``: "none").

    Example:
      keywords({"src": "photos", "val_fraction": 0.1, "compression": Compression.none})
      # {"val_fraction": 0.1, "compression": "none"}
    """
    return {name: value.value if isinstance(value, enum.Enum) else value for name, value in flags.items()
            if name not in CLI_ONLY}


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


def convert_and_report(convert: Callable, src: str, out: str, say: Callable[[str], None], quiet: bool = False,
                       **run) -> None:
    """Runs ``convert(src, out, **run)`` with a progress bar; ``say``s when it resumes and, once it finishes, the
    result's summary (``ConversionResult.lines``; neither when ``quiet``).

    The library tells what it found in OUT through ``on_status`` (a ``RunStatus``).

    Example:
      convert_and_report(convert_images, "photos", "out", print, workers=2, val_fraction=0.1)
      # out: 1,200 records in 2 shards ... (the result's summary)
    """
    shown = objects.redact(out)
    if objects.uses_fsspec(out) and not quiet:  # converted in a local staging folder, then uploaded
        from ..ingest.to_store import staging_folder

        say(f"{shown}: converting into the local staging folder {staging_folder(out)}, then uploading")

    def on_status(status) -> None:
        if status.resumed and not quiet:
            say(f"{shown}: resumed: kept {status.kept_shards} of {status.total_shards} shards already committed")

    result = convert(src, out, progress=not quiet, on_status=on_status, **run)
    stops.check()  # no summary after a stop, even one swallowed on its way
    if not quiet:
        for line in result.lines():
            say(line)
