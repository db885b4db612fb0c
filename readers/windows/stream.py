"""Resident windows on the index-driven stream (``readers/sampling``): mixtures, class balance and elastic resume.

Every source's episodes lie end to end in one resident array (``Concatenated``), so each source's window start rows
are one contiguous block of the starts array: the stream's ``(source, window)`` is the start row at the source's
offset plus the window (``readers/indexed/stream.py``'s ``Stream``, whose table is here the starts). With class
balance the stream's sources are the classes (each window's class is its episode's label) and ``ClassMembers``
maps them back to windows. Global step ``s`` holds global elements ``[s·G, (s+1)·G)`` and each replica reads its
contiguous slice (``sampling.slicing``), so ``start_step`` counts global steps and resumes on any replica count.

The stages: chunk numbers → each chunk's start rows, computed by numpy once per epoch's steps (``tf.numpy_function``:
an epoch's order, each replica's slice) → batches of start rows → the gather (``index.py``). The default path (no
argument of the stream given) is ``index.index_batches``, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from ..epoch_guard import Stamp
from ..indexed.stream import EpochCount, Position, Stream
from ..input_position import InputPosition, opened
from ..python_steps import numpy_step
from ..sampling import classes as sampling_classes
from ..sampling.plan import StreamSpec
from ..windowing.starts import WindowSpec
from .index import once_checked

AUTOTUNE = tf.data.AUTOTUNE


def window_stream(spec: WindowSpec, lengths: Sequence[int], episode_sources: Sequence[int], *, weights, epoch_size,
                  balance: str | None, labels: np.ndarray | None, class_names: Sequence[str], shuffle: bool,
                  seed: int, where: str) -> Stream:
    """The stream over the windows of episodes ``lengths`` (source by source, in order: ``episode_sources``).

    Args:
      spec: the windows' ``WindowSpec``.
      lengths, episode_sources: every episode's length and its source's index, in the resident order.
      weights, epoch_size: as ``StreamSpec`` takes them (None: in proportion to the sources' windows; their total).
      balance: ``"class"``: each class (``labels``, one per episode) an equal share of every epoch.
      class_names: named in errors.
      shuffle, seed: as ``StreamSpec``'s.

    Raises:
      ValueError: a source with no window, or with balance a class with no window, naming it.
    """
    per_episode = np.array([spec.episode_windows(t)[1] for t in lengths], np.int64)
    episode_sources = np.asarray(episode_sources, np.int64)
    sources = int(episode_sources.max()) + 1 if len(episode_sources) else 0
    sizes = np.bincount(episode_sources, weights=per_episode, minlength=sources).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if balance is None:
        try:
            stream_spec = StreamSpec(sizes=tuple(int(n) for n in sizes), weights=weights, epoch_size=epoch_size,
                                     shuffle=shuffle, seed=seed)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        return Stream(stream_spec, None, starts)
    window_labels = np.repeat(np.asarray(labels, np.int64), per_episode)
    try:
        stream_spec, members = sampling_classes.balanced(window_labels, list(class_names), epoch_size=epoch_size,
                                                         shuffle=shuffle, seed=seed)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    return Stream(stream_spec, members, starts)


def stream_batches(
    starts: np.ndarray, *, stream: Stream, position: Position, drop_remainder: bool, repeat: bool = False,
    start_step: int | InputPosition = 0, then: Callable | None = None, where: str = "resident windows",
    epoch_check: Callable | None = None, stamp: Stamp | None = None,
) -> tf.data.Dataset:
    """Batches of window start rows for one pipeline, read from the stream: ``index_batches``' counterpart.

    Without ``repeat`` each iteration of the dataset is the next epoch of the stream, of a known length (this
    pipeline's batches of it). With ``repeat`` the stream runs on from global step ``start_step``, a chunk of one
    epoch's steps at a time, so starting at any step costs one epoch's order (an ``InputPosition``: the step it
    holds when the iterator opens, ``readers.BackupAndRestore``'s). ``then``, ``epoch_check`` (run by each
    chunk's function) and ``stamp`` (checked by each chunk, so a checkpoint restores only into the same data): as
    ``index_batches`` takes them.
    """
    epoch_size, batch = stream.spec.epoch_size, position.batch
    per_epoch = position.batches(epoch_size, drop_remainder)
    if repeat and per_epoch == 0:
        raise ValueError(f"{where}: {epoch_size} windows an epoch give this pipeline no batch of {batch}, so "
                         "repeat=True would never yield one; pass a smaller batch_size or a larger epoch_size")
    epochs = EpochCount()
    dtype = tf.as_dtype(starts.dtype)

    def chunk(number, start) -> tuple[np.ndarray, np.ndarray]:  # (full batches [k, B], the partial last batch)
        if repeat:
            indices = position.chunk(int(number), int(start), epoch_size)
        else:
            indices = position.epoch(epochs.at(int(number)), epoch_size, drop_remainder, chunk=int(number))
        rows = starts[stream.records(indices)[1]]
        full = len(rows) // batch * batch
        return rows[:full].reshape(-1, batch), rows[full:]

    def chunk_of(stamp_element, number, start):
        number = once_checked(number, stamp, stamp_element, number, epoch_check)
        full, tail = numpy_step(chunk, [number, start], [dtype, dtype], stateful=True)
        return tf.ensure_shape(full, [None, batch]), tf.ensure_shape(tail, [None])

    def batches_of(full, tail):
        batches = tf.data.Dataset.from_tensor_slices(full)
        if not drop_remainder:
            batches = batches.concatenate(tf.data.Dataset.from_tensors(tail).filter(lambda t: tf.size(t) > 0))
        return batches

    def from_step(start):  # the start step, read once when the iterator opens (input_position.py)
        numbers = tf.data.Dataset.range(2**62 if repeat else position.epoch_chunks(epoch_size, drop_remainder))
        stamps = stamp.stamps() if stamp is not None else tf.data.Dataset.range(0, 2**63 - 1)
        # The next chunk's order is computed while this one's batches are read (prefetch), so a chunk boundary does
        # not stall the gather.
        return tf.data.Dataset.zip((stamps, numbers)).map(lambda s, n: chunk_of(s, n, start)).prefetch(1).flat_map(
            batches_of)

    index = opened(start_step if repeat else 0, from_step)
    if then is not None:
        index = index.map(then, num_parallel_calls=AUTOTUNE, deterministic=True)
    return index if repeat else index.apply(tf.data.experimental.assert_cardinality(per_epoch))
