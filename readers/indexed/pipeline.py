"""The stages every reader on the index-driven stream shares (where a pipeline stands in each global step is
``stream.pipeline_position``): its elements a chunk at a time (Python per chunk: the order from
``readers/sampling``, each source's epoch check), and their records read by position, in order.

    records = read(elements(indices_of, rows, dtypes, guards, repeat=True), table, None, read_batch=64)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...format.storage import is_url
from ..input_position import InputPosition, opened
from ..python_steps import assert_no_problem, numpy_step
from . import records as records_lib

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_PARALLEL_READS = 16  # remote records read at once
READ_BATCH = 64  # local records read by one Python call


def elements(indices_of, rows, dtypes: list[tf.DType], guards, *, repeat: bool, epoch_chunks: int = 1,
             start_step: int | InputPosition = 0) -> tf.data.Dataset:
    """The rows of this pipeline's elements, in order, a chunk at a time: ``indices_of(number, start)`` the global
    elements of chunk ``number`` from start step ``start`` (with ``repeat``; without, chunk ``number`` of
    ``epoch_chunks`` of the iteration's epoch), ``rows(indices)`` their rows as 1-D arrays of ``dtypes``. Each chunk
    first runs every source's epoch check (``epoch_guard.py``). ``start_step``: an int, or an ``InputPosition``
    read when the iterator opens (so ``readers.BackupAndRestore`` can move it, ``input_position.py``)."""

    def chunk(number, start):
        problem = next((p for p in (g.problem() for g in guards) if p), "")
        indices = indices_of(int(number), int(start))
        if problem:
            indices = indices[:0]
        return (*rows(indices), np.array(problem.encode()))

    def elements_of(number, start):
        *found, problem = numpy_step(chunk, [number, start], [*dtypes, tf.string], stateful=True)
        for column in found:  # one row each, as chunk() makes them: set, not checked by an op (python_steps.no_problem)
            column.set_shape([None])
        with tf.control_dependencies([assert_no_problem(problem)]):
            found[0] = tf.identity(found[0])
        return tf.data.Dataset.from_tensor_slices(tuple(found))

    def from_step(start):  # the start step, read once when the iterator opens (input_position.py)
        numbers = tf.data.Dataset.range(2**62 if repeat else epoch_chunks)
        return numbers.flat_map(lambda number: elements_of(number, start))

    return opened(start_step, from_step)


SESSIONS_ATTRIBUTE = "_tfshard_shard_cache_sessions"


def holding_sessions(ds: tf.data.Dataset, sessions) -> tf.data.Dataset:
    """``ds`` holding the sources' shard-cache ``sessions`` (None for a source without one): their copies, read by
    position, stay pinned while it lives (a dataset made from it, an iterator of it or a distributed one hold it
    too) and are released with it. Not in a function of the pipeline: TensorFlow keeps those after the dataset is
    gone, and the pins with them."""
    setattr(ds, SESSIONS_ATTRIBUTE, tuple(s for s in sessions if s is not None))
    return ds


def read(elements: tf.data.Dataset, table: records_lib.RecordTable, num_parallel_reads: int | None,
         read_batch: int = READ_BATCH) -> tf.data.Dataset:
    """``(shard, offset, length, *carried)`` rows → ``(record, *carried)``, in order: local files ``read_batch``
    records at a time (``pread``), remote ones (an index file, no shard cache) one ``FixedLengthRecordDataset`` per
    record."""
    if not any(is_url(f) for f in table.files):
        read_batch_of = records_lib.pread_batch(table.files, table.identities)

        def read_many(shard, offset, length, *carried):
            found = numpy_step(read_batch_of, [shard, offset, length], tf.string, stateful=False)
            return (tf.ensure_shape(found, [None]), *carried)

        return elements.batch(read_batch).map(read_many, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()
    files, sizes = tf.constant(table.files), tf.constant(table.file_sizes, tf.int64)

    def read_one(shard, offset, length, *carried):
        return records_lib.read_at(files, sizes, shard, offset, length).map(lambda record: (record, *carried))

    cycle = num_parallel_reads or DEFAULT_PARALLEL_READS
    return elements.interleave(read_one, cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                               deterministic=True)
