"""Streamed windows (``readers.windows(resident=False)``): for data larger than device memory.

Episodes are read from the shards (``readers.episodes``' stream), each is windowed
with one gather, and a shuffle buffer mixes the windows. Without shuffling it reads
episodes in the manifest's order; for a dataset written with ``--no-shuffle`` that is
source order, and it then yields exactly what resident mode does. Through a tf.data
service the reading, windowing, shuffling and batching run on the service's workers.
"""

from __future__ import annotations

import tensorflow as tf

from .. import files as files_lib
from ..arguments import check_not_empty
from ..episodes import stream_episodes
from ..epoch_guard import EpochGuard
from ..options import quiet_options, seeded_shuffle
from ..windowing.targets import LABEL
from .layout import pad_fill
from .request import WindowRequest
from .resident import report_short_episodes

AUTOTUNE = tf.data.AUTOTUNE


def _slice_bounds(spec, steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``spec.bounds`` in the graph: the same floor of the same float64 products."""
    if spec.time_range is None:
        return tf.constant(0, tf.int64), steps
    a, b = spec.time_range
    if isinstance(a, float):
        total = tf.cast(steps, tf.float64)
        return tf.cast(tf.floor(a * total), tf.int64), tf.cast(tf.floor(b * total), tf.int64)
    return tf.minimum(tf.constant(a, tf.int64), steps), tf.minimum(tf.constant(b, tf.int64), steps)


def episode_windows(layout, keys: dict, episode: dict, pad_value=0) -> tuple:
    """One episode's windows, as ``spec.starts`` places them: ``(keys, gathered, mask, label)`` per window, each
    window one gather of its span's points from the episode's slice (padded before it with ``pad_value``).

    ``keys``: ``{"episode": id}``; ``episode``: its features (and ``"label"`` when the layout yields labels)."""
    spec = layout.spec
    steps = tf.shape(episode[layout.gathered[0]], out_type=tf.int64)[0]
    lo, hi = _slice_bounds(spec, steps)
    used = hi - lo
    first = -(spec.history // spec.shift)
    last = tf.math.floordiv(used - spec.extent, spec.shift)
    count = tf.maximum(last - first + 1, 0)
    starts = (first + tf.range(count, dtype=tf.int64)) * spec.shift  # from the slice's first step; < 0: padded
    positions = spec.history + starts[:, None] + tf.range(spec.points, dtype=tf.int64) * spec.sampling_rate
    gathered = {}
    for name in layout.gathered:
        values = episode[name][lo:hi]
        if spec.history:
            # The value resident mode pads with (tf.cast of a Python float would round through float32 first).
            fill = tf.constant(pad_fill(pad_value, values.dtype.as_numpy_dtype, name, "windows"), values.dtype)
            pad = tf.fill(tf.concat([[spec.history], tf.shape(values)[1:]], 0), fill)
            values = tf.concat([pad, values], 0)
        gathered[name] = tf.gather(values, positions)
    mask = (starts[:, None] + tf.range(spec.length, dtype=tf.int64) * spec.sampling_rate >= 0) if layout.masked \
        else tf.zeros([count, 0], tf.bool)
    label = tf.fill([count], episode[LABEL]) if layout.label else tf.zeros([count], tf.int64)
    window_keys = {"episode": tf.fill([count], keys["episode"]), "step": lo + starts}
    return window_keys, gathered, mask, label


def pipeline_batch(request: WindowRequest, context: tf.distribute.InputContext | None) -> tuple:
    """``(batch_size, input_context, replicas, pipelines)`` of this pipeline: the request's own, or (``context``,
    under a strategy) one input pipeline's, whose batch is the per-replica batch of the replicas it feeds."""
    if context is None:
        return request.batch_size, request.input_context, 1, 1
    return (context.get_per_replica_batch_size(request.batch_size), context, context.num_replicas_in_sync,
            context.num_input_pipelines)


def check_batch(where: str, count: int, batch_size: int, replicas: int, pipelines: int) -> None:
    """With drop_remainder, a pipeline of fewer ``count`` windows than one step takes from it is refused."""
    # Under a strategy one pipeline feeds several replicas; a step takes a batch for each or none at all.
    fed = max(1, replicas // pipelines)
    what = f"batch_size={batch_size}" if replicas == 1 else (
        f"the {batch_size * fed} a step takes from it (a batch of {batch_size} for each of the {fed} replicas it "
        f"feeds; batch_size={batch_size * replicas} over {replicas} replicas)")
    check_not_empty(where, count, "windows", "for this pipeline", batch_size * fed, what)


def pipeline_windows(dataset, split, layout, input_context) -> tuple[int, set]:
    """``(windows, shards)`` of this pipeline's file share of the split, from the manifest (every episode's length
    is checked as it is read, so the count is exact); episodes too short for a window are reported."""
    mine = set(files_lib.pipeline_shards(dataset, split, input_context=input_context))
    lengths = [e.length for e in files_lib.split_info(dataset, split).episodes if e.shard in mine]
    report_short_episodes(f"{dataset.path}: split {split!r}", layout.spec, lengths)
    return layout.spec.count(lengths), mine


def source_windows(dataset, split, layout, schema, request: WindowRequest, *, input_context, seed, local=True,
                   shard_cache=None) -> tf.data.Dataset:
    """One dataset's windows for this pipeline, unbatched and (``request.shuffle``) mixed by the buffer, each
    ``(keys, gathered, mask, label)``; ``local``: False on tf.data service workers (``stream_episodes``)."""
    episodes = stream_episodes(
        dataset, split, {n: schema[n] for n in layout.gathered}, shuffle_files=request.shuffle, seed=seed,
        input_context=input_context, num_parallel_reads=None, read_buffer_bytes=request.read_buffer_bytes,
        with_keys=True, local=local, with_label=layout.label, shard_cache=shard_cache,
    )

    def to_windows(keys, episode):
        return tf.data.Dataset.from_tensor_slices(episode_windows(layout, keys, episode, layout.pad_value))

    windows_ = episodes.flat_map(to_windows)
    if request.shuffle:
        windows_ = seeded_shuffle(windows_, request.shuffle_buffer, seed)
    return windows_


def shaped(batches: tf.data.Dataset, layout, request: WindowRequest, with_source: bool = False) -> tf.data.Dataset:
    """Batches of ``(keys, gathered, mask, label)`` as the reader yields them (``with_keys``; ``with_source``: the
    keys hold ``"source"``, alone without ``with_keys``), prefetched."""
    def shape(keys, gathered, mask, label):
        element = layout.shape(gathered, mask if layout.masked else None, label if layout.label else None)
        if request.with_keys:
            return keys, element
        return ({"source": keys["source"]}, element) if with_source else element

    return batches.map(shape, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE).with_options(quiet_options())


def streamed_windows(dataset, split, layout, schema, request: WindowRequest, *, remote=None, shard_cache=None,
                     context: tf.distribute.InputContext | None = None):
    """The windows of ``request`` streamed from the shards: this process's pipeline, or (``context``, under a
    strategy) one input pipeline's, whose batch is the per-replica batch of the replicas it feeds."""
    batch_size, input_context, replicas, pipelines = pipeline_batch(request, context)
    seed, drop_remainder = request.seed, request.drop_remainder
    if remote is not None:
        # The service splits the epoch (not input_context), and each epoch is a new job built from this graph:
        # a fixed seed on the workers would replay one order every epoch, so they draw fresh randomness.
        seed, input_context = None, None
    count, mine = pipeline_windows(dataset, split, layout, input_context)
    if drop_remainder:
        check_batch(f"{dataset.path}: split {split!r}", count, batch_size, replicas, pipelines)
    windows_ = source_windows(dataset, split, layout, schema, request, input_context=input_context, seed=seed,
                              local=remote is None, shard_cache=shard_cache)
    batches = windows_.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE)
    if remote is not None:  # the workers send each gathered window once; (x, x) or past/future are made here
        # Workers cannot run the epoch check's Python: this client runs it at the start of each of its epochs.
        shards = files_lib.check_shards(dataset, split, sorted(mine))
        batches = EpochGuard(dataset, split, shards).ahead(remote.distribute(batches.with_options(quiet_options())))
    else:
        # Every episode's length is asserted against the manifest as it is read, so the count is exact; knowing it
        # lets Keras end each epoch on it instead of warning that the input "ran out of data". Not with a service:
        # it shares each epoch among its clients.
        batches = batches.apply(tf.data.experimental.assert_cardinality(
            count // batch_size if drop_remainder else -(-count // batch_size)))
    return shaped(batches, layout, request)
