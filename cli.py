"""``tfshard``: a thin typer layer. Each command parses its flags, calls one library function and prints.

Library errors become one line on stderr and a non-zero exit (``EXIT_CODES``); ``--debug`` shows the traceback.
TensorFlow is loaded once, quietly, by the commands that need it (``_load_tensorflow``), before any module that
imports it: the converter's engine, the readers and the tools are imported inside the commands for that reason
(only the pure modules, which never load TensorFlow, at the top).
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import sys
import time
from typing import Optional

import typer

from .format import stops
from .format.storage import prefer_small_gcs_blocks
from .ingest.holdout import Holdout
from .ingest.options import ConvertOptions, EpisodeOptions, ImageOptions
from .tools import console
from .tools.console import EXIT_CODES, global_flags_first  # noqa: F401  (the command's API)
from .tools.report import append_lines, describe_lines, summary_lines, window_of

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Sharded TFRecords from image folders and numpy episodes, verified.")
_state = {"debug": False}


class OnError(str, enum.Enum):
    skip = "skip"
    fail = "fail"


class Runner(str, enum.Enum):
    local = "local"
    beam = "beam"


class LabelKind(str, enum.Enum):
    class_ = "class"
    multi = "multi"
    value = "value"


class Compression(str, enum.Enum):
    none = "none"
    gzip = "gzip"


class OnNan(str, enum.Enum):
    fail = "fail"
    skip = "skip"
    keep = "keep"


# --- what every command shares (tools/console.py) -------------------------------------------------------------------


def _load_tensorflow() -> None:
    console.load_tensorflow(_state["debug"])


def _errors() -> tuple[type[BaseException], ...]:
    return console.reportable()


def _fail(error: BaseException) -> None:
    if _state["debug"]:
        raise error
    typer.echo(console.one_line(error), err=True)
    raise typer.Exit(1)


def _stopped(what: str, error: KeyboardInterrupt, resumable: bool = False) -> None:
    if _state["debug"]:
        raise error
    line, code = console.stopped(what, error, resumable)
    typer.echo(line, err=True)
    raise typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"tfshard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug",
                               help="Show tracebacks and TensorFlow's own logs (anywhere on the line)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does (anywhere on the line)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = debug
    if not debug:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    prefer_small_gcs_blocks()  # before TensorFlow first touches gs://
    logging.basicConfig(level=logging.INFO if verbose or debug else logging.WARNING,
                        format="%(levelname)s: %(message)s")


def _echo_lines(lines) -> None:
    try:
        for line in lines:
            typer.echo(line)
    finally:
        if hasattr(lines, "close"):  # a generator's clean-up (say, a temporary cache) runs however the loop ends
            lines.close()


# --- converting -----------------------------------------------------------------------------------------------------


def _runner(runner: Runner, beam_options: str | None):
    """None for local worker processes, else a BeamRunner (Beam's own logs quiet unless -v/--debug)."""
    if runner is Runner.local:
        if beam_options:
            raise ValueError(f"--beam-options: only used with --runner beam (got {beam_options!r}); add --runner beam")
        return None
    from .ingest.beam_runner import BeamRunner

    quiet = not (_state["debug"] or logging.getLogger().isEnabledFor(logging.INFO))
    return BeamRunner(beam_options or "--runner=DirectRunner", quiet_logs=quiet)


# Held-out splits: the same options, and meaning, for both conversion commands (ingest/holdout.py).
_VAL_FRACTION = typer.Option(0.0, "--val-fraction", help="Hold out this share of train as a val split (by a "
                             "seeded hash of each file's path: stable when files are added or removed).")
_TEST_FRACTION = typer.Option(0.0, "--test-fraction", help="Hold out this share of train as a test split.")
_SPLIT_SEED = typer.Option(0, "--split-seed", help="Seed of the held-out splits' hash.")
_STRATIFY = typer.Option(False, "--stratify", help="Exact per-class held-out counts instead of the per-file hash "
                         "(class labels only; a file's split may then move when others are added).")


def _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index, holdout,
                     **kind):
    """The ConvertOptions both conversion commands share, plus the kind's own (``image=`` or ``episode=``).

    ``holdout``: ``(val_fraction, test_fraction, split_seed, stratify)`` as the options give them.
    """
    return ConvertOptions(shard_bytes=shard_size, num_shards=num_shards, min_shards=min_shards,
                          compression=None if compression is Compression.none else compression.value,
                          seed=seed if shuffle else None, on_error=on_error.value, index=index,
                          holdout=Holdout(*holdout), **kind)


_TFDS_DONE = "{out}: wrote {what}; open it with tfds.builder_from_directory({out!r})"


def _tfds_splits_note(manifest) -> str:
    """After an append, how TFDS reads each whole split (each generation is a TFDS split of its own)."""
    from .format.tfds import tfds_read_splits

    whole = {split: names for split, names in tfds_read_splits(manifest).items() if "+" in names}
    return "".join(f"; split={names!r} reads all of {split}" for split, names in whole.items())


def _convert_and_report(convert, src, out, options, quiet=False, **run):
    """Runs ``convert``; says when it resumes (before the progress bar) and prints the summary (unless quiet).

    The library tells what it found in OUT through ``on_status`` (a ``RunStatus``); printing is the CLI's.
    """
    found = []

    def on_status(status) -> None:
        found.append(status)
        if status.resumed and not quiet:
            typer.echo(f"{out}: resumed: kept {status.kept_shards} of {status.total_shards} shards already committed")

    started = time.monotonic()
    manifest = convert(src, out, options, progress=not quiet, on_status=on_status, **run)
    stops.check()  # no summary after a stop, even one swallowed on its way
    if not quiet:
        status = found[0] if found else None
        _echo_lines(summary_lines(out, manifest, time.monotonic() - started, status))
        if status is not None and status.append is not None:
            _echo_lines(append_lines(out, status.append, status.complete))
        if run.get("tfds"):
            typer.echo(_TFDS_DONE.format(out=out, what="TFDS metadata") + _tfds_splits_note(manifest))


@app.command()
def images(
    src: str = typer.Argument(..., help="SRC/<class>/<image>, SRC/<split>/<class>/<image>, or any with --labels."),
    out: str = typer.Argument(..., help="Output folder (local or gs://); created if missing."),
    shard_size: str = typer.Option("128MiB", help="Target shard size, e.g. 64MiB, 1GB."),
    num_shards: Optional[int] = typer.Option(None, help="Exact shards per split; wins over --shard-size."),
    min_shards: int = typer.Option(1, help="At least this many shards per split (>= reader workers)."),
    compression: Compression = typer.Option(Compression.none, help="Shard compression."),
    seed: int = typer.Option(0, help="Seed of the write-time shuffle of record order."),
    shuffle: bool = typer.Option(True, "--shuffle/--no-shuffle", help="Shuffle record order at write time."),
    quality: int = typer.Option(95, help="JPEG quality for converted images."),
    rgb: bool = typer.Option(False, "--rgb", help="Convert grayscale images to 3-channel RGB."),
    max_side: Optional[int] = typer.Option(None, help="Resize so the longer side is at most N pixels."),
    max_pixels: int = typer.Option(89_478_485, help="Reject images with more pixels (decompression bombs)."),
    validate: bool = typer.Option(True, "--validate/--no-validate", help="Decode every image to catch corruption "
                                  "(JPEGs at 1/8 scale, strictly: every byte still entropy-decoded)."),
    on_error: OnError = typer.Option(OnError.skip, help="skip: record bad files in the manifest; fail: stop."),
    labels: Optional[str] = typer.Option(
        None, "--labels", help="CSV or JSON Lines labelling each image: its path relative to SRC, an optional split "
        "column, and a label (a class, classes joined by ';', or numbers; several number columns: a vector)."
    ),
    label_kind: Optional[LabelKind] = typer.Option(None, "--label-kind", help="What the labels are (default: "
                                                   "decided from the values)."),
    val_fraction: float = _VAL_FRACTION,
    test_fraction: float = _TEST_FRACTION,
    split_seed: int = _SPLIT_SEED,
    stratify: bool = _STRATIFY,
    workers: Optional[int] = typer.Option(None, help="Decode processes (default: all CPUs; 0: in-process)."),
    index: bool = typer.Option(False, "--index", help="Also write DALI tfrecord2idx index files."),
    tfds: bool = typer.Option(False, "--tfds", help="Also write TFDS metadata (as `tfshard tfds OUT` does), so "
                              "tfds.builder_from_directory(OUT) opens it; also when OUT is already complete."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset in OUT made from other inputs."),
    append: bool = typer.Option(False, "--append", help="Convert only the images not yet in the dataset in OUT into "
                                "new shards, with its options; existing shards are never rewritten."),
    dedupe: bool = typer.Option(False, "--dedupe", help="Keep one copy of identical images (val/test keep theirs over "
                                "train's); duplicates are reported either way."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
    runner: Runner = typer.Option(Runner.local, help="local: worker processes here; beam: an Apache Beam pipeline."),
    beam_options: Optional[str] = typer.Option(
        None, help='Beam pipeline options, e.g. "--runner=DataflowRunner --project=p ..." (default DirectRunner).'
    ),
) -> None:
    """Convert image class folders into sharded TFRecords plus dataset.json."""
    try:
        _load_tensorflow()
        from .ingest.convert import convert_images

        image = ImageOptions(quality=quality, rgb=rgb, max_side=max_side, max_pixels=max_pixels, validate=validate,
                             labels_file=labels, label_kind=label_kind and label_kind.value)
        options = _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index,
                                   (val_fraction, test_fraction, split_seed, stratify), image=image, dedupe=dedupe)
        _convert_and_report(convert_images, src, out, options, quiet, workers=workers, overwrite=overwrite,
                            runner=_runner(runner, beam_options), tfds=tfds, append=append)
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _stopped(out, e, resumable=True)


@app.command()
def episodes(
    src: str = typer.Argument(..., help="SRC/**/*.npy|npz (or SRC/<split>/**): one episode per file, time on axis 0."),
    out: str = typer.Argument(..., help="Output folder (local or gs://); created if missing."),
    shard_size: str = typer.Option("128MiB", help="Target shard size, e.g. 64MiB, 1GB."),
    num_shards: Optional[int] = typer.Option(None, help="Exact shards per split; wins over --shard-size."),
    min_shards: int = typer.Option(1, help="At least this many shards per split (>= reader workers)."),
    compression: Compression = typer.Option(Compression.none, help="Shard compression."),
    seed: int = typer.Option(0, help="Seed of the write-time shuffle of episode order."),
    shuffle: bool = typer.Option(True, "--shuffle/--no-shuffle", help="Shuffle episode order at write time."),
    on_nan: OnNan = typer.Option(OnNan.fail, help="NaN/inf: fail (name file and index), skip the episode, or keep."),
    max_record_bytes: str = typer.Option("64MiB", "--max-record-bytes", "--max-record-size",
                                         help="Longer episodes are split into chunk records of this size."),
    max_episode_bytes: str = typer.Option(
        "1GiB", help="Reject episodes whose headers declare more data (memory: a worker holds ~2 copies of one)."
    ),
    on_error: OnError = typer.Option(OnError.fail, help="Unreadable or mismatched files: fail, or skip and record."),
    labels: Optional[str] = typer.Option(
        None, "--labels", help="CSV of `path,label` rows (path relative to SRC) labelling each episode."
    ),
    label_kind: Optional[LabelKind] = typer.Option(None, "--label-kind", help="What the labels are: class or value "
                                                   "(default: decided from the values)."),
    class_folders: bool = typer.Option(
        True, "--class-folders/--no-class-folders",
        help="Label episodes by folder when every file is SRC/[split/]<class>/<episode> (2+ classes).",
    ),
    val_fraction: float = _VAL_FRACTION,
    test_fraction: float = _TEST_FRACTION,
    split_seed: int = _SPLIT_SEED,
    stratify: bool = _STRATIFY,
    workers: Optional[int] = typer.Option(None, help="Loader processes (default: all CPUs; 0: in-process)."),
    index: bool = typer.Option(False, "--index", help="Also write DALI tfrecord2idx index files."),
    tfds: bool = typer.Option(False, "--tfds", help="Also write TFDS metadata (as `tfshard tfds OUT` does), so "
                              "tfds.builder_from_directory(OUT) opens it; also when OUT is already complete."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset in OUT made from other inputs."),
    append: bool = typer.Option(False, "--append", help="Not for episodes yet: refused (image datasets only)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
    runner: Runner = typer.Option(Runner.local, help="local: worker processes here; beam: an Apache Beam pipeline."),
    beam_options: Optional[str] = typer.Option(
        None, help='Beam pipeline options, e.g. "--runner=DataflowRunner --project=p ..." (default DirectRunner).'
    ),
) -> None:
    """Convert numpy episodes (.npy, or .npz with named arrays) into sharded TFRecords plus dataset.json."""
    try:
        _load_tensorflow()
        from .ingest.convert import convert_episodes

        episode = EpisodeOptions(on_nan=on_nan.value, max_record_bytes=max_record_bytes,
                                 max_episode_bytes=max_episode_bytes, labels_file=labels, class_folders=class_folders,
                                 label_kind=label_kind and label_kind.value)
        options = _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index,
                                   (val_fraction, test_fraction, split_seed, stratify), episode=episode)
        _convert_and_report(convert_episodes, src, out, options, quiet, workers=workers, overwrite=overwrite,
                            runner=_runner(runner, beam_options), tfds=tfds, append=append)
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _stopped(out, e, resumable=True)


# --- a finished dataset ---------------------------------------------------------------------------------------------


@app.command()
def info(
    out: str = typer.Argument(..., help="A dataset folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    length: int | None = typer.Option(None, "--length", min=1,
                                      help="Episodes: also count the windows of this length per split, and the "
                                           "episodes too short for one."),
    shift: int | None = typer.Option(None, "--shift", min=1,
                                     help="With --length: steps between window starts (default 1)."),
    horizon: int | None = typer.Option(None, "--horizon", min=0,
                                       help="With --length: forecast steps after each window (default 0)."),
) -> None:
    """Counts, sizes, options and rejected files, from the manifest alone (no data pass)."""
    try:
        _load_tensorflow()
        from .format.dataset import load_manifest
        from .format.manifest import to_json

        manifest = load_manifest(out)
        if as_json:
            typer.echo(to_json(manifest), nl=False)
            return
        lines = describe_lines(out, manifest, window_of(length, shift, horizon))
    except _errors() as e:
        _fail(e)
    _echo_lines(lines)


@app.command()
def verify(out: str = typer.Argument(..., help="A dataset folder.")) -> None:
    """Read every record; check CRCs, counts, sha256 and every manifest field a reader uses against the records."""
    try:
        _load_tensorflow()
        from .format.errors import VerifyError
        from .tools.verify import verify as verify_dataset

        manifest = verify_dataset(out)
    except VerifyError as e:
        for problem in e.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1) from None
    except _errors() as e:
        _fail(e)
    shards = sum(len(s.shards) for s in manifest.splits.values())
    typer.echo(f"{out}: OK, {manifest.total_records:,} records in {shards} shards match the manifest")


@app.command()
def bench(
    out: str = typer.Argument(..., help="A dataset folder."),
    split: str = typer.Option("train", help="Split to read."),
    batch_size: int = typer.Option(64, help="Batch size."),
    image_size: int = typer.Option(224, help="Output height and width."),
    training: bool = typer.Option(True, "--training/--eval", help="Training path (crop, shuffle, augment) or eval."),
    cache: Optional[str] = typer.Option(
        None, help="Cache folder or 'memory' (default: a temporary folder, removed afterwards); 'none' for no cache."
    ),
    epochs: int = typer.Option(2, help="Epochs to time; epoch 1 fills the cache."),
    ignore_errors: bool = typer.Option(False, "--ignore-errors", help="Skip records that fail to read or decode."),
    window: Optional[int] = typer.Option(None, help="Episode datasets: window length L (time windows alone)."),
    shift: int = typer.Option(1, help="Episode datasets: steps between window starts S."),
    streamed: bool = typer.Option(False, "--streamed", help="Episode datasets: resident=False (stream from shards)."),
    compare: bool = typer.Option(False, "--compare", help="Image datasets: every reader mode side by side with the "
                                 "decode floors (and keras with --src), and the ratios benchmarks/images.py reports."),
    src: Optional[str] = typer.Option(None, help="With --compare: the source folder, to time keras' loader on it."),
    limit: Optional[int] = typer.Option(None, help="With --compare: JPEGs held in RAM for the floors (default all)."),
) -> None:
    """Time the input pipeline alone (no model): images/s or windows/s, and batches/s, per epoch."""
    try:
        _load_tensorflow()
        from .tools.bench import run

        _echo_lines(run(out, split, batch_size=batch_size, image_size=image_size, training=training, cache=cache,
                        epochs=epochs, ignore_errors=ignore_errors, window=window, shift=shift, streamed=streamed,
                        compare=compare, src=src, limit=limit))
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _stopped(f"{out}: bench", e)


@app.command(name="cache")
def cache_shards(
    out: str = typer.Argument(..., help="A dataset folder (gs:// or local)."),
    directory: str = typer.Argument(..., metavar="DIR", help="The shard cache folder readers name in shard_cache=."),
    limit: Optional[str] = typer.Option(None, "--limit", help="The most DIR may hold, e.g. 200GB (default: 90% of "
                                        "its disk's free space)."),
    split: Optional[list[str]] = typer.Option(None, "--split", help="A split to cache (repeat it; default all)."),
    fetches: int = typer.Option(8, "--fetches", min=1, max=64, help="Shards downloaded at once."),
) -> None:
    """Fill a shard cache ahead of a job: download, verify (sha256, size) and keep the shards on local disk."""
    try:
        _load_tensorflow()
        from .tools.cache import fill_shard_cache

        report = fill_shard_cache(out, directory, limit, splits=split or None, fetches=fetches,
                                  progress=sys.stderr.isatty())
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _stopped(f"{out}: cache", e)
    _echo_lines(report.lines())


@app.command(name="tfds")
def tfds_metadata(out: str = typer.Argument(..., help="A dataset folder (uncompressed shards).")) -> None:
    """Write TFDS metadata next to dataset.json, so tfds.builder_from_directory(OUT) opens the dataset."""
    try:
        _load_tensorflow()
        from .format.dataset import load_manifest
        from .tools.tfds import write_tfds_metadata

        written = write_tfds_metadata(out)
        typer.echo(_TFDS_DONE.format(out=out, what=", ".join(written)) + _tfds_splits_note(load_manifest(out)))
    except _errors() as e:
        _fail(e)


@app.command()
def preview(
    out: str = typer.Argument(..., help="A dataset folder."),
    output: str = typer.Option(..., "--output", "-o", help="The picture to write: FILE.png (or .jpg)."),
    split: str = typer.Option("train", help="Split to show."),
    n: Optional[int] = typer.Option(None, "-n", help="Images per class (default 8) or episodes (default 3)."),
    augmented: bool = typer.Option(False, "--augmented", help="Images: what training sees (random crop and flip)."),
    seed: Optional[int] = typer.Option(None, help="Images with --augmented: seed of the crops and flips (default 0)."),
    tile: Optional[int] = typer.Option(None, help="Images: tile size in pixels, 16 to 1024 (default 128)."),
    length: Optional[int] = typer.Option(None, help="Episodes: window length drawn (default: a quarter, at most 64)."),
    shift: Optional[int] = typer.Option(None, help="Episodes: steps between window starts (default: length / 2)."),
) -> None:
    """Draw a dataset: a contact sheet (a row per class) or episodes over time with their windows."""
    try:
        _load_tensorflow()
        from .tools.preview import preview as draw
        from .tools.preview import save_picture

        # None is "not given", so an option of the other kind of dataset is refused rather than ignored.
        image = draw(out, split, n, augmented=True if augmented else None, seed=seed, tile=tile, length=length,
                     shift=shift)
        save_picture(image, output)
        typer.echo(f"{output}: {image.width}x{image.height} preview of {out} [{split}]")
    except _errors() as e:
        _fail(e)


@app.command()
def demo(
    folder: str = typer.Argument("tfshard-demo", help="Where to put the demo's images and dataset."),
    workers: Optional[int] = typer.Option(None, help="Decode processes (default: all CPUs)."),
) -> None:
    """Make small image and episode trees (with a few broken files), convert, verify and read them back."""
    try:
        _load_tensorflow()
        from .tools.demo import run_demo

        _echo_lines(run_demo(folder, workers))
    except _errors() as e:
        _fail(e)


# --- the tf.data service --------------------------------------------------------------------------------------------

service_app = typer.Typer(
    no_args_is_help=True,
    help="Run tf.data service servers, so CPU hosts preprocess for readers.images/windows(service=...).",
)
app.add_typer(service_app, name="service")


def _start_server(start):
    """Imports TensorFlow quietly and starts a tf.data service server with ``start(readers.service)``."""
    _load_tensorflow()
    from .readers import service as service_lib

    try:
        return service_lib, start(service_lib)
    except _errors() as e:
        _fail(e)


@service_app.command("dispatcher")
def service_dispatcher(
    port: int = typer.Option(5050, help="Port to listen on (0: any free port)."),
    work_dir: Optional[str] = typer.Option(None, help="Folder (local or gs://) for datasets and the journal."),
    fault_tolerant: bool = typer.Option(
        False, "--fault-tolerant", help="Journal state to --work-dir, so a restarted dispatcher resumes its jobs."
    ),
) -> None:
    """Start a dispatcher and serve until Ctrl-C; prints the address readers and workers use."""
    service_lib, server = _start_server(
        lambda lib: lib.start_dispatcher(port, work_dir=work_dir, fault_tolerant=fault_tolerant)
    )
    address = f"{socket.gethostname()}:{service_lib.bound_port(server)}"
    typer.echo(f"dispatcher: serving at grpc://{address}; add workers with `tfshard service worker --dispatcher "
               f"{address}`, read with service='grpc://{address}'")
    service_lib.serve_until_stopped(server)
    typer.echo("dispatcher: stopped")


@service_app.command("worker")
def service_worker(
    dispatcher: str = typer.Option(..., help="HOST:PORT of the dispatcher (as `tfshard service dispatcher` prints)."),
    port: int = typer.Option(5051, help="Port to listen on. Keep it fixed: a client waits for a stopped worker "
                                        "until one is back at the same address (0: any free port)."),
    worker_address: Optional[str] = typer.Option(
        None, help="Address clients use to reach this worker; %port% stands for the bound port.",
        show_default="<hostname>:%port%",
    ),
) -> None:
    """Start a worker for the --dispatcher and serve until Ctrl-C; it runs the readers' pipelines up to batching."""
    service_lib, server = _start_server(
        lambda lib: lib.start_worker(dispatcher, port=port, worker_address=worker_address))
    bound = service_lib.bound_port(server)
    advertised = (worker_address or f"{socket.gethostname()}:%port%").replace("%port%", str(bound))
    typer.echo(f"worker: serving at {advertised} (port {bound}) for dispatcher {dispatcher}")
    service_lib.serve_until_stopped(server)
    typer.echo("worker: stopped")


def main(args: list[str] | None = None) -> None:
    """The ``tfshard`` command (``python -m tfshard``); exits with one of ``EXIT_CODES``."""
    sys.exit(console.run(app, sys.argv[1:] if args is None else list(args), "tfshard"))


if __name__ == "__main__":
    sys.exit(main())
