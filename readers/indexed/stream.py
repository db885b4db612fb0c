"""What one input pipeline of the index-driven stream reads, as arithmetic on ``readers/sampling``: which global
elements, in which chunks, and which record each one is. Pure numpy, no TensorFlow.

The stream's global element ``n`` is ``sampling.plan.element(spec, n)``: a ``(source, record)`` pair, or with class
balance a ``(class, j)`` pair that ``ClassMembers`` turns into a record. Global step ``s`` covers elements
``[s·G, (s+1)·G)``; pipeline ``p`` of ``P`` takes its contiguous part of each (``sampling.slicing``), one per-replica
batch for each replica it feeds. With ``repeat`` a pipeline reads its elements in chunks of one epoch's steps from
``start_step`` on, so resuming costs one epoch's order whatever the step; without, one epoch per iteration.

    stream = Stream(StreamSpec(sizes=(3, 1), shuffle=False), None, np.array([0, 3]))
    stream.records(np.arange(4))   # (array([0, 1, 0, 0]), array([0, 3, 1, 2])): sources and records in the table
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..sampling import slicing
from ..sampling.classes import ClassMembers
from ..sampling.plan import StreamSpec, elements


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
        return max(1, slicing.steps_per_epoch(epoch_size, self.global_batch))

    def chunk(self, chunk: int, start_step: int, epoch_size: int) -> np.ndarray:
        """The global elements chunk ``chunk`` of an endless stream (``repeat``) from ``start_step`` holds."""
        steps = self.steps_per_chunk(epoch_size)
        return slicing.replica_steps(start_step + chunk * steps, steps, self.pipeline, self.pipelines,
                                     self.global_batch)

    def epoch(self, epoch: int, epoch_size: int, drop_remainder: bool) -> np.ndarray:
        """The global elements of epoch ``epoch`` alone (no ``repeat``) this pipeline takes."""
        return epoch * epoch_size + slicing.replica_epoch(epoch_size, self.pipeline, self.pipelines,
                                                          self.global_batch, drop_remainder=drop_remainder)

    def batches(self, epoch_size: int, drop_remainder: bool) -> int:
        """Batches this pipeline yields of one epoch (no ``repeat``)."""
        mine = len(self.epoch(0, epoch_size, drop_remainder))
        return mine // self.batch if drop_remainder else -(-mine // self.batch)


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
