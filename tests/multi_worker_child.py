"""One worker of a real two-process MultiWorkerMirroredStrategy cluster on loopback (run by test_multi_worker.py).

Usage: python multi_worker_child.py IMAGES EPISODES ONE_SHARD RESULT.json IMAGES_B EPISODES_B, with TF_CONFIG set by
the parent. Writes what this worker read, so the parent can check the shares are disjoint and complete, and the
first global steps of the index-driven streams, so it can resume them in one process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tfshard import readers  # noqa: E402


def image_signatures(strategy, path: str) -> list[list[float]]:
    def dataset_fn(context):
        return readers.images(path, batch_size=4, image_size=(8, 8), training=False, input_context=context,
                              drop_remainder=False)

    seen = []
    for images, labels in strategy.distribute_datasets_from_function(dataset_fn):
        for part_images, part_labels in zip(strategy.experimental_local_results(images),
                                            strategy.experimental_local_results(labels)):
            seen += [[int(label), round(float(np.sum(image)), 3)] for image, label in
                     zip(part_images.numpy(), part_labels.numpy())]
    return seen


ELASTIC_STEPS, ELASTIC_BATCH = 5, 4  # global steps the two workers run of the elastic stream, its global batch


def elastic_reader(path, batch_size: int = ELASTIC_BATCH, context=None, start_step: int = 0, **stream):
    """The index-driven stream the elastic tests read: a global shuffle, seeded crops, endless; ``path`` a list and
    ``stream`` ``weights`` for a mixture."""
    return readers.images(path, batch_size=batch_size, image_size=(8, 8), seed=0, shuffle="global", repeat=True,
                          input_context=context, start_step=start_step, **stream)


MIXTURE = {"weights": [0.7, 0.3]}  # the image and window mixtures' weights


def window_reader(paths: list[str], batch_size: int = ELASTIC_BATCH, start_step: int = 0, **distribution):
    """Windows on the stream: a seeded 70/30 mixture of two episode datasets in epochs of 24 windows, endless;
    ``distribution`` ``strategy=`` or ``input_context=`` (``batch_size`` then the per-replica batch)."""
    return readers.windows(paths, length=4, shift=2, batch_size=batch_size, features="data", seed=0, repeat=True,
                           start_step=start_step, with_source=True, epoch_size=24, **MIXTURE, **distribution)


def window_signatures(keys, windows) -> list[list[float]]:
    """``[source, first value, last value]`` of each window of a batch (a window is known by its first value)."""
    return [[int(s), float(w[0, 0]), float(w[-1, 0])] for s, w in zip(keys["source"], windows)]


def signatures(images, labels) -> list[list[float]]:
    """``[label, pixel sum]`` of each image of a batch."""
    return [[int(label), round(float(np.sum(image)), 3)] for image, label in zip(images, labels)]


def local_steps(strategy, distributed, signature) -> list[list[list[float]]]:
    """The first ELASTIC_STEPS global steps of ``distributed``, as this worker's replicas read them (in replica
    order), each replica's part by ``signature(*part)``."""
    iterator = iter(distributed)
    local = len(strategy.extended.worker_devices)
    steps = []
    for _ in range(ELASTIC_STEPS):
        element = next(iterator)
        steps.append([s for r in range(local) for s in signature(*tf.nest.map_structure(
            lambda v, r=r: strategy.experimental_local_results(v)[r].numpy(), element))])
    return steps


def elastic_steps(strategy, path, **stream) -> list[list[list[float]]]:
    """The first ELASTIC_STEPS global steps of the elastic image stream under ``input_context``."""
    def dataset_fn(context):
        return elastic_reader(path, context.get_per_replica_batch_size(ELASTIC_BATCH), context, **stream)

    return local_steps(strategy, strategy.distribute_datasets_from_function(dataset_fn), signatures)


def window_steps(strategy, paths: list[str]) -> dict[str, list[list[list[float]]]]:
    """The first ELASTIC_STEPS global steps of the window stream, read with ``strategy=`` and under
    ``input_context``."""
    def dataset_fn(context):
        return window_reader(paths, context.get_per_replica_batch_size(ELASTIC_BATCH), input_context=context)

    return {"strategy": local_steps(strategy, window_reader(paths, strategy=strategy), window_signatures),
            "input_context": local_steps(strategy, strategy.distribute_datasets_from_function(dataset_fn),
                                         window_signatures)}


def window_epoch(strategy, paths: list[str]) -> dict:
    """One epoch (no repeat) of 22 windows of the window stream, drop_remainder=False under ``strategy=``: the last
    global step has 2 windows, all worker 0's, so worker 1 runs out a batch early; a collective every step
    (TensorFlow's partial batch handling keeps the workers in step)."""
    ds = readers.windows(paths, length=4, shift=2, batch_size=ELASTIC_BATCH, features="data", seed=0,
                         epoch_size=22, drop_remainder=False, with_source=True, strategy=strategy, **MIXTURE)

    @tf.function
    def count(windows):
        total = strategy.run(lambda w: tf.shape(w)[0], args=(windows,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)

    steps, windows = [], []
    for keys, batch in ds:
        steps.append(int(count(batch)))
        windows += [s for part in zip(strategy.experimental_local_results(keys),
                                      strategy.experimental_local_results(batch))
                    for s in window_signatures({"source": part[0]["source"].numpy()}, part[1].numpy())]
    return {"steps": steps, "windows": windows}


def main(images: str, episodes: str, one_shard: str, result_path: str, images_b: str, episodes_b: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    result = {"task": task, "images": image_signatures(strategy, images), "elastic": elastic_steps(strategy, images),
              "elastic_mixture": elastic_steps(strategy, [images, images_b], **MIXTURE),
              "elastic_windows": window_steps(strategy, [episodes, episodes_b]),
              "window_epoch": window_epoch(strategy, [episodes, episodes_b])}
    try:
        readers.model_windows([episodes, episodes_b], length=4, shift=2, batch_size=ELASTIC_BATCH, features="data",
                              seed=0, strategy=strategy, **MIXTURE)
        result["model_windows_error"] = None
    except ValueError as e:
        result["model_windows_error"] = str(e)
    try:
        image_signatures(strategy, one_shard)
        result["few_shards_error"] = None
    except ValueError as e:
        result["few_shards_error"] = str(e)

    ds = readers.windows(episodes, length=4, shift=2, batch_size=2 * strategy.num_replicas_in_sync, features="data",
                         seed=0, strategy=strategy)

    @tf.function
    def step(windows):  # a collective every step: it hangs unless every worker runs the same number of steps
        total = strategy.run(lambda w: tf.reduce_sum(tf.ones_like(w[:, 0, 0])), args=(windows,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)

    epochs = []
    for _ in range(2):
        windows, counted = [], 0
        for batch in ds:
            counted += int(step(batch))
            for part in strategy.experimental_local_results(batch):
                windows += [w[:, 0].tolist() for w in part.numpy()]
        epochs.append({"windows": windows, "global_count": counted})
    result["epochs"] = epochs
    result["resident"] = [
        # [rows, steps per row, 1]; shift 2 and these lengths give rows of one step (two would pad more than 1/64)
        {"device": arrays["data"].device, "values": sorted(set(arrays["data"].numpy().reshape(-1).tolist()))}
        for arrays in ds.resident_arrays
    ]
    # The window options under the same strategy: targets with a gap, sampling_rate, a split in time, padding, keys.
    options = dict(length=3, shift=2, batch_size=2 * strategy.num_replicas_in_sync, features="data",
                   targets=readers.Targets(width=1, offset=2), sampling_rate=2, time_range=(0.2, 1.0),
                   padding="start", pad_value=-1.0, seed=0, strategy=strategy, with_keys=True)
    shaped = []
    for keys, (x, y) in readers.windows(episodes, **options):
        step(x["inputs"])  # the collective: equal steps on both workers
        for k, inputs, target in zip(strategy.experimental_local_results(keys),
                                     strategy.experimental_local_results(x),
                                     strategy.experimental_local_results(y)):
            shaped += [[int(e), int(s), i[:, 0].tolist(), m.tolist(), t[:, 0].tolist()] for e, s, i, m, t in zip(
                k["episode"].numpy(), k["step"].numpy(), inputs["inputs"].numpy(), inputs["mask"].numpy(),
                target.numpy())]
    result["shaped"] = shaped
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:7])
