"""A reader's batches as numpy arrays, for training loops that are not TensorFlow's (PyTorch, JAX, plain numpy).

``tf.data.Dataset.as_numpy_iterator()`` is a one-pass iterator without a length, so ``len(loader)``, a progress bar's
total or a learning-rate schedule's steps are lost on the way. ``readers.as_numpy(ds)`` keeps them: each ``for``
loop over it is one pass (an epoch) over ``ds``, and ``len()`` is the batches the reader counts in that pass
(``readers.images`` and the windows readers set it; ``repeat=True`` or ``ignore_errors=True`` have none).

    batches = readers.as_numpy(readers.images("photos-tfr", batch_size=32, seed=0))
    len(batches)                      # 38: steps per epoch
    for images, labels in batches:    # numpy arrays: torch.from_numpy(images), jnp.asarray(images)
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tensorflow as tf


class NumpyBatches:
    """An iterable of a ``tf.data.Dataset``'s elements as numpy arrays (nested as the dataset nests them), with the
    dataset's length. Iterable again and again: each ``iter()`` starts a new pass of the dataset."""

    def __init__(self, dataset: tf.data.Dataset):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"as_numpy: takes a tf.data.Dataset, as the readers return (got {type(dataset).__name__});"
                            " pass readers.images(...), readers.windows(...) or readers.episodes(...)")
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        return self.dataset.as_numpy_iterator()

    def __len__(self) -> int:
        count = int(self.dataset.cardinality())
        if count < 0:
            what = "endless" if count == int(tf.data.INFINITE_CARDINALITY) else "not known"
            raise TypeError(f"as_numpy: this dataset's length is {what} (got cardinality {count}); len() needs a "
                            "reader of one pass with a known length (no repeat=True, no ignore_errors=True), or count "
                            "steps with readers.info(path).steps_per_epoch(split, batch_size)")
        return count

    def __repr__(self) -> str:
        count = int(self.dataset.cardinality())
        return f"NumpyBatches({count if count >= 0 else 'unknown'} batches of {self.dataset.element_spec})"


def as_numpy(dataset: tf.data.Dataset) -> NumpyBatches:
    """``dataset``'s elements as numpy arrays, in an iterable that keeps its length (``len()``) for other loops.

    Raises:
      TypeError: not a ``tf.data.Dataset``; ``len()`` of one whose length is endless or not known.

    Example:
      batches = readers.as_numpy(readers.images("photos-tfr", batch_size=32, training=False))
      len(batches), next(iter(batches))[0].shape   # (2, (32, 224, 224, 3)) for 40 images
    """
    return NumpyBatches(dataset)
