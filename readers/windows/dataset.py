"""``readers.windows()``: sliding windows over episodes, gathered from device-resident arrays (the default).

Resident mode (default) lives in ``readers/windows/resident.py``: the episodes held once
in device memory (one copy per replica under a strategy), a dataset of window
start indices, one gather per batch on the arrays' device. ``readers/windows/in_model.py``
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

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from ...format.objects import use_storage_options
from .. import files as files_lib
from .. import service as service_lib
from ..arguments import DEFAULT_READ_BUFFER_BYTES
from ..episodes import feature_schema, select_features
from ..epoch_guard import EpochGuard
from ..graph_ready import without_autograph
from ..indexed.request import StreamRequest, stream_request
from ..shard_cache.pipeline import ShardCacheArg
from ..windowing.targets import TargetsArg
from . import mixture as mixture_lib
from .layout import Layout, check_window_args, pad_fill
from .loader import load_concatenated
from .mixture import Mixture
from .request import DEFAULT_SHUFFLE_BUFFER, WindowRequest
from .resident import Source, build_resident
from .streamed import streamed_windows
from .streamed_mixture import streamed_mixture

PAD_HINT = ", or padding='start' (padded windows)"


def _plan(path: str, split: str, features, targets: TargetsArg, **shape):
    """The dataset, what to gather and how to shape it, and the feature schema; refuses a split with no window.

    ``shape``: ``length``, ``shift``, ``sampling_rate``, ``time_range``, ``padding``, ``pad_value``
    (``WindowRequest.layout_shape``).
    """
    dataset = files_lib.info(path)
    chosen = select_features(dataset, features)
    schema = feature_schema(dataset)
    # A one-feature dataset (``.npy`` sources name it "data") gives tensors unasked, so a Sequential takes it as is.
    single = isinstance(features, str) or (features is None and len(schema) == 1)
    layout = Layout(list(chosen), single, targets, list(schema), path, labelled=dataset.labelled, **shape)
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
                  f"{dataset.path}: split {split!r}", guard.check, guard.stamp)


def resident_layout(path: str, split: str, *, length: int, shift: int, features=None, targets: TargetsArg = None,
                    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
                    **shape) -> tuple[Layout, Source]:
    """What ``readers.model_windows`` needs of a path: the layout and the episodes' source (arguments checked)."""
    check_window_args(length, shift, 1, path)
    return plan_resident(path, split, features, targets, read_buffer_bytes, length=int(length), shift=int(shift),
                         **shape)


def plan_resident(path: str, split: str, features, targets: TargetsArg, read_buffer_bytes: int,
                  **shape) -> tuple[Layout, Source]:
    """``resident_layout`` of checked arguments (``shape``: ``WindowRequest.layout_shape``)."""
    dataset, layout, schema = _plan(path, split, features, targets, **shape)
    return layout, shard_source(dataset, split, layout, schema, read_buffer_bytes)


def plan_mixture(stream: StreamRequest, split: str, features, targets: TargetsArg, read_buffer_bytes: int,
                 shard_cache: ShardCacheArg | None = None, **shape) -> tuple[Layout, Source, Mixture]:
    """The stream's sources, checked (``mixture.check_sources``) before any is read, then laid end to end as one
    (``mixture.combine``); ``shape``: ``WindowRequest.layout_shape``."""
    planned = [_plan(path, split, features, targets, **shape) for path in stream.paths]
    mixture_lib.check_sources(stream, planned)
    sources = [shard_source(dataset, split, layout, schema, read_buffer_bytes, shard_cache)
               for dataset, layout, schema in planned]
    return mixture_lib.combine(stream, split, planned, sources)


def _streamed_mixture(stream: StreamRequest, split: str, features, targets: TargetsArg, request: WindowRequest,
                      cache: ShardCacheArg):
    """``readers.windows`` of a stream with ``resident=False``: the sources checked before any is read, then one
    streamed mixture per input pipeline (``streamed_mixture.py``)."""
    planned = [_plan(path, split, features, targets, **request.layout_shape()) for path in stream.paths]
    mixture_lib.check_sources(stream, planned)
    if request.strategy is None:
        return streamed_mixture(planned, stream, split, request, shard_cache=cache)
    return request.strategy.distribute_datasets_from_function(
        lambda ctx: streamed_mixture(planned, stream, split, request, shard_cache=cache, context=ctx))


@without_autograph
def windows(
    path: str | Sequence[str],
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
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    service: str | None = None,
    service_job_name: str | None = None,
    processing_mode: str = "distributed_epoch",
    with_keys: bool = False,
    repeat: bool = False,
    start_step: int = 0,
    shard_cache: str | None = None,
    shard_cache_limit: str | int | None = None,
    weights: Sequence[float] | None = None,
    epoch_size: int | None = None,
    balance: str | None = None,
    with_source: bool = False,
    storage_options: Mapping[str, Any] | None = None,
):
    """Batches of sliding windows (length L, shift S) over the episodes of a ``tfshard episodes`` dataset.

    Every window lies inside one episode; an epoch holds exactly
    ``Σ ⌊(U_e − E) / S⌋ + 1`` windows over episodes whose used steps ``U_e`` (all ``T_e`` steps, or their
    ``time_range``) reach the span's extent ``E = (L + offset − 1)·sampling_rate + 1`` (``E = L + H`` for a
    horizon H), known from the manifest: ``readers.info(path).num_windows(split, L, S, ...)``. Episodes too short
    for any window are counted and logged, never dropped silently.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``), or a list of them: a mixture (the sources
        must have the same features), read on the stream (docs/guide/mixtures.md#windows); with ``resident=False``
        each source streamed, the stream choosing the source of every window (no ``balance``).
      split: which split.
      length, shift, batch_size, features, targets, sampling_rate, time_range, padding, pad_value, shuffle, seed,
        drop_remainder, device, strategy, resident, shuffle_buffer, input_context, read_buffer_bytes, service,
        service_job_name, processing_mode, with_keys, repeat, start_step: documented once, for every windows
        reader, in ``WindowRequest`` (``tfshard.readers.windows.request``, in docs/reference/api.md), which
        checks them before anything is read.
      shard_cache: a local folder keeping verified copies of the shards (for ``gs://`` data): resident loading
        and the streamed epochs read them from there once fetched (docs/guide/shard-cache.md); with ``service``
        each worker caches on its own host. ``s3://``, ``az://`` and ``https://`` shards always are, None then
        meaning a default folder (docs/guide/object-stores.md).
      shard_cache_limit: the most that folder may hold, e.g. ``"200GB"`` (None: 90% of the disk's free space).
      weights: each path's part of an epoch's windows (only the ratios count); None: in proportion to their windows.
      epoch_size: windows per epoch; None: the sources' windows. A source smaller than its share repeats in a fresh
        order, a larger one is subsampled (no window twice within a pass).
      balance: ``"class"``: each episode class an equal share of every epoch's windows (class labels; not with
        ``weights``).
      with_source: each element becomes ``(keys, element)``, ``keys["source"]`` int32 [B] the index in ``path``
        of each window's dataset (with ``with_keys``, beside ``"episode"`` and ``"step"``).
        Any of these four, or a list of paths, reads the index-driven stream: every epoch a seeded order of
        ``(source, window)`` computed from ``seed``, ``start_step`` in global steps on any replica count
        (docs/guide/mixtures.md#windows). Without them the reader is unchanged.
      storage_options: as for ``readers.images``.

    Returns:
      A ``tf.data.Dataset`` (or, with a strategy, a ``tf.distribute.DistributedDataset``). In
      resident mode its ``resident_arrays`` attribute lists the placed variables, one
      ``{feature: tf.Variable}`` per device (``.device`` says where each lives), each
      ``[rows, g, ...]``: the episodes in rows of g steps (see ``readers/windows/resident.py``). Without a
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
    service_lib.check_storage_options(path, service, storage_options)
    use_storage_options(path, storage_options)
    stream = stream_request(path, weights=weights, epoch_size=epoch_size, balance=balance, with_source=with_source)
    request = WindowRequest(
        where=f"{path}" if stream is None else stream.where, length=length, shift=shift, batch_size=batch_size,
        features=features, targets=targets,
        sampling_rate=sampling_rate, time_range=time_range, padding=padding, pad_value=pad_value, shuffle=shuffle,
        seed=seed, drop_remainder=drop_remainder, device=device, strategy=strategy, with_keys=with_keys,
        repeat=repeat, start_step=start_step, read_buffer_bytes=read_buffer_bytes, resident=resident,
        shuffle_buffer=shuffle_buffer, input_context=input_context, service=service,
        service_job_name=service_job_name, processing_mode=processing_mode, stream=stream)
    cache = ShardCacheArg(shard_cache, shard_cache_limit)
    if stream is not None and not request.resident:
        return _streamed_mixture(stream, split, features, targets, request, cache)
    if stream is not None:
        layout, source, mixture = plan_mixture(stream, split, features, targets, request.read_buffer_bytes, cache,
                                               **request.layout_shape())
        return mixture_lib.mixture_windows(source, layout, request, mixture)
    remote = service_lib.service_options(service, processing_mode, service_job_name, where=request.where,
                                         input_context=input_context)
    dataset, layout, schema = _plan(path, split, features, targets, **request.layout_shape())
    if request.resident:
        source = shard_source(dataset, split, layout, schema, request.read_buffer_bytes, cache)
        return build_resident(source, layout, request)
    if strategy is None:
        return streamed_windows(dataset, split, layout, schema, request, remote=remote, shard_cache=cache)
    return strategy.distribute_datasets_from_function(
        lambda ctx: streamed_windows(
            dataset, split, layout, schema, request, remote=service_lib.service_options(
                service, processing_mode, service_job_name, where=request.where, input_context=ctx),
            shard_cache=cache, context=ctx))
