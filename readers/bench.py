"""Timing an input pipeline alone, with no model: what ``tfshard bench`` reports.

    for epoch in time_epochs(readers.images("photos-tfr", batch_size=64), epochs=2):
        print(epoch.examples / epoch.seconds, "img/s")
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class EpochTiming:
    """One epoch: examples (images or windows) and batches read, and the wall time it took."""

    epoch: int
    examples: int
    batches: int
    seconds: float


def _batch_size(element) -> int:
    """Examples in one batch: the leading dimension of its first tensor (of a tuple, a dict, or a tensor)."""
    first = tf.nest.flatten(element)[0]
    return int(first.shape[0])


def time_epochs(dataset: tf.data.Dataset, epochs: int) -> Iterator[EpochTiming]:
    """Iterates ``dataset`` ``epochs`` times from Python, as a training loop would, timing each epoch."""
    for epoch in range(1, epochs + 1):
        started, examples, batches = time.perf_counter(), 0, 0
        for element in dataset:
            examples += _batch_size(element)
            batches += 1
        yield EpochTiming(epoch, examples, batches, time.perf_counter() - started)
