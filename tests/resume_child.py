"""A training job that can be killed at any step and restarted (tests/test_input_checkpoint.py runs it).

    python resume_child.py windows|images DATASET CKPT_DIR LOG STEPS SAVE_EVERY [STRATEGY_REPLICAS]

It trains a tiny Keras model on ``readers.windows(..., repeat=True, with_keys=True)``
with ``train_on_batch``, saving the model, the optimizer and the step together every
SAVE_EVERY steps (``tf.train.CheckpointManager``), and on start restores the latest
checkpoint. Without a strategy the input iterator is in the checkpoint too; under one
(whose distributed iterators TensorFlow cannot checkpoint) the input restarts at the
restored step with ``start_step``. Each step appends ``step<TAB>episode:start,...`` to
LOG (flushed), so the test can rebuild what the job consumed after any kills.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tfshard import readers  # noqa: E402


def images_reader(dataset: str, start_step: int = 0):
    """The images job's input (the test reads it in-process too, as the uninterrupted job's reference)."""
    return readers.images(dataset, batch_size=4, image_size=8, seed=7, repeat=True, start_step=start_step)


def images_line(images, labels) -> str:
    """What the images job logs of a batch: ``label:pixel sum`` of each image."""
    sums = tf.reduce_sum(images, axis=[1, 2, 3]).numpy()
    return ",".join(f"{int(label)}:{total:.4f}" for label, total in zip(labels.numpy(), sums))


def windows_reader(dataset: str, strategy=None, start_step: int = 0):
    """The windows job's input (the test reads it in-process too, as the uninterrupted job's reference)."""
    return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", targets=1, seed=11,
                           with_keys=True, repeat=True, start_step=start_step, strategy=strategy)


def local(value, strategy=None):
    """A per-replica value as one tensor, the replicas' parts in order (the value itself without a strategy)."""
    return tf.concat(strategy.experimental_local_results(value), 0) if strategy is not None else value


def windows_line(keys, strategy=None) -> str:
    """What the windows job logs of a batch: ``episode:step`` of each window."""
    keys = {k: local(v, strategy) for k, v in keys.items()}
    return ",".join(f"{e}:{s}" for e, s in zip(keys["episode"].numpy(), keys["step"].numpy()))


def images_job(dataset: str, ckpt_dir: str, log: str, steps: str, save_every: str) -> None:
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(24)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=step)
    manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=2)
    manager.restore_or_initialize()
    iterator = iter(images_reader(dataset, start_step=int(step.numpy())))
    with open(log, "a") as out:
        while int(step.numpy()) < int(steps):
            images, labels = next(iterator)
            model.train_on_batch(images, labels)
            step.assign_add(1)
            out.write(f"{int(step.numpy())}\t{images_line(images, labels)}\n")
            out.flush()
            if int(step.numpy()) % int(save_every) == 0:
                manager.save(checkpoint_number=int(step.numpy()))


def main(kind: str, dataset: str, ckpt_dir: str, log: str, steps: str, save_every: str, replicas: str = "0", *,
         strategy=None) -> None:
    """The job; ``strategy``: a MirroredStrategy over ``replicas`` CPUs to use instead of making one (a test runs
    the job in its own process so, on the logical CPUs conftest.py split)."""
    if kind == "images":
        return images_job(dataset, ckpt_dir, log, steps, save_every)
    replicas_ = int(replicas)
    if replicas_ and strategy is not None:
        assert strategy.num_replicas_in_sync == replicas_, (strategy, replicas_)
    elif replicas_:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas_)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas_)])
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 2)), keras.layers.Flatten(), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.01), "mse")
        step = tf.Variable(0, dtype=tf.int64)
    distributed = strategy if replicas_ else None

    def windows(start_step=0):
        return windows_reader(dataset, distributed, start_step)

    if replicas_:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=step)
        manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=2)
        manager.restore_or_initialize()
        iterator = iter(windows(start_step=int(step.numpy())))
    else:
        iterator = iter(windows())
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, input=iterator, step=step)
        manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=2)
        manager.restore_or_initialize()
    with open(log, "a") as out:
        while int(step.numpy()) < int(steps):
            keys, (x, y) = next(iterator)
            model.train_on_batch(local(x, distributed), tf.reshape(local(y, distributed), [-1, 2]))
            step.assign_add(1)
            out.write(f"{int(step.numpy())}\t{windows_line(keys, distributed)}\n")
            out.flush()
            if int(step.numpy()) % int(save_every) == 0:
                manager.save(checkpoint_number=int(step.numpy()))


if __name__ == "__main__":
    main(*sys.argv[1:])
