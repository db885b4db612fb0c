"""The last stages of both image readers (``readers/images.py`` and ``readers/indexed/images.py``): decode and batch
(one fused stage where it can be), then augment the uint8 batches and cast them to the asked dtype."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from . import augment as augment_lib
from .graph_ready import as_map_converts
from .image_ops import seed_stream
from .image_recipe import AUGMENTATIONS, Recipe
from .input_position import InputPosition, skipped

AUTOTUNE = tf.data.AUTOTUNE

try:  # map then batch as one stage (what tf.data.experimental.map_and_batch, deprecated, builds)
    from tensorflow.python.data.experimental.ops.batching import _MapAndBatchDataset
except ImportError:  # pragma: no cover - every TensorFlow this project supports has it
    _MapAndBatchDataset = None


def decoded_batches(records: tf.data.Dataset, decode: Callable, *, batch_size: int, drop_remainder: bool,
                    deterministic, ignore_errors: bool = False, fused: bool = True) -> tf.data.Dataset:
    """``records.map(decode)`` batched, both in parallel: with ``fused`` (every image finished in the decode: the
    recipe's ``per_image``), one map-and-batch stage, each image decoded straight into its batch, unless order may
    change (``deterministic=False``) or records may be skipped (``ignore_errors``). The readers run without
    tf.data's static rewrites (readers/options.py), so nothing else fuses them: a parallel map then a parallel batch
    took ~10% more CPU per evaluation image and ~20 ms more to the first batch."""
    if not fused or ignore_errors or deterministic is False or _MapAndBatchDataset is None:
        return batched(decoded(records, decode, deterministic=deterministic, ignore_errors=ignore_errors),
                       batch_size=batch_size, drop_remainder=drop_remainder, deterministic=deterministic)
    return _MapAndBatchDataset(records, decode, batch_size, AUTOTUNE, drop_remainder)


def decoded(records: tf.data.Dataset, decode: Callable, *, deterministic, ignore_errors: bool) -> tf.data.Dataset:
    """``records.map(decode)`` in parallel; with ``ignore_errors``, a record that fails to decode is logged and
    skipped."""
    ds = records.map(decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return ds.ignore_errors(log_warning=True) if ignore_errors else ds


def batched(ds: tf.data.Dataset, *, batch_size: int, drop_remainder: bool, deterministic) -> tf.data.Dataset:
    """Decoded images (from a cache) batched, copied into the batch in parallel."""
    return ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def augmented(ds: tf.data.Dataset, recipe: Recipe, *, batch_size: int, seed, start_step: int | InputPosition,
              deterministic, element_seeds: bool = False) -> tf.data.Dataset:
    """Augment the uint8 batches (the crop after a cache, colour jitter, a callable), then cast to the asked dtype.
    Nothing to do when every image left the decode map finished. ``batch_size``: ``batched``'s (the crop's count of
    boxes when the last batch may be partial).

    ``element_seeds``: the batches are ``(images, labels, seeds [B, 2])``, each image's own stateless seed (the
    index-driven stream's, from ``(seed, global element)``); the crop and the named augmentations draw each image's
    numbers from it, so an image is augmented alike in any batch, on any replica count. A callable still gets one
    seed per pipeline batch. Without it (the default reader), every augmentation gets one seed per batch."""
    if recipe.per_image:
        return ds
    unit_float = recipe.dtype == "float32"

    def finish(images_):  # only float32 output is ever cast, once, on the batch
        return augment_lib.to_unit_float(images_) if unit_float else images_

    if not (recipe.training and (recipe.augment is not None or recipe.crop_after_cache is not None)):
        if not unit_float and not element_seeds:
            return ds
        return ds.map(lambda images_, labels, *_: (finish(images_), labels), num_parallel_calls=AUTOTUNE,
                      deterministic=deterministic)
    augment, crop_to = recipe.augment, recipe.crop_after_cache
    if callable(augment):  # the reader is traced without AutoGraph; a user's function is converted, as map would
        augment = as_map_converts(augment)

    def augment_batch(batch, seed_):
        images_, labels = batch[:2]  # uint8: crop and flip stay uint8; a cast to float, if any, comes last
        image_seeds = batch[2] if element_seeds else None
        if isinstance(augment, str):
            drawn = seed_ if image_seeds is None else image_seeds
            if augment == "default":
                return augment_lib.default_augment(images_, drawn, crop_to=crop_to, unit_float=unit_float,
                                                   batch_size=batch_size), labels
            return finish(AUGMENTATIONS[augment](images_, drawn, crop_to=crop_to, batch_size=batch_size)), labels
        if crop_to is not None:
            crop_seed, seed_ = tf.unstack(tf.random.experimental.stateless_split(seed_, 2))
            images_ = augment_lib.random_resized_crop_batch(
                images_, crop_to, crop_seed if image_seeds is None else image_seeds, batch_size=batch_size)
        images_ = finish(images_)
        return (augment(images_, seed_) if augment is not None else images_), labels

    if element_seeds and isinstance(augment, str):  # no seed stream: every number comes from the images' seeds
        return ds.map(lambda *batch: augment_batch(batch, None), num_parallel_calls=AUTOTUNE,
                      deterministic=deterministic)
    # Per-batch seeds continue from the resumed step too (start_step batches in).
    ds = tf.data.Dataset.zip((ds, skipped(lambda: seed_stream(seed, salt=2), start_step, per_step=1)))
    return ds.map(augment_batch, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
