"""The arguments that take ``readers.images`` onto the index-driven stream, checked once, up front. Pure.

A list of paths, ``weights``, ``epoch_size``, ``balance``, ``shuffle="global"`` or ``with_source`` asks for it;
without any of them the reader is today's (one path, files and a buffer shuffled). What the stream cannot do with
today's other arguments is refused here, each in one line saying why.

    stream_request("photos-tfr")                                       # None: today's reader
    stream_request(["a-tfr", "b-tfr"], weights=[0.7, 0.3]).where       # 'a-tfr + b-tfr'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from ..sampling.plan import StreamSpec

BALANCES = (None, "class")
SHUFFLES = (None, "global")


@dataclasses.dataclass(frozen=True)
class StreamRequest:
    """What the index-driven stream is asked for.

    Attributes:
      paths: the dataset folders, the sources in order.
      weights: each source's part of an epoch (None: in proportion to their records), as ``StreamSpec`` takes them.
      epoch_size: elements per epoch; None: the sources' records.
      balance: ``"class"``: each class an equal share of every epoch; None: the sources' weights.
      shuffle: ``"global"``: every epoch a seeded permutation, even with ``training=False``.
      with_source: labels become ``{"label": labels, "source": source index int32}``.
    """

    paths: tuple[str, ...]
    weights: tuple[float, ...] | None = None
    epoch_size: int | None = None
    balance: str | None = None
    shuffle: str | None = None
    with_source: bool = False

    @property
    def where(self) -> str:
        """The paths, for messages."""
        return " + ".join(self.paths)


def _paths(path) -> tuple[tuple[str, ...], bool]:
    """``(paths, given as a list)``; a list must be non-empty paths."""
    if isinstance(path, (str, os.PathLike)):
        return (os.fspath(path),), False
    if isinstance(path, Sequence) and not isinstance(path, bytes) and len(path) > 0 and all(
            isinstance(p, (str, os.PathLike)) and os.fspath(p) for p in path):
        return tuple(os.fspath(p) for p in path), True
    raise TypeError(f"path: must be a dataset folder or a non-empty list of them (got {path!r}); pass e.g. "
                    "'photos-tfr' or ['a-tfr', 'b-tfr']")


def stream_request(path, *, weights=None, epoch_size=None, balance=None, shuffle=None, with_source=False,
                   cache=None, service=None, ignore_errors=False, deterministic=None) -> StreamRequest | None:
    """The checked ``StreamRequest`` of ``readers.images``' arguments, or None when none asks for the stream.

    Raises:
      TypeError: a path that is neither a folder nor a list of folders.
      ValueError: weights that are not one positive finite number per path, a bad ``epoch_size``, ``balance``,
        ``shuffle`` or ``with_source``, ``balance`` with ``weights``, or the stream with an argument it cannot honour
        (``cache``, ``service``, ``ignore_errors``, ``deterministic=False``), naming the paths and why.
    """
    paths, listed = _paths(path)
    where = " + ".join(paths)
    if balance not in BALANCES:
        raise ValueError(f"{where}: balance must be one of {BALANCES} (got balance={balance!r}); pass "
                         "balance='class' for an equal share of every class")
    if shuffle not in SHUFFLES:
        raise ValueError(f"{where}: shuffle must be one of {SHUFFLES} (got shuffle={shuffle!r}); pass "
                         "shuffle='global' for a permutation of every record each epoch")
    if not isinstance(with_source, bool):
        raise ValueError(f"{where}: with_source must be True or False (got with_source={with_source!r})")
    if not (listed or weights is not None or epoch_size is not None or balance or shuffle or with_source):
        return None
    if balance is not None and weights is not None:
        raise ValueError(f"{where}: balance={balance!r} gives every class an equal share, so it cannot also follow "
                         f"the sources' weights (got weights={weights!r}); drop one of the two")
    try:  # the weights and epoch_size as the stream will take them, before any manifest is read
        spec = StreamSpec(sizes=(1,) * len(paths), weights=weights, epoch_size=epoch_size)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    for given, problem in [
        (cache is not None, f"cache={cache!r}: each epoch reads its records by position in a new order, so a cache "
         "of one epoch's images would replay that epoch; drop cache"),
        (service is not None, f"service={service!r}: the service's workers share an epoch out by files, not by "
         "position, so the order, the shares and resuming would be lost; read without service"),
        (ignore_errors, "ignore_errors=True: a skipped record would shift every later element of the order, so the "
         "batches would differ by replica count and resuming would not be exact; drop ignore_errors"),
        (deterministic is False, "deterministic=False: the order is the point of the stream; drop deterministic"),
    ]:
        if given:
            raise ValueError(f"{where}: cannot read the index-driven stream (mixtures, balance, a global shuffle) "
                             f"with {problem}")
    return StreamRequest(paths, spec.weights, epoch_size, balance, shuffle, with_source)


def episode_request(path, *, weights=None, epoch_size=None, shuffle=None, with_source=False, repeat=False,
                    start_step=0, shuffle_files=False) -> StreamRequest | None:
    """The checked ``StreamRequest`` of ``readers.episodes``' arguments, or None when none asks for the stream: a
    list of paths, ``weights``, ``epoch_size``, ``shuffle``, ``with_source``, ``repeat=True`` or a ``start_step``.

    Raises:
      TypeError: a path that is neither a folder nor a list of folders.
      ValueError: what ``stream_request`` refuses, a ``repeat`` that is not a bool, or the stream with
        ``shuffle_files=True`` (a file order of one dataset; the stream orders episodes itself).
    """
    paths, _ = _paths(path)
    where = " + ".join(paths)
    if not isinstance(repeat, bool):
        raise ValueError(f"{where}: repeat must be True or False (got repeat={repeat!r})")
    request = stream_request(path, weights=weights, epoch_size=epoch_size, shuffle=shuffle, with_source=with_source)
    zero_step = not isinstance(start_step, bool) and hasattr(start_step, "__index__") and start_step == 0
    if request is None and (repeat or not zero_step):  # any other start_step is checked (and refused) by the stream
        request = StreamRequest(paths)
    if request is not None and shuffle_files:
        raise ValueError(f"{where}: cannot read the index-driven stream (mixtures, a global shuffle, repeat, "
                         "start_step) with shuffle_files=True: it orders whole episodes itself; pass "
                         "shuffle='global' for a permutation of every episode each epoch, and drop shuffle_files")
    return request
