"""Which global elements each replica takes at each global step: the rule that makes a run resume on any number of
replicas. Pure numpy, no TensorFlow.

The stream is one sequence of global elements, the epochs of ``plan.py`` laid end to end (element ``n`` is
``element(spec, n)``). Global step ``s`` covers ``[s·G, (s+1)·G)`` for a global batch of ``G``; of ``R`` replicas (or
pipelines), replica ``r`` takes the contiguous per-replica batch ``[s·G + r·B, s·G + (r+1)·B)``, ``B = G / R``. The
elements consumed before step ``s`` are ``[0, s·G)`` whatever ``R``, in the same order, so a run checkpointed at a
global step resumes on another replica count with one counter.

Steps and epochs, with ``repeat`` (the stream endless): steps run on across epoch boundaries and no element is
dropped, so when ``G`` does not divide ``epoch_size`` a step straddles two epochs; ``steps_per_epoch`` is then only
how many steps a Keras epoch counts. Without ``repeat`` (one epoch): ``epoch_size // G`` steps with
``drop_remainder`` (the last ``epoch_size % G`` elements are not read), or one more, partial, global batch without
it, of which each replica keeps its part of the same contiguous slice (fewer than ``B``, maybe none).

    replica_elements(step=1, replica=1, replicas=2, global_batch=4)   # array([6, 7])
    replica_epoch(10, replica=0, replicas=2, global_batch=4, drop_remainder=False)   # array([0, 1, 4, 5, 8, 9])
"""

from __future__ import annotations

import numpy as np

from .plan import _is_int


def _check(name: str, value, low: int) -> int:
    if not _is_int(value) or value < low:
        raise ValueError(f"{name}: must be an integer of at least {low} (got {name}={value!r})")
    return int(value)


def per_replica_batch(global_batch: int, replicas: int, replica: int = 0) -> int:
    """``B = global_batch / replicas``, after checking the three (``replica`` in ``[0, replicas)``).

    Raises:
      ValueError: a global batch the replicas do not divide (each replica takes the same number of elements).
    """
    global_batch, replicas = _check("global_batch", global_batch, 1), _check("replicas", replicas, 1)
    if global_batch % replicas:
        raise ValueError(f"global_batch: must be a multiple of replicas={replicas}, every replica taking an equal "
                         f"slice (got global_batch={global_batch}); pass a multiple of {replicas}")
    if not _is_int(replica) or not 0 <= replica < replicas:
        raise ValueError(f"replica: must be an integer in [0, {replicas - 1}] (got replica={replica!r})")
    return global_batch // replicas


def replica_elements(step: int, replica: int, replicas: int, global_batch: int) -> np.ndarray:
    """The global element indices replica ``replica`` of ``replicas`` takes at global step ``step`` (int64 [B]).

    Example:
      replica_elements(step=1, replica=1, replicas=2, global_batch=4)   # array([6, 7])
    """
    return replica_steps(step, 1, replica, replicas, global_batch)


def replica_steps(first_step: int, steps: int, replica: int, replicas: int, global_batch: int) -> np.ndarray:
    """The global element indices a replica takes over global steps ``[first_step, first_step + steps)``, in order,
    at once (int64 [steps·B]): what a pipeline reads, of an endless stream (``repeat``).

    Example:
      replica_steps(2, 2, replica=0, replicas=2, global_batch=4)   # array([ 8,  9, 12, 13])
    """
    batch = per_replica_batch(global_batch, replicas, replica)
    first_step, steps = _check("first_step", first_step, 0), _check("steps", steps, 0)
    starts = (first_step + np.arange(steps, dtype=np.int64)) * global_batch + replica * batch
    return (starts[:, None] + np.arange(batch, dtype=np.int64)).reshape(-1)


def steps_per_epoch(epoch_size: int, global_batch: int, *, drop_remainder: bool = True) -> int:
    """Global steps of one epoch: ``epoch_size // global_batch``, or with ``drop_remainder=False`` one more for the
    partial last global batch when there is one. With ``repeat`` the stream does not stop there (see the module).

    Example:
      steps_per_epoch(10, 4), steps_per_epoch(10, 4, drop_remainder=False)   # (2, 3)
    """
    epoch_size, global_batch = _check("epoch_size", epoch_size, 0), _check("global_batch", global_batch, 1)
    return epoch_size // global_batch if drop_remainder else -(-epoch_size // global_batch)


def replica_epoch(epoch_size: int, replica: int, replicas: int, global_batch: int, *,
                  drop_remainder: bool = True) -> np.ndarray:
    """The indices ``[0, epoch_size)`` of a one-epoch stream (no ``repeat``) that a replica takes, step by step, at
    once (int64). Without ``drop_remainder`` the last global batch is partial, and the replica keeps what of its
    contiguous slice the epoch holds: fewer than ``B`` elements, or none.

    Example:
      replica_epoch(10, replica=1, replicas=2, global_batch=4, drop_remainder=False)   # array([2, 3, 6, 7])
    """
    steps = steps_per_epoch(epoch_size, global_batch, drop_remainder=drop_remainder)
    indices = replica_steps(0, steps, replica, replicas, global_batch)
    return indices[indices < epoch_size]
