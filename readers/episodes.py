"""``readers.episodes()``: whole episodes from ``tfshard episodes`` shards (the bulk load of resident windows is
``windows/loader.py``).

An episode is one record, or several chunk records written one after another in the same shard; by default
chunks are joined per shard file before files are interleaved, so a join never sees another episode's chunk
(``episode_decode.py`` joins and decodes them). A list of paths, ``weights``, ``epoch_size``, ``shuffle="global"``,
``with_source``, ``repeat`` or ``start_step`` reads the index-driven stream instead (``indexed/episodes.py``):
whole episodes read by position in the order ``readers/sampling`` computes.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from ..format.names import tf_compression_type
from ..format.objects import use_storage_options
from ..format.records import LABEL_KEY, episode_parse_spec, parse_spec
from . import files as files_lib
from .arguments import DEFAULT_READ_BUFFER_BYTES, check_reading, check_resume, check_seed
from .episode_decode import (
    decode_episode,
    feature_schema,
    join_chunks,
    manifest_lookup,
    repair_hint,
    select_features,
    whole_record,
)
from .epoch_guard import EpochGuard
from .graph_ready import without_autograph
from .guard import ShardGuard, checkpointable
from .indexed.episodes import indexed_episodes
from .indexed.request import episode_request
from .options import quiet_options, seeded_shuffle
from .shard_cache.pipeline import ShardCacheArg

# feature_schema, select_features and repair_hint are the episode readers' (windows/ reads them from here).
__all__ = ["episodes", "feature_schema", "repair_hint", "select_features", "stream_episodes"]

AUTOTUNE = tf.data.AUTOTUNE


@without_autograph
def episodes(
    path: str | Sequence[str],
    split: str = "train",
    *,
    features: str | Sequence[str] | None = None,
    shuffle_files: bool = False,
    seed: int | None = None,
    input_context: tf.distribute.InputContext | None = None,
    num_parallel_reads: int | None = None,
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    with_keys: bool = False,
    shard_cache: str | None = None,
    shard_cache_limit: str | int | None = None,
    weights: Sequence[float] | None = None,
    epoch_size: int | None = None,
    shuffle: str | None = None,
    with_source: bool = False,
    repeat: bool = False,
    start_step: int = 0,
    storage_options: Mapping[str, Any] | None = None,
) -> tf.data.Dataset:
    """Whole episodes as ``{feature: [T, ...]}``, in manifest order unless ``shuffle_files``.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``); or a list of them, a mixture read as one
        stream (docs/guide/mixtures.md#episodes): they must have the same features and labels.
      split: which split.
      features: a name or names to read (default: all). Episodes are always dicts,
        even of one feature (``data``, from ``.npy`` files): an episode is a record
        of named features, unlike ``readers.windows``, whose single feature is
        a model's input tensor.
      shuffle_files: read shards in a new seeded order each epoch, several at once
        (otherwise one shard after another, so the order is the manifest's).
      seed: seed of the file order, an int in [0, 2**63 - 1]; None draws fresh randomness.
      input_context: FILE sharding across input pipelines (``tf.distribute``).
      num_parallel_reads: shards read at once when ``shuffle_files`` (default up to 16).
      read_buffer_bytes: read buffer per shard.
      with_keys: yield ``(keys, episode)`` with ``keys = {"episode": id}``: the
        episode's id, its place in the sorted source files.
      shard_cache: a local folder keeping verified copies of the shards (for ``gs://`` data), fetched ahead in
        the epoch's file order and read from disk from then on (docs/guide/shard-cache.md); ``s3://``,
        ``az://`` and ``https://`` shards always are, None then meaning a default folder
        (docs/guide/object-stores.md).
      shard_cache_limit: the most that folder may hold, e.g. ``"200GB"`` (None: 90% of the disk's free space).
      weights: each path's part of an epoch (only the ratios count); None: in proportion to their episodes.
      epoch_size: episodes per epoch of the stream; None: the paths' episodes.
      shuffle: ``"global"``: each epoch a seeded permutation of every episode of the split (of each path's passes,
        in a mixture); None: manifest order (a mixture's paths interleaved smoothly).
      with_source: each episode gains ``"source"``: int32, its dataset's index in ``path``.
      repeat: epoch after epoch from one endless iterator.
      start_step: with ``repeat``, start after this many episodes of the stream, exactly as if they had been read:
        the episodes the whole job consumed (under ``input_context``, every pipeline's together), so a job resumes
        on another number of replicas. Costs one epoch's order, whatever the step.
        A list of paths, ``weights``, ``epoch_size``, ``shuffle``, ``with_source``, ``repeat`` or ``start_step``
        reads the index-driven stream (``readers/indexed/``, docs/guide/mixtures.md#episodes): whole episodes read
        by position in an order computed from ``seed``; under ``input_context`` each pipeline takes its contiguous
        part of every ``num_replicas_in_sync`` episodes. Not with ``shuffle_files`` or compressed shards; a remote
        dataset needs index files (``--index``) or ``shard_cache``.
      storage_options: as for ``readers.images``.

    Returns:
      A dataset of dicts ``{feature: [T, ...]}``, one per episode (with ``with_keys``, pairs). A dataset converted
      with episode labels adds ``"label"``: a scalar, int64 (an index into ``class_names``) or float32.

    Raises:
      FileNotFoundError: a shard is missing.
      ValueError: a split or feature that does not exist, or a shard that is not a regular file or not the
        manifest's size. While reading, an episode whose records disagree with the manifest (or with themselves)
        raises ``tf.errors.InvalidArgumentError``, as does the start of an epoch when the dataset at ``path`` is
        no longer the one the pipeline was built on (an ``--overwrite`` since): build it again.

    Example:
      ep = next(iter(readers.episodes("runs-tfr")))
      {k: v.shape for k, v in ep.items()}  # {'action': [5120], 'obs': [5120, 3]}
    """
    use_storage_options(path, storage_options)
    seed = check_seed(seed, path)
    stream = episode_request(path, weights=weights, epoch_size=epoch_size, shuffle=shuffle, with_source=with_source,
                             repeat=repeat, start_step=start_step, shuffle_files=shuffle_files)
    path = path if stream is None else stream.where  # the paths, in messages
    read_buffer_bytes, num_parallel_reads = check_reading(path, read_buffer_bytes=read_buffer_bytes,
                                                          num_parallel_reads=num_parallel_reads)
    if stream is not None:  # mixtures, a global shuffle, resuming: episodes read by position (readers/indexed/)
        start_step = check_resume(repeat, start_step, path, shuffle=stream.shuffle == "global", seed=seed)
        return indexed_episodes(stream, split, features=features, seed=seed, input_context=input_context,
                                num_parallel_reads=num_parallel_reads, with_keys=with_keys, repeat=repeat,
                                start_step=start_step, shard_cache=ShardCacheArg(shard_cache, shard_cache_limit))
    dataset = files_lib.info(path)
    return stream_episodes(dataset, split, select_features(dataset, features), shuffle_files=shuffle_files, seed=seed,
                           input_context=input_context, num_parallel_reads=num_parallel_reads,
                           read_buffer_bytes=read_buffer_bytes, with_keys=with_keys, with_label=dataset.labelled,
                           shard_cache=ShardCacheArg(shard_cache, shard_cache_limit))


def stream_episodes(dataset: files_lib.DatasetInfo, split: str, schema: dict, *, shuffle_files: bool,
                    seed: int | None, input_context, num_parallel_reads: int | None, read_buffer_bytes: int,
                    with_keys: bool, local: bool = True, with_label: bool = False,
                    shard_cache: ShardCacheArg | None = None) -> tf.data.Dataset:
    """``readers.episodes`` of checked arguments; ``with_label``: each episode's ``"label"`` too (a labelled dataset).
    ``shard_cache``: the reader's ``shard_cache=``/``shard_cache_limit=`` (``readers/shard_cache``).

    ``local``: the pipeline runs in this process, so its reads are guarded (``readers/guard.py``) and its length is
    known; False for tf.data service workers, which cannot run the guard's Python and each read a share of the files.
    """
    path = dataset.path
    chosen = files_lib.pipeline_shards(dataset, split, input_context=input_context)
    shards = files_lib.check_shards(dataset, split, chosen)
    session = (shard_cache or ShardCacheArg()).session(path, shards)
    spec = episode_parse_spec(schema)
    label_dtype = None
    if with_label:
        spec.update(parse_spec(dataset.manifest.features, [LABEL_KEY]))
        label_dtype = spec[LABEL_KEY].dtype
    compression = tf_compression_type(dataset.manifest.compression)
    decode = decode_episode(schema, f"{path}: split {split!r}", repair_hint(path),
                             manifest_lookup(files_lib.split_info(dataset, split).episodes, label_dtype),
                             with_keys, with_label)
    checks = ShardGuard(shards, strict=True)
    # Every episode one record (the manifest counts as many records as episodes in each shard): no join needed.
    per_shard = collections.Counter(e.shard for e in files_lib.split_info(dataset, split).episodes)
    whole = all(s.info.records == per_shard[i] for i, s in zip(chosen, shards))
    parse = lambda r: tf.io.parse_single_example(r, spec)  # noqa: E731
    triple = whole_record(list(schema), f"{path}: split {split!r}", repair_hint(path), with_label, parse=parse)

    def decode_record(record):  # one record an episode: record → join_chunks' triple → episode, in one map
        return decode(*triple(record))

    def open_records(shard):
        return files_lib.tfrecord_file(shard, compression, read_buffer_bytes)

    def read_remote(index, shard):
        return checks.read(index, shard, open_records) if local else open_records(shard)

    def read_one(index, shard, cached=None):  # chunks are joined per shard: a join never sees another episode's chunk
        records = read_remote(index, shard) if cached is None else session.read(
            index, shard, cached, open_records, read_remote)
        # One record an episode: parsed in the decode's parallel map below; else chunks joined here, per shard.
        return records if whole else join_chunks(records, list(schema), with_label, parse=parse)

    files = tf.data.Dataset.from_tensor_slices((tf.range(len(shards), dtype=tf.int64), [s.path for s in shards]))
    cycle = (num_parallel_reads or min(len(shards), 16)) if shuffle_files else 1
    if shuffle_files:
        files = seeded_shuffle(files, len(shards), seed)
    if session is not None:  # fetched into the cache a few files ahead of the reads, in this epoch's order
        files = session.localized(files, ahead=min(len(shards), cycle + files_lib.FETCH_AHEAD))
    if shuffle_files:  # read in parallel; otherwise one shard after another, in manifest order, cache or not
        joined = files.interleave(read_one, cycle_length=cycle, num_parallel_calls=AUTOTUNE, deterministic=False)
    else:
        joined = files.flat_map(read_one)
    # Every episode is checked against the manifest as it is decoded, so its count is exact: Keras then ends an
    # epoch on it instead of warning that the input "ran out of data".
    mine = set(chosen)
    count = sum(e.shard in mine for e in files_lib.split_info(dataset, split).episodes)
    joined = joined.map(decode_record if whole else decode, num_parallel_calls=AUTOTUNE,
                        deterministic=not shuffle_files)
    if not local:  # the service's client runs the epoch check (``streamed.py``)
        return joined
    # Each epoch first checks OUT still holds the dataset this pipeline was built on (a shard cache's copies would
    # otherwise serve the old one: readers/epoch_guard.py), unless every shard's read checks its own.
    guard = EpochGuard(dataset, split, shards)
    joined = joined if guard.covered_by_reads(session) else guard.ahead(joined)
    # A checkpoint of it restores only into a pipeline of the same shards (readers/epoch_guard.py).
    ds = guard.stamp.lead(joined.apply(tf.data.experimental.assert_cardinality(count)))
    return checkpointable(ds.prefetch(AUTOTUNE).with_options(quiet_options()))
