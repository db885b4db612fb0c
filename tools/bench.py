"""Timing an input pipeline alone, with no model: what ``tfshard bench`` reports, and its side-by-side rows.

    for epoch in time_epochs(readers.images("photos-tfr", batch_size=64), epochs=2):
        print(epoch.examples / epoch.seconds, "img/s")
    for line in run("photos-tfr"):   # what `tfshard bench photos-tfr` prints
        print(line)
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator

import tensorflow as tf

from ..format import stops
from ..readers.files import DatasetInfo, info, records_in_order
from ..readers.image_batches import decoded_batches
from ..readers.image_ops import ImageLabels, decode_center_crop, decode_random_crop, parse_image
from ..readers.images import images
from ..readers.options import quiet_options
from ..readers.windows.dataset import windows
from ..readers.windows.resident import default_device


@dataclasses.dataclass(frozen=True)
class EpochTiming:
    """One epoch: examples (images or windows) and batches read, and the wall time it took."""

    epoch: int
    examples: int
    batches: int
    seconds: float


def _batch_size(element) -> int:
    """Examples in one batch: the leading dimension of its first tensor (of a tuple, a dict, or a tensor)."""
    first = tf.nest.flatten(element)[0]
    return int(first.shape[0])


def time_epochs(dataset: tf.data.Dataset, epochs: int) -> Iterator[EpochTiming]:
    """Iterates ``dataset`` ``epochs`` times from Python, as a training loop would, timing each epoch.

    Under the ``tfshard`` command a Ctrl-C or SIGTERM stops it after the batch it arrived in, even one raised
    where Python could only print it (an iterator's finalizer between epochs; ``format/stops.py``).
    """
    for epoch in range(1, epochs + 1):
        started, examples, batches = time.perf_counter(), 0, 0
        for element in dataset:
            stops.check()
            examples += _batch_size(element)
            batches += 1
        stops.check()
        yield EpochTiming(epoch, examples, batches, time.perf_counter() - started)


# --- side by side: the reader against the floors and keras (tfshard bench --compare, benchmarks/images.py) ----------

FLOOR_CROP = "floor: fused random crop, bytes in RAM"
FLOOR_DECODE = "floor: full decode + resize, bytes in RAM"
FLOOR_EVAL = "floor: fused centre crop, fixed parallelism"
FLOOR_EVAL_AUTOTUNE = "floor: fused centre crop, autotune"
FLOOR_EVAL_READ = "floor: tf.data read + centre crop, no checks"
KERAS = "keras image_dataset_from_directory"
EVAL = "tfshard eval (training=False)"
NO_AUGMENT = "tfshard training, augment=None"
DEFAULT = "tfshard training (default: crop+flip)"
UINT8 = "tfshard training, dtype=uint8"
COLOR = "tfshard training, augment='color'"
CACHE_FIRST = "tfshard cache: first epoch (fills it)"
CACHE_AGAIN = "tfshard cache: cached epoch"

# (label, numerator, denominator, goal): the image reader's goals, as ratios of img/s measured in one run.
IMAGE_RATIOS = [
    ("training (default) / keras", DEFAULT, KERAS, 1.2),
    ("training (default) / fused-crop floor", DEFAULT, FLOOR_CROP, 0.9),
    ("eval / keras", EVAL, KERAS, 1.2),
    ("eval / its fused centre-crop floor", EVAL, FLOOR_EVAL, 0.95),
    ("training default / augment=None", DEFAULT, NO_AUGMENT, 0.9),
    ("cached epoch / first epoch", CACHE_AGAIN, CACHE_FIRST, 3.0),
]


# (label, numerator, denominator): where evaluation's time against its floor goes, no goal of their own.
IMAGE_SHARES = [
    ("reading the shards: bare read / in RAM", FLOOR_EVAL_READ, FLOOR_EVAL),
    ("the reader's checks: eval / bare read", EVAL, FLOOR_EVAL_READ),
]


def jpeg_records(path: str, split: str, limit: int | None = None) -> tuple[list[bytes], list]:
    """The JPEG bytes and labels of (the first ``limit``) records of a split, held in RAM for the floors."""
    dataset = info(path)
    kind = ImageLabels.of(dataset.manifest)  # class indices, or the multi-hot or value labels readers.images yields
    parsed = itertools.chain.from_iterable(records.map(lambda r: parse_image(r, kind)).as_numpy_iterator()
                                           for records in records_in_order(dataset, split))
    blobs, labels = [], []
    for encoded, label in itertools.islice(parsed, limit):
        stops.check()
        blobs.append(encoded)
        labels.append(label)
    return blobs, labels


def floor_fused_crop(blobs: list[bytes], labels: list[int], batch_size: int, image_size: tuple[int, int]):
    """The reader's own fused random-crop decode + resize over bytes already in RAM, on all cores: training's floor."""
    seeds = tf.data.Dataset.random(seed=0, rerandomize_each_iteration=True).batch(2)
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices((blobs, labels)), seeds))
    ds = ds.map(lambda item, seed: (decode_random_crop(item[0], seed, image_size), item[1]),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def floor_center_crop(blobs: list[bytes], labels: list[int], batch_size: int, image_size: tuple[int, int],
                      autotune: bool = False):
    """The evaluation reader's own fused centre-crop decode + resize to float32 over bytes in RAM: evaluation's floor.

    ``autotune`` False: one decode per core and tf.data's autotuner off, as the readers run; True: ``AUTOTUNE``
    parallelism with the autotuner on (it made this floor bimodal on 2 cores: 845-1,268 img/s).
    """
    parallel = tf.data.AUTOTUNE if autotune else len(os.sched_getaffinity(0))
    ds = tf.data.Dataset.from_tensor_slices((blobs, labels)).map(
        lambda encoded, label: (decode_center_crop(encoded, image_size, unit_float=True), label),
        num_parallel_calls=parallel)
    ds = ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    if autotune:
        return ds
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def floor_read_center_crop(path: str, split: str, batch_size: int, image_size: tuple[int, int]) -> tf.data.Dataset:
    """The least a tf.data evaluation reader of a dataset's shards does: read them (``TFRecordDataset``, with its
    CRC check), parse, the fused centre-crop decode fused with the batch, prefetch; no checks of any kind, no
    AutoGraph, tf.data's autotune and static rewrites off, as the readers run. Against ``floor_center_crop`` (the
    same decode of bytes in RAM) it shows what reading the shards costs; against evaluation, what the reader's
    checks cost."""
    dataset = info(path)
    kind = ImageLabels.of(dataset.manifest)

    @tf.autograph.experimental.do_not_convert
    def decode(record):
        encoded, label = parse_image(record, kind)
        return decode_center_crop(encoded, image_size, unit_float=True), label

    parts = list(records_in_order(dataset, split))
    records = parts[0]
    for part in parts[1:]:
        records = records.concatenate(part)
    batches = decoded_batches(records, decode, batch_size=batch_size, drop_remainder=False, deterministic=None)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(quiet_options())


def floor_full_decode(blobs: list[bytes], labels: list[int], batch_size: int, image_size: tuple[int, int]):
    """A full ``decode_jpeg`` + resize over bytes in RAM, on all cores: what any full-decode loader costs."""
    def decode(encoded, label):
        return tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), image_size), label

    ds = tf.data.Dataset.from_tensor_slices((blobs, labels)).map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def keras_folder(src: str, batch_size: int, image_size: tuple[int, int]):
    """keras' ``image_dataset_from_directory`` on the source folder, plus prefetch: the loader tfshard replaces."""
    import keras

    ds = keras.utils.image_dataset_from_directory(src, batch_size=batch_size, image_size=image_size, verbose=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def image_methods(path: str, split: str, *, batch_size: int, image_size: tuple[int, int], blobs, labels,
                  src: str | None = None, shuffle_buffer: int | None = None) -> dict:
    """Name → a function making a fresh dataset, for every row of the comparison (keras only with ``src``)."""
    buffer = {} if shuffle_buffer is None else {"shuffle_buffer": shuffle_buffer}

    def reader(**kwargs):
        return lambda: images(path, split, batch_size=batch_size, image_size=image_size, seed=0, **buffer, **kwargs)

    methods = {
        FLOOR_CROP: lambda: floor_fused_crop(blobs, labels, batch_size, image_size),
        FLOOR_DECODE: lambda: floor_full_decode(blobs, labels, batch_size, image_size),
        FLOOR_EVAL: lambda: floor_center_crop(blobs, labels, batch_size, image_size),
        FLOOR_EVAL_AUTOTUNE: lambda: floor_center_crop(blobs, labels, batch_size, image_size, autotune=True),
        FLOOR_EVAL_READ: lambda: floor_read_center_crop(path, split, batch_size, image_size),
    }
    if src is not None:
        methods[KERAS] = lambda: keras_folder(src, batch_size, image_size)
    methods.update({EVAL: reader(training=False), NO_AUGMENT: reader(augment=None), DEFAULT: reader(),
                    UINT8: reader(dtype="uint8"), COLOR: reader(augment="color")})
    return methods


def ratios(rates: dict[str, float]) -> list[tuple[str, float, float]]:
    """``(label, measured, target)`` for each of ``IMAGE_RATIOS`` whose two rows were measured."""
    return [(label, rates[num] / rates[den], target) for label, num, den, target in IMAGE_RATIOS
            if num in rates and den in rates]


def shares(rates: dict[str, float]) -> list[tuple[str, float]]:
    """``(label, measured)`` for each of ``IMAGE_SHARES`` whose two rows were measured."""
    return [(label, rates[num] / rates[den]) for label, num, den in IMAGE_SHARES if num in rates and den in rates]


# --- what `tfshard bench` runs ----------------------------------------------------------------------------------------


def run(out: str, split: str = "train", *, batch_size: int = 64, image_size: int = 224, training: bool = True,
        cache: str | None = None, epochs: int = 2, ignore_errors: bool = False, window: int | None = None,
        shift: int = 1, streamed: bool = False, compare: bool = False, src: str | None = None,
        limit: int | None = None) -> Iterator[str]:
    """The lines ``tfshard bench`` prints, as each is measured. Close the generator (or let an exception through
    it) and the temporary cache it made is removed, however the run stops.

    Args: as the command's flags. ``cache`` None: a temporary folder, removed afterwards; ``"none"``: no cache.
    """
    if epochs < 1:
        raise ValueError(f"--epochs: must be at least 1 (got {epochs}); pass the number of epochs to time")
    dataset = info(out)
    if dataset.manifest.kind == "episodes" or window is not None:
        yield from _window_epochs(out, dataset, split, window, shift, batch_size, epochs, streamed)
    elif compare:
        if limit is not None and limit < batch_size:
            raise ValueError(f"--limit: at least one batch of JPEGs for the floors (got {limit}, batch {batch_size}); "
                             "pass a larger --limit or leave it out")
        if src is not None and not os.path.isdir(src):
            raise FileNotFoundError(f"{src}: --src is not a folder; pass the source folder of the conversion")
        yield from _compare(out, split, batch_size, (image_size, image_size), src, limit)
    else:
        yield from _image_epochs(out, dataset, split, batch_size, image_size, training, cache, epochs, ignore_errors)


def _image_epochs(out: str, dataset: DatasetInfo, split: str, batch_size: int, image_size: int, training: bool,
                  cache: str | None, epochs: int, ignore_errors: bool) -> Iterator[str]:
    expected = dataset.num_records(split)
    temp = tempfile.mkdtemp(prefix="tfshard-bench-cache-") if cache is None else None
    try:
        chosen = None if cache == "none" else (temp or cache)
        ds = images(out, split, batch_size=batch_size, image_size=(image_size, image_size), training=training, seed=0,
                    cache=chosen, drop_remainder=False, ignore_errors=ignore_errors)
        yield (f"{out} [{split}]: {expected:,} records, batch {batch_size}, {image_size}x{image_size}, "
               f"{'training' if training else 'eval'}, cache={chosen or 'none'}")
        for timed in time_epochs(ds, epochs):
            note = " (fills the cache)" if timed.epoch == 1 and chosen else (" (cached)" if chosen else "")
            skipped = f", {expected - timed.examples:,} records skipped" if timed.examples != expected else ""
            yield (f"  epoch {timed.epoch}{note}: {timed.examples:,} images in {timed.seconds:.2f} s: "
                   f"{timed.examples / timed.seconds:,.0f} img/s, {timed.batches / timed.seconds:,.1f} batches/s"
                   f"{skipped}")
    finally:
        if temp:
            shutil.rmtree(temp, ignore_errors=True)


def _compare(out: str, split: str, batch_size: int, size: tuple[int, int], src: str | None,
             limit: int | None) -> Iterator[str]:
    """The rows and ratios of benchmarks/images.py on this dataset: one pass each, after an XLA warm-up."""
    blobs, labels = jpeg_records(out, split, limit)
    methods = image_methods(out, split, batch_size=batch_size, image_size=size, blobs=blobs, labels=labels, src=src)
    for name in (DEFAULT, COLOR, FLOOR_CROP):
        next(iter(methods[name]()))  # compile the XLA-fused ops once, before any clock runs
    yield (f"{out} [{split}]: batch {batch_size}, {size[0]}x{size[1]}; floors over {len(blobs):,} JPEGs in RAM"
           + ("" if src else "; pass --src SRC to add keras' loader"))
    rates = {}
    for name, make in methods.items():
        (timed,) = time_epochs(make(), 1)
        rates[name] = timed.examples / timed.seconds
        yield f"  {name:<44} {rates[name]:>8,.0f} img/s"
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-cache-") as folder:
        cached = images(out, split, batch_size=batch_size, image_size=size, seed=0, cache=folder)
        for name, timed in zip((CACHE_FIRST, CACHE_AGAIN), time_epochs(cached, 2)):
            rates[name] = timed.examples / timed.seconds
            yield f"  {name:<44} {rates[name]:>8,.0f} img/s"
    for label, value, goal in ratios(rates):
        yield f"  {label:<44} {value:>7.2f}x  (goal >= {goal}x: {'met' if value >= goal else 'missed'})"
    for label, value in shares(rates):
        yield f"  {label:<44} {value:>7.2f}x"


def _window_epochs(out: str, dataset: DatasetInfo, split: str, window: int | None, shift: int, batch_size: int,
                   epochs: int, streamed: bool) -> Iterator[str]:
    if window is None:
        raise ValueError(f"{out}: an episode dataset; pass --window L (and --shift S) to time its windows")
    if dataset.manifest.kind != "episodes":
        raise ValueError(f"{out}: --window needs an episode dataset (got {dataset.manifest.kind!r}); drop --window")
    expected = dataset.num_windows(split, window, shift)
    started = time.perf_counter()
    ds = windows(out, split, length=window, shift=shift, batch_size=batch_size, seed=0, resident=not streamed)
    built = time.perf_counter() - started
    mode = "streamed from the shards" if streamed else f"resident on {default_device()}, built in {built:.2f} s"
    yield f"{out} [{split}]: {expected:,} windows of {window} (shift {shift}), batch {batch_size}, {mode}"
    for timed in time_epochs(ds, epochs):
        yield (f"  epoch {timed.epoch}: {timed.examples:,} windows in {timed.seconds:.2f} s: "
               f"{timed.examples / timed.seconds:,.0f} windows/s, {timed.batches / timed.seconds:,.1f} batches/s")
