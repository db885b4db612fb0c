"""What one input pipeline of the index-driven stream reads, as arithmetic on ``readers/sampling``: which global
elements, in which chunks, and which record each one is. Pure numpy, no TensorFlow.

The stream's global element ``n`` is ``sampling.plan.element(spec, n)``: a ``(source, record)`` pair, or with class
balance a ``(class, j)`` pair that ``ClassMembers`` turns into a record. Global step ``s`` covers elements
``[s·G, (s+1)·G)``; pipeline ``p`` of ``P`` takes its contiguous part of each (``sampling.slicing``), one per-replica
batch for each replica it feeds. A pipeline reads its elements in chunks of whole steps (an epoch's, or at most
``CHUNK_ELEMENTS`` global elements): with ``repeat`` from ``start_step`` on, so resuming costs one chunk's order
whatever the step; without, each iteration the next epoch's chunks.

    stream = Stream(StreamSpec(sizes=(3, 1), shuffle=False), None, np.array([0, 3]))
    stream.records(np.arange(4))   # (array([0, 1, 0, 0]), array([0, 3, 1, 2])): sources and records in the table
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..sampling import slicing
from ..sampling.classes import ClassMembers
from ..sampling.plan import StreamSpec, elements

CHUNK_ELEMENTS = 2**16  # global elements a chunk spans at most: its order is computed, and held, at once


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
    """The stream over the sources' records laid end to end.

    Attributes:
      spec: the ``StreamSpec``; its sources are the datasets, or with ``members`` the classes.
      members: class balance's map from ``(class, j)`` to a record of the table; None without balance.
      starts: int64 [sources + 1], where each dataset's records start in the table (and the end).
    """

    spec: StreamSpec
    members: ClassMembers | None
    starts: np.ndarray

    def records(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source int32, record int64)`` of each global element in ``indices``: its dataset, and its record's
        place in the table of every source's records."""
        first, second = elements(self.spec, indices)
        if self.members is None:
            return first, self.starts[first] + second
        records = self.members.record(first, second)
        return (np.searchsorted(self.starts, records, side="right") - 1).astype(np.int32), records


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a pipeline stands in each global step.

    Attributes:
      pipelines: input pipelines (``num_input_pipelines``; 1 without an ``input_context``).
      pipeline: this one's id.
      global_batch: ``G``, the elements of one global step.
      batch: the batch this pipeline yields (the per-replica batch under an ``input_context``; ``G`` without).
    """

    pipelines: int
    pipeline: int
    global_batch: int
    batch: int

    def __post_init__(self):
        slicing.per_replica_batch(self.global_batch, self.pipelines, self.pipeline)  # checks the three

    def steps_per_chunk(self, epoch_size: int) -> int:
        """Global steps a chunk spans: an epoch's, at most ``CHUNK_ELEMENTS`` elements' (one step at least)."""
        return max(1, min(slicing.steps_per_epoch(epoch_size, self.global_batch),
                          CHUNK_ELEMENTS // self.global_batch))

    def chunk(self, chunk: int, start_step: int, epoch_size: int) -> np.ndarray:
        """The global elements chunk ``chunk`` of an endless stream (``repeat``) from ``start_step`` holds."""
        steps = self.steps_per_chunk(epoch_size)
        return slicing.replica_steps(start_step + chunk * steps, steps, self.pipeline, self.pipelines,
                                     self.global_batch)

    def epoch_chunks(self, epoch_size: int, drop_remainder: bool) -> int:
        """Chunks of one epoch alone (no ``repeat``): ``epoch(e, ..., chunk=c)`` for ``c`` below it."""
        steps = slicing.steps_per_epoch(epoch_size, self.global_batch, drop_remainder=drop_remainder)
        return max(1, -(-steps // self.steps_per_chunk(epoch_size)))

    def epoch(self, epoch: int, epoch_size: int, drop_remainder: bool, chunk: int | None = None) -> np.ndarray:
        """The global elements of epoch ``epoch`` alone (no ``repeat``) this pipeline takes: all, or those of its
        chunk ``chunk``."""
        steps = slicing.steps_per_epoch(epoch_size, self.global_batch, drop_remainder=drop_remainder)
        first = 0 if chunk is None else chunk * self.steps_per_chunk(epoch_size)
        count = steps if chunk is None else max(0, min(self.steps_per_chunk(epoch_size), steps - first))
        indices = slicing.replica_steps(first, count, self.pipeline, self.pipelines, self.global_batch)
        return epoch * epoch_size + indices[indices < epoch_size]

    def batches(self, epoch_size: int, drop_remainder: bool) -> int:
        """Batches this pipeline yields of one epoch (no ``repeat``): a batch for each replica it feeds in each whole
        step (its part of a step is ``global_batch // pipelines`` elements), and without ``drop_remainder`` its part
        of the last, partial step in batches, the last one short."""
        share = self.global_batch // self.pipelines
        whole, rest = divmod(epoch_size, self.global_batch)
        last = 0 if drop_remainder else min(max(0, rest - self.pipeline * share), share)
        return whole * (share // self.batch) + -(-last // self.batch)


class EpochCount:
    """Without ``repeat`` each iteration of a dataset is the next epoch: chunk 0 of an iteration moves it on."""

    def __init__(self):
        self._epoch = -1

    def at(self, chunk: int) -> int:
        if chunk == 0:
            self._epoch += 1
        return self._epoch


def pipeline_position(batch_size: int, input_context, where: str) -> Position:
    """This pipeline's ``Position``: under an ``input_context`` (a ``tf.distribute.InputContext``) ``batch_size`` is
    the per-replica batch and the pipeline feeds its equal share of the replicas; without, one pipeline of global
    batches of ``batch_size``.

    Raises:
      ValueError: replicas the input pipelines do not divide.
    """
    if input_context is None:
        return Position(1, 0, batch_size, batch_size)
    pipelines, replicas = input_context.num_input_pipelines, input_context.num_replicas_in_sync
    if replicas % pipelines:
        raise ValueError(f"{where}: input_context has {replicas} replicas over {pipelines} input pipelines, which "
                         "do not feed equal slices of a step; use a strategy whose pipelines feed equal replicas")
    return Position(pipelines, input_context.input_pipeline_id, batch_size * replicas, batch_size)
