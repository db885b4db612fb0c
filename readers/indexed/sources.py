"""The sources of an index-driven stream: each dataset checked, its shards (or their shard-cache copies) located
record by record, its epoch check, and the labels of all of them as one.

Class names of image sources are merged by name: the sorted union, each source's class ids mapped into it by a
lookup table (one source keeps its own names and ids). The sources must have the same label kind (and value
columns); one that does not is refused naming both.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from .. import files as files_lib
from ..epoch_guard import EpochGuard
from ..image_ops import ImageLabels
from ..image_recipe import check_kind
from ..shard_cache.pipeline import ShardCacheArg
from . import records as records_lib

_LABEL_BATCH = 1024  # records parsed at once when the class ids are read


@dataclasses.dataclass(eq=False)
class Source:
    """One dataset of the stream: its manifest, its checked shards, where its records are, its epoch check.

    ``session`` (a shard cache's) is kept with the source: its copies stay pinned while the pipeline lives.
    """

    path: str
    dataset: files_lib.DatasetInfo
    shards: list[files_lib.ShardFile]
    guard: EpochGuard
    labels: ImageLabels
    table: records_lib.RecordTable
    session: object = None

    @property
    def kind(self) -> str:
        return self.dataset.label_kind


def load(path: str, split: str, shard_cache: ShardCacheArg) -> Source:
    """A source: the images dataset at ``path``, every shard of ``split`` checked and located record by record.

    Raises:
      ValueError: not an images dataset, or what ``locate`` refuses.
    """
    dataset = files_lib.info(path)
    check_kind(dataset)
    shards, session, table = locate(dataset, split, shard_cache)
    return Source(path, dataset, shards, EpochGuard(dataset, split, shards), ImageLabels.of(dataset.manifest), table,
                  session)


def locate(dataset: files_lib.DatasetInfo, split: str, shard_cache: ShardCacheArg):
    """``(shards, session, table)``: every shard of ``split`` checked, its shard-cache copies fetched (``session``
    None without a cache), and where each of its records is (``records.RecordTable``). Keep ``session`` with the
    pipeline: its copies stay pinned while it lives.

    Raises:
      ValueError: compressed shards (a record has no byte offset in a gzip stream), a shard or index file that does
        not fit the manifest, a remote shard without index or shard cache, a shard the cache cannot hold.
    """
    path = dataset.path
    compression = dataset.manifest.compression
    if compression is not None:
        raise ValueError(f"{path}: records of compressed shards cannot be read by position (got compression="
                         f"{compression!r}); convert the dataset again without --compression")
    chosen = list(range(len(files_lib.split_info(dataset, split).shards)))
    shards = files_lib.check_shards(dataset, split, chosen)
    session = shard_cache.session(path, shards) if shards else None
    reads = [s.path for s in shards]
    if session is not None:  # every record may come in any epoch: all the copies, before the first read
        for i, shard in enumerate(session.shards):
            local = session.fetch(shard)
            if local is None:
                raise ValueError(f"{path}: shard_cache could not hold a copy of {shard.remote} (see the log); every "
                                 "shard is read at random, so each needs its copy: raise shard_cache_limit")
            reads[i] = local
    return shards, session, records_lib.record_table(path, shards, reads)


@dataclasses.dataclass(frozen=True)
class MergedLabels:
    """The sources' labels as one: ``labels`` (merged class names' count), ``names`` and, per source, where its
    class ids start in ``remap`` (the merged id of source ``s``'s class ``c`` is ``remap[starts[s] + c]``)."""

    labels: ImageLabels
    names: tuple[str, ...]
    remap: np.ndarray
    starts: np.ndarray

    def label(self, parsed: dict, source: tf.Tensor) -> tf.Tensor:
        """The merged label of a parsed record of ``source``."""
        if self.labels.labels == "value" or len(self.starts) == 1:
            return self.labels.label(parsed)
        base = tf.gather(tf.constant(self.starts, tf.int64), tf.cast(source, tf.int64))
        remap = tf.constant(self.remap, tf.int64)
        key = self.labels.key
        if self.labels.labels == "multi":
            values = parsed[key]
            parsed = {key: tf.SparseTensor(values.indices, tf.gather(remap, base + values.values),
                                           values.dense_shape)}
            return self.labels.label(parsed)
        return tf.gather(remap, base + parsed[key])


def merged_labels(sources: list[Source]) -> MergedLabels:
    """The sources' labels as one (see the module docstring).

    Raises:
      ValueError: two sources of different label kinds or value columns, naming both.
    """
    first = sources[0]
    for other in sources[1:]:
        ours, theirs = (first.kind, first.labels.columns), (other.kind, other.labels.columns)
        if ours != theirs:
            raise ValueError(
                f"{other.path}: its labels are not {first.path}'s, so one stream cannot hold both (got "
                f"{other.kind!r} labels with {other.labels.columns} column(s), {first.path} has {first.kind!r} with "
                f"{first.labels.columns}); mix datasets of one label kind")
    if len(sources) == 1 or first.kind == "value":
        names = tuple(first.dataset.class_names)
        return MergedLabels(first.labels, names, np.arange(len(names), dtype=np.int64), np.zeros(1, np.int64))
    names = tuple(sorted({n for s in sources for n in s.dataset.class_names}))
    index = {n: i for i, n in enumerate(names)}
    remap = np.array([index[n] for s in sources for n in s.dataset.class_names], np.int64)
    starts = np.cumsum([0] + [len(s.dataset.class_names) for s in sources[:-1]]).astype(np.int64)
    merged = ImageLabels(first.labels.labels, len(names), first.labels.columns)
    return MergedLabels(merged, names, remap, starts)


def class_ids(sources: list[Source], merged: MergedLabels) -> np.ndarray:
    """The merged class id of every record of the sources, in record order, from one pass parsing only the label
    (a tf.data pass over the shards: every record's bytes are read once, none decoded)."""
    ids = []
    for i, source in enumerate(sources):
        key = source.labels.key
        spec = {key: source.labels.spec()[key]}  # the label alone

        def labels_of(batch, spec=spec, key=key):
            return tf.io.parse_example(batch, spec)[key]

        records = tf.data.TFRecordDataset(list(source.table.files))
        parsed = records.batch(_LABEL_BATCH).map(labels_of, num_parallel_calls=tf.data.AUTOTUNE)
        found = np.concatenate(list(parsed.as_numpy_iterator()) or [np.zeros(0, np.int64)])
        ids.append(merged.remap[merged.starts[i] + found] if len(merged.starts) > 1 else found)
    return np.concatenate(ids)
