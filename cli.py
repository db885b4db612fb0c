"""``tfshard``: a thin typer layer. Each command parses its flags, calls one library function and prints.

Library errors become one line on stderr and a non-zero exit (``EXIT_CODES``); ``--debug`` shows the traceback.
TensorFlow is loaded once, quietly, as a command that needs it starts (``_command``; ``push`` needs none, ``info``
none but for a gs:// OUT or --length), before any module that imports it: the converter's engine, the readers and
the tools are imported inside the commands, the pure modules at the top.
Longer than ~350 lines only by its ~80 flags and their help, which docs/reference/cli.md is made from; what is not
parsing is in ``tools/console.py`` (what every command shares), ``tools/conversion.py`` and ``tools/service.py``.
"""

from __future__ import annotations

import enum
import sys
from typing import Annotated

import typer
from typer import Argument, Option

from .tools import console, conversion
from .tools.console import EXIT_CODES, echo_lines, global_flags_first  # noqa: F401  (the command's API)
from .tools.report import describe_lines, window_of

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Sharded TFRecords from image folders and numpy episodes, verified.")
_state = {"debug": False}


def _choices(name: str, *values: str) -> type[enum.Enum]:
    """A str enum of ``values``: typer offers them as the option's choices, docs/make_reference.py lists them."""
    return enum.Enum(name, [(value, value) for value in values], type=str)


OnError = _choices("OnError", "skip", "fail")
Runner = _choices("Runner", "local", "beam")
LabelKind = _choices("LabelKind", "class", "multi", "value")
Compression = _choices("Compression", "none", "gzip")
OnNan = _choices("OnNan", "fail", "skip", "keep")


def _command(stop: str | None = None, resumable: bool = False, tensorflow: bool = True):
    """A command's body: TensorFlow loaded (unless ``tensorflow`` is False), errors as one line, a stop as one line
    naming ``stop`` (console.py)."""
    return console.command(_state["debug"], stop, resumable, tensorflow)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"tfshard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, Option(
        "--debug", help="Show tracebacks and TensorFlow's own logs (anywhere on the line).")] = False,
    verbose: Annotated[bool, Option(
        "--verbose", "-v", help="Log what the library does (anywhere on the line).")] = False,
    version: Annotated[bool, Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    _state["debug"] = debug
    console.configure(debug, verbose)


# --- converting: the flags images and episodes share, with one meaning (tools/conversion.py) --------------------------

Output = Annotated[str, Argument(help=(
    "Output folder (local or gs://; s3://, az://: staged locally, then pushed); created if missing."))]
StorageOption = Annotated[list[str] | None, Option("--storage-option", metavar="KEY=VALUE", help=(
    "An fsspec option for the command's s3://, az:// or https:// URLs, e.g. endpoint_url=https://minio:9000 or "
    "connection_string=... (repeat it); KEY:=JSON for another type (use_ssl:=false). Never printed."))]
ShardSize = Annotated[str, Option(help="Target shard size, e.g. 64MiB, 1GB.")]
NumShards = Annotated[int | None, Option(help="Exact shards per split; wins over --shard-size.")]
MinShards = Annotated[int, Option(help="At least this many shards per split (>= reader workers).")]
ShardCompression = Annotated[Compression, Option(help="Shard compression.")]
ValFraction = Annotated[float, Option("--val-fraction", help=(
    "Hold out this share of train as a val split (by a seeded hash of each file's path: stable when files are added "
    "or removed)."))]
TestFraction = Annotated[float, Option("--test-fraction", help="Hold out this share of train as a test split.")]
SplitSeed = Annotated[int, Option("--split-seed", help="Seed of the held-out splits' hash.")]
Stratify = Annotated[bool, Option("--stratify", help=(
    "Exact per-class held-out counts instead of the per-file hash (class labels only; a file's split may then move "
    "when others are added)."))]
Index = Annotated[bool, Option("--index", help="Also write DALI tfrecord2idx index files.")]
Tfds = Annotated[bool, Option("--tfds", help=(
    "Also write TFDS metadata (as `tfshard tfds OUT` does), so tfds.builder_from_directory(OUT) opens it; also when "
    "OUT is already complete."))]
Overwrite = Annotated[bool, Option("--overwrite", help="Replace a dataset in OUT made from other inputs.")]
Quiet = Annotated[bool, Option("--quiet", "-q", help="No progress bar or summary.")]
RunOn = Annotated[Runner, Option(help="local: worker processes here; beam: an Apache Beam pipeline.")]
BeamOptions = Annotated[str | None, Option(help=(
    'Beam pipeline options, e.g. "--runner=DataflowRunner --project=p ..." (default DirectRunner).'))]


@app.command()
def images(
    src: Annotated[str, Argument(help="SRC/<class>/<image>, SRC/<split>/<class>/<image>, or any with --labels.")],
    out: Output,
    shard_size: ShardSize = "128MiB",
    num_shards: NumShards = None,
    min_shards: MinShards = 1,
    compression: ShardCompression = Compression.none,
    seed: Annotated[int, Option(help="Seed of the write-time shuffle of record order.")] = 0,
    shuffle: Annotated[bool, Option("--shuffle/--no-shuffle", help="Shuffle record order at write time.")] = True,
    quality: Annotated[int, Option(help="JPEG quality for converted images.")] = 95,
    rgb: Annotated[bool, Option("--rgb", help="Convert grayscale images to 3-channel RGB.")] = False,
    max_side: Annotated[int | None, Option(help="Resize so the longer side is at most N pixels.")] = None,
    max_pixels: Annotated[int, Option(help="Reject images with more pixels (decompression bombs).")] = 89_478_485,
    validate: Annotated[bool, Option("--validate/--no-validate", help=(
        "Decode every image to catch corruption (JPEGs at 1/8 scale, strictly: every byte still entropy-decoded)."
    ))] = True,
    on_error: Annotated[OnError, Option(help="skip: record bad files in the manifest; fail: stop.")] = OnError.skip,
    labels: Annotated[str | None, Option("--labels", help=(
        "CSV or JSON Lines labelling each image: its path relative to SRC, an optional split column, and a label (a "
        "class, classes joined by ';', or numbers; several number columns: a vector)."))] = None,
    label_kind: Annotated[LabelKind | None, Option(
        "--label-kind", help="What the labels are (default: decided from the values).")] = None,
    val_fraction: ValFraction = 0.0,
    test_fraction: TestFraction = 0.0,
    split_seed: SplitSeed = 0,
    stratify: Stratify = False,
    workers: Annotated[int | None, Option(help="Decode processes (default: all CPUs; 0: in-process).")] = None,
    index: Index = False,
    tfds: Tfds = False,
    overwrite: Overwrite = False,
    append: Annotated[bool, Option("--append", help=(
        "Convert only the images not yet in the dataset in OUT into new shards, with its options; existing shards are "
        "never rewritten."))] = False,
    dedupe: Annotated[bool, Option("--dedupe", help=(
        "Keep one copy of identical images (val/test keep theirs over train's); duplicates are reported either "
        "way."))] = False,
    quiet: Quiet = False,
    runner: RunOn = Runner.local,
    beam_options: BeamOptions = None,
    storage_option: StorageOption = None,
) -> None:
    """Convert image class folders into sharded TFRecords plus dataset.json."""
    flags = conversion.keywords(locals())  # convert_images takes each flag under its own name
    with _command(out, resumable=True):
        console.storage_options(storage_option, out)
        from .ingest.convert import convert_images

        conversion.convert_and_report(convert_images, src, out, typer.echo, quiet, **flags,
                                      runner=conversion.runner(runner.value, beam_options, _state["debug"]))


@app.command()
def episodes(
    src: Annotated[str, Argument(help="SRC/**/*.npy|npz (or SRC/<split>/**): one episode per file, time on axis 0.")],
    out: Output,
    shard_size: ShardSize = "128MiB",
    num_shards: NumShards = None,
    min_shards: MinShards = 1,
    compression: ShardCompression = Compression.none,
    seed: Annotated[int, Option(help="Seed of the write-time shuffle of episode order.")] = 0,
    shuffle: Annotated[bool, Option("--shuffle/--no-shuffle", help="Shuffle episode order at write time.")] = True,
    on_nan: Annotated[OnNan, Option(
        help="NaN/inf: fail (name file and index), skip the episode, or keep.")] = OnNan.fail,
    max_record_bytes: Annotated[str, Option(
        "--max-record-bytes", "--max-record-size", help="Longer episodes are split into chunk records of this size."
    )] = "64MiB",
    max_episode_bytes: Annotated[str, Option(
        help="Reject episodes whose headers declare more data (memory: a worker holds ~2 copies of one).")] = "1GiB",
    on_error: Annotated[OnError, Option(
        help="Unreadable or mismatched files: fail, or skip and record.")] = OnError.fail,
    labels: Annotated[str | None, Option(
        "--labels", help="CSV of `path,label` rows (path relative to SRC) labelling each episode.")] = None,
    label_kind: Annotated[LabelKind | None, Option(
        "--label-kind", help="What the labels are: class or value (default: decided from the values).")] = None,
    class_folders: Annotated[bool, Option("--class-folders/--no-class-folders", help=(
        "Label episodes by folder when every file is SRC/[split/]<class>/<episode> (2+ classes)."))] = True,
    val_fraction: ValFraction = 0.0,
    test_fraction: TestFraction = 0.0,
    split_seed: SplitSeed = 0,
    stratify: Stratify = False,
    workers: Annotated[int | None, Option(help="Loader processes (default: all CPUs; 0: in-process).")] = None,
    index: Index = False,
    tfds: Tfds = False,
    overwrite: Overwrite = False,
    append: Annotated[bool, Option("--append", help="Not for episodes yet: refused (image datasets only).")] = False,
    quiet: Quiet = False,
    runner: RunOn = Runner.local,
    beam_options: BeamOptions = None,
    storage_option: StorageOption = None,
) -> None:
    """Convert numpy episodes (.npy, or .npz with named arrays) into sharded TFRecords plus dataset.json."""
    flags = conversion.keywords(locals())  # convert_episodes takes each flag under its own name
    with _command(out, resumable=True):
        console.storage_options(storage_option, out)
        from .ingest.convert import convert_episodes

        conversion.convert_and_report(convert_episodes, src, out, typer.echo, quiet, **flags,
                                      runner=conversion.runner(runner.value, beam_options, _state["debug"]))


# --- a finished dataset ---------------------------------------------------------------------------------------------

Dataset = Annotated[str, Argument(help="A dataset folder.")]


@app.command()
def info(
    out: Dataset,
    as_json: Annotated[bool, Option("--json", help="Print the manifest as JSON.")] = False,
    length: Annotated[int | None, Option("--length", min=1, help=(
        "Episodes: also count the windows of this length per split, and the episodes too short for one."))] = None,
    shift: Annotated[int | None, Option(
        "--shift", min=1, help="With --length: steps between window starts (default 1).")] = None,
    horizon: Annotated[int | None, Option(
        "--horizon", min=0, help="With --length: forecast steps after each window (default 0).")] = None,
    storage_option: StorageOption = None,
) -> None:
    """Counts, sizes, options and rejected files, from the manifest alone (no data pass)."""
    # No TensorFlow (~3 s to import) but for a gs:// OUT, or --length (its window arithmetic sits in the readers).
    with _command(tensorflow=length is not None or console.reads_through_tensorflow(out)):
        console.storage_options(storage_option, out)
        from .format.dataset import load_manifest
        from .format.manifest import to_json

        manifest = load_manifest(out)
        if as_json:
            typer.echo(to_json(manifest), nl=False)
            return
        lines = describe_lines(out, manifest, window_of(length, shift, horizon))
    echo_lines(lines)


@app.command()
def verify(out: Dataset, storage_option: StorageOption = None) -> None:
    """Read every record; check CRCs, counts, sha256 and every manifest field a reader uses against the records."""
    with _command():
        console.storage_options(storage_option, out)
        from .format.errors import VerifyError
        from .tools.verify import verify as verify_dataset

        try:
            manifest = verify_dataset(out)
        except VerifyError as e:
            for problem in e.problems:
                typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(1) from None
    shards = sum(len(s.shards) for s in manifest.splits.values())
    typer.echo(f"{out}: OK, {manifest.total_records:,} records in {shards} shards match the manifest")


@app.command()
def bench(
    out: Dataset,
    split: Annotated[str, Option(help="Split to read.")] = "train",
    batch_size: Annotated[int, Option(help="Batch size.")] = 64,
    image_size: Annotated[int, Option(help="Output height and width.")] = 224,
    training: Annotated[bool, Option(
        "--training/--eval", help="Training path (crop, shuffle, augment) or eval.")] = True,
    cache: Annotated[str | None, Option(help=(
        "Cache folder or 'memory' (default: a temporary folder, removed afterwards); 'none' for no cache."))] = None,
    epochs: Annotated[int, Option(help="Epochs to time; epoch 1 fills the cache.")] = 2,
    ignore_errors: Annotated[bool, Option("--ignore-errors", help="Skip records that fail to read or decode.")] = False,
    window: Annotated[int | None, Option(help="Episode datasets: window length L (time windows alone).")] = None,
    shift: Annotated[int, Option(help="Episode datasets: steps between window starts S.")] = 1,
    streamed: Annotated[bool, Option(
        "--streamed", help="Episode datasets: resident=False (stream from shards).")] = False,
    compare: Annotated[bool, Option("--compare", help=(
        "Image datasets: every reader mode side by side with the decode floors (and keras with --src), and the ratios "
        "benchmarks/images.py reports."))] = False,
    src: Annotated[str | None, Option(help="With --compare: the source folder, to time keras' loader on it.")] = None,
    limit: Annotated[int | None, Option(help="With --compare: JPEGs held in RAM for the floors (default all).")] = None,
    storage_option: StorageOption = None,
) -> None:
    """Time the input pipeline alone (no model): images/s or windows/s, and batches/s, per epoch."""
    with _command(f"{out}: bench"):
        console.storage_options(storage_option, out)
        from .tools.bench import run

        echo_lines(run(out, split, batch_size=batch_size, image_size=image_size, training=training, cache=cache,
                       epochs=epochs, ignore_errors=ignore_errors, window=window, shift=shift, streamed=streamed,
                       compare=compare, src=src, limit=limit))


@app.command(name="cache")
def cache_shards(
    out: Annotated[str, Argument(help="A dataset folder (gs:// or local).")],
    directory: Annotated[str, Argument(metavar="DIR", help="The shard cache folder readers name in shard_cache=.")],
    limit: Annotated[str | None, Option(
        "--limit", help="The most DIR may hold, e.g. 200GB (default: 90% of its disk's free space).")] = None,
    split: Annotated[list[str] | None, Option("--split", help="A split to cache (repeat it; default all).")] = None,
    fetches: Annotated[int, Option("--fetches", min=1, max=64, help="Shards downloaded at once.")] = 8,
    storage_option: StorageOption = None,
) -> None:
    """Fill a shard cache ahead of a job: download, verify (sha256, size) and keep the shards on local disk."""
    with _command(f"{out}: cache"):
        console.storage_options(storage_option, out)
        from .tools.cache import fill_shard_cache

        report = fill_shard_cache(out, directory, limit, splits=split or None, fetches=fetches,
                                  progress=sys.stderr.isatty())
    echo_lines(report.lines())


@app.command()
def push(
    out: Annotated[str, Argument(help="A finished local dataset folder.")],
    url: Annotated[str, Argument(help="Where to upload it: s3://bucket/ds, az://container/ds or abfs://...")],
    overwrite: Annotated[bool, Option("--overwrite", help=(
        "Replace a dataset at URL, removing only the objects its manifest lists (other objects stay)."))] = False,
    uploads: Annotated[int, Option("--uploads", min=1, max=64, help=(
        "Files sent at once (together at most 512 MiB held in memory)."))] = 64,
    storage_option: StorageOption = None,
) -> None:
    """Upload a finished dataset to an object store, each file checked, dataset.json last; rerun to resume."""
    # No TensorFlow: OUT is local and URL an fsspec store (push refuses gs://), so nothing here reads through it.
    with _command(f"{url}: push", resumable=True, tensorflow=False):
        console.storage_options(storage_option, url)
        from .ingest.push import push as upload

        report = upload(out, url, overwrite=overwrite, uploads=uploads)
    echo_lines(report.lines())


@app.command(name="tfds")
def tfds_metadata(out: Annotated[str, Argument(help="A dataset folder (uncompressed shards).")]) -> None:
    """Write TFDS metadata next to dataset.json, so tfds.builder_from_directory(OUT) opens the dataset."""
    with _command():
        from .format.dataset import load_manifest
        from .ingest.summary import tfds_written
        from .tools.tfds import write_tfds_metadata

        written = write_tfds_metadata(out)
        typer.echo(tfds_written(out, ", ".join(written), load_manifest(out)))


@app.command()
def preview(
    out: Dataset,
    output: Annotated[str, Option("--output", "-o", help="The picture to write: FILE.png (or .jpg).")],
    split: Annotated[str, Option(help="Split to show.")] = "train",
    n: Annotated[int | None, Option("-n", help="Images per class (default 8) or episodes (default 3).")] = None,
    augmented: Annotated[bool, Option(
        "--augmented", help="Images: what training sees (random crop and flip).")] = False,
    seed: Annotated[int | None, Option(
        help="Images with --augmented: seed of the crops and flips (default 0).")] = None,
    tile: Annotated[int | None, Option(help="Images: tile size in pixels, 16 to 1024 (default 128).")] = None,
    length: Annotated[int | None, Option(
        help="Episodes: window length drawn (default: a quarter, at most 64).")] = None,
    shift: Annotated[int | None, Option(help="Episodes: steps between window starts (default: length / 2).")] = None,
    changed: Annotated[bool, Option(
        "--changed", help="Images: only the inputs the converter re-encoded to JPEG (PNG, CMYK, rotated...).")] = False,
    feature: Annotated[list[str] | None, Option(
        help="Episodes: a feature to draw (repeat for several; default: the first 6 by name).")] = None,
    channel: Annotated[list[int] | None, Option(
        help="Episodes: a channel (element of a step, from 0) of each feature (repeat; default: all).")] = None,
    time_range: Annotated[str | None, Option(
        help="Episodes: the steps drawn, START:STOP (100:500) or fractions (0.5:1.0), as readers.windows.")] = None,
    storage_option: StorageOption = None,
) -> None:
    """Draw a dataset: a contact sheet (a row per class) or episodes over time with their windows."""
    with _command():
        console.storage_options(storage_option, out)
        from .tools.preview import preview as draw
        from .tools.preview import save_picture, time_range_of

        # None is "not given", so an option of the other kind of dataset is refused rather than ignored.
        image = draw(out, split, n, augmented=True if augmented else None, seed=seed, tile=tile,
                     changed=True if changed else None, length=length, shift=shift, feature=feature or None,
                     channel=channel or None, time_range=None if time_range is None else time_range_of(time_range))
        save_picture(image, output)
        typer.echo(f"{output}: {image.width}x{image.height} preview of {out} [{split}]")


@app.command()
def demo(
    folder: Annotated[str, Argument(help="Where to put the demo's images and dataset.")] = "tfshard-demo",
    workers: Annotated[int | None, Option(help="Decode processes (default: all CPUs).")] = None,
) -> None:
    """Make small image and episode trees (with a few broken files), convert, verify and read them back."""
    with _command():
        from .tools.demo import run_demo

        echo_lines(run_demo(folder, workers))


# --- the tf.data service --------------------------------------------------------------------------------------------

service_app = typer.Typer(no_args_is_help=True, help="Run tf.data service servers, so CPU hosts preprocess for "
                          "readers.images/windows(service=...).")
app.add_typer(service_app, name="service")


@service_app.command("dispatcher")
def service_dispatcher(
    port: Annotated[int, Option(help="Port to listen on (0: any free port).")] = 5050,
    work_dir: Annotated[str | None, Option(help="Folder (local or gs://) for datasets and the journal.")] = None,
    fault_tolerant: Annotated[bool, Option(
        "--fault-tolerant", help="Journal state to --work-dir, so a restarted dispatcher resumes its jobs.")] = False,
) -> None:
    """Start a dispatcher and serve until Ctrl-C; prints the address readers and workers use."""
    with _command("dispatcher"):
        from .tools.service import serve_dispatcher

        echo_lines(serve_dispatcher(port, work_dir, fault_tolerant))


@service_app.command("worker")
def service_worker(
    dispatcher: Annotated[str, Option(help="HOST:PORT of the dispatcher (as `tfshard service dispatcher` prints).")],
    port: Annotated[int, Option(help=(
        "Port to listen on. Keep it fixed: a client waits for a stopped worker until one is back at the same address "
        "(0: any free port)."))] = 5051,
    worker_address: Annotated[str | None, Option(show_default="<hostname>:%port%", help=(
        "Address clients use to reach this worker; %port% stands for the bound port."))] = None,
) -> None:
    """Start a worker for the --dispatcher and serve until Ctrl-C; it runs the readers' pipelines up to batching."""
    with _command("worker"):
        from .tools.service import serve_worker

        echo_lines(serve_worker(dispatcher, port, worker_address))


def main(args: list[str] | None = None) -> None:
    """The ``tfshard`` command (``python -m tfshard``); exits with one of ``EXIT_CODES``."""
    sys.exit(console.exiting(console.run(app, sys.argv[1:] if args is None else list(args), "tfshard")))


if __name__ == "__main__":
    sys.exit(main())
