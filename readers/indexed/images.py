"""``readers.images`` on the index-driven stream: mixtures, class balance, a global shuffle and elastic resume.

The stages, in their one order: this pipeline's global elements, a chunk at a time (Python per chunk: one
epoch's order from ``readers/sampling``, each source's epoch check) → each element's record read by position
(``records.read_at``, interleaved in order) → parse, the merged label, decode (a random crop seeded by the global
element index, so every replica count crops alike; each image's augmentation seed from it too) → batch → augment the
batch (each image's numbers from its own seed) → known length → prefetch.
"""

from __future__ import annotations

import secrets

import numpy as np
import tensorflow as tf

from ..epoch_guard import Stamp
from ..image_batches import augmented, decoded_batches
from ..image_ops import decode_center_crop, decode_random_crop
from ..image_recipe import Recipe
from ..input_position import InputPosition, attach
from ..options import external_state_ignored, quiet_options
from ..sampling import classes as sampling_classes
from ..sampling.plan import StreamSpec
from ..shard_cache.pipeline import ShardCacheArg
from . import pipeline as pipeline_lib
from . import records as records_lib
from . import sources as sources_lib
from .request import StreamRequest
from .stream import EpochCount, Stream, pipeline_position

AUTOTUNE = tf.data.AUTOTUNE


def indexed_images(request: StreamRequest, split: str, *, batch_size: int, recipe: Recipe, seed: int | None,
                   input_context, drop_remainder: bool, num_parallel_reads: int | None, repeat: bool,
                   start_step: int | InputPosition, shard_cache: ShardCacheArg) -> tf.data.Dataset:
    """The stream's batches (see ``readers.images``, which checks the arguments and calls this). ``start_step``: an
    int, or with ``repeat`` and a seed the ``InputPosition`` that says it when the iterator opens."""
    where = request.where
    sources = [sources_lib.load(path, split, shard_cache) for path in request.paths]
    merged = sources_lib.merged_labels(sources)
    seed = secrets.randbelow(2**62) if seed is None else seed  # unseeded: fresh, but one seed for the whole run
    stream = _stream(request, sources, merged, seed, shuffle=recipe.training or request.shuffle == "global")
    position = pipeline_position(batch_size, input_context, where)
    epoch_size = stream.spec.epoch_size
    if drop_remainder and position.batches(epoch_size, True) == 0:
        raise ValueError(f"{where}: split {split!r} gives {epoch_size} elements an epoch, fewer than one global "
                         f"batch of {position.global_batch} with drop_remainder=True, so an epoch would yield no "
                         "batch; pass a smaller batch_size, a larger epoch_size or drop_remainder=False")
    table = records_lib.concatenated([s.table for s in sources])

    epochs = EpochCount()

    def indices_of(number, start):
        if repeat:
            return position.chunk(number, start, epoch_size)
        return position.epoch(epochs.at(number), epoch_size, drop_remainder, chunk=number)

    def rows(indices):
        source, record = stream.records(indices)
        return (table.shard[record], table.offset[record], table.length[record], indices.astype(np.int64),
                source.astype(np.int32))

    elements = pipeline_lib.elements(indices_of, rows, [tf.int32, tf.int64, tf.int64, tf.int64, tf.int32],
                                     [s.guard for s in sources], repeat=repeat, start_step=start_step,
                                     epoch_chunks=position.epoch_chunks(epoch_size, drop_remainder))
    records = pipeline_lib.read(elements, table, num_parallel_reads)
    ds = decoded_batches(records, _decoder(recipe, merged, seed, request.with_source), batch_size=batch_size,
                         drop_remainder=drop_remainder, deterministic=True, fused=recipe.per_image)
    ds = augmented(ds, recipe, batch_size=batch_size, seed=seed, start_step=start_step, deterministic=True,
                   element_seeds=not recipe.per_image)
    if not repeat:
        ds = ds.apply(tf.data.experimental.assert_cardinality(position.batches(epoch_size, drop_remainder)))
    ds = Stamp(where, [s.info.sha256 for source in sources for s in source.shards]).lead(ds)
    options = quiet_options()
    ds = ds.prefetch(AUTOTUNE).with_options(options)
    ds = ds.with_options(external_state_ignored())  # the chunks' Python holds only the epoch count
    ds = pipeline_lib.holding_sessions(ds, [s.session for s in sources])
    return attach(ds, start_step if isinstance(start_step, InputPosition) else None)


def _stream(request: StreamRequest, sources, merged, seed: int, shuffle: bool) -> Stream:
    sizes = tuple(len(s.table) for s in sources)
    starts = np.cumsum((0, *sizes)).astype(np.int64)
    if request.balance is None:
        for source, size in zip(sources, sizes):
            if size == 0:
                raise ValueError(f"{source.path}: its split holds no record, so it cannot give a share of the stream "
                                 "(got 0 records); leave it out")
        spec = StreamSpec(sizes=sizes, weights=request.weights, epoch_size=request.epoch_size, shuffle=shuffle,
                          seed=seed)
        return Stream(spec, None, starts)
    kind = sources[0].kind
    if kind != "class":
        raise ValueError(f"{request.where}: balance='class' needs one class per image (got {kind!r} labels); drop "
                         "balance, or weigh the samples yourself")
    ids = sources_lib.class_ids(sources, merged)
    try:
        spec, members = sampling_classes.balanced(ids, list(merged.names), epoch_size=request.epoch_size,
                                                  shuffle=shuffle, seed=seed)
    except ValueError as e:
        raise ValueError(f"{request.where}: {e}") from e
    return Stream(spec, members, starts)


def _decoder(recipe: Recipe, merged: sources_lib.MergedLabels, seed: int, with_source: bool):
    spec = merged.labels.spec()
    flip = recipe.per_image and recipe.augment == "default"
    crop_seed = tf.constant(seed, tf.int64)  # with n, the stateless seed [seed, n] of element n
    batch_augmented = not recipe.per_image  # the batch stage augments: it gets each element's seed

    def decode(record, n, source):
        parsed = tf.io.parse_single_example(record, spec)
        encoded, label = parsed["image/encoded"], merged.label(parsed, source)
        if recipe.random_decode:
            image = decode_random_crop(encoded, tf.stack([crop_seed, n]), recipe.image_size, flip=flip,
                                       unit_float=recipe.unit_float)
        else:
            image = decode_center_crop(encoded, recipe.stage["size"], recipe.stage["padding"],
                                       unit_float=recipe.unit_float)
        label = {"label": label, "source": source} if with_source else label
        if batch_augmented:  # folded in per element here, in the parallel map, not in a loop over each batch
            return image, label, tf.random.experimental.stateless_fold_in(tf.stack([crop_seed, n]), 2)
        return image, label

    return decode

