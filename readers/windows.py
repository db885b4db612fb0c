"""``readers.windows()``: sliding windows over episodes, gathered from device-resident arrays (the fast way, by default).

Resident mode (default). The episodes of a split are laid end to end, once, as
one array per feature, held in a ``tf.Variable`` on the target device (a
variable, not a constant: a constant captured by a tf.data function is copied to
the host, a variable's buffer stays where it was made). The pipeline itself is
only a dataset of window *start indices* (int32 below 2**31 samples, from
``readers.starts``): each epoch they are permuted as one op
(``stateless_shuffle``, seeded per epoch), cut into batches, and every batch
becomes windows with one vectorised gather of ``starts[:, None] + range(L)``,
placed on the arrays' device. A window never crosses an episode boundary,
because starts are computed per episode.

Under a ``tf.distribute`` strategy each replica holds its own copy of the
arrays on its own device (the per-device components of one mirrored variable)
and its own pipeline (``InputReplicationMode.PER_REPLICA``); every epoch all
replicas permute the same starts with the same seed and each takes every n-th
one, so their shares are disjoint, cover the epoch, and change every epoch.

Streamed mode (``resident=False``) is for data larger than device memory:
episodes are read from shards, each is windowed with one gather, and a shuffle
buffer mixes windows. Without shuffling it yields exactly what resident mode does.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

from readers import files as files_lib
from readers.episodes import episodes as read_episodes
from readers.episodes import feature_schema, load_concatenated, select_features
from readers.starts import window_count, window_starts

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 16384
Targets = Union[None, str, int]


def default_device() -> str:
    """The first GPU if there is one, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


class _Layout:
    """What to gather and how to shape it: inputs (one name → tensors, several → dicts) and targets."""

    def __init__(self, names: list[str], single: bool, targets: Targets, available: Sequence[str], where: str):
        if isinstance(targets, bool) or not (targets is None or isinstance(targets, (str, int))):
            raise TypeError(f"{where}: targets must be None, 'same', a feature name or a horizon (got {targets!r})")
        if isinstance(targets, int) and targets < 1:
            raise ValueError(f"{where}: a forecast horizon must be at least 1 step (got targets={targets!r})")
        if isinstance(targets, str) and targets != "same" and targets not in available:
            raise ValueError(
                f"{where}: targets={targets!r} is neither 'same' nor a feature; the features are {sorted(available)}"
            )
        self.inputs, self.single, self.targets = names, single, targets
        self.horizon = targets if isinstance(targets, int) else 0
        extra = [targets] if isinstance(targets, str) and targets not in ("same", *names) else []
        self.gathered = names + extra

    def shape(self, gathered: dict, length: int):
        """``gathered`` holds windows of ``length + horizon`` steps per name; returns the dataset element."""
        def pick(values):
            return values[self.inputs[0]] if self.single else {n: values[n] for n in self.inputs}

        if self.horizon:
            past = {n: v[:, :length] for n, v in gathered.items()}
            future = {n: v[:, length:] for n, v in gathered.items()}
            return pick(past), pick(future)
        inputs = pick(gathered)
        if self.targets is None:
            return inputs
        if self.targets == "same":  # the autoencoder case: the very same tensor, no second gather or zip
            return inputs, inputs
        return inputs, gathered[self.targets]


def _check_common(length: int, shift: int, batch_size: int, where: str) -> None:
    for name, value in (("length", length), ("shift", shift), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{where}: {name} must be a positive integer (got {name}={value!r})")


def _index_batches(
    starts: np.ndarray, *, batch_size: int, shuffle: bool, seed: int, drop_remainder: bool, replica: int, replicas: int
) -> tf.data.Dataset:
    """Batches of window starts for one replica; a fresh seeded permutation of all starts each epoch."""
    per_replica = len(starts) // replicas  # equal shares, so no replica runs out of steps before the others
    full, tail = divmod(per_replica, batch_size)
    tail = 0 if drop_remainder else tail
    all_starts = tf.constant(starts)

    def epoch(seed_pair):
        order = tf.random.experimental.stateless_shuffle(all_starts, seed_pair) if shuffle else all_starts
        mine = order[replica : replica + per_replica * replicas : replicas]
        batches = tf.data.Dataset.from_tensor_slices(tf.reshape(mine[: full * batch_size], [full, batch_size]))
        if tail:
            batches = batches.concatenate(tf.data.Dataset.from_tensors(mine[full * batch_size :]))
        return batches

    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2).take(1)
    return seeds.flat_map(epoch).apply(tf.data.experimental.assert_cardinality(full + (1 if tail else 0)))


def _gather_batches(index: tf.data.Dataset, arrays: dict, layout: _Layout, length: int) -> tf.data.Dataset:
    device = next(iter(arrays.values())).device
    offsets = np.arange(length + layout.horizon, dtype=index.element_spec.dtype.as_numpy_dtype)

    def gather(batch_starts):
        with tf.device(device):  # run where the arrays are; only the [B, L, ...] result leaves the device
            positions = batch_starts[:, None] + offsets
            return layout.shape({n: tf.gather(arrays[n], positions) for n in layout.gathered}, length)

    return index.map(gather, num_parallel_calls=AUTOTUNE, deterministic=True).prefetch(AUTOTUNE)


def _resident(
    arrays: dict[str, np.ndarray],
    lengths: list[int],
    layout: _Layout,
    *,
    length: int,
    shift: int,
    batch_size: int,
    shuffle: bool,
    seed: int | None,
    drop_remainder: bool,
    device: str | None,
    strategy: tf.distribute.Strategy | None,
):
    starts = window_starts(lengths, length, shift, layout.horizon)
    seed = int(np.random.SeedSequence().entropy % 2**62) if seed is None else seed  # one seed shared by all replicas
    options = dict(shuffle=shuffle, seed=seed, drop_remainder=drop_remainder)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is None:
        with tf.device(device or default_device()):
            resident = {n: tf.Variable(arrays[n], trainable=False, name=f"resident_{n}") for n in layout.gathered}
        index = _index_batches(starts, batch_size=batch_size, replica=0, replicas=1, **options)
        return _gather_batches(index, resident, layout, length)

    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is the global batch and must divide evenly over the strategy's {replicas} "
            f"replicas; pass a multiple of {replicas}"
        )
    with strategy.scope():  # one mirrored variable = one component per replica, each on that replica's device
        mirrored = {n: tf.Variable(arrays[n], trainable=False, name=f"resident_{n}") for n in layout.gathered}
    per_device = {n: strategy.experimental_local_results(v) for n, v in mirrored.items()}

    def replica_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
        i = context.input_pipeline_id
        index = _index_batches(starts, batch_size=batch_size // replicas, replica=i, replicas=replicas, **options)
        return _gather_batches(index, {n: per_device[n][i] for n in layout.gathered}, layout, length)

    per_replica = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
    )
    # TF 2.21's MirroredExtended._input_workers_with_options overwrites the strategy's input workers when asked for
    # PER_REPLICA and never restores them, so every later dataset distributed by that strategy (the user's
    # validation set, a streamed reader) would silently get per-replica pipelines. Put them back.
    saved = getattr(strategy.extended, "_input_workers_devices", None)
    try:
        return strategy.distribute_datasets_from_function(replica_dataset, options=per_replica)
    finally:
        if saved is not None:
            strategy.extended._input_workers_devices = saved


def resident_windows(
    episodes: Mapping[str, Sequence[np.ndarray]],
    *,
    length: int,
    shift: int = 1,
    batch_size: int,
    features: str | Sequence[str] | None = None,
    targets: Targets = None,
    shuffle: bool = True,
    seed: int | None = None,
    drop_remainder: bool = True,
    device: str | None = None,
    strategy: tf.distribute.Strategy | None = None,
):
    """Resident windows over episodes already in memory (what ``windows`` does after reading the shards).

    Args:
      episodes: feature name → list of per-episode arrays ``[T_e, ...]`` (the
        same ``T_e`` for every feature of one episode).
      Others: as for ``windows``.

    Example:
      ds = resident_windows({"x": [np.zeros((1000, 3))]}, length=256, shift=16, batch_size=16, features="x")
      next(iter(ds)).shape  # (16, 256, 3); 48 windows → 3 batches
    """
    where = "resident_windows"
    _check_common(length, shift, batch_size, where)
    if not episodes:
        raise ValueError(f"{where}: episodes must hold at least one feature (got an empty mapping)")
    names = list(episodes) if features is None else [features] if isinstance(features, str) else list(features)
    unknown = [n for n in names if n not in episodes]
    if unknown or not names:
        raise ValueError(f"{where}: no feature(s) {unknown or names!r}; episodes has {sorted(episodes)}")
    layout = _Layout(names, isinstance(features, str), targets, list(episodes), where)
    lengths = [len(e) for e in episodes[layout.gathered[0]]]
    for name in layout.gathered[1:]:
        other = [len(e) for e in episodes[name]]
        if other != lengths:
            raise ValueError(f"{where}: episodes[{name!r}]: episode lengths {other} differ from {layout.gathered[0]!r}'s {lengths}")
    arrays = {n: np.concatenate(episodes[n]) for n in layout.gathered}
    return _resident(arrays, lengths, layout, length=length, shift=shift, batch_size=batch_size, shuffle=shuffle,
                     seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy)


def _streamed(path, split, layout, schema, *, length, shift, batch_size, shuffle, seed, drop_remainder,
              shuffle_buffer, input_context, read_buffer_bytes):
    span = length + layout.horizon
    gathered_schema = {n: schema[n] for n in layout.gathered}
    episodes = read_episodes(
        path, split, features=list(gathered_schema), shuffle_files=shuffle, seed=seed, input_context=input_context,
        read_buffer_bytes=read_buffer_bytes,
    )

    def to_windows(episode):
        steps = tf.shape(episode[layout.gathered[0]])[0]
        starts = tf.range(0, tf.maximum(steps - span + 1, 0), shift)  # none from an episode shorter than span
        positions = starts[:, None] + tf.range(span)
        return tf.data.Dataset.from_tensor_slices({n: tf.gather(v, positions) for n, v in episode.items()})

    windows_ = episodes.flat_map(to_windows)
    if shuffle:
        windows_ = windows_.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    batches = windows_.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE)
    return batches.map(lambda b: layout.shape(b, length), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)


def windows(
    path: str,
    split: str = "train",
    *,
    length: int,
    shift: int = 1,
    batch_size: int,
    features: str | Sequence[str] | None = None,
    targets: Targets = None,
    shuffle: bool = True,
    seed: int | None = None,
    drop_remainder: bool = True,
    device: str | None = None,
    strategy: tf.distribute.Strategy | None = None,
    resident: bool = True,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    input_context: tf.distribute.InputContext | None = None,
    read_buffer_bytes: int = files_lib.DEFAULT_READ_BUFFER_BYTES,
):
    """Batches of sliding windows (length L, shift S) over the episodes of a ``tfshard episodes`` dataset.

    Every window lies inside one episode; an epoch holds exactly
    ``Σ ⌊(T_e − L − H) / S⌋ + 1`` windows over episodes with ``T_e ≥ L + H``
    (``H`` = forecast horizon, else 0), known from the manifest:
    ``readers.info(path).num_windows(split, L, S)``.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``).
      split: which split.
      length: window length L in time steps.
      shift: steps between consecutive window starts S.
      batch_size: windows per batch; under a strategy, the global batch (split evenly over replicas).
      features: a feature name (elements are tensors) or a list of names (elements
        are dicts); None means every feature, as a dict.
      targets: None (windows only); ``"same"`` (``(x, x)``, the autoencoder case:
        the same tensor twice, no second gather); a feature name (``(x, that
        feature's window)``); or an int horizon H (``(x, the next H steps of x)``).
      shuffle: a new seeded order of windows every epoch.
      seed: makes the order reproducible; None draws one.
      drop_remainder: drop the last partial batch (static batch shapes).
      device: resident mode: where the arrays live (default the first GPU, else the CPU).
      strategy: a ``tf.distribute`` strategy: returns a distributed dataset with one
        resident copy per replica, each replica drawing a disjoint share of the
        windows every epoch. Called inside ``strategy.scope()`` it is picked up.
      resident: False streams episodes from the shards instead (data larger than
        device memory); windows are then mixed by a buffer of ``shuffle_buffer``.
      input_context: streamed mode: FILE sharding across input pipelines.
      read_buffer_bytes: read buffer per shard.

    Returns:
      A ``tf.data.Dataset`` (or, with a strategy, a ``tf.distribute.DistributedDataset``).

    Raises:
      ValueError: bad arguments, a split or feature that does not exist, or not an episode dataset.

    Example:
      ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64, features="obs", targets="same")
      x, y = next(iter(ds))  # both [64, 256, 3], equal: one gather, emitted twice
    """
    where = f"{path}"
    _check_common(length, shift, batch_size, where)
    if resident and input_context is not None:
        raise ValueError(f"{where}: input_context is for resident=False; resident mode shards by replica (strategy=)")
    dataset = files_lib.info(path)
    chosen = select_features(dataset, features)
    schema = feature_schema(dataset)
    layout = _Layout(list(chosen), isinstance(features, str), targets, list(schema), where)
    lengths = dataset.episode_lengths(split)
    if window_count(lengths, length, shift, layout.horizon) == 0:
        raise ValueError(
            f"{where}: split {split!r} has no episode of at least {length + layout.horizon} steps (longest "
            f"{max(lengths, default=0)}); pass a shorter length"
        )
    if not resident:
        if strategy is not None:
            return strategy.distribute_datasets_from_function(
                lambda ctx: _streamed(
                    path, split, layout, schema, length=length, shift=shift,
                    batch_size=ctx.get_per_replica_batch_size(batch_size), shuffle=shuffle, seed=seed,
                    drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer, input_context=ctx,
                    read_buffer_bytes=read_buffer_bytes,
                )
            )
        return _streamed(path, split, layout, schema, length=length, shift=shift, batch_size=batch_size,
                         shuffle=shuffle, seed=seed, drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                         input_context=input_context, read_buffer_bytes=read_buffer_bytes)
    arrays, lengths = load_concatenated(
        dataset, split, {n: schema[n] for n in layout.gathered}, read_buffer_bytes=read_buffer_bytes
    )
    return _resident(arrays, lengths, layout, length=length, shift=shift, batch_size=batch_size, shuffle=shuffle,
                     seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy)
