"""The ``tf.data.Options`` every reader sets, and its seeded shuffles and random streams, in one place.

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

try:  # the seeded datasets, built as tf.data builds them (see seed_pair)
    from tensorflow.python.data.ops.dataset_ops import DatasetSource, UnaryUnchangedStructureDataset
    from tensorflow.python.framework.random_seed import get_seed as _op_seeds
except ImportError:  # pragma: no cover - every TensorFlow this project supports has them
    _op_seeds = None


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
    if not repeat or _op_seeds is None:
        ds = seeded_shuffle(ds, buffer_size, seed)
        return ds.repeat() if repeat else ds
    seed, seed2 = seed_pair(seed)
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


def seed_pair(seed: int | None) -> tuple[int, int]:
    """The two seeds tf.data's seeded datasets (``shuffle``, ``Dataset.random``) derive from ``seed`` and the global
    seed, worked out in Python. tf.data works out the second with three eager ops (``Equal``, ``LogicalAnd``,
    ``SelectV2``), and the first eager op of each kind in a process costs ~2-4 ms (TensorFlow runs it as a function
    of one op, set up through every graph pass): ~9 ms of a training reader's first batch."""
    seed, seed2 = _op_seeds(seed)
    if seed is None:  # no seed and no global seed: both 0, a fresh draw for every iterator
        return 0, 0
    return seed, 2**31 - 1 if seed == 0 and seed2 == 0 else seed2


def seeded_shuffle(ds: tf.data.Dataset, buffer_size: int, seed: int | None) -> tf.data.Dataset:
    """``ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)``, the same dataset, with no eager op
    (``seed_pair``)."""
    if _op_seeds is None:  # pragma: no cover
        return ds.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)
    seed, seed2 = seed_pair(seed)
    variant = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=ds._variant_tensor, buffer_size=tf.constant(buffer_size, tf.int64), seed=seed, seed2=seed2,
        seed_generator=tf.raw_ops.DummySeedGenerator(), reshuffle_each_iteration=True,
        output_types=ds._flat_types, output_shapes=ds._flat_shapes)
    return _Unchanged(ds, variant)


def random_numbers(seed: int | None, rerandomize_each_iteration: bool = False) -> tf.data.Dataset:
    """``tf.data.Dataset.random(seed, rerandomize_each_iteration)``, the same dataset, with no eager op
    (``seed_pair``)."""
    if _op_seeds is None:  # pragma: no cover
        return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=rerandomize_each_iteration)
    seed, seed2 = seed_pair(seed)
    types = {"output_types": [tf.int64], "output_shapes": [[]]}
    if rerandomize_each_iteration:
        variant = tf.raw_ops.RandomDatasetV2(seed=seed, seed2=seed2, seed_generator=tf.raw_ops.DummySeedGenerator(),
                                             rerandomize_each_iteration=True, **types)
    else:
        variant = tf.raw_ops.RandomDataset(seed=seed, seed2=seed2, **types)
    return _RandomNumbers(variant)


if _op_seeds is not None:
    class _Unchanged(UnaryUnchangedStructureDataset):
        """A dataset of ``input_dataset``'s elements from ``variant`` (its input kept: options, checkpoints)."""

        def __init__(self, input_dataset: tf.data.Dataset, variant: tf.Tensor):
            self._input_dataset = input_dataset
            super().__init__(input_dataset, variant)

    class _RandomNumbers(DatasetSource):
        """int64 scalars from a random dataset's ``variant``."""

        @property
        def element_spec(self) -> tf.TensorSpec:
            return tf.TensorSpec([], tf.int64)
