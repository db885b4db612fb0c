"""``readers.windows()``: sliding windows over episodes, gathered from device-resident arrays (the default).

Resident mode (default) lives in ``readers/resident.py``: the episodes held once
in device memory (one copy per replica under a strategy), a dataset of window
start indices, one gather per batch on the arrays' device. ``readers/in_model.py``
(``readers.model_windows``) moves that gather into the model's step.

Streamed mode (``resident=False``) is for data larger than device memory:
episodes are read from shards, each is windowed with one gather, and a shuffle
buffer mixes windows. Without shuffling it reads episodes in the manifest's order
(resident mode: source order); for a dataset written with ``--no-shuffle`` the two
are the same, and then it yields exactly what resident mode does.
Its batch count is known from the manifest's episode lengths, as resident mode's
is (``len(ds)``), except through a tf.data service, which shares the epoch out.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from .. import files as files_lib
from .. import service as service_lib
from ..arguments import MAX_SHUFFLE_BUFFER, check_count, check_reading, check_resume
from ..episodes import feature_schema, load_concatenated, select_features
from ..epoch_guard import EpochGuard
from ..shard_cache.pipeline import ShardCacheArg
from .layout import Layout, TargetsArg, check_window_args, pad_fill
from .resident import Source, build_resident
from .streamed import streamed_windows

DEFAULT_SHUFFLE_BUFFER = 16384
PAD_HINT = ", or padding='start' (padded windows)"


def _plan(path: str, split: str, features, targets: TargetsArg, length: int, shift: int, **shape):
    """The dataset, what to gather and how to shape it, and the feature schema; refuses a split with no window.

    ``shape``: ``sampling_rate``, ``time_range``, ``padding``, ``pad_value`` (see ``windows``).
    """
    dataset = files_lib.info(path)
    chosen = select_features(dataset, features)
    schema = feature_schema(dataset)
    # A one-feature dataset (``.npy`` sources name it "data") gives tensors unasked, so a Sequential takes it as is.
    single = isinstance(features, str) or (features is None and len(schema) == 1)
    layout = Layout(list(chosen), single, targets, list(schema), path, length=length, shift=shift,
                    labelled=dataset.labelled, **shape)
    if layout.masked:  # refused before anything is read: a pad_value a feature's dtype cannot hold
        for name in layout.gathered:
            pad_fill(layout.pad_value, schema[name][0], name, path)
    lengths = dataset.episode_lengths(split)
    if layout.spec.count(lengths) == 0:
        spec = layout.spec
        slices = [hi - lo for lo, hi in map(spec.bounds, lengths)]
        longest = (f"in its time_range={spec.time_range} (longest slice {max(slices, default=0)} steps)"
                   if spec.time_range else f"(longest {max(lengths, default=0)})")
        shorter = ["length"] + ["horizon" if layout.spec.width == spec.offset else "offset"] * bool(spec.offset) + [
            "sampling_rate"] * (spec.sampling_rate > 1)
        raise ValueError(
            f"{path}: split {split!r} has no episode of at least {spec.extent} steps "
            f"{longest}; pass a shorter "
            f"{' or '.join(shorter)}{'' if spec.padding else PAD_HINT}"
        )
    return dataset, layout, schema


def shard_source(dataset: files_lib.DatasetInfo, split: str, layout: Layout, schema: dict,
                 read_buffer_bytes: int, shard_cache: ShardCacheArg | None = None) -> Source:
    """The split's episodes to hold resident, loaded from its shards on demand (through ``shard_cache``); each
    epoch checks the split's shards are still the ones loaded (``readers/epoch_guard.py``)."""
    split_episodes = files_lib.split_info(dataset, split).episodes
    count = len(files_lib.split_info(dataset, split).shards)
    guard = EpochGuard(dataset, split, files_lib.check_shards(dataset, split, list(range(count))))

    def load(shards, row):
        return load_concatenated(dataset, split, {n: schema[n] for n in layout.gathered}, shards=shards,
                                 read_buffer_bytes=read_buffer_bytes, row=row, spec=layout.spec,
                                 pad_value=layout.pad_value, labels=layout.label, shard_cache=shard_cache)

    return Source(dataset.episode_lengths(split), [e.shard for e in split_episodes], count, load,
                  f"{dataset.path}: split {split!r}", guard.ahead)


def resident_layout(path: str, split: str, *, length: int, shift: int, features=None, targets: TargetsArg = None,
                    read_buffer_bytes: int = files_lib.DEFAULT_READ_BUFFER_BYTES,
                    **shape) -> tuple[Layout, Source]:
    """What ``readers.model_windows`` needs of a path: the layout and the episodes' source (arguments checked)."""
    check_window_args(length, shift, 1, path)
    dataset, layout, schema = _plan(path, split, features, targets, int(length), int(shift), **shape)
    return layout, shard_source(dataset, split, layout, schema, read_buffer_bytes)


def windows(
    path: str,
    split: str = "train",
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
    with_keys: bool = False,
    repeat: bool = False,
    start_step: int = 0,
    shard_cache: str | None = None,
    shard_cache_limit: str | int | None = None,
):
    """Batches of sliding windows (length L, shift S) over the episodes of a ``tfshard episodes`` dataset.

    Every window lies inside one episode; an epoch holds exactly
    ``Σ ⌊(U_e − E) / S⌋ + 1`` windows over episodes whose used steps ``U_e`` (all ``T_e`` steps, or their
    ``time_range``) reach the span's extent ``E = (L + offset − 1)·sampling_rate + 1`` (``E = L + H`` for a
    horizon H), known from the manifest: ``readers.info(path).num_windows(split, L, S, ...)``. Episodes too short
    for any window are counted and logged, never dropped silently.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``).
      split: which split.
      length: window length L in time steps.
      shift: steps between consecutive window starts S.
      batch_size: windows per batch; under a strategy, the global batch (split evenly over replicas).
      features: a feature name (elements are tensors) or a list of names (elements
        are dicts); None means every feature: as a dict, or, when the dataset has
        only one (``data``, from ``.npy`` files), as tensors, just as that name gives.
      targets: None (windows only); ``"same"`` (``(x, x)``, the autoencoder case:
        the same tensor twice, no second gather); a feature name (``(x, that
        feature's window)``); an int horizon H (``(x, the next H steps of x)``);
        ``"label"`` (``(x, the episode's label)``, for a dataset converted with
        episode labels); or a ``readers.Targets(features, width=, offset=)``: the
        last ``width`` points of a span of ``length + offset`` points, of any
        features (forecast another feature, leave a gap, predict the last step).
        One gather of the span serves inputs and targets.
      sampling_rate: steps between the points of a window (keras' name): point k
        of a window starting at step s is step ``s + k·sampling_rate``.
      time_range: ``(a, b)``: use only the steps ``[⌊a·T⌋, ⌊b·T⌋)`` of each episode
        (floats in [0, 1]) or ``[a, b)`` (ints), exactly as if each episode were that
        slice: ``(0.0, 0.8)`` to train and ``(0.8, 1.0)`` to validate, so no window
        straddles the cut.
      padding: None, or ``"start"``: also the windows that begin before an
        episode's (or its slice's) first step, as long as their last input point
        and the span's end lie in it (so targets after the inputs are always
        real), and so episodes shorter than the span; the points before the
        start hold ``pad_value``, and the inputs
        become ``{"inputs": x, "mask": m}`` with ``m`` bool ``[B, length]``, True
        where a point is real.
      pad_value: the value of padded points (default 0).
      shuffle: a new seeded order of windows every epoch. False: resident windows
        come in source order (episode id order: the sorted source files, each
        episode's windows by start step); streamed ones in the manifest's order,
        which is source order for a dataset written with ``--no-shuffle``.
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
      with_keys: each element becomes ``(keys, element)``, ``keys = {"episode":
        int64 [B], "step": int64 [B]}``: each window's episode id (its source
        file's place in sorted order, as ``readers.info`` lists) and start step,
        to match predictions to sources in evaluation. Not for ``model.fit``
        (drop them: ``ds.map(lambda keys, element: element)``).
      repeat: resident mode: every epoch, each in a new order, from one endless
        iterator (``model.fit(..., steps_per_epoch=len(readers.windows(...)))``).
        ``tf.train.Checkpoint(input=iter(ds))`` saves that iterator mid-epoch in a
        few KB (the epoch's seed and position; never the arrays or prefetched
        windows) and a restore continues with exactly the windows an uninterrupted
        run would have seen next, this epoch and later ones (docs/guide/resuming.md).
      start_step: with ``repeat``, start the stream at this step (batch) as if
        the ones before had been read: a job that saved only its step count
        (under a strategy, whose distributed iterators TensorFlow cannot
        checkpoint) resumes exactly from it.

      shard_cache: a local folder keeping verified copies of the shards (for ``gs://`` data): resident loading
        and the streamed epochs read them from there once fetched (docs/guide/shard-cache.md); with ``service``
        each worker caches on its own host.
      shard_cache_limit: the most that folder may hold, e.g. ``"200GB"`` (None: 90% of the disk's free space).

    Returns:
      A ``tf.data.Dataset`` (or, with a strategy, a ``tf.distribute.DistributedDataset``). In
      resident mode its ``resident_arrays`` attribute lists the placed variables, one
      ``{feature: tf.Variable}`` per device (``.device`` says where each lives), each
      ``[rows, g, ...]``: the episodes in rows of g steps (see ``readers/resident.py``). Without a
      strategy or service its length is known (``len(ds)``): this pipeline's windows
      ``// batch_size`` with ``drop_remainder``, else rounded up.

    Raises:
      FileNotFoundError: a shard this pipeline reads is missing.
      ValueError: bad arguments, a split or feature that does not exist, not an episode dataset, fewer windows
        than one batch with ``drop_remainder``, a shard that is not a regular file or not the manifest's size, or
        (resident) a chunk record that disagrees with the manifest. While iterating,
        ``tf.errors.InvalidArgumentError`` naming ``path`` at the start of an epoch when the dataset there is no
        longer the one the pipeline was built on (resident episodes would be the old ones): build it again.

    Example:
      ds = readers.windows("runs-tfr", length=256, shift=16, batch_size=64, features="obs", targets="same")
      x, y = next(iter(ds))  # both [64, 256, 3], equal: one gather, emitted twice
    """
    where = f"{path}"
    check_window_args(length, shift, batch_size, where)
    shuffle_buffer = check_count(shuffle_buffer, "shuffle_buffer", where, high=MAX_SHUFFLE_BUFFER)
    read_buffer_bytes, _ = check_reading(where, read_buffer_bytes=read_buffer_bytes)
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
    dataset, layout, schema = _plan(path, split, features, targets, length, shift, sampling_rate=sampling_rate,
                                    time_range=time_range, padding=padding, pad_value=pad_value)
    check_resume(repeat, start_step, where, shuffle=shuffle, seed=seed)  # the streamed mode resumes neither, below
    cache = ShardCacheArg(shard_cache, shard_cache_limit)
    if repeat and not resident:
        raise ValueError(f"{where}: repeat= is for resident windows (got resident=False); a streamed epoch's "
                         "shuffle buffer cannot be resumed exactly: repeat the dataset yourself (ds.repeat())")
    if not resident:
        if strategy is not None:
            return strategy.distribute_datasets_from_function(
                lambda ctx: streamed_windows(
                    dataset, split, layout, schema,
                    batch_size=ctx.get_per_replica_batch_size(batch_size), shuffle=shuffle, seed=seed,
                    drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer, input_context=ctx,
                    read_buffer_bytes=read_buffer_bytes,
                    remote=service_lib.service_options(service, processing_mode, service_job_name, where=where,
                                                       input_context=ctx),
                    replicas=ctx.num_replicas_in_sync, pipelines=ctx.num_input_pipelines, with_keys=with_keys,
                    shard_cache=cache,
                )
            )
        return streamed_windows(dataset, split, layout, schema, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                drop_remainder=drop_remainder, shuffle_buffer=shuffle_buffer,
                                input_context=input_context, read_buffer_bytes=read_buffer_bytes, remote=remote,
                                with_keys=with_keys, shard_cache=cache)
    source = shard_source(dataset, split, layout, schema, read_buffer_bytes, cache)
    return build_resident(source, layout, batch_size=batch_size, shuffle=shuffle, seed=seed,
                          drop_remainder=drop_remainder, device=device, strategy=strategy, with_keys=with_keys,
                          repeat=repeat, start_step=start_step)
