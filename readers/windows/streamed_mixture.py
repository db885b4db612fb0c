"""Mixtures of streamed windows (``readers.windows([a, b], ..., resident=False)``): for episodes larger than memory.

Each source is the streamed pipeline of its path (``streamed.py``: episodes read from its shards, windowed, mixed
by a shuffle buffer), made endless: every pass a fresh file order and buffer. ``tf.data.Dataset.choose_from_datasets``
combines them, the source of element ``k`` of epoch ``e`` given by the stream core (``sampling.plan.elements``
over each source's windows in this pipeline, from the manifest), so every epoch holds each source's share exactly,
in a seeded order, and the length is known. Which window a source gives comes from its buffer, so the stream is not
resumable by position (``repeat``, ``start_step`` refused, as for one streamed path).

    ds = streamed_mixture(planned, stream, "train", request, shard_cache=ShardCacheArg(None, None))
    len(ds)   # this pipeline's epoch_size // batch_size
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from .. import files as files_lib
from ..indexed.request import StreamRequest
from ..indexed.stream import CHUNK_ELEMENTS, EpochCount
from ..python_steps import numpy_step
from ..sampling.plan import StreamSpec, elements
from .layout import Layout
from .request import WindowRequest
from .resident import draw_seed
from .streamed import check_batch, pipeline_batch, pipeline_windows, shaped, source_windows

AUTOTUNE = tf.data.AUTOTUNE


def pipeline_epoch_size(epoch_size: int | None, input_context) -> int | None:
    """This pipeline's part of ``epoch_size`` (None: its sources' windows): ``epoch_size // P``, the first
    ``epoch_size % P`` pipelines one more, so the parts add up to it."""
    if epoch_size is None or input_context is None:
        return epoch_size
    pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    return epoch_size // pipelines + (pipeline < epoch_size % pipelines)


def choices(spec: StreamSpec) -> tf.data.Dataset:
    """The source of every element of an epoch (int64), from the stream core (``sampling.plan.elements``) a chunk of
    at most ``CHUNK_ELEMENTS`` at a time, so no epoch's order is held whole; each iteration is the next epoch."""
    epochs, size = EpochCount(), spec.epoch_size

    def sources_of(number) -> np.ndarray:
        number = int(number)
        first = number * CHUNK_ELEMENTS
        indices = epochs.at(number) * size + first + np.arange(min(CHUNK_ELEMENTS, size - first), dtype=np.int64)
        return elements(spec, indices)[0].astype(np.int64)

    def chunk(number):
        return tf.ensure_shape(numpy_step(sources_of, [number], tf.int64, stateful=True), [None])

    return tf.data.Dataset.range(-(-size // CHUNK_ELEMENTS)).map(chunk).unbatch()


def streamed_mixture(planned: Sequence[tuple[files_lib.DatasetInfo, Layout, dict]], stream: StreamRequest,
                     split: str, request: WindowRequest, *, shard_cache=None,
                     context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """One pipeline of the mixture: this process's, or (``context``, under a strategy) one input pipeline's.

    Args:
      planned: each path's ``(dataset, layout, schema)`` (``dataset._plan``), checked to agree
        (``mixture.check_sources``).
      stream: the stream's arguments (``weights``, ``epoch_size``, ``with_source``; ``balance`` is refused by
        ``WindowRequest``).
      split, request, shard_cache: as ``streamed.streamed_windows`` takes them.

    Raises:
      ValueError: a source with no window in this pipeline's shards, or fewer windows an epoch than one batch
        with ``drop_remainder``, naming the paths.
    """
    batch_size, input_context, replicas, pipelines = pipeline_batch(request, context)
    where, layout = stream.where, planned[0][1]
    sizes = []
    for path, (dataset, source_layout, _) in zip(stream.paths, planned):
        count, mine = pipeline_windows(dataset, split, source_layout, input_context)
        if count == 0:
            raise ValueError(f"{path}: split {split!r} has no window in this input pipeline's shards (got shards "
                             f"{sorted(mine)} of {pipelines} pipelines); a mixture needs windows of every source in "
                             "every pipeline: convert it with more shards (--min-shards), or leave it out")
        sizes.append(count)
    try:
        spec = StreamSpec(sizes=tuple(sizes), weights=stream.weights,
                          epoch_size=pipeline_epoch_size(stream.epoch_size, input_context),
                          shuffle=request.shuffle, seed=draw_seed(request.seed))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    if request.drop_remainder:
        check_batch(f"{where}: split {split!r}", spec.epoch_size, batch_size, replicas, pipelines)

    def source(index: int, dataset, source_layout, schema) -> tf.data.Dataset:
        windows = source_windows(dataset, split, source_layout, schema, request, input_context=input_context,
                                 seed=request.seed, shard_cache=shard_cache)
        if stream.with_source:
            windows = windows.map(lambda keys, *rest: ({**keys, "source": tf.constant(index, tf.int32)}, *rest))
        return windows.repeat()  # endless: each pass a fresh file order and buffer

    sources = [source(i, *plan) for i, plan in enumerate(planned)]
    windows = tf.data.Dataset.choose_from_datasets(sources, choices(spec), stop_on_empty_dataset=True)
    batches = windows.batch(batch_size, drop_remainder=request.drop_remainder, num_parallel_calls=AUTOTUNE)
    per_epoch = spec.epoch_size // batch_size if request.drop_remainder else -(-spec.epoch_size // batch_size)
    batches = batches.apply(tf.data.experimental.assert_cardinality(per_epoch))
    # Fused, shuffle + repeat keeps its buffer full across a pass's end, so every source would read most of a next
    # pass the epoch never takes (measured: ~30% more CPU a window); unfused, a source starts a pass only when its
    # share needs one.
    unfused = tf.data.Options()
    unfused.experimental_optimization.shuffle_and_repeat_fusion = False
    return shaped(batches, layout, request, with_source=stream.with_source).with_options(unfused)
