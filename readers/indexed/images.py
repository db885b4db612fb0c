"""``readers.images`` on the index-driven stream: mixtures, class balance, a global shuffle and elastic resume.

The stages, in their one order: this pipeline's global elements, a chunk at a time (Python per chunk: one
epoch's order from ``readers/sampling``, each source's epoch check) → each element's record read by position
(``records.read_at``, interleaved in order) → parse, the merged label, decode (a random crop seeded by the global
element index, so every replica count crops alike) → batch → augment the batch → known length → prefetch.
"""

from __future__ import annotations

import itertools
import secrets

import numpy as np
import tensorflow as tf

from ...format.storage import is_url
from ..epoch_guard import Stamp
from ..image_batches import augmented, batched
from ..image_ops import decode_center_crop, decode_random_crop
from ..image_recipe import Recipe
from ..options import external_state_ignored, quiet_options
from ..sampling import classes as sampling_classes
from ..sampling.plan import StreamSpec
from ..shard_cache.pipeline import ShardCacheArg
from . import records as records_lib
from . import sources as sources_lib
from .request import StreamRequest
from .stream import Position, Stream, pipeline_position

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_PARALLEL_READS = 16  # remote records read at once
_READ_BATCH = 64  # local records read by one Python call


def indexed_images(request: StreamRequest, split: str, *, batch_size: int, recipe: Recipe, seed: int | None,
                   input_context, drop_remainder: bool, num_parallel_reads: int | None, repeat: bool,
                   start_step: int, shard_cache: ShardCacheArg) -> tf.data.Dataset:
    """The stream's batches (see ``readers.images``, which checks the arguments and calls this)."""
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

    elements = _elements(stream, table, position, [s.guard for s in sources], repeat=repeat, start_step=start_step,
                         drop_remainder=drop_remainder)
    records = _read(elements, table, num_parallel_reads)
    ds = records.map(_decoder(recipe, merged, seed, request.with_source), num_parallel_calls=AUTOTUNE,
                     deterministic=True)
    ds = batched(ds, recipe, batch_size=batch_size, drop_remainder=drop_remainder, deterministic=True)
    ds = augmented(ds, recipe, seed=seed, start_step=start_step, deterministic=True)
    if not repeat:
        ds = ds.apply(tf.data.experimental.assert_cardinality(position.batches(epoch_size, drop_remainder)))
    ds = Stamp(where, [s.info.sha256 for source in sources for s in source.shards]).lead(ds)
    options = quiet_options()
    options.experimental_optimization.map_parallelization = True
    ds = ds.prefetch(AUTOTUNE).with_options(options)
    return ds.with_options(external_state_ignored())  # the chunks' Python holds only the epoch count


def _read(elements: tf.data.Dataset, table, num_parallel_reads: int | None) -> tf.data.Dataset:
    """``(record, n, source)`` of each element, in order: local files a batch of records at a time (``pread``),
    remote ones (an index file, no shard cache) one ``FixedLengthRecordDataset`` per record."""
    if not any(is_url(f) for f in table.files):
        read_batch = records_lib.pread_batch(table.files)

        def read_many(n, shard, offset, length, source):
            found = tf.numpy_function(read_batch, [shard, offset, length], tf.string, stateful=False)
            return tf.ensure_shape(found, [None]), n, source

        return elements.batch(_READ_BATCH).map(read_many, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()
    files, sizes = tf.constant(table.files), tf.constant(table.file_sizes, tf.int64)

    def read(n, shard, offset, length, source):
        return records_lib.read_at(files, sizes, shard, offset, length).map(lambda record: (record, n, source))

    cycle = num_parallel_reads or DEFAULT_PARALLEL_READS
    return elements.interleave(read, cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                               deterministic=True)


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


def _elements(stream: Stream, table, position: Position, guards, *, repeat: bool, start_step: int,
              drop_remainder: bool) -> tf.data.Dataset:
    """``(n, shard, offset, length, source)`` of this pipeline's elements, in order; a chunk's order is computed in
    Python once per chunk, after each source's epoch check (``epoch_guard.py``)."""
    epoch_size = stream.spec.epoch_size
    iterations = itertools.count()  # without repeat each iteration of the dataset is the next epoch

    def chunk(number):
        problem = next((p for p in (g.problem() for g in guards) if p), "")
        if repeat:
            indices = position.chunk(int(number), start_step, epoch_size)
        else:
            indices = position.epoch(next(iterations), epoch_size, drop_remainder)
        if problem:
            indices = indices[:0]
        source, record = stream.records(indices)
        return (indices.astype(np.int64), table.shard[record], table.offset[record], table.length[record],
                source.astype(np.int32), np.array(problem.encode()))

    def elements_of(number):
        n, shard, offset, length, source, problem = tf.numpy_function(
            chunk, [number], [tf.int64, tf.int32, tf.int64, tf.int64, tf.int32, tf.string], stateful=True)
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(problem, b""), [problem])]):
            n = tf.identity(n)
        return tf.data.Dataset.from_tensor_slices(tuple(tf.ensure_shape(t, [None]) for t in
                                                        (n, shard, offset, length, source)))

    numbers = tf.data.Dataset.range(2**62) if repeat else tf.data.Dataset.range(1)
    return numbers.flat_map(elements_of)


def _decoder(recipe: Recipe, merged: sources_lib.MergedLabels, seed: int, with_source: bool):
    spec = merged.labels.spec()
    flip = recipe.per_image and recipe.augment == "default"
    crop_seed = tf.constant(seed, tf.int64)  # with n, the stateless seed [seed, n] of element n

    def decode(record, n, source):
        parsed = tf.io.parse_single_example(record, spec)
        encoded, label = parsed["image/encoded"], merged.label(parsed, source)
        if recipe.random_decode:
            image = decode_random_crop(encoded, tf.stack([crop_seed, n]), recipe.image_size, flip=flip,
                                       unit_float=recipe.unit_float)
        else:
            image = decode_center_crop(encoded, recipe.stage["size"], recipe.stage["padding"],
                                       unit_float=recipe.unit_float)
        return image, ({"label": label, "source": source} if with_source else label)

    return decode

