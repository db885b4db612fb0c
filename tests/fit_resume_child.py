"""A ``model.fit`` job with ``readers.BackupAndRestore``, held at a step to be killed, then rerun to its end
(tests/test_input_checkpoint.py runs it).

    python fit_resume_child.py STREAM DATASET BACKUP LOG EPOCHS STEPS_PER_EPOCH SAVE_FREQ HOLD_AT [STEPS_PER_EXECUTION]

STREAM is ``default`` (readers.images' default stream) or ``global`` (the index-driven one, ``shuffle="global"``).
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
    extra = {"shuffle": "global"} if stream == "global" else {}
    return readers.images(dataset, batch_size=4, image_size=8, seed=7, repeat=True, start_step=start_step, **extra)


def line(images, labels) -> str:
    """What the job logs of a batch: ``label:pixel sum`` of each image."""
    sums = np.sum(images, axis=(1, 2, 3))
    return ",".join(f"{int(label)}:{total:.4f}" for label, total in zip(labels, sums))


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

    model = Logged([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(
        24, kernel_initializer=keras.initializers.GlorotUniform(seed=0))])  # the same start in every process
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=int(steps_per_execution))
    model.fit(ds, epochs=int(epochs), steps_per_epoch=int(steps), callbacks=[backup, Hold()], verbose=0)
    out.close()
    np.save(log + ".weights.npy", np.concatenate([w.ravel() for w in model.get_weights()]))


if __name__ == "__main__":
    job(*sys.argv[1:])
