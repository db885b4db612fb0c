"""Sliding windows gathered from one device-resident array per feature (the story this project exists for).

The episodes are held once, concatenated, as one tensor per feature placed on
the target device. The pipeline is a dataset of window *start indices*
(4 bytes each, from ``readers.starts``): shuffled once per epoch as one op,
batched first, then each batch becomes windows with one vectorised gather of
``starts[:, None] + range(length)``. A window never crosses an episode boundary.

Work in progress (issue 4): ``resident_windows`` takes episodes already in
memory; reading them from ``tfshard episodes`` shards, per-replica arrays under
a strategy and the streamed mode come next. tf.data places its map functions on
the CPU, so on a GPU the gather has to move into the train step (or after
``copy_to_device``) to really run on the device; that is not verified here (no GPU).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from readers.starts import window_count, window_starts


def _default_device() -> str:
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def resident_windows(
    episodes: Mapping[str, Sequence[np.ndarray]],
    *,
    length: int,
    shift: int = 1,
    batch_size: int,
    horizon: int = 0,
    targets: str | None = None,
    shuffle: bool = True,
    seed: int | None = None,
    drop_remainder: bool = True,
    device: str | None = None,
) -> tf.data.Dataset:
    """Batches of windows over episodes held once on ``device``.

    Args:
      episodes: feature name → list of per-episode arrays ``[T_e, ...]`` (same T_e
        across features for one episode).
      length: window length L in samples.
      shift: samples between consecutive window starts S.
      batch_size: windows per batch.
      horizon: with ``targets="next"``, the H samples after each window are the target.
      targets: None (windows only), ``"same"`` (the autoencoder case: the same
        tensor twice, no second gather), or ``"next"`` (the next ``horizon`` steps).
      shuffle: reshuffle the window order every epoch (seeded by ``seed``).
      drop_remainder: drop the last partial batch.
      device: where the arrays live; default the first GPU, else the CPU (see the module docstring).

    Returns:
      A dataset of ``{feature: [B, L, ...]}`` (or ``(windows, targets)``).

    Example:
      ds = resident_windows({"x": [np.zeros((1000, 3))]}, length=256, shift=16, batch_size=64)
      # 48 windows of [256, 3] → 0 full batches of 64; with batch_size=16: 3 batches
    """
    if not episodes:
        raise ValueError("episodes: need at least one feature (got an empty mapping)")
    if targets not in (None, "same", "next"):
        raise ValueError(f"targets: must be None, 'same' or 'next' (got {targets!r})")
    if targets == "next" and horizon < 1:
        raise ValueError(f"horizon: targets='next' needs horizon >= 1 (got {horizon!r})")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer (got {batch_size!r})")
    names = list(episodes)
    lengths = [len(e) for e in episodes[names[0]]]
    for name in names[1:]:
        other = [len(e) for e in episodes[name]]
        if other != lengths:
            raise ValueError(f"episodes[{name!r}]: episode lengths {other} differ from {names[0]!r}'s {lengths}")
    span_horizon = horizon if targets == "next" else 0
    starts = window_starts(lengths, length, shift, span_horizon)
    count = window_count(lengths, length, shift, span_horizon)
    with tf.device(device or _default_device()):
        resident = {name: tf.constant(np.concatenate(episodes[name])) for name in names}
        offsets = tf.range(length, dtype=starts.dtype)
        future = tf.range(length, length + span_horizon, dtype=starts.dtype)

    def gather(batch_starts):
        windows = {name: tf.gather(array, batch_starts[:, None] + offsets) for name, array in resident.items()}
        if targets == "same":
            return windows, windows
        if targets == "next":
            return windows, {name: tf.gather(array, batch_starts[:, None] + future) for name, array in resident.items()}
        return windows

    index = tf.data.Dataset.from_tensor_slices(starts)
    if shuffle:  # one permutation per epoch over 4-byte indices: a buffer of them all costs count * 4 bytes
        index = index.shuffle(max(count, 1), seed=seed, reshuffle_each_iteration=True)
    index = index.batch(batch_size, drop_remainder=drop_remainder)
    return index.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
