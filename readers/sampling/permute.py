"""Keyed permutations evaluated one index at a time: ``permute(i, size, key)`` is where index ``i`` goes in a seeded
shuffle of ``range(size)``, without building the shuffle. Pure numpy, no TensorFlow.

Above ``EXACT_UP_TO`` a balanced Feistel network over the smallest ``4**h >= size`` (eight rounds of the splitmix64
finaliser keyed by ``key`` and the round) is a bijection of ``range(4**h)``; "cycle walking" (apply it again while
the result is ``>= size``) restricts it to a bijection of ``range(size)``. This is how grain's ``index_shuffle`` and
TensorFlow's ``tf.random.experimental.index_shuffle`` shuffle an epoch: element ``k`` of an epoch of a billion costs
what element ``k`` of an epoch of ten does, and nothing of size ``size`` is ever held. A Feistel network of a few
bits a half is measurably not uniform, so a small ``size`` is shuffled exactly instead: ``range(size)`` sorted by
a keyed hash of each value, a uniformly random permutation. Every operation is on uint64 with wrap-around, so the
result is the same on every platform and numpy version.

    key = mix_key(0, 1, 7)                        # one key per (seed, domain, ...) tuple
    permute(np.arange(5), 5, key)                 # a permutation of [0, 5)
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 8
EXACT_UP_TO = 1024  # sizes shuffled exactly (sorted by a hash); a Feistel network above
_EXACT_CELLS = 2**22  # hash values held at once by the exact path
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, element-wise on uint64 (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def mix_key(*parts) -> np.ndarray:
    """One uint64 key per position of the broadcast ``parts`` (ints or integer arrays, each taken modulo 2**64):
    distinct tuples give unrelated keys."""
    with np.errstate(over="ignore"):
        key = np.zeros((), np.uint64)
        for part in parts:
            key = _mix((key * _GOLDEN) ^ (np.asarray(part).astype(np.uint64) + _GOLDEN))
        return key


def _feistel(x: np.ndarray, key: np.ndarray, half: int) -> np.ndarray:
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    left, right = x >> shift, x & mask
    for r in range(_ROUNDS):
        left, right = right, left ^ (_mix(right ^ (key + np.uint64(r + 1) * _GOLDEN)) & mask)
    return (left << shift) | right


def _exact(index: np.ndarray, size: int, keys: np.ndarray) -> np.ndarray:
    """``permute`` for a small ``size``: each key's permutation is ``range(size)`` sorted by a keyed hash."""
    unique, which = np.unique(keys, return_inverse=True)
    out = np.empty(index.shape, np.int64)
    values = np.arange(size, dtype=np.uint64)
    step = max(1, _EXACT_CELLS // size)
    for first in range(0, len(unique), step):  # a block of keys at a time: memory bounded whatever the count
        block = unique[first:first + step]
        rows = np.argsort(_mix(values[None, :] ^ _mix(block[:, None])), axis=1, kind="stable")
        mine = np.flatnonzero((which >= first) & (which < first + len(block)))
        out[mine] = rows[which[mine] - first, index[mine]]
    return out


def permute(index, size: int, key) -> np.ndarray:
    """Where each ``index`` (ints in ``[0, size)``) goes in the permutation of ``range(size)`` keyed by ``key``
    (a uint64, or an array of them broadcast against ``index``: one permutation per key), as int64 of
    ``index``'s shape.

    Example:
      permute(np.arange(4), 4, mix_key(3))   # the 4 values 0..3 in a keyed order
    """
    index = np.asarray(index, np.int64)
    if size <= 1:
        return index.copy()
    with np.errstate(over="ignore"):
        keys = np.broadcast_to(np.asarray(key, np.uint64), index.shape).ravel()
        flat = index.ravel()
        if size <= EXACT_UP_TO:
            return _exact(flat, int(size), keys).reshape(index.shape)
        half = -(-(int(size) - 1).bit_length() // 2)
        out = _feistel(flat.astype(np.uint64), keys, half)
        todo = np.flatnonzero(out >= np.uint64(size))
        while todo.size:  # each walk ends: a permutation's cycle through an index in range comes back into range
            out[todo] = _feistel(out[todo], keys[todo], half)
            todo = todo[out[todo] >= np.uint64(size)]
    return out.astype(np.int64).reshape(index.shape)
