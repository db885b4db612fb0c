"""Where a resumable input starts, read when its iterator opens, so that a callback can move it before then.

``readers.images(..., repeat=True, seed=...)``, resident ``readers.windows(..., repeat=True, seed=...)`` and the
``starts`` of ``readers.model_windows(..., repeat=True, seed=...)`` are a stream that is a pure function of its seed
and its start step (``start_step``), in every iterator. Such an input gets an
``InputPosition``: its start is read from Python when the pipeline's first element is asked for, not when the
pipeline is built. Keras' ``model.fit`` opens its input's iterator after
``callbacks.on_train_begin()``, so ``readers.BackupAndRestore`` (``readers/backup.py``) restores the model there and
moves the input to the step it had reached. The pipeline references its position weakly, and the dataset strongly
(``POSITION_ATTRIBUTE``), so the live positions are those of live datasets.

    position = InputPosition(0, "photos-tfr")
    ds = skipped(lambda: records, position, per_step=64)   # reads position.start when its iterator opens
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from .python_steps import numpy_step

POSITION_ATTRIBUTE = "_tfshard_position"  # the returned dataset's strong reference to its position
_LIVE: weakref.WeakSet = weakref.WeakSet()


class InputPosition:
    """The start, in global steps, of a resumable input's next iterator.

    Attributes:
      first: the reader's ``start_step``: where an input nobody moved starts.
      start: where the next iterator starts (``first`` until a restore moves it).
      where: the dataset's path(s), for messages.
    """

    def __init__(self, first: int, where: str):
        self.first, self.start, self.where = int(first), int(first), where
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"InputPosition({self.where!r}, start={self.start})"


def live() -> list[InputPosition]:
    """The positions of the resumable inputs whose datasets are still alive."""
    return list(_LIVE)


def attach(ds: tf.data.Dataset, position: InputPosition | None) -> tf.data.Dataset:
    """``ds`` holding ``position`` (nothing to hold without one)."""
    if position is not None:
        setattr(ds, POSITION_ATTRIBUTE, position)
    return ds


def of(ds) -> InputPosition | None:
    """The position of a reader's dataset (a distributed one too), or of the reader's dataset a derived one
    (``ds.map(...)``) reads."""
    seen, todo = set(), [ds]
    while todo:
        d = todo.pop()
        found = getattr(d, POSITION_ATTRIBUTE, None)
        if found is not None:
            return found
        if id(d) not in seen and isinstance(d, tf.data.Dataset):
            seen.add(id(d))
            todo.extend(d._inputs())  # tf.data's own walk of a dataset's inputs
    return None


def opened(start: int | InputPosition, build) -> tf.data.Dataset:
    """``build(start int64 scalar tensor)``: with a position, built when the iterator asks for its first element."""
    if not isinstance(start, InputPosition):
        return build(tf.constant(start, tf.int64))
    ref, first = weakref.ref(start), start.first

    def read():
        position = ref()  # gone only with its dataset; an iterator outliving both starts where the reader said
        return np.int64(first if position is None else position.start)

    @tf.autograph.experimental.do_not_convert  # plain Python: autograph would convert `build` with it
    def build_now(_):
        return build(tf.ensure_shape(numpy_step(read, [], tf.int64, stateful=True), []))

    return tf.data.Dataset.range(1).flat_map(build_now)


def skipped(build: Callable[[], tf.data.Dataset], start: int | InputPosition, per_step: int) -> tf.data.Dataset:
    """``build()`` after the ``per_step`` elements of each step before ``start`` (exactly ``build()`` when ``start``
    is 0). With a position, ``build()`` runs when each iterator opens: a seeded ``shuffle`` or ``Dataset.random``
    that reshuffles each iteration draws its seeds from a generator all iterators of one dataset share, so a dataset
    built once would give a later iterator (Keras opens one to build a model under a strategy, and drops it after a
    prefetch of a timing-dependent length) other epochs than the first; built for each, every iterator starts at the
    first epoch's seeds."""
    if not isinstance(start, InputPosition):
        ds = build()
        return ds.skip(start * per_step) if start else ds
    return opened(start, lambda step: build().skip(step * per_step))
