"""Timing an input pipeline alone, with no model: what ``tfshard bench`` reports.

    for epoch in time_epochs(readers.images("photos-tfr", batch_size=64), epochs=2):
        print(epoch.examples / epoch.seconds, "img/s")
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import tensorflow as tf


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
    """Iterates ``dataset`` ``epochs`` times from Python, as a training loop would, timing each epoch."""
    for epoch in range(1, epochs + 1):
        started, examples, batches = time.perf_counter(), 0, 0
        for element in dataset:
            examples += _batch_size(element)
            batches += 1
        yield EpochTiming(epoch, examples, batches, time.perf_counter() - started)


# --- side by side: the reader against the floors and keras (tfshard bench --compare, benchmarks/images.py) ----------

FLOOR_CROP = "floor: fused random crop, bytes in RAM"
FLOOR_DECODE = "floor: full decode + resize, bytes in RAM"
KERAS = "keras image_dataset_from_directory"
EVAL = "tfshard eval (training=False)"
NO_AUGMENT = "tfshard training, augment=None"
DEFAULT = "tfshard training (default: crop+flip)"
UINT8 = "tfshard training, dtype=uint8"
COLOR = "tfshard training, augment='color'"
CACHE_FIRST = "tfshard cache: first epoch (fills it)"
CACHE_AGAIN = "tfshard cache: cached epoch"

# (label, numerator, denominator, target): issue 11's goals, as ratios of img/s measured in one run.
IMAGE_RATIOS = [
    ("training (default) / keras", DEFAULT, KERAS, 1.2),
    ("training (default) / fused-crop floor", DEFAULT, FLOOR_CROP, 0.9),
    ("eval / keras", EVAL, KERAS, 1.2),
    ("training default / augment=None", DEFAULT, NO_AUGMENT, 0.9),
    ("cached epoch / first epoch", CACHE_AGAIN, CACHE_FIRST, 3.0),
]


def jpeg_records(path: str, split: str, limit: int | None = None) -> tuple[list[bytes], list[int]]:
    """The JPEG bytes and labels of (the first ``limit``) records of a split, held in RAM for the floors."""
    from ..format.names import tf_compression_type
    from ..format.records import IMAGE_FEATURES, parse_spec
    from .files import info

    dataset = info(path)
    spec = parse_spec(IMAGE_FEATURES, ("image/encoded", "image/class/label"))
    records = tf.data.TFRecordDataset(dataset.shard_paths(split),
                                      compression_type=tf_compression_type(dataset.manifest.compression))
    if limit is not None:
        records = records.take(limit)
    blobs, labels = [], []
    for parsed in records.map(lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator():
        blobs.append(parsed["image/encoded"])
        labels.append(int(parsed["image/class/label"]))
    return blobs, labels


def floor_fused_crop(blobs: list[bytes], labels: list[int], batch_size: int, image_size: tuple[int, int]):
    """The reader's own fused random-crop decode + resize over bytes already in RAM, on all cores: training's floor."""
    from .images import decode_random_crop

    seeds = tf.data.Dataset.random(seed=0, rerandomize_each_iteration=True).batch(2)
    ds = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices((blobs, labels)), seeds))
    ds = ds.map(lambda item, seed: (decode_random_crop(item[0], seed, image_size), item[1]),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


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
    from .images import images

    buffer = {} if shuffle_buffer is None else {"shuffle_buffer": shuffle_buffer}

    def reader(**kwargs):
        return lambda: images(path, split, batch_size=batch_size, image_size=image_size, seed=0, **buffer, **kwargs)

    methods = {
        FLOOR_CROP: lambda: floor_fused_crop(blobs, labels, batch_size, image_size),
        FLOOR_DECODE: lambda: floor_full_decode(blobs, labels, batch_size, image_size),
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
