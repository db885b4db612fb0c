"""The sources of resident windows on the stream, checked and laid end to end, and the pipelines that read them.

Each path's episodes load as ``readers.windows`` loads one (``dataset.shard_source``), at one row size for all, and
are concatenated source by source into ONE resident array per feature (``Concatenated``): each source's windows are
then one contiguous block of the start rows (``stream.window_stream``). The sources must agree on the features
read (names, dtypes, shapes) and, where labels are read or balanced, on the labels' kind and class names; a
disagreement is refused naming the two paths and the difference.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from .. import files as files_lib
from ..epoch_guard import Stamp
from ..indexed.request import StreamRequest
from ..indexed.stream import Position, Stream, pipeline_position
from ..input_position import InputPosition
from ..windowing.starts import row_steps_of, start_rows
from .index import Episodes, gather_batches
from .layout import LABEL_ARRAY, Concatenated, Layout, aligned_empty
from .request import WindowRequest
from .resident import (
    Source,
    check_batch_divides,
    default_device,
    distribute_per_replica,
    draw_seed,
    pick_strategy,
    report_short_episodes,
    variables_on,
    with_arrays,
)
from .stream import stream_batches, window_stream


@dataclasses.dataclass(frozen=True, eq=False)
class Mixture:
    """What the stream needs of the sources beyond their episodes.

    Attributes:
      request: the stream's arguments.
      episode_sources: each episode's source index, in the resident order (source by source, ids ascending).
      labels: each episode's class id, for ``balance="class"``; else None.
      class_names: the sources' class names (the same for all), named in errors.
    """

    request: StreamRequest
    episode_sources: np.ndarray
    labels: np.ndarray | None
    class_names: tuple[str, ...]


def _describe(schema: dict, name: str) -> str:
    if name not in schema:
        return "no such feature"
    dtype, shape = schema[name]
    return f"{np.dtype(dtype).name} {list(shape)}"


def _check_agree(first: tuple[str, dict, files_lib.DatasetInfo], other: tuple[str, dict, files_lib.DatasetInfo],
                 names: Sequence[str], labels: bool) -> None:
    """Refuses sources that disagree on the features read or (``labels``) on the labels, naming both paths."""
    (a, schema_a, info_a), (b, schema_b, info_b) = first, other
    for name in names:
        if _describe(schema_a, name) != _describe(schema_b, name):
            raise ValueError(f"{a} + {b}: the sources' features differ (got {name!r}: {_describe(schema_a, name)} "
                             f"in {a}, {_describe(schema_b, name)} in {b}); mix datasets converted with the same "
                             "features, or pick the common ones with features=")
    if labels and (info_a.label_kind, info_a.class_names) != (info_b.label_kind, info_b.class_names):
        raise ValueError(f"{a} + {b}: the sources' labels differ (got {info_a.label_kind!r} labels, classes "
                         f"{info_a.class_names} in {a}, {info_b.label_kind!r}, classes {info_b.class_names} in {b}); "
                         "mix datasets labelled alike")


def check_sources(stream: StreamRequest, planned: Sequence[tuple[files_lib.DatasetInfo, Layout, dict]]) -> None:
    """Refuses sources that disagree (features read; labels where read or balanced) or, with ``balance``, that have
    no class labels. ``planned``: each path's ``(dataset, layout, schema)`` (``dataset._plan``)."""
    layout = planned[0][1]
    balance = stream.balance == "class"
    for path, (info, _, _) in zip(stream.paths, planned):
        if balance and info.label_kind != "class":
            kind = "no" if info.label_kind is None else repr(info.label_kind)
            raise ValueError(f"{path}: balance='class' needs one class per episode (got {kind} labels); drop "
                             "balance, or convert the episodes with class labels (class folders or a labels file)")
    for path, (info, _, schema) in zip(stream.paths[1:], planned[1:]):
        _check_agree((stream.paths[0], planned[0][2], planned[0][0]), (path, schema, info), layout.gathered,
                     labels=layout.label or balance)


def combine(stream: StreamRequest, split: str, planned: Sequence[tuple[files_lib.DatasetInfo, Layout, dict]],
            sources: Sequence[Source]) -> tuple[Layout, Source, Mixture]:
    """The layout, ONE source of every path's episodes laid end to end (``sources``: each path's, as
    ``dataset.shard_source`` makes them), and the ``Mixture``; ``check_sources`` first."""
    layout = planned[0][1]
    balance = stream.balance == "class"
    episode_sources = np.concatenate([np.full(len(s.lengths), i, np.int64) for i, s in enumerate(sources)])
    labels = None
    if balance:
        labels = np.concatenate([[e.label for e in sorted(files_lib.split_info(info, split).episodes,
                                                          key=lambda e: e.id)] for info, _, _ in planned])
    where = stream.where

    def load(shards, row):  # shards: one source, so always every episode (None)
        parts = [s.load(None, row) for s in sources]
        labels_of = None if parts[0].labels is None else np.concatenate([p.labels for p in parts])
        return Concatenated({n: joined([p.arrays[n] for p in parts]) for n in parts[0].arrays},
                            [t for p in parts for t in p.lengths], [i for p in parts for i in p.ids], row,
                            layout.spec, labels_of)

    def epoch_check() -> tf.Operation:
        return tf.group([s.epoch_check() for s in sources if s.epoch_check is not None])

    lengths = [t for s in sources for t in s.lengths]
    source = Source(lengths, [0] * len(lengths), 1, load, where, epoch_check,
                    Stamp(where, [str(s.stamp.value) for s in sources]))
    mixture = Mixture(stream, episode_sources, labels, tuple(planned[0][0].class_names))
    return layout, source, mixture


def stream_of(mixture: Mixture, spec, lengths: Sequence[int], *, shuffle: bool, seed: int) -> Stream:
    """The stream over the loaded episodes' windows."""
    request = mixture.request
    return window_stream(spec, lengths, mixture.episode_sources, weights=request.weights,
                         epoch_size=request.epoch_size, balance=request.balance, labels=mixture.labels,
                         class_names=mixture.class_names, shuffle=shuffle, seed=seed, where=request.where)


def check_epoch_batches(where: str, position: Position, epoch_size: int, drop_remainder: bool) -> None:
    """With drop_remainder, an epoch shorter than one global batch would yield nothing: refused."""
    if drop_remainder and position.batches(epoch_size, True) == 0:
        raise ValueError(f"{where}: the stream gives {epoch_size} windows an epoch, fewer than one global batch of "
                         f"{position.global_batch} with drop_remainder=True, so an epoch would yield no batch; pass a "
                         "smaller batch_size, a larger epoch_size or drop_remainder=False")


def _several_workers(strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _check_strategy(strategy, request: WindowRequest, where: str) -> None:
    """Refuses a strategy the stream does not support, a global batch its replicas do not divide, and an unseeded
    shuffle read by several processes (each would draw its own seed, so its own order: the slices would overlap)."""
    if strategy is not None and not (_several_workers(strategy) or
                                     isinstance(strategy, tf.distribute.MirroredStrategy)):
        raise ValueError(f"{where}: the stream (mixtures, balance, elastic resume) holds every window on every "
                         f"replica and supports MirroredStrategy and MultiWorkerMirroredStrategy (got "
                         f"{type(strategy).__name__}); read one path without weights, epoch_size, balance or "
                         "with_source, or use one of those two")
    if strategy is not None:
        check_batch_divides(request.batch_size, strategy.num_replicas_in_sync, where)
    context = request.input_context
    processes = (context is not None and context.num_input_pipelines > 1) or _several_workers(strategy)
    if request.shuffle and request.seed is None and processes:
        what = (f"input_context of {context.num_input_pipelines} input pipelines" if strategy is None else
                type(strategy).__name__)
        raise ValueError(f"{where}: the stream read by several workers or input pipelines needs one order for all, "
                         f"so a seed (got seed=None under {what}); pass seed=<int>, the same on every worker")


def mixture_windows(source: Source, layout: Layout, request: WindowRequest, mixture: Mixture):
    """``readers.windows`` on the stream: one pipeline (of global batches, or under ``input_context`` of its
    per-replica slices), or one per replica of a ``MirroredStrategy``, or on each worker of a
    ``MultiWorkerMirroredStrategy`` one per local replica: global replica ``worker · local + r`` reads its
    contiguous slice of every global step. Every replica holds every window, so all run the same steps."""
    where, batch_size = source.where, request.batch_size
    spec = layout.spec
    strategy = None if request.input_context is not None else pick_strategy(request.strategy)
    _check_strategy(strategy, request, where)
    replicas = 1 if strategy is None else strategy.num_replicas_in_sync
    report_short_episodes(where, spec, source.lengths)
    row = row_steps_of(spec, source.lengths)
    epoch_size = spec.count(source.lengths) if mixture.request.epoch_size is None else mixture.request.epoch_size
    first = (pipeline_position(batch_size, request.input_context, where) if strategy is None else
             Position(replicas, 0, batch_size, batch_size // replicas))
    check_epoch_batches(where, first, epoch_size, request.drop_remainder)
    data = source.load(None, row)
    stream = stream_of(mixture, spec, data.lengths, shuffle=request.shuffle, seed=draw_seed(request.seed))
    starts = start_rows(spec, data.lengths, row)
    devices = [request.device or default_device()] if strategy is None else strategy.extended.worker_devices
    per_device = variables_on(data, devices)
    sources = mixture.episode_sources if mixture.request.with_source else None
    # A seeded endless stream is a pure function of its start: readers.BackupAndRestore moves it (input_position.py).
    resumable = request.repeat and (request.seed is not None or not request.shuffle)
    start = InputPosition(request.start_step, where) if resumable else request.start_step

    def replica_dataset(position: Position, local: int) -> tf.data.Dataset:
        index = functools.partial(stream_batches, starts, stream=stream, position=position,
                                  drop_remainder=request.drop_remainder, repeat=request.repeat,
                                  start_step=start, where=where, epoch_check=source.epoch_check,
                                  stamp=source.stamp)
        episodes = Episodes(data, tf.as_dtype(starts.dtype), per_device[local].get(LABEL_ARRAY), sources)
        return gather_batches(index, per_device[local], layout, episodes, request.with_keys, sources is not None)

    def of_replica(replica: int, local: int) -> tf.data.Dataset:
        return replica_dataset(Position(replicas, replica, batch_size, batch_size // replicas), local)

    if strategy is None:
        return with_arrays(replica_dataset(first, 0), per_device, start)
    if not _several_workers(strategy):
        return distribute_per_replica(strategy, lambda context: of_replica(context.input_pipeline_id,
                                                                           context.input_pipeline_id), per_device,
                                      start)

    def worker_dataset(context: tf.distribute.InputContext) -> tf.data.Dataset:
        worker, local = context.input_pipeline_id, len(devices)
        datasets = [of_replica(worker * local + r, r) for r in range(local)]
        if local == 1:
            return datasets[0]
        # The worker's iterator hands its elements to the local replicas round robin: element r goes to replica r.
        return tf.data.Dataset.choose_from_datasets(datasets, tf.data.Dataset.range(local).repeat())

    return with_arrays(strategy.distribute_datasets_from_function(worker_dataset), per_device, start)


def joined(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate(arrays)`` into an aligned array (``layout.aligned_empty``), which ``resident.host_tensor``
    copies into its variable at memory speed."""
    out = aligned_empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), np.result_type(*arrays))
    return np.concatenate(arrays, out=out)
