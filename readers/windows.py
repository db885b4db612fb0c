"""``readers.windows()``: sliding windows over episodes, gathered from device-resident arrays (the default).

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

import concurrent.futures
import dataclasses
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

from . import files as files_lib
from . import service as service_lib
from .episodes import episodes as read_episodes
from .episodes import feature_schema, load_concatenated, select_features
from .starts import window_count, window_starts

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 16384
Targets = Union[None, str, int]


def default_device() -> str:
    """The first GPU if there is one, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


class _Layout:
    """What to gather and how to shape it: inputs (one name → tensors, several → dicts) and targets."""

    def __init__(self, names: list[str], single: bool, targets: Targets, available: Sequence[str], where: str):
        if isinstance(targets, bool) or not (targets is None or isinstance(targets, (str, int, np.integer))):
            raise TypeError(f"{where}: targets must be None, 'same', a feature name or a horizon (got {targets!r})")
        if isinstance(targets, np.integer):  # a horizon from numpy arithmetic, as length and shift may be
            targets = int(targets)
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


def _check_not_empty(where: str, windows: int, scope: str, need: int, what: str) -> None:
    """With drop_remainder, a share of fewer windows than one step takes from it would make an epoch of nothing.

    ``need``: the windows one step takes from this share; ``what`` says which batch that is, e.g. "batch_size=64".
    """
    if windows < need:
        raise ValueError(
            f"{where} has {windows} windows {scope}, fewer than {what} with drop_remainder=True, so an epoch would "
            "yield no batch; pass a smaller batch_size or drop_remainder=False"
        )


def _per_replica(batch: int, batch_size: int, replicas: int) -> str:
    return f"the per-replica batch of {batch} (batch_size={batch_size} over {replicas} replicas)"


def _index_batches(
    starts: np.ndarray, *, batch_size: int, shuffle: bool, seed: int, drop_remainder: bool, replica: int, replicas: int,
    limit: int | None = None,
) -> tf.data.Dataset:
    """Batches of window starts for one replica; a fresh seeded permutation of all starts each epoch.

    ``limit``: use only the first ``limit`` starts of each epoch's permutation (equal steps across workers).
    """
    usable = len(starts) if limit is None else min(limit, len(starts))
    per_replica = usable // replicas  # equal shares, so no replica runs out of steps before the others
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


@dataclasses.dataclass
class _Source:
    """The episodes to hold resident: their lengths and shards in order, and how to load some shards of them."""

    lengths: list[int]
    shard_of: list[int]  # episode -> shard index (in memory: each episode is its own "shard")
    num_shards: int
    load: Callable[[Sequence[int] | None], tuple[dict[str, np.ndarray], list[int]]]  # shards (None: all)
    where: str

    def worker_shards(self, worker: int, workers: int) -> list[int]:
        if self.num_shards < workers:
            raise ValueError(
                f"{self.where}: {self.num_shards} shards for {workers} workers; each worker holds its own shards' "
                f"episodes, so write at least one shard per worker (`tfshard episodes ... --min-shards {workers}`)"
            )
        return list(range(worker, self.num_shards, workers))

    def lengths_in(self, shards: Sequence[int]) -> list[int]:
        wanted = set(shards)
        return [t for t, shard in zip(self.lengths, self.shard_of) if shard in wanted]


def _variables_on(arrays: dict[str, np.ndarray], devices: Sequence[str]) -> list[dict[str, tf.Variable]]:
    """One plain variable per feature on each device.

    Made on a fresh thread: TensorFlow keeps the strategy scope and its variable
    creator per thread, so inside ``strategy.scope()`` these stay plain per-device
    variables instead of becoming mirrored ones (whose multi-worker creation would
    broadcast worker 0's values over every worker's own share).
    """

    def make():
        placed = []
        for device in devices:
            with tf.device(device):
                placed.append({n: tf.Variable(a, trainable=False, name=f"resident_{n}") for n, a in arrays.items()})
        return placed

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(make).result()


def _resident(
    source: _Source,
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
    seed = int(np.random.SeedSequence().entropy % 2**62) if seed is None else seed  # one seed shared by all replicas
    options = dict(shuffle=shuffle, seed=seed, drop_remainder=drop_remainder)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is None:
        if drop_remainder:
            _check_not_empty(source.where, window_count(source.lengths, length, shift, layout.horizon),
                             "for this pipeline", batch_size, f"batch_size={batch_size}")
        arrays, lengths = source.load(None)
        (resident,) = _variables_on(arrays, [device or default_device()])
        starts = window_starts(lengths, length, shift, layout.horizon)
        index = _index_batches(starts, batch_size=batch_size, replica=0, replicas=1, **options)
        return _with_arrays(_gather_batches(index, resident, layout, length), [resident])

    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} is the global batch and must divide evenly over the strategy's {replicas} "
            f"replicas; pass a multiple of {replicas}"
        )
    if isinstance(strategy, tf.distribute.MirroredStrategy):  # one worker: every replica holds every episode
        if drop_remainder:
            total = window_count(source.lengths, length, shift, layout.horizon)
            _check_not_empty(source.where, total // replicas, f"per replica ({total} over {replicas} replicas)",
                             batch_size // replicas, _per_replica(batch_size // replicas, batch_size, replicas))
        arrays, lengths = source.load(None)
        per_device = _variables_on(arrays, strategy.extended.worker_devices)
        starts = window_starts(lengths, length, shift, layout.horizon)

        def replica_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
            i = context.input_pipeline_id
            index = _index_batches(starts, batch_size=batch_size // replicas, replica=i, replicas=replicas, **options)
            return _gather_batches(index, per_device[i], layout, length)

        per_replica = tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
        )
        # TF 2.21's MirroredExtended._input_workers_with_options overwrites the strategy's input workers when asked
        # for PER_REPLICA and never restores them, so every later dataset distributed by that strategy (the user's
        # validation set, a streamed reader) would silently get per-replica pipelines. Put them back.
        saved = getattr(strategy.extended, "_input_workers_devices", None)
        try:
            return _with_arrays(strategy.distribute_datasets_from_function(replica_dataset, options=per_replica),
                                per_device)
        finally:
            if saved is not None:
                strategy.extended._input_workers_devices = saved

    def worker_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Several workers (MultiWorkerMirroredStrategy): each loads only its own shards' episodes, once per local
        # replica on that replica's device, and every worker runs the same number of steps (the smallest share).
        worker, workers = context.input_pipeline_id, context.num_input_pipelines
        shards = source.worker_shards(worker, workers)
        equal = min(window_count(source.lengths_in(source.worker_shards(w, workers)), length, shift, layout.horizon)
                    for w in range(workers))
        devices = strategy.extended.worker_devices
        if drop_remainder:
            _check_not_empty(source.where, equal // len(devices),
                             f"per replica ({equal} per worker, the smallest worker's share, over {len(devices)} "
                             "local replicas)", batch_size // replicas,
                             _per_replica(batch_size // replicas, batch_size, replicas))
        arrays, lengths = source.load(shards)
        starts = window_starts(lengths, length, shift, layout.horizon)
        per_device = _variables_on(arrays, devices)
        placed.extend(per_device)
        datasets = [
            _gather_batches(
                _index_batches(starts, batch_size=batch_size // replicas, replica=r, replicas=len(devices),
                               limit=equal, **options),
                per_device[r], layout, length,
            )
            for r in range(len(devices))
        ]
        if len(datasets) == 1:
            return datasets[0]
        # The per-worker iterator hands elements to local replicas round robin: element r goes to replica r.
        return tf.data.Dataset.choose_from_datasets(datasets, tf.data.Dataset.range(len(datasets)).repeat())

    placed: list[dict[str, tf.Variable]] = []
    return _with_arrays(strategy.distribute_datasets_from_function(worker_dataset), placed)


def _with_arrays(dataset, arrays: list[dict[str, tf.Variable]]):
    """Attaches the resident variables (one dict per device) as ``dataset.resident_arrays``, to see where they live."""
    dataset.resident_arrays = arrays
    return dataset


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
    length, shift, batch_size = int(length), int(shift), int(batch_size)  # numpy ints would mix dtypes in the graph
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
            raise ValueError(
                f"{where}: episodes[{name!r}]: episode lengths {other} differ from {layout.gathered[0]!r}'s {lengths}"
            )
    def load(shards):
        chosen = range(len(lengths)) if shards is None else shards
        arrays = {n: np.concatenate([episodes[n][i] for i in chosen]) for n in layout.gathered}
        return arrays, [lengths[i] for i in chosen]

    source = _Source(lengths, list(range(len(lengths))), len(lengths), load, where)
    return _resident(source, layout, length=length, shift=shift, batch_size=batch_size, shuffle=shuffle,
                     seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy)


def _streamed(dataset, split, layout, schema, *, length, shift, batch_size, shuffle, seed, drop_remainder,
              shuffle_buffer, input_context, read_buffer_bytes, remote=None, replicas=1, pipelines=1):
    """``batch_size``: this pipeline's batch (per replica under a strategy of ``replicas`` over ``pipelines``)."""
    path = dataset.path
    span = length + layout.horizon
    gathered_schema = {n: schema[n] for n in layout.gathered}
    if remote is not None:
        # The service splits the epoch (not input_context), and each epoch is a new job built from this graph:
        # a fixed seed on the workers would replay one order every epoch, so they draw fresh randomness.
        seed, input_context = None, None
    if drop_remainder:
        mine = set(files_lib.pipeline_shards(dataset, split, input_context=input_context))
        lengths = [e["length"] for e in files_lib.split_info(dataset, split).episodes or [] if e["shard"] in mine]
        # Under a strategy one pipeline feeds several replicas; a step takes a batch for each or none at all.
        fed = max(1, replicas // pipelines)
        what = f"batch_size={batch_size}" if replicas == 1 else (
            f"the {batch_size * fed} a step takes from it (a batch of {batch_size} for each of the {fed} replicas it "
            f"feeds; batch_size={batch_size * replicas} over {replicas} replicas)")
        _check_not_empty(f"{path}: split {split!r}", window_count(lengths, length, shift, layout.horizon),
                         "for this pipeline", batch_size * fed, what)
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
    if remote is not None:  # the workers send each gathered window once; (x, x) or past/future are made here
        batches = remote.distribute(batches)
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
    service: str | None = None,
    service_job_name: str | None = None,
    processing_mode: str = "distributed_epoch",
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
      service: streamed mode: ``"grpc://HOST:PORT"`` of a tf.data service
        dispatcher; reading, windowing, shuffling and batching run on its
        workers (see ``readers.images``: ``seed`` does not reach the workers,
        which shuffle afresh every epoch). Resident windows stay local by
        design: their arrays live in this process's device memory, and a
        service would ship every window over the network.
      service_job_name: clients passing the same name share one stream.
      processing_mode: ``"distributed_epoch"`` (each window once per epoch
        across workers) or ``"parallel_epochs"`` (each worker reads it all).

    Returns:
      A ``tf.data.Dataset`` (or, with a strategy, a ``tf.distribute.DistributedDataset``). In
      resident mode its ``resident_arrays`` attribute lists the placed variables, one
      ``{feature: tf.Variable}`` per device (``.device`` says where each lives).

    Raises:
      FileNotFoundError: a shard this pipeline reads is missing.
      ValueError: bad arguments, a split or feature that does not exist, not an episode dataset, fewer windows
        than one batch with ``drop_remainder``, a shard that is not a regular file or not the manifest's size, or
        (resident) a chunk record that disagrees with the manifest.

    Example:
      ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64, features="obs", targets="same")
      x, y = next(iter(ds))  # both [64, 256, 3], equal: one gather, emitted twice
    """
    where = f"{path}"
    _check_common(length, shift, batch_size, where)
    length, shift, batch_size = int(length), int(shift), int(batch_size)  # numpy ints would mix dtypes in the graph
    if resident and input_context is not None:
        raise ValueError(f"{where}: input_context is for resident=False; resident mode shards by replica (strategy=)")
    if resident and service is not None:
        raise ValueError(
            f"{where}: service= is for resident=False (got service={service!r}); resident windows stay local by "
            "design: their arrays live in this process's device memory, and a service would ship every window "
            "over the network. Pass resident=False to window on service workers"
        )
    remote = service_lib.service_options(service, processing_mode, service_job_name, where=where,
                                         input_context=input_context)
    dataset = files_lib.info(path)
    chosen = select_features(dataset, features)
    schema = feature_schema(dataset)
    layout = _Layout(list(chosen), isinstance(features, str), targets, list(schema), where)
    lengths = dataset.episode_lengths(split)
    if window_count(lengths, length, shift, layout.horizon) == 0:
        raise ValueError(
            f"{where}: split {split!r} has no episode of at least {length + layout.horizon} steps (longest "
            f"{max(lengths, default=0)}); pass a shorter length{' or horizon' if layout.horizon else ''}"
        )
    if not resident:
        if strategy is not None:
            return strategy.distribute_datasets_from_function(
                lambda ctx: _streamed(
                    dataset, split, layout, schema, length=length, shift=shift,
                    batch_size=ctx.get_per_replica_batch_size(batch_size), shuffle=shuffle, seed=seed,
                    drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer, input_context=ctx,
                    read_buffer_bytes=read_buffer_bytes,
                    remote=service_lib.service_options(service, processing_mode, service_job_name, where=where,
                                                       input_context=ctx),
                    replicas=ctx.num_replicas_in_sync, pipelines=ctx.num_input_pipelines,
                )
            )
        return _streamed(dataset, split, layout, schema, length=length, shift=shift, batch_size=batch_size,
                         shuffle=shuffle, seed=seed, drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                         input_context=input_context, read_buffer_bytes=read_buffer_bytes, remote=remote)
    split_episodes = files_lib.split_info(dataset, split).episodes

    def load(shards):
        return load_concatenated(dataset, split, {n: schema[n] for n in layout.gathered}, shards=shards,
                                 read_buffer_bytes=read_buffer_bytes)

    source = _Source(lengths, [e["shard"] for e in split_episodes], len(dataset.shard_paths(split)), load,
                     f"{where}: split {split!r}")
    return _resident(source, layout, length=length, shift=shift, batch_size=batch_size, shuffle=shuffle,
                     seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy)
