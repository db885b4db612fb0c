"""Resident sliding windows: episodes held once in device memory, a dataset of window starts, one gather per batch.

The episodes of a split are laid end to end, once, in source (episode id)
order, as one array per feature, held in a ``tf.Variable`` on the target device
(a variable, not a constant: a constant captured by a tf.data function is copied
to the host, a variable's buffer stays where it was made). The arrays are cut
into rows of ``g`` steps (``windowing/starts.py``'s ``row_steps``: the gcd of the window span and
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
import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from ..arguments import check_not_empty, per_replica_text
from ..epoch_guard import Stamp
from ..graph_ready import without_autograph
from ..input_position import InputPosition, attach
from ..windowing.starts import row_steps_of, start_rows
from ..windowing.targets import TargetsArg
from .index import Episodes, gather_batches, index_batches
from .layout import ALIGNMENT, LABEL_ARRAY, Concatenated, Layout
from .request import WindowRequest

log = logging.getLogger(__name__)


def report_short_episodes(where: str, spec, lengths: Sequence[int]) -> int:
    """Logs how many episodes give no window (never silent); returns that count."""
    short = spec.too_short(lengths)
    if short:
        served = spec.served_by_padding(lengths)
        fix = f"; padding='start' serves {served} of them" if served else ""
        log.warning("%s: %d of %d episodes give no window (shorter than the span of %d steps, or their time_range "
                    "slice is)%s", where, short, len(lengths), spec.extent, fix)
    return short


def default_device() -> str:
    """The first GPU if there is one, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"




@dataclasses.dataclass
class Source:
    """The episodes to hold resident: their lengths and shards in order, and how to load some shards of them."""

    lengths: list[int]
    shard_of: list[int]  # episode -> shard index (in memory: each episode is its own "shard")
    num_shards: int
    load: Callable[[Sequence[int] | None, int], Concatenated]  # (shards (None: all), steps per row), as the layout asks
    where: str
    # () -> op run by each epoch's function, asserting the shards loaded are unchanged (``EpochGuard.check``; None:
    # in memory)
    epoch_check: Callable[[], tf.Operation] | None = None
    # the stamp of the shards loaded, which a checkpoint's restore checks (``EpochGuard.stamp``; None: in memory)
    stamp: Stamp | None = None

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


def host_tensor(array: np.ndarray) -> tf.Tensor | np.ndarray:
    """``array`` copied into a CPU tensor of TensorFlow's own at memory speed, when it can be: viewed through DLPack
    (C-contiguous, aligned as TensorFlow's allocator aligns: ``layout.aligned_empty``; not empty; a dtype DLPack
    carries), then one ``DeepCopy``. Else ``array`` itself, for TensorFlow to convert.

    TensorFlow's own conversion of an array copies ~10x slower than memory does (0.7 s against 0.07 s for 256 MB
    here). A variable made straight from the view would share the array's memory, but a buffer the variable does not
    own alone is copied whole at its first sparse read (``ResourceGather``), and once a variable has been read so,
    every later dense read copies it whole too: the gathers could only read densely, and one ``tf.gather`` of
    ``resident_arrays`` by a user would make every later batch copy all the data. A variable on a GPU copies the
    tensor once.
    """
    if not (array.size and array.flags.c_contiguous and array.flags.writeable
            and array.ctypes.data % ALIGNMENT == 0 and array.dtype.kind in "iufc"):
        return array
    try:
        view = tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    except (BufferError, TypeError, ValueError, tf.errors.OpError):  # a dtype DLPack or TensorFlow does not take
        return array
    with tf.device("/CPU:0"):
        return tf.raw_ops.DeepCopy(x=view)


def resident_variables(data: Concatenated) -> dict[str, tf.Variable]:
    """One variable per feature, shaped in rows (``[rows, g, ...]``), and the episodes' labels when there are."""
    placed = {n: tf.Variable(host_tensor(data.rows(n)), trainable=False, name=f"resident_{n}") for n in data.arrays}
    if data.labels is not None:
        placed[LABEL_ARRAY] = tf.Variable(np.asarray(data.labels), trainable=False, name="resident_labels")
    return placed


def variables_on(data: Concatenated, devices: Sequence[str]) -> list[dict[str, tf.Variable]]:
    """One plain variable per feature on each device, shaped in rows: ``[rows, g, ...]``.

    Inside ``strategy.scope()`` they are made on a fresh thread: TensorFlow keeps
    the strategy scope and its variable creator per thread, so these stay plain
    per-device variables instead of becoming mirrored ones (whose multi-worker
    creation would broadcast worker 0's values over every worker's own share).
    Outside one, on this thread (a fresh thread pays TensorFlow's per-thread
    set-up of each kind of op again), so a ``tf.variable_creator_scope`` of the
    caller's sees them.
    """

    def make():
        placed = []
        for device in devices:
            with tf.device(device):
                placed.append(resident_variables(data))
        return placed

    if not tf.distribute.has_strategy():
        return make()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(make).result()


def build_resident(source: Source, layout: Layout, request: WindowRequest):
    """The resident pipeline of ``request`` over ``source``'s episodes: one per replica under a strategy."""
    batch_size, drop_remainder, with_keys = request.batch_size, request.drop_remainder, request.with_keys
    spec = layout.spec
    report_short_episodes(source.where, spec, source.lengths)
    row = row_steps_of(spec, source.lengths)  # one layout for every replica and worker
    # A seeded endless stream is a pure function of its start: readers.BackupAndRestore moves it (input_position.py).
    resumable = request.repeat and (request.seed is not None or not request.shuffle)
    start = InputPosition(request.start_step, source.where) if resumable else request.start_step
    options = dict(shuffle=request.shuffle, seed=draw_seed(request.seed), drop_remainder=drop_remainder,
                   repeat=request.repeat, start_step=start, where=source.where,
                   epoch_check=source.epoch_check, stamp=source.stamp)
    strategy = pick_strategy(request.strategy)
    if strategy is None:
        if drop_remainder:
            check_not_empty(source.where, spec.count(source.lengths), "windows", "for this pipeline", batch_size,
                            f"batch_size={batch_size}")
        data = source.load(None, row)
        (resident,) = variables_on(data, [request.device or default_device()])
        starts = start_rows(spec, data.lengths, row)
        index = functools.partial(index_batches, starts, batch_size=batch_size, replica=0, replicas=1, **options)
        episodes = Episodes(data, tf.as_dtype(starts.dtype), resident.get(LABEL_ARRAY))
        return with_arrays(gather_batches(index, resident, layout, episodes, with_keys), [resident], start)

    replicas = strategy.num_replicas_in_sync
    check_batch_divides(batch_size, replicas, source.where)
    if isinstance(strategy, tf.distribute.MirroredStrategy):  # one worker: every replica holds every episode
        if drop_remainder:
            total = spec.count(source.lengths)
            check_not_empty(source.where, total // replicas, "windows",
                            f"per replica ({total} over {replicas} replicas)", batch_size // replicas,
                            per_replica_text(batch_size // replicas, batch_size, replicas))
        data = source.load(None, row)
        per_device = variables_on(data, strategy.extended.worker_devices)
        starts = start_rows(spec, data.lengths, row)

        def replica_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
            i = context.input_pipeline_id
            index = functools.partial(index_batches, starts, batch_size=batch_size // replicas, replica=i,
                                      replicas=replicas, **options)
            episodes = Episodes(data, tf.as_dtype(starts.dtype), per_device[i].get(LABEL_ARRAY))
            return gather_batches(index, per_device[i], layout, episodes, with_keys)

        return distribute_per_replica(strategy, replica_dataset, per_device, start)

    def worker_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Several workers (MultiWorkerMirroredStrategy): each loads only its own shards' episodes, once per local
        # replica on that replica's device, and every worker runs the same number of steps (the smallest share).
        worker, workers = context.input_pipeline_id, context.num_input_pipelines
        shards = source.worker_shards(worker, workers)
        equal = min(spec.count(source.lengths_in(source.worker_shards(w, workers))) for w in range(workers))
        devices = strategy.extended.worker_devices
        if drop_remainder:
            check_not_empty(source.where, equal // len(devices), "windows",
                             f"per replica ({equal} per worker, the smallest worker's share, over {len(devices)} "
                             "local replicas)", batch_size // replicas,
                             per_replica_text(batch_size // replicas, batch_size, replicas))
        data = source.load(shards, row)
        starts = start_rows(spec, data.lengths, row)
        per_device = variables_on(data, devices)
        placed.extend(per_device)
        datasets = []
        for r in range(len(devices)):
            index = functools.partial(index_batches, starts, batch_size=batch_size // replicas, replica=r,
                                      replicas=len(devices), limit=equal, **options)
            episodes = Episodes(data, tf.as_dtype(starts.dtype), per_device[r].get(LABEL_ARRAY))
            datasets.append(gather_batches(index, per_device[r], layout, episodes, with_keys))
        if len(datasets) == 1:
            return datasets[0]
        # The per-worker iterator hands elements to local replicas round robin: element r goes to replica r.
        return tf.data.Dataset.choose_from_datasets(datasets, tf.data.Dataset.range(len(datasets)).repeat())

    placed: list[dict[str, tf.Variable]] = []
    return with_arrays(strategy.distribute_datasets_from_function(worker_dataset), placed, start)


def distribute_per_replica(strategy: tf.distribute.MirroredStrategy, replica_dataset: Callable,
                           arrays: list[dict[str, tf.Variable]], start: int | InputPosition = 0):
    """One pipeline per replica of a single-worker strategy (``replica_dataset(context)``, on the replica's own
    arrays), distributed as they are (``InputReplicationMode.PER_REPLICA``), with ``resident_arrays`` and the input's
    position attached."""
    per_replica = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
    )
    # TF 2.21's MirroredExtended._input_workers_with_options overwrites the strategy's input workers when asked
    # for PER_REPLICA and never restores them, so every later dataset distributed by that strategy (the user's
    # validation set, a streamed reader) would silently get per-replica pipelines. Put them back.
    saved = getattr(strategy.extended, "_input_workers_devices", None)
    try:
        return with_arrays(strategy.distribute_datasets_from_function(replica_dataset, options=per_replica), arrays,
                           start)
    finally:
        if saved is not None:
            strategy.extended._input_workers_devices = saved


def with_arrays(dataset, arrays: list[dict[str, tf.Variable]], start: int | InputPosition = 0):
    """Attaches the resident variables (one dict per device) as ``dataset.resident_arrays``, to see where they live,
    and the input's position, that every replica's pipeline reads (when it is resumable)."""
    dataset.resident_arrays = arrays
    return attach(dataset, start if isinstance(start, InputPosition) else None)


@without_autograph
def resident_windows(
    episodes: Mapping[str, Sequence[np.ndarray]],
    *,
    length: int,
    shift: int = 1,
    batch_size: int,
    features: str | Sequence[str] | None = None,
    targets: TargetsArg = None,
    sampling_rate: int = 1,
    time_range: tuple | None = None,
    padding: str | None = None,
    pad_value=0,
    labels: Sequence | None = None,
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
      labels: one label per episode (ints or floats), for ``targets="label"``.
      with_keys: as for ``windows``; an episode's id is its index in the lists.
      Others: as ``WindowRequest`` documents them (``readers/windows/request.py``).

    Example:
      ds = resident_windows({"x": [np.zeros((1000, 3))]}, length=256, shift=16, batch_size=16, features="x")
      next(iter(ds)).shape  # (16, 256, 3); 48 windows → 3 batches
    """
    where = "resident_windows"
    request = WindowRequest(
        where=where, length=length, shift=shift, batch_size=batch_size, features=features, targets=targets,
        sampling_rate=sampling_rate, time_range=time_range, padding=padding, pad_value=pad_value, shuffle=shuffle,
        seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy, with_keys=with_keys,
        repeat=repeat, start_step=start_step)
    if not episodes:
        raise ValueError(f"{where}: episodes must hold at least one feature (got an empty mapping)")
    names = list(episodes) if features is None else [features] if isinstance(features, str) else list(features)
    unknown = [n for n in names if n not in episodes]
    if unknown or not names:
        raise ValueError(f"{where}: no feature(s) {unknown or names!r}; episodes has {sorted(episodes)}")
    layout = Layout(names, isinstance(features, str), targets, list(episodes), where, labelled=labels is not None,
                    **request.layout_shape())
    lengths = [len(e) for e in episodes[layout.gathered[0]]]
    if not lengths:
        raise ValueError(f"{where}: episodes[{layout.gathered[0]!r}] holds no episode; pass at least one array")
    for name in layout.gathered[1:]:
        other = [len(e) for e in episodes[name]]
        if other != lengths:
            raise ValueError(
                f"{where}: episodes[{name!r}]: episode lengths {other} differ from {layout.gathered[0]!r}'s {lengths}"
            )
    if labels is not None and len(labels) != len(lengths):
        raise ValueError(f"{where}: labels: one per episode (got {len(labels)} labels for {len(lengths)} episodes)")

    def load(shards, row):
        chosen = list(range(len(lengths))) if shards is None else list(shards)
        wanted = [labels[i] for i in chosen] if layout.label else None
        return Concatenated.of({n: [episodes[n][i] for i in chosen] for n in layout.gathered}, chosen, row,
                               layout.spec, where, layout.pad_value, wanted)

    source = Source(lengths, list(range(len(lengths))), len(lengths), load, where)
    return build_resident(source, layout, request)
