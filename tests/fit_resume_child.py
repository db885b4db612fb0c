"""A ``model.fit`` job with ``readers.BackupAndRestore``, held at a step to be killed, then rerun to its end
(tests/test_input_checkpoint.py runs it).

    python fit_resume_child.py STREAM DATASET BACKUP LOG EPOCHS STEPS_PER_EPOCH SAVE_FREQ HOLD_AT [STEPS_PER_EXECUTION]

STREAM is ``default`` (readers.images' default stream), ``global`` (the index-driven one, ``shuffle="global"``) or
``windows`` (resident readers.windows; DATASET then holds episodes).
The model's train step appends ``step<TAB>label:pixel sum,...`` of every batch it trains on to LOG (flushed), the
step counted from the one the callback restored. Once the input has given HOLD_AT global steps (-1: never), the job
creates ``LOG.held`` after that batch's save, if any, and waits there to be killed. At the end it writes its weights
to ``LOG.weights.npy``.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tfshard import readers  # noqa: E402


def reader(stream: str, dataset: str, start_step: int = 0):
    """The job's input (the test reads it in-process too, as the uninterrupted job's reference)."""
    if stream == "windows":
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", targets=1, seed=11,
                               repeat=True, start_step=start_step)
    extra = {"shuffle": "global"} if stream == "global" else {}
    return readers.images(dataset, batch_size=4, image_size=8, seed=7, repeat=True, start_step=start_step, **extra)


def line(x, y) -> str:
    """What the job logs of a batch: ``target sum:input sum`` of each example (a label and its image's pixels)."""
    pairs = zip(np.reshape(y, (len(y), -1)).sum(axis=1), np.reshape(x, (len(x), -1)).sum(axis=1))
    return ",".join(f"{target:.4f}:{total:.4f}" for target, total in pairs)


def job(stream: str, dataset: str, backup_dir: str, log: str, epochs: str, steps: str, save_freq: str,
        hold_at: str, steps_per_execution: str = "1", *, pass_dataset: bool = False) -> None:
    ds = reader(stream, dataset)
    backup = readers.BackupAndRestore(backup_dir, save_freq=int(save_freq), **({"dataset": ds} if pass_dataset
                                                                             else {}))
    out = open(log, "a")
    trained = [0]  # global steps, from the restored one

    def record(images, labels):
        trained[0] += 1
        out.write(f"{trained[0]}\t{line(images, labels)}\n")
        out.flush()
        return np.int64(0)

    class Logged(keras.Sequential):
        def train_step(self, data):
            tf.numpy_function(record, list(data), tf.int64, stateful=True)
            return super().train_step(data)

    class Hold(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            trained[0] = backup.step

        def on_train_batch_end(self, batch, logs=None):
            if 0 <= int(hold_at) <= backup.step:
                with open(log + ".held", "w"):
                    pass
                while True:
                    time.sleep(0.01)  # held here until the test kills the job

    x, y = (spec.shape[1:] for spec in ds.element_spec)
    outputs = int(np.prod(y)) if stream == "windows" else 24
    model = Logged([keras.Input(x), keras.layers.Flatten(), keras.layers.Dense(
        outputs, kernel_initializer=keras.initializers.GlorotUniform(seed=0))])  # the same start in every process
    loss = "mse" if stream == "windows" else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if stream == "windows":
        model.add(keras.layers.Reshape(y))
    model.compile(keras.optimizers.SGD(0.01), loss, steps_per_execution=int(steps_per_execution))
    model.fit(ds, epochs=int(epochs), steps_per_epoch=int(steps), callbacks=[backup, Hold()], verbose=0)
    out.close()
    np.save(log + ".weights.npy", np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    job(*sys.argv[1:])
