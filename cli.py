"""``tfshard``: a thin typer layer over ``ingest`` (and, later, ``readers``).

Library errors become one line on stderr and a non-zero exit; ``--debug`` shows
the traceback. TensorFlow is imported only by the commands that need it, after
its C++ logging has been quietened.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import sys
import time
from typing import Optional

import typer

from .ingest.report import describe_lines, summary_lines

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Sharded TFRecords from image folders and numpy episodes, verified.")
_state = {"debug": False}


class OnError(str, enum.Enum):
    skip = "skip"
    fail = "fail"


class Runner(str, enum.Enum):
    local = "local"
    beam = "beam"


def _runner(runner: "Runner", beam_options: str | None):
    """None for local worker processes, else a BeamRunner; Beam's own logs stay quiet unless -v/--debug."""
    if runner is Runner.local:
        if beam_options:
            raise ValueError(f"--beam-options: only used with --runner beam (got {beam_options!r}); add --runner beam")
        return None
    from .ingest.beam_runner import BeamRunner

    if not (_state["debug"] or logging.getLogger().isEnabledFor(logging.INFO)):
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        logging.disable(logging.WARNING)  # Beam warns about optional GCP clients on the root logger at import
        try:
            import apache_beam  # noqa: F401
        except ImportError:
            pass  # BeamRunner says how to install it
        finally:
            logging.disable(logging.NOTSET)
    return BeamRunner(beam_options or "--runner=DirectRunner")


class Compression(str, enum.Enum):
    none = "none"
    gzip = "gzip"


def _load_tensorflow() -> None:
    """Imports TensorFlow once, up front; without --debug its C++ start-up chatter is kept off stderr.

    The CUDA-enabled wheel prints "Could not find cuda drivers" on CPU-only hosts
    before TF_CPP_MIN_LOG_LEVEL is read, so only an fd-level redirect hides it.
    """
    if _state["debug"] or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            import tensorflow as tf

            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _errors() -> tuple[type[BaseException], ...]:
    """What a command reports as one line: bad input, OS errors (a full disk), a missing optional extra (the
    message says what to install) and TensorFlow's op errors."""
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return ValueError, OSError, ImportError, tf.errors.OpError
    return ValueError, OSError, ImportError


def _fail(error: BaseException) -> None:
    if _state["debug"]:
        raise error
    message = str(error)
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        if isinstance(error, tf.errors.OpError):
            from .ingest.readback import short_tf_error

            message = f"{short_tf_error(error.message) or type(error).__name__} (TensorFlow {type(error).__name__})"
    typer.echo(f"error: {' '.join(message.split()) or type(error).__name__}", err=True)
    raise typer.Exit(1)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"tfshard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and TensorFlow's own logs (anywhere on the line)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what the library does (anywhere on the line)."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = debug
    if not debug:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TF's GCS client gives every open gs:// file a 64 MiB read-ahead; 8 MiB blocks read 16 shards at once
    # 2.6x faster in benchmarks/network.py. Read once, when TF first touches gs://; a user's own value wins.
    os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", "8")
    logging.basicConfig(level=logging.INFO if verbose or debug else logging.WARNING, format="%(levelname)s: %(message)s")


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


def _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index, **kind):
    """The ConvertOptions both conversion commands share, plus the kind's own (``image=`` or ``episode=``)."""
    from .ingest import ConvertOptions

    return ConvertOptions(
        shard_bytes=shard_size,
        num_shards=num_shards,
        min_shards=min_shards,
        compression=None if compression is Compression.none else compression.value,
        seed=seed if shuffle else None,
        on_error=on_error.value,
        index=index,
        **kind,
    )


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
    if not quiet:
        _echo_lines(summary_lines(out, manifest, time.monotonic() - started, found[0] if found else None))
    return manifest


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and ``kill`` send), raised in the main thread to stop like Ctrl-C."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """For the block, SIGTERM stops the command as Ctrl-C does: the work stops cleanly, resumable."""
    def terminate(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread (an embedding caller): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(out: str, error: KeyboardInterrupt) -> None:
    """Ctrl-C or SIGTERM during a conversion: one line on stderr, exit 128 + the signal number, as shells expect."""
    terminated = isinstance(error, _Terminated)
    how = "terminated (SIGTERM)" if terminated else "interrupted"
    typer.echo(f"{out}: {how}; run the same command again to resume (committed shards are kept)", err=True)
    if _state["debug"]:
        raise error
    raise typer.Exit(128 + (signal.SIGTERM if terminated else signal.SIGINT))


@app.command()
def images(
    src: str = typer.Argument(..., help="SRC/<class>/<image> or SRC/<split>/<class>/<image>."),
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
    validate: bool = typer.Option(True, "--validate/--no-validate", help="Decode every image to catch corruption (JPEGs at 1/8 scale: every byte still entropy-decoded)."),
    on_error: OnError = typer.Option(OnError.skip, help="skip: record bad files in the manifest; fail: stop."),
    workers: Optional[int] = typer.Option(None, help="Decode processes (default: all CPUs; 0: in-process)."),
    index: bool = typer.Option(False, "--index", help="Also write DALI tfrecord2idx index files."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset in OUT made from other inputs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
    runner: Runner = typer.Option(Runner.local, help="local: worker processes here; beam: an Apache Beam pipeline."),
    beam_options: Optional[str] = typer.Option(
        None, help='Beam pipeline options, e.g. "--runner=DataflowRunner --project=p ..." (default DirectRunner).'
    ),
) -> None:
    """Convert image class folders into sharded TFRecords plus dataset.json."""
    try:
        _load_tensorflow()
        from .ingest import ImageOptions, convert_images

        image = ImageOptions(quality=quality, rgb=rgb, max_side=max_side, max_pixels=max_pixels, validate=validate)
        options = _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index,
                                   image=image)
        with _sigterm_as_interrupt():
            _convert_and_report(convert_images, src, out, options, quiet, workers=workers, overwrite=overwrite,
                                runner=_runner(runner, beam_options))
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _interrupted(out, e)


class OnNan(str, enum.Enum):
    fail = "fail"
    skip = "skip"
    keep = "keep"


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
    workers: Optional[int] = typer.Option(None, help="Loader processes (default: all CPUs; 0: in-process)."),
    index: bool = typer.Option(False, "--index", help="Also write DALI tfrecord2idx index files."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a dataset in OUT made from other inputs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summary."),
    runner: Runner = typer.Option(Runner.local, help="local: worker processes here; beam: an Apache Beam pipeline."),
    beam_options: Optional[str] = typer.Option(
        None, help='Beam pipeline options, e.g. "--runner=DataflowRunner --project=p ..." (default DirectRunner).'
    ),
) -> None:
    """Convert numpy episodes (.npy, or .npz with named arrays) into sharded TFRecords plus dataset.json."""
    try:
        _load_tensorflow()
        from .ingest import EpisodeOptions, convert_episodes

        episode = EpisodeOptions(on_nan=on_nan.value, max_record_bytes=max_record_bytes,
                                 max_episode_bytes=max_episode_bytes)
        options = _convert_options(shard_size, num_shards, min_shards, compression, seed, shuffle, on_error, index,
                                   episode=episode)
        with _sigterm_as_interrupt():
            _convert_and_report(convert_episodes, src, out, options, quiet, workers=workers, overwrite=overwrite,
                                runner=_runner(runner, beam_options))
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        _interrupted(out, e)


@app.command()
def info(
    out: str = typer.Argument(..., help="A dataset folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Counts, sizes, options and rejected files, from the manifest alone (no data pass)."""
    try:
        _load_tensorflow()
        from .ingest import load_manifest
        from .format.manifest import to_json

        manifest = load_manifest(out)
    except _errors() as e:
        _fail(e)
    if as_json:
        typer.echo(to_json(manifest), nl=False)
        return
    for line in describe_lines(out, manifest):
        typer.echo(line)


@app.command()
def verify(out: str = typer.Argument(..., help="A dataset folder.")) -> None:
    """Read every record; check CRCs, counts and sha256 against the manifest."""
    try:
        _load_tensorflow()
        from .ingest import VerifyError
        from .ingest import verify as verify_dataset

        manifest = verify_dataset(out)
    except VerifyError as e:
        for problem in e.problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(1)
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
    import shutil
    import tempfile

    temp = None
    try:
        if epochs < 1:
            raise ValueError(f"--epochs: must be at least 1 (got {epochs}); pass the number of epochs to time")
        _load_tensorflow()
        from . import readers
        from .readers.bench import time_epochs

        info = readers.info(out)
        if info.manifest.kind == "episodes" or window is not None:
            _bench_windows(out, info, split, window, shift, batch_size, epochs, streamed)
            return
        if compare:
            if limit is not None and limit < batch_size:
                raise ValueError(f"--limit: at least one batch of JPEGs for the floors (got {limit}, batch {batch_size});"
                                 " pass a larger --limit or leave it out")
            if src is not None and not os.path.isdir(src):
                raise FileNotFoundError(f"{src}: --src is not a folder; pass the source folder of the conversion")
            with _sigterm_as_interrupt():
                _bench_compare(out, split, batch_size, (image_size, image_size), src, limit)
            return
        expected = info.num_records(split)
        temp = tempfile.mkdtemp(prefix="tfshard-bench-cache-") if cache is None else None
        chosen = None if cache == "none" else (temp or cache)
        with _sigterm_as_interrupt():
            ds = readers.images(
                out, split, batch_size=batch_size, image_size=(image_size, image_size), training=training, seed=0,
                cache=chosen, drop_remainder=False, ignore_errors=ignore_errors,
            )
            typer.echo(f"{out} [{split}]: {expected:,} records, batch {batch_size}, {image_size}x{image_size}, "
                       f"{'training' if training else 'eval'}, cache={chosen or 'none'}")
            for timed in time_epochs(ds, epochs):
                note = " (fills the cache)" if timed.epoch == 1 and chosen else (" (cached)" if chosen else "")
                skipped = f", {expected - timed.examples:,} records skipped" if timed.examples != expected else ""
                typer.echo(f"  epoch {timed.epoch}{note}: {timed.examples:,} images in {timed.seconds:.2f} s: "
                           f"{timed.examples / timed.seconds:,.0f} img/s, {timed.batches / timed.seconds:,.1f} "
                           f"batches/s{skipped}")
    except _errors() as e:
        _fail(e)
    except KeyboardInterrupt as e:
        typer.echo(f"{out}: bench {'terminated (SIGTERM)' if isinstance(e, _Terminated) else 'interrupted'}",
                   err=True)
        raise typer.Exit(128 + (signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT))
    finally:
        if temp:  # its temporary cache goes however the run ends
            shutil.rmtree(temp, ignore_errors=True)


def _bench_compare(out: str, split: str, batch_size: int, size: tuple[int, int], src: str | None,
                   limit: int | None) -> None:
    """The rows and ratios of benchmarks/images.py on this dataset: one pass each, after an XLA warm-up."""
    import tempfile

    from .readers import bench

    blobs, labels = bench.jpeg_records(out, split, limit)
    methods = bench.image_methods(out, split, batch_size=batch_size, image_size=size, blobs=blobs, labels=labels,
                                  src=src)
    for name in (bench.DEFAULT, bench.COLOR, bench.FLOOR_CROP):
        next(iter(methods[name]()))  # compile the XLA-fused ops once, before any clock runs
    typer.echo(f"{out} [{split}]: batch {batch_size}, {size[0]}x{size[1]}; floors over {len(blobs):,} JPEGs in RAM"
               + ("" if src else "; pass --src SRC to add keras' loader"))
    rates = {}
    for name, make in methods.items():
        (timed,) = bench.time_epochs(make(), 1)
        rates[name] = timed.examples / timed.seconds
        typer.echo(f"  {name:<44} {rates[name]:>8,.0f} img/s")
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-cache-") as folder:
        from . import readers

        cached = readers.images(out, split, batch_size=batch_size, image_size=size, seed=0, cache=folder)
        for name, timed in zip((bench.CACHE_FIRST, bench.CACHE_AGAIN), bench.time_epochs(cached, 2)):
            rates[name] = timed.examples / timed.seconds
            typer.echo(f"  {name:<44} {rates[name]:>8,.0f} img/s")
    for label, value, target in bench.ratios(rates):
        typer.echo(f"  {label:<44} {value:>7.2f}x  (issue 11 target >= {target}x: {'met' if value >= target else 'missed'})")


def _bench_windows(out: str, info, split: str, window: int | None, shift: int, batch_size: int, epochs: int,
                   streamed: bool) -> None:
    from . import readers
    from .readers.bench import time_epochs
    from .readers.resident import default_device

    if window is None:
        raise ValueError(f"{out}: an episode dataset; pass --window L (and --shift S) to time its windows")
    if info.manifest.kind != "episodes":
        raise ValueError(f"{out}: --window needs an episode dataset (got {info.manifest.kind!r}); drop --window")
    expected = info.num_windows(split, window, shift)
    started = time.perf_counter()
    ds = readers.windows(out, split, length=window, shift=shift, batch_size=batch_size, seed=0, resident=not streamed)
    built = time.perf_counter() - started
    mode = "streamed from the shards" if streamed else f"resident on {default_device()}, built in {built:.2f} s"
    typer.echo(f"{out} [{split}]: {expected:,} windows of {window} (shift {shift}), batch {batch_size}, {mode}")
    for timed in time_epochs(ds, epochs):
        typer.echo(f"  epoch {timed.epoch}: {timed.examples:,} windows in {timed.seconds:.2f} s: "
                   f"{timed.examples / timed.seconds:,.0f} windows/s, {timed.batches / timed.seconds:,.1f} batches/s")


@app.command(name="tfds")
def tfds_metadata(out: str = typer.Argument(..., help="A dataset folder (uncompressed shards).")) -> None:
    """Write TFDS metadata next to dataset.json, so tfds.builder_from_directory(OUT) opens the dataset."""
    try:
        _load_tensorflow()
        from .ingest.tfds_metadata import write_tfds_metadata

        written = write_tfds_metadata(out)
        typer.echo(f"{out}: wrote {', '.join(written)}; open it with tfds.builder_from_directory({out!r})")
    except _errors() as e:
        _fail(e)


def _save_image(image, path: str) -> None:
    """Writes a PIL image to ``path`` (PNG, or JPEG by the extension) under a temporary name, then renames it."""
    formats = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG"}
    extension = os.path.splitext(path)[1].lower()
    if extension not in formats:
        raise ValueError(f"{path}: --output must end in .png, .jpg or .jpeg (got {extension or 'no extension'})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: folder {folder} does not exist; create it or choose another --output")
    import tempfile

    handle, temp = tempfile.mkstemp(prefix=".tmp-", suffix=extension, dir=folder)  # a new file, never followed
    try:
        with os.fdopen(handle, "wb") as f:
            image.save(f, formats[extension])
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        if os.path.lexists(temp):
            os.remove(temp)


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
        from .readers.preview import preview as draw

        # None is "not given", so an option of the other kind of dataset is refused rather than ignored.
        image = draw(out, split, n, augmented=True if augmented else None, seed=seed, tile=tile, length=length,
                     shift=shift)
        _save_image(image, output)
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
        from .ingest import ConvertOptions, convert_images, verify as verify_dataset
        from .ingest.demo import make_image_folders

        src = make_image_folders(os.path.join(folder, "images"))
        out = os.path.join(folder, "images-tfrecord")
        typer.echo(f"demo: made {src}/{{train,val}}/<class>/*.jpg, including 6 odd or broken files")
        _convert_and_report(convert_images, src, out, ConvertOptions(min_shards=2), workers=workers, overwrite=True)
        verify_dataset(out)
        typer.echo(f"{out}: verified, every record's CRC and every shard's sha256 match dataset.json")
        from . import readers

        ds = readers.images(out, batch_size=16, image_size=(64, 64), seed=0)
        images, labels = next(iter(ds))
        typer.echo(f"readers.images({out!r}, batch_size=16, image_size=(64, 64)): images {tuple(images.shape)} "
                   f"{images.dtype.name} in [0, 1], labels {labels.numpy().tolist()}")
        from .ingest import EpisodeOptions, convert_episodes
        from .ingest.demo import make_episodes
        from .readers.resident import default_device

        src = make_episodes(os.path.join(folder, "episodes"))
        out_ep = os.path.join(folder, "episodes-tfrecord")
        typer.echo(f"demo: made {src}/{{train,val}}/run-*.npz (obs float32 [T, 3], action int32 [T]), "
                   "plus an empty episode and one with a NaN")
        options = ConvertOptions(min_shards=2, episode=EpisodeOptions(on_nan="skip"))
        _convert_and_report(convert_episodes, src, out_ep, options, workers=workers, overwrite=True)
        verify_dataset(out_ep)
        typer.echo(f"{out_ep}: verified")
        windows = readers.windows(out_ep, length=128, shift=16, batch_size=32, features="obs", targets=8, seed=0)
        x, y = next(iter(windows))
        count = readers.info(out_ep).num_windows("train", 128, 16, horizon=8)
        typer.echo(f"readers.windows({out_ep!r}, length=128, shift=16, batch_size=32, features='obs', targets=8): "
                   f"x {tuple(x.shape)}, y {tuple(y.shape)} (the next 8 steps); {count:,} windows per epoch, "
                   f"gathered from one resident array on {default_device()}")
        from .readers.preview import preview as draw

        drawings = ((out, "images-preview.png", {}), (out_ep, "episodes-preview.png", {"length": 128, "shift": 16}))
        for dataset, name, options in drawings:  # length/shift only for episodes: preview refuses them for images
            path = os.path.join(folder, name)
            try:
                _save_image(draw(dataset, **options), path)
            except ImportError as e:  # episode plots need the preview extra (make demo installs it)
                typer.echo(f"preview: {path} not drawn: {e}")
                continue
            typer.echo(f"preview: {path} (tfshard preview {dataset} -o {path})")
        typer.echo(f"next: tfshard info {out}; tfshard bench {out}; tfshard bench {out_ep} --window 128 --shift 16")
    except _errors() as e:
        _fail(e)


service_app = typer.Typer(
    no_args_is_help=True,
    help="Run tf.data service servers, so CPU hosts preprocess for readers.images/windows(service=...).",
)
app.add_typer(service_app, name="service")


def _serve(server, name: str) -> None:
    """Blocks until Ctrl-C or SIGTERM, then stops ``server``.

    Not ``server.join()``: it blocks inside C++ and never lets Python see Ctrl-C.
    """
    import signal
    import threading

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.stop()
    typer.echo(f"{name}: stopped")


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
    import socket

    service_lib, server = _start_server(
        lambda lib: lib.start_dispatcher(port, work_dir=work_dir, fault_tolerant=fault_tolerant)
    )
    address = f"{socket.gethostname()}:{service_lib.bound_port(server)}"
    typer.echo(f"dispatcher: serving at grpc://{address}; add workers with `tfshard service worker --dispatcher "
               f"{address}`, read with service='grpc://{address}'")
    _serve(server, "dispatcher")


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
    import socket

    service_lib, server = _start_server(lambda lib: lib.start_worker(dispatcher, port=port, worker_address=worker_address))
    bound = service_lib.bound_port(server)
    advertised = (worker_address or f"{socket.gethostname()}:%port%").replace("%port%", str(bound))
    typer.echo(f"worker: serving at {advertised} (port {bound}) for dispatcher {dispatcher}")
    _serve(server, "worker")


_GLOBAL_FLAGS = ("--debug", "--verbose", "-v")


def global_flags_first(args: list[str]) -> list[str]:
    """Moves ``--debug``/``-v`` to the front, so they work after the subcommand too (before any ``--``)."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in _GLOBAL_FLAGS]
    return flags + [a for a in args[:end] if a not in _GLOBAL_FLAGS] + args[end:]


def _click():
    """The click typer runs on: vendored as ``typer._click`` since typer 0.22, the ``click`` package before."""
    import importlib

    return getattr(typer, "_click", None) or importlib.import_module("click")


EXIT_CODES = {0: "success", 1: "an error (one line on stderr)", 2: "a usage error: a bad flag or argument",
              130: "interrupted (Ctrl-C)", 143: "terminated (SIGTERM)"}


def main(args: list[str] | None = None) -> None:
    """The ``tfshard`` command (``python -m tfshard``); exits with one of ``EXIT_CODES``.

    Usage errors are one line too (``error: ...``, exit 2), not the boxed panel typer draws by default.
    """
    errors = _click().exceptions
    command = typer.main.get_command(app)
    try:
        code = command.main(args=global_flags_first(sys.argv[1:] if args is None else list(args)),
                            prog_name="tfshard", standalone_mode=False)
    except errors.NoArgsIsHelpError as e:
        typer.echo(e.format_message())
        code = 2
    except errors.UsageError as e:
        hint = f"; see `{e.ctx.command_path} --help`" if e.ctx is not None else ""
        typer.echo(f"error: {' '.join(e.format_message().split())}{hint}", err=True)
        code = 2
    except errors.ClickException as e:
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        code = e.exit_code
    except errors.Abort:
        typer.echo("error: aborted", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    sys.exit(main())
