"""Class balance as the stream's arithmetic: a stream whose sources are the classes, at equal weights, and the
weights ``model.fit(class_weight=)`` takes. Pure numpy, no TensorFlow.

Each class is a source of the records that hold it; equal weights make the shares of every epoch differ by at
most one element (the largest remainder), so each class is equally likely in every epoch, exactly. A class smaller
than its share repeats in a fresh order each pass; a larger one is subsampled, and consecutive epochs walk through
all of it (``plan.py``'s pass rule).

    spec, members = balanced(np.array([0, 0, 0, 1]), 2, shuffle=False)
    shares(spec)                                  # array([2, 2])
    members.record(*epoch_order(spec, 0))         # array([0, 3, 1, 3]): record 3, the one of class 1, twice
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .plan import StreamSpec, _is_int


@dataclasses.dataclass(frozen=True, eq=False)
class ClassMembers:
    """Which record is element ``j`` of class ``c``: the records of each class, in record order.

    Attributes:
      records: int64 [records], the record indices grouped by class, ascending within each class.
      starts: int64 [classes + 1], where each class's records begin in ``records`` (and the end).
    """

    records: np.ndarray
    starts: np.ndarray

    def record(self, classes, j) -> np.ndarray:
        """The record index of element ``j`` of class ``classes`` (arrays of one shape, or ints), as int64.

        Example:
          members.record(np.array([1, 0]), np.array([0, 2]))   # the first record of class 1, the third of class 0
        """
        classes, j = np.asarray(classes, np.int64), np.asarray(j, np.int64)
        return self.records[self.starts[classes] + j]


def _class_name(c: int, names: Sequence[str]) -> str:
    return f"class {c} ({names[c]!r})" if c < len(names) else f"class {c}"


def balanced(labels: np.ndarray, classes: int | Sequence[str], *, epoch_size: int | None = None,
             shuffle: bool = True, seed: int = 0) -> tuple[StreamSpec, ClassMembers]:
    """A stream that gives each class an equal share of every epoch, and the map back to the records.

    Args:
      labels: the class id of each record, a 1-D integer array, each in ``[0, classes)``.
      classes: the number of classes, or their names (named in errors).
      epoch_size: elements per epoch; None: the records' count.
      shuffle, seed: as ``StreamSpec``'s.

    Returns:
      ``(spec, members)``: a ``StreamSpec`` whose source ``c`` is class ``c`` (equal weights), and the
      ``ClassMembers`` that turns its ``(source, record)`` pairs into record indices: ``members.record(s, r)``.

    Raises:
      ValueError: labels that are not 1-D integers in range, or a class with no record (named; a balanced stream
        cannot give it its share).

    Example:
      spec, members = balanced(np.array([1, 0, 1, 1]), ["cat", "dog"])   # spec.sizes == (1, 3), shares 2 and 2
    """
    names = () if _is_int(classes) or not isinstance(classes, Sequence) else list(classes)
    count = int(classes) if _is_int(classes) else len(names)
    if count < 1 or isinstance(classes, str):
        raise ValueError(f"classes: must be at least one class, a count or the names (got classes={classes!r})")
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(f"labels: must be a 1-D array of integer class ids, one per record (got dtype "
                         f"{labels.dtype}, shape {labels.shape})")
    outside = np.flatnonzero((labels < 0) | (labels >= count))
    if outside.size:
        first = int(outside[0])
        raise ValueError(f"labels: class ids must be in [0, {count - 1}] (got {labels[first].item()!r} at record "
                         f"{first}); pass classes that cover every label")
    labels = labels.astype(np.int64)  # in range now; bincount refuses uint64
    sizes = np.bincount(labels, minlength=count)
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        named = ", ".join(_class_name(int(c), names) for c in empty[:5]) + (", ..." if empty.size > 5 else "")
        raise ValueError(f"labels: {named} {'has' if empty.size == 1 else 'have'} no record, so no share of a "
                         f"balanced epoch (got counts {sizes.tolist()[:20]}); leave the empty classes out")
    records = np.argsort(labels, kind="stable").astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    records.setflags(write=False)
    starts.setflags(write=False)
    spec = StreamSpec(sizes=tuple(int(n) for n in sizes), weights=(1.0,) * count, epoch_size=epoch_size,
                      shuffle=shuffle, seed=seed)
    return spec, ClassMembers(records, starts)


def class_weights(counts: Sequence[int], where: str, class_names: Sequence[str] = ()) -> dict[int, float]:
    """The "balanced" weights of keras and scikit-learn: ``total / (classes · count_c)`` per class index, so a class's
    records weigh as much in all as any other's, and the mean weight per record is 1.

    A class with no record is refused rather than weighted 0 or left out: its balanced weight is infinite, and a
    split without one class is usually a mistake a silent weight would hide (scikit-learn refuses it too).

    Args:
      counts: records per class, in class order.
      where: the dataset and split, for the message.
      class_names: the classes' names, for the message.

    Example:
      class_weights([30, 10], "photos-tfr: split 'train'")   # {0: 0.6666666666666666, 1: 2.0}
    """
    total, count = sum(counts), len(counts)
    for c, n in enumerate(counts):
        if n == 0:
            raise ValueError(f"{where}: {_class_name(c, class_names)} has no record, so no balanced weight (got "
                             f"class_counts {list(counts)[:20]}); train on a split that holds every class, or pass "
                             "class_weight yourself")
    return {c: total / (count * n) for c, n in enumerate(counts)}
