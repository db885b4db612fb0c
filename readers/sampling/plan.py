"""The stream of a reader over one or more sources, as arithmetic: element ``k`` of epoch ``e`` is a pure function
of ``(seed, e, k)`` giving ``(source, record)``. Pure numpy, no TensorFlow.

Each source gives its *share* of every epoch: ``weights``' proportions of ``epoch_size``, rounded by the largest
remainder so the shares add up to ``epoch_size`` exactly. A source's records form an endless stream of *passes*:
pass ``p`` of source ``i`` is a seeded permutation of ``range(sizes[i])`` keyed by ``(seed, i, p)`` (unshuffled: in
order). Epoch ``e`` takes elements ``[e·share, (e+1)·share)`` of that stream, so a source smaller than its share
repeats in a fresh order, a larger one is subsampled and consecutive epochs walk through all of it, and no record
comes twice within a pass. An epoch's elements are then merged: shuffled (a seeded permutation keyed by
``(seed, e)``), or interleaved smoothly by each element's time ``(j + 0.5) / share``.

The permutations are evaluated an index at a time (``permute.py``), so with ``shuffle`` any element costs the same
whatever the epoch's size or the position in it, and reading a chunk of an epoch holds only that chunk. Unshuffled,
an epoch's interleaving is computed whole (and kept for the next reads).

    spec = StreamSpec(sizes=(3, 1), weights=(0.5, 0.5), epoch_size=4, shuffle=False)
    shares(spec)           # array([2, 2])
    epoch_order(spec, 0)   # (array([0, 1, 0, 1]), array([0, 0, 1, 0])); epoch 1 takes source 0's records 2, 0
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from .permute import mix_key, permute

MAX_EPOCH_SIZE = 2**31 - 1  # elements of an epoch: tf.data's counts are C++ ints
MAX_SEED = 2**63 - 1  # a non-negative int64, what TensorFlow's seeds hold
# Domains of the random keys, so a source's pass and an epoch's shuffle never share a stream.
_PASS, _EPOCH = 0, 1


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_seed(value) -> bool:
    """Whether ``value`` is a seed every reader takes: an int (numpy's too, not a bool) in ``[0, MAX_SEED]``."""
    return _is_int(value) and 0 <= value <= MAX_SEED


def _sequence(value, name: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)) or len(value) == 0:
        raise ValueError(f"{name}: must be a non-empty sequence, one entry per source (got {name}={value!r})")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """What decides a stream over sources, checked on construction.

    Attributes:
      sizes: records per source, each an int of at least 1.
      weights: each source's part of an epoch, positive finite numbers (stored as floats); only their ratios
        count, normalised exactly when the shares are taken; None: in proportion to ``sizes``.
      epoch_size: elements per epoch, in [1, 2**31 - 1]; None: the sources' total (stored resolved).
      shuffle: each epoch a seeded permutation, and each pass of a source too; False: records in order and the
        sources interleaved smoothly.
      seed: an int in [0, 2**63 - 1]; with the epoch and the position it decides every element.

    Example:
      StreamSpec(sizes=(70, 10), weights=(0.7, 0.3))   # epoch_size=80: shares 56 and 24
    """

    sizes: tuple[int, ...]
    weights: tuple[float, ...] | None = None
    epoch_size: int | None = None
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self):
        sizes = _sequence(self.sizes, "sizes")
        if not all(_is_int(n) and n >= 1 for n in sizes):
            raise ValueError(f"sizes: must be integers of at least 1, the records of each source (got sizes="
                             f"{list(sizes)!r}); leave out a source with no record")
        object.__setattr__(self, "sizes", tuple(int(n) for n in sizes))
        if self.weights is not None:
            object.__setattr__(self, "weights", _checked_weights(self.weights, len(sizes)))
        if self.epoch_size is None:
            object.__setattr__(self, "epoch_size", sum(self.sizes))
        if not _is_int(self.epoch_size) or not 1 <= self.epoch_size <= MAX_EPOCH_SIZE:
            raise ValueError(f"epoch_size: must be an integer in [1, {MAX_EPOCH_SIZE:,}] (got epoch_size="
                             f"{self.epoch_size!r}); pass the elements per epoch, or None for the sources' total")
        object.__setattr__(self, "epoch_size", int(self.epoch_size))
        if not isinstance(self.shuffle, (bool, np.bool_)):
            raise ValueError(f"shuffle: must be True or False (got shuffle={self.shuffle!r})")
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        if not is_seed(self.seed):
            raise ValueError(f"seed: must be an integer in [0, 2**63 - 1] (got seed={self.seed!r}); pass the "
                             "seed the job started with")
        object.__setattr__(self, "seed", int(self.seed))


def _checked_weights(weights, sources: int) -> tuple[float, ...]:
    """``weights`` checked, one positive finite number per source, as floats. They are not divided by their sum
    here: rounded floats would no longer tie where the weights do (1, 2, 3 as sixths)."""
    weights = _sequence(weights, "weights")
    if len(weights) != sources:
        raise ValueError(f"weights: must give one weight per source, {sources} (got {len(weights)} weights: "
                         f"{list(weights)!r}); pass one per source, or None for weights in proportion to sizes")
    def valid(w) -> bool:
        finite = _is_int(w) and w < 2**1000 or isinstance(w, (float, np.floating)) and math.isfinite(w)
        # not subnormal: TensorFlow's threads flush those to zero, where the shares are taken (all-zero weights)
        return finite and w >= sys.float_info.min

    if not all(valid(w) for w in weights):
        raise ValueError(f"weights: must be positive finite numbers (got weights={list(weights)!r}); leave out a "
                         "source that should give nothing")
    return tuple(float(w) for w in weights)


def _decimal(weight) -> Fraction:
    """A weight as the shortest decimal that prints it (0.7 is 7/10, not the binary float nearest it), so weights
    meant to tie do tie."""
    return Fraction(repr(float(weight)))


def shares(spec: StreamSpec) -> np.ndarray:
    """Elements each source gives per epoch: the weights' proportions of ``epoch_size``, rounded by the largest
    remainder (ties to the lower source index), so they add up to ``epoch_size`` exactly.

    The weights count as the shortest decimals that print them, in exact rational arithmetic, so the shares are the
    same on every platform. A source whose proportion is below one element may get 0.

    Example:
      shares(StreamSpec(sizes=(5, 5, 5), weights=(1, 1, 1), epoch_size=10))   # array([4, 3, 3])
    """
    return np.array(_shares(spec), dtype=np.int64)


@functools.lru_cache(maxsize=64)  # exact rationals are slow: every source's records of every epoch take the shares
def _shares(spec: StreamSpec) -> tuple[int, ...]:
    exact = [_decimal(w) for w in spec.weights] if spec.weights is not None else [Fraction(n) for n in spec.sizes]
    total = sum(exact)
    quotas = [w * spec.epoch_size / total for w in exact]
    floors = [math.floor(q) for q in quotas]
    left = spec.epoch_size - sum(floors)
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    return tuple(floors)


def _check_epoch(epoch) -> int:
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"epoch: must be a non-negative integer (got epoch={epoch!r})")
    return int(epoch)


def _check_source(spec: StreamSpec, source) -> int:
    if not _is_int(source) or not 0 <= source < len(spec.sizes):
        raise ValueError(f"source: must be an integer in [0, {len(spec.sizes) - 1}], a source's index (got "
                         f"source={source!r})")
    return int(source)


def _stream_records(spec: StreamSpec, source: int, positions: np.ndarray) -> np.ndarray:
    """The records at ``positions`` (int64) of source ``source``'s endless stream of passes."""
    size = spec.sizes[source]
    passes, offsets = np.divmod(positions, size)
    if not spec.shuffle:
        return offsets
    return permute(offsets, size, mix_key(spec.seed, _PASS, source, passes))


def source_records(spec: StreamSpec, source: int, epoch: int) -> np.ndarray:
    """The records source ``source`` gives in epoch ``epoch``, in its stream's order (int64 [share]).

    Costs O(share), whatever the epoch and the source's size.

    Example:
      source_records(StreamSpec(sizes=(3,), epoch_size=2, shuffle=False), 0, 1)   # array([2, 0])
    """
    source, epoch = _check_source(spec, source), _check_epoch(epoch)
    share = int(shares(spec)[source])
    return _stream_records(spec, source, epoch * share + np.arange(share, dtype=np.int64))


def _shuffled(spec: StreamSpec, epochs: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(source int32, record int64)`` of position ``ks`` of epochs ``epochs`` with ``shuffle``: the position's
    place in the epoch's keyed permutation picks an element of the sources' shares laid end to end."""
    counts = shares(spec)
    ends = np.cumsum(counts)
    placed = permute(ks, spec.epoch_size, mix_key(spec.seed, _EPOCH, epochs))
    sources = np.searchsorted(ends, placed, side="right").astype(np.int32)
    records = np.empty(ks.shape, np.int64)
    for source in np.unique(sources):
        mine = sources == source
        positions = epochs[mine] * counts[source] + placed[mine] - (ends[source] - counts[source])
        records[mine] = _stream_records(spec, int(source), positions)
    return sources, records


def epoch_order(spec: StreamSpec, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Every element of one epoch, in order: ``(source int32 [epoch_size], record int64 [epoch_size])``.

    With ``shuffle``, the sources' elements (source by source, each in its stream's order) permuted uniformly by a
    keyed permutation of ``(seed, epoch)``. Without, interleaved smoothly: element ``j`` of a source of share ``s``
    comes at time ``(j + 0.5) / s`` (ties to the lower source index), so up to any time ``t`` each source has given
    ``round(t·s)`` elements, within half an element of its proportion. The arrays are read-only.

    Example:
      epoch_order(StreamSpec(sizes=(2, 1), shuffle=False), 0)   # (array([0, 1, 0]), array([0, 0, 1]))
    """
    epoch = _check_epoch(epoch)
    if spec.shuffle:
        ks = np.arange(spec.epoch_size, dtype=np.int64)
        sources, records = _shuffled(spec, np.full_like(ks, epoch), ks)
    else:
        counts = shares(spec)
        sources = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        records = np.concatenate([source_records(spec, i, epoch) for i in range(len(counts))])
        # (2j + 1) / (2s) is divided exactly rounded under IEEE, so equal times tie on every platform.
        j = np.arange(spec.epoch_size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        times = (2 * j + 1) / (2 * np.repeat(counts, counts)).astype(np.float64)
        order = np.lexsort((sources, times))
        sources, records = sources[order], records[order]
    sources.setflags(write=False)
    records.setflags(write=False)
    return sources, records


@functools.lru_cache(maxsize=2)  # unshuffled: the epoch being read, and the next one while a batch straddles both
def _cached_epoch(spec: StreamSpec, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    return epoch_order(spec, epoch)


def element(spec: StreamSpec, n: int) -> tuple[int, int]:
    """``(source, record)`` of global element ``n = epoch·epoch_size + k``.

    Example:
      element(StreamSpec(sizes=(2, 1), shuffle=False), 4)   # (1, 0): epoch 1, position 1
    """
    if not _is_int(n) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, a global element index (got n={n!r})")
    sources, records = elements(spec, np.array([int(n)], np.int64))
    return int(sources[0]), int(records[0])


def elements(spec: StreamSpec, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``element`` of every global index in ``indices`` at once: ``(source int32, record int64)`` of its shape.

    With ``shuffle`` each costs O(1), whatever the epoch's size; unshuffled, each epoch the indices reach is
    computed once (the last two epochs are kept: the one being read, and the next while a batch straddles both).

    Example:
      elements(StreamSpec(sizes=(2, 1), shuffle=False), np.arange(3, 6))   # (array([0, 1, 0]), array([0, 0, 1]))
    """
    indices = np.asarray(indices)
    if indices.size and (indices.dtype.kind not in "iu" or indices.min() < 0):
        raise ValueError(f"indices: must be non-negative integers, global element indices (got dtype "
                         f"{indices.dtype}, minimum {indices.min().item()!r})")
    epochs, ks = np.divmod(indices.astype(np.int64), spec.epoch_size)
    if spec.shuffle:
        return _shuffled(spec, epochs, ks)
    sources = np.zeros(indices.shape, np.int32)
    records = np.zeros(indices.shape, np.int64)
    for epoch in np.unique(epochs):
        where = epochs == epoch
        epoch_sources, epoch_records = _cached_epoch(spec, int(epoch))
        sources[where], records[where] = epoch_sources[ks[where]], epoch_records[ks[where]]
    return sources, records
