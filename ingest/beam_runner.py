"""Writing the planned shards on Apache Beam (DirectRunner, Dataflow, Flink, Spark…), for datasets too big for one box.

Only the shard writing moves: the driver scans, plans, checks the output folder
and resumes exactly as a local run does (``ingest.engine.run_job``), then
hands Beam the shards still to do. In the pipeline every input is prepared by
the same picklable ``prepare`` the local workers run, grouped by shard, put
back in plan order, and written by the same ``write.write_shard`` — so the records,
the shard files and the manifest are byte for byte those of a local run. Each
shard is committed atomically by the worker that writes it (temporary name,
commit record, rename); the driver writes ``dataset.json`` last, once
every shard is committed. A retried bundle just rewrites the same shard.

Requires the ``beam`` extra: from a clone of tfshard, ``pip install -e ".[beam]"``.
"""

from __future__ import annotations

import functools
import logging
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from ..format import stops
from ..format.errors import InputError
from .state import record_commit
from .write import write_shard


def _prepare(task: tuple[int, int, Any], prepare) -> tuple[int, tuple[int, Any, Any]]:
    shard, position, item = task
    return shard, (position, item, prepare(item))


class _WriteShard:
    """A Beam DoFn body (wrapped below, so this module imports without Beam): one shard per key."""

    def __init__(self, job, out: str, todo, options):
        self.job, self.out, self.todo, self.options = job, out, todo, options

    def __call__(self, element: tuple[int, Iterable[tuple[int, Any, Any]]]) -> Iterable[str]:
        shard, entries = element
        spec = self.todo[shard]
        ordered = sorted(entries, key=lambda entry: entry[0])
        if [position for position, _, _ in ordered] != list(range(spec.num_records)):
            raise RuntimeError(f"{spec.file_name}: got {len(ordered)} of {spec.num_records} inputs; a runner bug")
        pairs = ((item, prepared) for _, item, prepared in ordered)
        write_shard(self.job, self.out, spec, pairs, self.options, record=functools.partial(record_commit, self.out,
                                                                                             spec))
        yield spec.file_name


def _quiet_beam_logs() -> None:
    """Beam's own INFO/WARNING logs off; it warns about optional GCP clients on the root logger at import."""
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    logging.disable(logging.WARNING)
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        pass  # __call__ says how to install it
    finally:
        logging.disable(logging.NOTSET)


class BeamRunner:
    """Runs the shard writing of a conversion as a Beam pipeline.

    Args:
      pipeline_args: Beam pipeline options, as a list or one shell-quoted string,
        e.g. ``"--runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing"``
        or ``"--runner=DataflowRunner --project=p --region=r --temp_location=gs://b/tmp --setup_file=./setup.py"``.
        Default: the DirectRunner.
      quiet_logs: silence Beam's own logs (the CLI does, unless -v/--debug).

    Example:
      convert_images("photos/", "gs://b/photos-tfr", runner=BeamRunner("--runner=DirectRunner"))
    """

    def __init__(self, pipeline_args: str | Sequence[str] | None = None, quiet_logs: bool = False):
        args = shlex.split(pipeline_args) if isinstance(pipeline_args, str) else list(pipeline_args or [])
        self.pipeline_args = args
        if quiet_logs:
            _quiet_beam_logs()

    def __call__(self, job, out: str, todo, ordered, options) -> None:
        try:
            import apache_beam as beam
            from apache_beam.options.pipeline_options import PipelineOptions
        except ImportError as e:
            raise InputError(
                f"--runner beam needs Apache Beam, which is not installed ({e}); from the tfshard clone, "
                "pip install -e '.[beam]'"
            ) from e

        class WriteShard(beam.DoFn):
            def __init__(self, body: _WriteShard):
                self.body = body

            def process(self, element):
                yield from self.body(element)

        tasks = [
            (shard, position, item)
            for shard, spec in enumerate(todo)
            for position, item in enumerate(ordered[spec.split][spec.start : spec.stop])
        ]
        try:
            with beam.Pipeline(options=PipelineOptions(self.pipeline_args)) as pipeline:
                _ = (
                    pipeline
                    | "Inputs" >> beam.Create(tasks)
                    | "Prepare" >> beam.Map(_prepare, job.prepare)
                    | "GroupByShard" >> beam.GroupByKey()
                    | "WriteShard" >> beam.ParDo(WriteShard(_WriteShard(job, out, todo, options)))
                )
        except Exception as e:  # runners re-raise or wrap worker errors: surface a bad input as its one-line error
            cause = e
            while cause is not None and not isinstance(cause, (InputError, KeyboardInterrupt)):
                cause = cause.__cause__ or cause.__context__
            if isinstance(cause, KeyboardInterrupt):  # a stop in a step, wrapped ("RuntimeError: KeyboardInterrupt
                stops.check()  # [while running 'WriteShard']"): the stop itself, as the command reports it
                raise cause.with_traceback(None) from None
            if cause is not None:  # Beam appends " [while running 'Step']"
                raise InputError(re.sub(r" \[while running '[^']*'\]$", "", str(cause))) from e
            raise
