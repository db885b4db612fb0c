"""The ``tf.data.Options`` every reader sets, in one place.

Autotune is off everywhere: with it on (TF 2.21), deleting an iterator often blocks until the autotuner's next
optimisation step, so ``model.fit`` paid 0.4-1.3 s between epochs (``benchmarks/images.py``'s model.fit rows);
off, 0.03 s, with the same img/s on 2 cores (AUTOTUNE parallelism then means one thread per core), and the
resident windows' per-batch cost drops ~10%.

tf.data's static rewrites are off too. With any of them on, every new iterator serializes the pipeline, runs
Grappler over it and rebuilds every dataset and function from the result before its first element: ~20-35 ms of
each reader's first batch on 2 cores (and of every epoch's start without ``repeat=True``: each epoch is a new
iterator), whichever rewrites are on. The readers are written
as the rewrites would leave them (parallel maps and batches, a final prefetch), and the two fusions they relied on
are built directly: the decode map with its batch (``image_batches.decoded_batches``) and a shuffle with the repeat
after it (``shuffled``). The options reach stages a user adds after a reader too: a ``map`` there runs as written
(pass ``num_parallel_calls``), or turn the rewrites back on with ``ds.with_options(options)`` where
``options.experimental_optimization.apply_default_optimizations = True``.
"""

from __future__ import annotations

import tensorflow as tf

try:  # the (seed, seed2) pair Dataset.shuffle derives from its seed argument
    from tensorflow.python.data.util.random_seed import get_seed as _shuffle_seeds
except ImportError:  # pragma: no cover - every TensorFlow this project supports has it
    _shuffle_seeds = None


def quiet_options() -> tf.data.Options:
    """Autotune and tf.data's static rewrites off (see the module docstring)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False
    return options


def shuffled(ds: tf.data.Dataset, buffer_size: int, seed: int | None, repeat: bool) -> tf.data.Dataset:
    """``ds`` shuffled anew each epoch and each iterator (from ``seed``, or fresh randomness); with ``repeat``,
    endless, as one fused shuffle-and-repeat stage: the dataset tf.data's ``shuffle_and_repeat_fusion`` made of the
    pair. An iterator checkpoint restores it exactly, across every later epoch's end; the unfused pair, restored
    into a fresh pipeline of several shards, yielded another order from the second epoch after the restore on
    (tests/test_input_checkpoint.py). (``tf.data.experimental.shuffle_and_repeat``, deprecated, builds the first
    version of the op, which gives every iterator of a seeded dataset the same order.)"""
    if not repeat or _shuffle_seeds is None:
        ds = ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)
        return ds.repeat() if repeat else ds
    seed, seed2 = _shuffle_seeds(seed)
    fused = tf.raw_ops.ShuffleAndRepeatDatasetV2(
        input_dataset=tf.data.experimental.to_variant(ds), buffer_size=tf.constant(buffer_size, tf.int64),
        seed=seed, seed2=seed2, count=tf.constant(-1, tf.int64), seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=ds._flat_types, output_shapes=ds._flat_shapes,  # a ragged or sparse element's too
        reshuffle_each_iteration=True)
    return tf.data.experimental.from_variant(fused, ds.element_spec)


def external_state_ignored(options: tf.data.Options | None = None) -> tf.data.Options:
    """``options`` (new ones by default) letting ``tf.train.Checkpoint(iterator)`` save a pipeline whose functions
    read state tf.data cannot save but that never changes while the dataset exists: resident arrays, or the
    shard checks' Python (``readers/guard.py``), which stats the file anew each time, or a resumable input's start
    step (``readers/input_position.py``), read once as its iterator opens."""
    options = options or tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options
