"""``readers.episodes`` on the index-driven stream: mixtures, a global shuffle and elastic resume of whole episodes.

The element is one episode. The stream's sources are the datasets, their records the episodes of the split
(``episode_table.py`` maps each to its consecutive chunk records). The stages, in their one order: this pipeline's
global elements, a chunk at a time (``pipeline.elements``: one epoch's order, each source's epoch check), expanded
to their episodes' chunk records → each record read by position (``pipeline.read``) → parsed, checked to be the
episode and chunk expected → chunks joined → decoded and checked against the manifest → known length → prefetch.

The reader yields no batches, so a global step is one episode: ``start_step`` counts the episodes of the stream
the whole job has consumed. Under an ``input_context`` of ``R`` replicas over ``P`` pipelines the stream is dealt in
groups of ``R`` consecutive episodes, one per replica; pipeline ``p`` takes its contiguous ``R / P`` of each
(``sampling.slicing`` with a global batch of ``R``).
"""

from __future__ import annotations

import dataclasses
import secrets

import numpy as np
import tensorflow as tf

from ...format.records import LABEL_KEY, episode_parse_spec, parse_spec
from .. import files as files_lib
from ..episode_decode import assert_that, decode_episode, feature_schema, join_chunks, repair_hint, select_features
from ..epoch_guard import EpochGuard, Stamp
from ..options import external_state_ignored, quiet_options
from ..sampling.plan import StreamSpec
from ..shard_cache.pipeline import ShardCacheArg
from . import episode_table as episode_table_lib
from . import pipeline as pipeline_lib
from . import records as records_lib
from . import sources as sources_lib
from .request import StreamRequest
from .stream import EpochCount, Stream, pipeline_position

AUTOTUNE = tf.data.AUTOTUNE
_READ_BYTES = 4 * 2**20  # local record bytes read by one Python call (at least one record)
# Keys the reader puts beside a record's parsed keys: its episode's place in the episode table, its chunk index and
# its dataset's index in the paths.
_EPISODE, _CHUNK, _SOURCE = "stream/episode", "stream/chunk", "stream/source"


@dataclasses.dataclass(eq=False)
class Source:
    """One dataset of the stream: its manifest, its checked shards, where its records and episodes are, its epoch
    check; ``session`` (a shard cache's) keeps its copies pinned while the pipeline lives."""

    path: str
    dataset: files_lib.DatasetInfo
    shards: list[files_lib.ShardFile]
    guard: EpochGuard
    table: records_lib.RecordTable
    episodes: episode_table_lib.EpisodeTable
    session: object = None


def load(path: str, split: str, shard_cache: ShardCacheArg) -> Source:
    """A source: the episodes dataset at ``path``, its split's shards checked and located record by record.

    Raises:
      ValueError: not an episodes dataset, what ``sources.locate`` refuses, or a split holding no episode.
    """
    dataset = files_lib.info(path)
    feature_schema(dataset)  # refuses an images dataset
    shards, session, table = sources_lib.locate(dataset, split, shard_cache)
    info = files_lib.split_info(dataset, split)
    episodes = episode_table_lib.episode_table(info.episodes, [s.records for s in info.shards],
                                               f"{path}: split {split!r}", labelled=dataset.labelled)
    if not len(episodes):
        raise ValueError(f"{path}: split {split!r} holds no episode, so it cannot give a share of the stream (got 0 "
                         "episodes); leave it out")
    return Source(path, dataset, shards, EpochGuard(dataset, split, shards), table, episodes, session)


def agreed(sources: list[Source]) -> None:
    """Refuses sources whose features (names, dtypes, shapes) or labels differ, naming both and the difference."""
    first = sources[0]
    ours = feature_schema(first.dataset)
    for other in sources[1:]:
        theirs = feature_schema(other.dataset)
        differ = [f"{n!r} only in {first.path if n in ours else other.path}" for n in sorted(set(ours) ^ set(theirs))]
        differ += [f"{n!r} {theirs[n][0]} {list(theirs[n][1])}, {first.path} has {ours[n][0]} {list(ours[n][1])}"
                   for n in sorted(set(ours) & set(theirs)) if ours[n] != theirs[n]]
        if differ:
            raise ValueError(f"{other.path}: its features are not {first.path}'s, so one stream cannot hold both (got "
                             f"{'; '.join(differ)}); mix datasets of one feature schema")
        labels = [(s.dataset.label_kind, s.dataset.class_names) for s in (first, other)]
        if labels[0] != labels[1]:
            raise ValueError(f"{other.path}: its labels are not {first.path}'s, so one stream cannot hold both (got "
                             f"{labels[1][0]!r} labels, classes {labels[1][1]}; {first.path} has {labels[0][0]!r}, "
                             f"classes {labels[0][1]}); mix datasets labelled alike")


def indexed_episodes(request: StreamRequest, split: str, *, features, seed: int | None, input_context,
                     num_parallel_reads: int | None, with_keys: bool, repeat: bool, start_step: int,
                     shard_cache: ShardCacheArg) -> tf.data.Dataset:
    """The stream's episodes (see ``readers.episodes``, which checks the arguments and calls this)."""
    where = request.where
    sources = [load(path, split, shard_cache) for path in request.paths]
    agreed(sources)
    schema = select_features(sources[0].dataset, features)
    seed = secrets.randbelow(2**62) if seed is None else seed  # unseeded: fresh, but one seed for the whole run
    sizes = tuple(len(s.episodes) for s in sources)
    spec = StreamSpec(sizes=sizes, weights=request.weights, epoch_size=request.epoch_size,
                      shuffle=request.shuffle == "global", seed=seed)
    stream = Stream(spec, None, np.cumsum((0, *sizes)).astype(np.int64))
    table = records_lib.concatenated([s.table for s in sources])
    episodes = episode_table_lib.concatenated([s.episodes for s in sources],
                                              np.cumsum([0] + [len(s.table) for s in sources[:-1]]))
    position = pipeline_position(1, input_context, where)
    epoch_size = spec.epoch_size
    epochs = EpochCount()

    def indices_of(number, _start):  # the start is this reader's own start_step (no InputPosition: not resumable)
        if repeat:  # start_step counts episodes, not steps of the position's global batch
            return start_step + position.chunk(number, 0, epoch_size)
        return position.epoch(epochs.at(number), epoch_size, drop_remainder=False, chunk=number)

    def rows(indices):
        source, episode = stream.records(indices)
        record, of, chunk = episodes.records(episode)
        return (table.shard[record], table.offset[record], table.length[record], of, chunk,
                np.repeat(source, episodes.chunks[episode]).astype(np.int32))

    elements = pipeline_lib.elements(indices_of, rows, [tf.int32, tf.int64, tf.int64, tf.int64, tf.int64, tf.int32],
                                     [s.guard for s in sources], repeat=repeat,
                                     epoch_chunks=position.epoch_chunks(epoch_size, False))
    read_batch = int(np.clip(_READ_BYTES // max(1, int(table.length.max(initial=1))), 1, pipeline_lib.READ_BATCH))
    records = pipeline_lib.read(elements, table, num_parallel_reads, read_batch)
    labelled = sources[0].dataset.labelled
    parsed = records.map(_parser(schema, sources[0].dataset, episodes, where, labelled), num_parallel_calls=AUTOTUNE,
                         deterministic=True)
    joined = join_chunks(parsed, list(schema), labelled, carry=(_EPISODE, _SOURCE))
    lengths, labels = tf.constant(episodes.lengths), tf.constant(episodes.labels)

    def lookup(meta):
        return tf.gather(lengths, meta[_EPISODE]), tf.gather(labels, meta[_EPISODE])

    decode = decode_episode(schema, f"{where}: split {split!r}", repair_hint(where), lookup, with_keys, labelled,
                            _SOURCE if request.with_source else None)
    ds = joined.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True)
    if not repeat:
        ds = ds.apply(tf.data.experimental.assert_cardinality(position.batches(epoch_size, False)))
    ds = Stamp(where, [s.info.sha256 for source in sources for s in source.shards]).lead(ds)
    ds = ds.prefetch(AUTOTUNE).with_options(quiet_options())
    ds = ds.with_options(external_state_ignored())  # the chunks' Python holds only the epoch count
    return pipeline_lib.holding_sessions(ds, [s.session for s in sources])


def _parser(schema, dataset, episodes: episode_table_lib.EpisodeTable, where: str, labelled: bool):
    """A record, its episode and chunk → its parsed keys, checked to be that episode's chunk (the episode table
    inferred from the manifest says which records an episode is; the records have the last word)."""
    spec = episode_parse_spec(schema)
    if labelled:
        spec.update(parse_spec(dataset.manifest.features, [LABEL_KEY]))
    ids, chunks = tf.constant(episodes.ids), tf.constant(episodes.chunks)
    fix = repair_hint(where)

    def parse(record, episode, chunk, source):
        parsed = tf.io.parse_single_example(record, spec)
        expected = tf.stack([tf.gather(ids, episode), chunk, tf.gather(chunks, episode)])
        found = tf.stack([parsed["episode/id"], parsed["episode/chunk"], parsed["episode/chunks"]])
        with tf.control_dependencies([assert_that(
                tf.reduce_all(tf.equal(found, expected)),
                [f"{where}: a record of the source", source, "is episode, chunk, chunks", found,
                 "where the manifest places", expected, f"; {fix}"])]):
            return {**parsed, _EPISODE: tf.identity(episode), _CHUNK: chunk, _SOURCE: source}

    return parse
