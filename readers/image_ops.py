"""The image ops the reader, ``tfshard preview`` and the benchmarks share: parse a record, decode a JPEG crop.

Both decodes decode only the crop they keep (fused ``decode_and_crop_jpeg``) and
resize it, then round to the pixel values a uint8 image holds, returned as uint8
or as float32 in [0, 1] (the uint8 values / 255, without a uint8 round trip).

Their windows are computed in the fewest pairs of op and ``T`` (its dtype attribute): the first iterator of a
process sets up each new pair in ~1.5 ms (oneDNN's graph pass, on by default on x86, scans every registered
kernel for it; docs/design.md). The centre crop's window reuses the float32 ops of the resize and the clip
(``Cast`` and ``GatherV2`` have no ``T``): 8 int32 pairs fewer, ~10 ms off evaluation's first batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from ..format.records import IMAGE_LABEL_KEYS, image_features, parse_spec
from .options import random_numbers

CROP_PADDING = 32  # the eval centre crop keeps image_size / (image_size + 32) of the shorter side


@dataclasses.dataclass(frozen=True)
class ImageLabels:
    """What an image's label is, from the manifest: ``labels`` (None/``"class"``: an int64 class index;
    ``"multi"``: a multi-hot float32 ``[num_classes]``; ``"value"``: float32, ``[]`` for one column, else
    ``[columns]``)."""

    labels: str | None = None
    num_classes: int = 0
    columns: int = 1

    @classmethod
    def of(cls, manifest) -> ImageLabels:
        return cls(manifest.labels, len(manifest.class_names), max(1, len(manifest.label_columns)))

    @property
    def key(self) -> str:
        return IMAGE_LABEL_KEYS[self.labels]

    def spec(self) -> dict:
        """The parse spec of the encoded image and the label key."""
        return parse_spec(image_features(self.labels, self.columns), ("image/encoded", self.key))

    def label(self, parsed: dict) -> tf.Tensor:
        value = parsed[self.key]
        if self.labels == "multi":  # sorted indices → multi-hot; an image of no class is all zeros
            indices = tf.cast(value.values, tf.int32)
            hot = tf.math.bincount(indices, minlength=self.num_classes, maxlength=self.num_classes) > 0
            # bincount's static shape is [None]: the reshape gives batches a known [B, C] (a model's head size)
            return tf.reshape(tf.cast(hot, tf.float32), [self.num_classes])
        if self.labels == "value" and self.columns == 1:
            return tf.reshape(value, [])
        return value


CLASS_LABELS = ImageLabels()


def parse_image(record: tf.Tensor, labels: ImageLabels = CLASS_LABELS) -> tuple[tf.Tensor, tf.Tensor]:
    """A serialized image record → ``(JPEG bytes, label)``: the two keys the reader parses of it."""
    parsed = tf.io.parse_single_example(record, labels.spec())
    return parsed["image/encoded"], labels.label(parsed)


def _pixels(image: tf.Tensor) -> tf.Tensor:
    """A resized float image rounded and clipped to the 0..255 pixel values a uint8 image holds."""
    return tf.clip_by_value(tf.round(image), 0.0, 255.0)


def _output(pixels: tf.Tensor, unit_float: bool) -> tf.Tensor:
    """uint8, or with ``unit_float`` float32 in [0, 1]: the same values / 255, without a uint8 round trip."""
    return pixels / 255.0 if unit_float else tf.cast(pixels, tf.uint8)


def decode_random_crop(encoded: tf.Tensor, seed: tf.Tensor, size: tuple[int, int], flip: bool = False,
                       unit_float: bool = False) -> tf.Tensor:
    """Inception-style random-resized crop, decoding only the crop (fused ``decode_and_crop_jpeg``).

    uint8, or with ``unit_float`` float32 in [0, 1] (the uint8 values / 255). ``flip``: also flip a random half
    of the images left-right, here on the one image: done per image inside the decode map, the flip and the cast
    cost ~2% of the pass; as a separate map over the batch, ~8% (benchmarks/images.py, 2 cores).
    """
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    # offset and size, height and width: a stack as the flip's seed fold stacks, a GatherNd (no T), no concat
    window = tf.gather_nd(tf.stack([begin, crop_size]), [[0, 0], [0, 1], [1, 0], [1, 1]])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    pixels = _pixels(tf.image.resize(image, size))
    if flip:
        # a 0 or 1 of a seed folded off the crop's (one Philox stream each); drawn as an int, cast: no float ops
        heads = tf.cast(tf.random.stateless_uniform([], tf.random.experimental.stateless_fold_in(seed, 1), 0, 2,
                                                    tf.int32), tf.bool)
        pixels = tf.cond(heads, lambda: tf.reverse(pixels, axis=[1]), lambda: pixels)
    return _output(pixels, unit_float)


def decode_center_crop(encoded: tf.Tensor, size: tuple[int, int], padding: int = CROP_PADDING,
                       unit_float: bool = False) -> tf.Tensor:
    """Deterministic: decode only a centred square of ``size/(size+padding)`` of the shorter side, resize to ``size``.

    uint8, or with ``unit_float`` float32 in [0, 1] straight from the resize, equal to the uint8 values / 255
    (the uint8 round trip and a separate batch map cost ~10% of an evaluation pass's CPU, by TensorFlow's profiler).
    """
    window = center_crop_window(tf.io.extract_jpeg_shape(encoded), size[0], padding)
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return _output(_pixels(tf.image.resize(image, size)), unit_float)


def center_crop_window(shape: tf.Tensor, size: int, padding: int = CROP_PADDING) -> tf.Tensor:
    """The crop window ``[top, left, side, side]`` (int32) of an image of ``shape`` ``[height, width, channels]``:
    the centred square of ``side = max(int(min(height, width) * share), 1)``, ``share = size / (size + padding)`` in
    float32 as TensorFlow divides; offsets ``(height - side + 1) // 2``, ``(width - side + 1) // 2``.

    Computed in float32 with the ops the resize and the clip use anyway (``Cast`` and ``GatherV2`` have no ``T``:
    see the module docstring), exactly: whole and half pixels below 2**23."""
    shape = tf.cast(shape, tf.float32)
    share = np.float32(size) / np.float32(size + padding)
    side = tf.minimum(tf.gather(shape, 0), tf.gather(shape, 1)) * share
    side = tf.maximum(tf.cast(tf.cast(side, tf.int32), tf.float32), 1.0)  # truncated, as an int32 cast truncates
    offsets_and_side = shape * (0.5, 0.5, 0.0) + side * (-0.5, -0.5, 1.0) + (0.5, 0.5, 0.0)
    return tf.cast(tf.gather(offsets_and_side, [0, 1, 2, 2]), tf.int32)


def seed_stream(seed: int | None, salt: int) -> tf.data.Dataset:
    """An endless stream of stateless seeds ``[2]``, new each epoch; reproducible when ``seed`` is set."""
    return random_numbers(
        None if seed is None else seed + salt, rerandomize_each_iteration=True
    ).batch(2)
