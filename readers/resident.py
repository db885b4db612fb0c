"""Resident sliding windows: episodes held once in device memory, a dataset of window starts, one gather per batch.

The episodes of a split are laid end to end, once, in source (episode id)
order, as one array per feature, held in a ``tf.Variable`` on the target device
(a variable, not a constant: a constant captured by a tf.data function is copied
to the host, a variable's buffer stays where it was made). The arrays are cut
into rows of ``g`` steps (``starts.row_steps``: the gcd of the window span and
the shift, each episode zero-padded to whole rows, at most 1/64 of the data), so
a window is ``span / g`` consecutive rows. The pipeline itself is only a dataset
of window *start rows* (int32 below 2**31 rows: 4 bytes a window): each epoch
they are permuted as one op (``stateless_shuffle``, seeded per epoch), cut into
batches, and every batch becomes windows with one vectorised gather of rows
``starts[:, None] + range(span / g)``, placed on the arrays' device: contiguous
blocks of ``g`` steps instead of single steps (1.7x the windows/s at L=256,
S=16, 8 channels). A window never crosses an episode boundary, because starts
are computed per episode. Without shuffling, windows come in source order.

Under a ``tf.distribute`` strategy each replica holds its own copy of the
arrays on its own device (a plain variable per device, made outside the
strategy's scope) and its own pipeline (``InputReplicationMode.PER_REPLICA``); every epoch all
replicas permute the same starts with the same seed and each takes every n-th
one, so their shares are disjoint, cover the epoch, and change every epoch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from .arguments import INT32_LIMIT  # tf.data's skip() takes a C++ int: a larger count silently wraps
from .layout import (Concatenated, Layout, Targets, check_not_empty, check_resume, check_window_args,
                     per_replica_text)
from .starts import row_steps, window_count, window_starts

AUTOTUNE = tf.data.AUTOTUNE


def default_device() -> str:
    """The first GPU if there is one, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"




def _index_batches(
    starts: np.ndarray, *, batch_size: int, shuffle: bool, seed: int, drop_remainder: bool, replica: int, replicas: int,
    limit: int | None = None, repeat: bool = False, start_step: int = 0, then: Callable | None = None,
    where: str = "resident windows",
) -> tf.data.Dataset:
    """Batches of window starts for one replica; a fresh seeded permutation of all starts each epoch.

    Each epoch permutes the starts as one op (``stateless_shuffle`` keyed by the epoch's seed) and slices
    batches from it. Replica ``r`` of ``n`` takes positions ``r, r + n, ...`` of the permutation, so replicas'
    shares are disjoint. Under ``resumable_options`` (symbolic checkpointing) a ``tf.train.Checkpoint`` of
    the iterator holds only the epoch's seed and positions: a few KB; a restore recomputes the permutation.

    ``limit``: use only the first ``limit`` positions of each epoch's permutation (equal steps across workers).
    ``repeat``: epoch after epoch, each with a new permutation, in one iterator (whose checkpoint then holds
    the epoch too). Epoch ``e``'s seed is then the e-th pair of ``Dataset.random(seed)``, so the stream is a
    pure function of ``seed`` and the step: ``start_step`` starts it at any step without reading the ones before.
    ``then``: a function of the start rows run in one parallel map (the gather: one map, one hand-off).
    """
    usable = len(starts) if limit is None else min(limit, len(starts))
    per_replica = usable // replicas  # equal shares, so no replica runs out of steps before the others
    full, tail = divmod(per_replica, batch_size)
    tail = 0 if drop_remainder else tail
    per_epoch = full + (1 if tail else 0)
    all_starts = tf.constant(starts)

    def epoch(seed_pair):
        order = tf.random.experimental.stateless_shuffle(all_starts, seed_pair) if shuffle else all_starts
        mine = order[replica : replica + per_replica * replicas : replicas]
        batches = tf.data.Dataset.from_tensor_slices(tf.reshape(mine[: full * batch_size], [full, batch_size]))
        if tail:
            batches = batches.concatenate(tf.data.Dataset.from_tensors(mine[full * batch_size :]))
        return batches

    def rows(index: tf.data.Dataset) -> tf.data.Dataset:
        return index if then is None else index.map(then, num_parallel_calls=AUTOTUNE, deterministic=True)

    if repeat:
        if not per_epoch:  # an endless stream of empty epochs would never yield: refuse it
            raise ValueError(f"{where}: {usable} windows over {replicas} replicas leave replica {replica} no batch "
                             "in an epoch, so repeat=True would never yield one; pass a smaller batch_size or use "
                             "fewer replicas")
        first_epoch, first_batch = divmod(start_step, per_epoch)
        if first_epoch > INT32_LIMIT:
            raise ValueError(f"{where}: start_step={start_step} is {first_epoch} epochs in; tf.data skips at most "
                             f"{INT32_LIMIT}; pass the step count the job saved")
        seeds = tf.data.Dataset.random(seed=seed).batch(2, drop_remainder=True).skip(first_epoch).enumerate()
        return rows(seeds.flat_map(lambda e, seed_pair: epoch(seed_pair).skip(
            tf.where(e == 0, tf.constant(first_batch, tf.int64), tf.constant(0, tf.int64)))))
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2, drop_remainder=True).take(1)
    return rows(seeds.flat_map(epoch)).apply(tf.data.experimental.assert_cardinality(per_epoch))


class Keys:
    """Which episode (its id: source order) and step each window starts at, computed from its start row."""

    def __init__(self, data: Concatenated, dtype: tf.DType):
        self.row = data.row
        self.offsets = tf.constant((data.offsets // data.row).astype(dtype.as_numpy_dtype))  # start row of each episode
        self.ids = tf.constant(np.asarray(data.ids, np.int64))

    def of(self, starts: tf.Tensor) -> dict[str, tf.Tensor]:
        episode = tf.searchsorted(self.offsets, starts, side="right") - 1
        step = tf.cast(starts - tf.gather(self.offsets, episode), tf.int64) * self.row
        return {"episode": tf.gather(self.ids, episode), "step": step}


def _gather_rows(array: tf.Variable, rows: tf.Tensor) -> tf.Tensor:
    """A gather straight from the variable's buffer, never a read of the whole array. A mirrored variable in a
    replica's step gives that replica's own copy (``tf.gather`` would read it whole first: no ``sparse_read``)."""
    try:
        handle = array.handle
    except ValueError:  # a mirrored variable outside any replica's step: tf.gather reads its primary copy
        return tf.gather(array, rows)
    return tf.raw_ops.ResourceGather(resource=handle, indices=rows, dtype=array.dtype)


def gather_windows(arrays: dict, starts: tf.Tensor, names: Sequence[str], span: int) -> dict[str, tf.Tensor]:
    """Windows ``[B, span, ...]`` of the row-shaped arrays ``[rows, g, ...]`` at start rows ``starts`` ``[B]``:
    one gather of ``span / g`` consecutive rows per window and feature, on the arrays' device."""
    out = {}
    for name in names:
        array = arrays[name]
        row = array.shape[1]
        with tf.device(array.device):
            rows = starts[:, None] + tf.range(span // row, dtype=starts.dtype)
            gathered = _gather_rows(array, rows)  # [B, span / g, g, ...]: contiguous blocks of g steps
            out[name] = tf.reshape(gathered, [tf.shape(starts)[0], span, *array.shape[2:]])  # no -1: [T, 0] too
    return out


def _gather_batches(make_index: Callable, arrays: dict, layout: Layout, length: int,
                    keys: Keys | None = None) -> tf.data.Dataset:
    """``make_index``: ``_index_batches`` with its arguments bound; the gather runs in its map."""
    span = length + layout.horizon

    def gather(batch_starts):
        # Runs where the arrays are; only the [B, L, ...] result leaves the device (to the host: see readers.windows).
        element = layout.shape(gather_windows(arrays, batch_starts, layout.gathered, span), length)
        return element if keys is None else (keys.of(batch_starts), element)

    return make_index(then=gather).prefetch(AUTOTUNE).with_options(
        resumable_options(small=make_index.keywords.get("repeat", False)))


def quiet_options() -> tf.data.Options:
    """Autotune off, as in ``readers.images``: with it on (TF 2.21) deleting an iterator can block until the
    autotuner's next step, a pause at every epoch end; off, the per-batch cost also drops ~10% here."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def resumable_options(small: bool) -> tf.data.Options:
    """What lets ``tf.train.Checkpoint(input=iterator)`` save a resident pipeline mid-epoch: the gather's read
    of the resident arrays treated as external state (they never change while the dataset exists).

    ``small`` (``repeat=True``, the resume path): symbolic checkpointing too, so the checkpoint holds
    positions into the index (~2 KB), not the prefetched windows (MBs). It costs ~10% of the windows/s
    iterated from Python (measured A/B, 1 channel), so one-epoch datasets keep TensorFlow's explicit mode.
    """
    options = quiet_options()
    options.experimental_symbolic_checkpoint = small
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


@dataclasses.dataclass
class Source:
    """The episodes to hold resident: their lengths and shards in order, and how to load some shards of them."""

    lengths: list[int]
    shard_of: list[int]  # episode -> shard index (in memory: each episode is its own "shard")
    num_shards: int
    load: Callable[[Sequence[int] | None, int], Concatenated]  # (shards (None: all), steps per row)
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


def pick_strategy(strategy: tf.distribute.Strategy | None) -> tf.distribute.Strategy | None:
    """The strategy passed, else the one of an enclosing ``strategy.scope()``, else None."""
    if strategy is None and tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    return strategy


def draw_seed(seed: int | None) -> int:
    """``seed``, or a fresh one: drawn once, so every replica permutes alike."""
    return int(np.random.SeedSequence().entropy % 2**62) if seed is None else seed


def check_batch_divides(batch_size: int, replicas: int, where: str) -> None:
    if batch_size % replicas:
        raise ValueError(
            f"{where}: batch_size={batch_size} is the global batch and must divide evenly over the strategy's "
            f"{replicas} replicas; pass a multiple of {replicas}"
        )


def _variables_on(data: Concatenated, devices: Sequence[str]) -> list[dict[str, tf.Variable]]:
    """One plain variable per feature on each device, shaped in rows: ``[rows, g, ...]``.

    Made on a fresh thread: TensorFlow keeps the strategy scope and its variable
    creator per thread, so inside ``strategy.scope()`` these stay plain per-device
    variables instead of becoming mirrored ones (whose multi-worker creation would
    broadcast worker 0's values over every worker's own share).
    """

    def make():
        placed = []
        for device in devices:
            with tf.device(device):
                placed.append({n: tf.Variable(data.rows(n), trainable=False, name=f"resident_{n}")
                               for n in data.arrays})
        return placed

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(make).result()


def build_resident(
    source: Source,
    layout: Layout,
    *,
    length: int,
    shift: int,
    batch_size: int,
    shuffle: bool,
    seed: int | None,
    drop_remainder: bool,
    device: str | None,
    strategy: tf.distribute.Strategy | None,
    with_keys: bool = False,
    repeat: bool = False,
    start_step: int = 0,
):
    start_step = check_resume(repeat, start_step, source.where, shuffle=shuffle, seed=seed)
    row = row_steps(source.lengths, length, shift, layout.horizon)  # one layout for every replica and worker
    options = dict(shuffle=shuffle, seed=draw_seed(seed), drop_remainder=drop_remainder, repeat=repeat,
                   start_step=start_step, where=source.where)
    strategy = pick_strategy(strategy)
    if strategy is None:
        if drop_remainder:
            check_not_empty(source.where, window_count(source.lengths, length, shift, layout.horizon),
                             "for this pipeline", batch_size, f"batch_size={batch_size}")
        data = source.load(None, row)
        (resident,) = _variables_on(data, [device or default_device()])
        starts = window_starts(data.lengths, length, shift, layout.horizon, row)
        index = functools.partial(_index_batches, starts, batch_size=batch_size, replica=0, replicas=1, **options)
        keys = Keys(data, tf.as_dtype(starts.dtype)) if with_keys else None
        return _with_arrays(_gather_batches(index, resident, layout, length, keys), [resident])

    replicas = strategy.num_replicas_in_sync
    check_batch_divides(batch_size, replicas, source.where)
    if isinstance(strategy, tf.distribute.MirroredStrategy):  # one worker: every replica holds every episode
        if drop_remainder:
            total = window_count(source.lengths, length, shift, layout.horizon)
            check_not_empty(source.where, total // replicas, f"per replica ({total} over {replicas} replicas)",
                             batch_size // replicas, per_replica_text(batch_size // replicas, batch_size, replicas))
        data = source.load(None, row)
        per_device = _variables_on(data, strategy.extended.worker_devices)
        starts = window_starts(data.lengths, length, shift, layout.horizon, row)

        def replica_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
            i = context.input_pipeline_id
            index = functools.partial(_index_batches, starts, batch_size=batch_size // replicas, replica=i,
                                      replicas=replicas, **options)
            keys = Keys(data, tf.as_dtype(starts.dtype)) if with_keys else None
            return _gather_batches(index, per_device[i], layout, length, keys)

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
            check_not_empty(source.where, equal // len(devices),
                             f"per replica ({equal} per worker, the smallest worker's share, over {len(devices)} "
                             "local replicas)", batch_size // replicas,
                             per_replica_text(batch_size // replicas, batch_size, replicas))
        data = source.load(shards, row)
        starts = window_starts(data.lengths, length, shift, layout.horizon, row)
        per_device = _variables_on(data, devices)
        placed.extend(per_device)
        datasets = []
        for r in range(len(devices)):
            index = functools.partial(_index_batches, starts, batch_size=batch_size // replicas, replica=r,
                                      replicas=len(devices), limit=equal, **options)
            keys = Keys(data, tf.as_dtype(starts.dtype)) if with_keys else None
            datasets.append(_gather_batches(index, per_device[r], layout, length, keys))
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
    with_keys: bool = False,
    repeat: bool = False,
    start_step: int = 0,
):
    """Resident windows over episodes already in memory (what ``windows`` does after reading the shards).

    Args:
      episodes: feature name → list of per-episode arrays ``[T_e, ...]`` (the
        same ``T_e`` for every feature of one episode).
      features: as for ``windows``, except that None always gives dicts, even
        for a one-key mapping: here the caller named every feature.
      with_keys: as for ``windows``; an episode's id is its index in the lists.
      Others: as for ``windows``.

    Example:
      ds = resident_windows({"x": [np.zeros((1000, 3))]}, length=256, shift=16, batch_size=16, features="x")
      next(iter(ds)).shape  # (16, 256, 3); 48 windows → 3 batches
    """
    where = "resident_windows"
    check_window_args(length, shift, batch_size, where)
    length, shift, batch_size = int(length), int(shift), int(batch_size)  # numpy ints would mix dtypes in the graph
    if not episodes:
        raise ValueError(f"{where}: episodes must hold at least one feature (got an empty mapping)")
    names = list(episodes) if features is None else [features] if isinstance(features, str) else list(features)
    unknown = [n for n in names if n not in episodes]
    if unknown or not names:
        raise ValueError(f"{where}: no feature(s) {unknown or names!r}; episodes has {sorted(episodes)}")
    layout = Layout(names, isinstance(features, str), targets, list(episodes), where)
    lengths = [len(e) for e in episodes[layout.gathered[0]]]
    if not lengths:
        raise ValueError(f"{where}: episodes[{layout.gathered[0]!r}] holds no episode; pass at least one array")
    for name in layout.gathered[1:]:
        other = [len(e) for e in episodes[name]]
        if other != lengths:
            raise ValueError(
                f"{where}: episodes[{name!r}]: episode lengths {other} differ from {layout.gathered[0]!r}'s {lengths}"
            )
    def load(shards, row):
        chosen = list(range(len(lengths))) if shards is None else list(shards)
        return Concatenated.of({n: [episodes[n][i] for i in chosen] for n in layout.gathered}, chosen, row, where)

    source = Source(lengths, list(range(len(lengths))), len(lengths), load, where)
    return build_resident(source, layout, length=length, shift=shift, batch_size=batch_size, shuffle=shuffle,
                          seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy,
                          with_keys=with_keys, repeat=repeat, start_step=start_step)


