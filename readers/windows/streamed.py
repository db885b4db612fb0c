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
from ..options import quiet_options
from .starts import window_count

AUTOTUNE = tf.data.AUTOTUNE


def streamed_windows(dataset, split, layout, schema, *, length, shift, batch_size, shuffle, seed, drop_remainder,
              shuffle_buffer, input_context, read_buffer_bytes, remote=None, replicas=1, pipelines=1,
              with_keys=False):
    """``batch_size``: this pipeline's batch (per replica under a strategy of ``replicas`` over ``pipelines``)."""
    path = dataset.path
    span = length + layout.horizon
    gathered_schema = {n: schema[n] for n in layout.gathered}
    if remote is not None:
        # The service splits the epoch (not input_context), and each epoch is a new job built from this graph:
        # a fixed seed on the workers would replay one order every epoch, so they draw fresh randomness.
        seed, input_context = None, None
    mine = set(files_lib.pipeline_shards(dataset, split, input_context=input_context))
    lengths = [e.length for e in files_lib.split_info(dataset, split).episodes if e.shard in mine]
    count = window_count(lengths, length, shift, layout.horizon)  # this pipeline's windows (episodes are checked)
    if drop_remainder:
        # Under a strategy one pipeline feeds several replicas; a step takes a batch for each or none at all.
        fed = max(1, replicas // pipelines)
        what = f"batch_size={batch_size}" if replicas == 1 else (
            f"the {batch_size * fed} a step takes from it (a batch of {batch_size} for each of the {fed} replicas it "
            f"feeds; batch_size={batch_size * replicas} over {replicas} replicas)")
        check_not_empty(f"{path}: split {split!r}", count, "windows", "for this pipeline", batch_size * fed, what)
    episodes = stream_episodes(
        dataset, split, gathered_schema, shuffle_files=shuffle, seed=seed, input_context=input_context,
        num_parallel_reads=None, read_buffer_bytes=read_buffer_bytes, with_keys=True, local=remote is None,
    )

    def to_windows(keys, episode):
        steps = tf.shape(episode[layout.gathered[0]])[0]
        starts = tf.range(0, tf.maximum(steps - span + 1, 0), shift)  # none from an episode shorter than span
        positions = starts[:, None] + tf.range(span)
        windows_ = {n: tf.gather(v, positions) for n, v in episode.items()}
        if not with_keys:
            return tf.data.Dataset.from_tensor_slices(windows_)
        # Each window carries its episode id and start step through the shuffle.
        keys = {"episode": tf.fill(tf.shape(starts), keys["episode"]), "step": tf.cast(starts, tf.int64)}
        return tf.data.Dataset.from_tensor_slices((keys, windows_))

    windows_ = episodes.flat_map(to_windows)
    if shuffle:
        windows_ = windows_.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    batches = windows_.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE)
    if remote is not None:  # the workers send each gathered window once; (x, x) or past/future are made here
        batches = remote.distribute(batches)
    else:
        # Every episode's length is asserted against the manifest as it is read, so the count is exact; knowing it
        # lets Keras end each epoch on it instead of warning that the input "ran out of data". Not with a service:
        # it shares each epoch among its clients.
        batches = batches.apply(tf.data.experimental.assert_cardinality(
            count // batch_size if drop_remainder else -(-count // batch_size)))

    def shape(*batch):
        if with_keys:
            keys, gathered = batch
            return keys, layout.shape(gathered, length)
        return layout.shape(batch[0], length)

    return batches.map(shape, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE).with_options(quiet_options())
