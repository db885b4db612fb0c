"""``readers.episodes()``: whole episodes from ``tfshard episodes`` shards, and the feature schema every episode
reader shares (the bulk load of resident windows is ``windows/loader.py``).

An episode is one record, or several chunk records written one after another
in the same shard; chunks are joined per shard file before files are
interleaved, so a join never sees another episode's chunk. Feature bytes are
raw little-endian, read with ``tf.io.decode_raw`` (no per-element parsing).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from ..format.manifest import EpisodeInfo
from ..format.names import tf_compression_type
from ..format.records import LABEL_KEY, data_features, episode_parse_spec, parse_spec
from . import files as files_lib
from .arguments import DEFAULT_READ_BUFFER_BYTES, check_reading
from .epoch_guard import EpochGuard
from .guard import ShardGuard, checkpointable
from .shard_cache.pipeline import ShardCacheArg
from .windowing.targets import LABEL, label_array

AUTOTUNE = tf.data.AUTOTUNE
# decode_raw has no unsigned 32/64-bit output: read the signed twin and bitcast (same bytes).
_RAW_TWIN = {np.dtype("<u4"): tf.int32, np.dtype("<u8"): tf.int64}


def feature_schema(dataset: files_lib.DatasetInfo) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Feature name → (numpy dtype, trailing shape), from the manifest of an episode dataset."""
    kind = dataset.manifest.kind
    if kind != "episodes":
        raise ValueError(
            f"{dataset.path}: an {kind!r} dataset, not episodes (got kind={kind!r} in dataset.json); read it with "
            "readers.images, or write an episodes dataset with `tfshard episodes SRC OUT`"
        )
    return {
        name: (np.dtype(spec["dtype"]), tuple(spec["shape"]))
        for name, spec in data_features(dataset.manifest.features).items()
    }


def select_features(
    dataset: files_lib.DatasetInfo, features: str | Sequence[str] | None
) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The schema restricted to ``features`` (None: all), in the order asked; unknown names are an error."""
    schema = feature_schema(dataset)
    names = list(schema) if features is None else [features] if isinstance(features, str) else list(features)
    unknown = [n for n in names if n not in schema]
    if unknown or not names:
        raise ValueError(
            f"{dataset.path}: no feature(s) {unknown or names!r} (got features={features!r}); "
            f"the dataset has {sorted(schema)}"
        )
    return {n: schema[n] for n in names}


def decode_feature(raw: tf.Tensor, dtype: np.dtype, shape: tuple[int, ...],
                   steps: tf.Tensor | None = None) -> tf.Tensor:
    """Raw little-endian bytes → ``[steps, *shape]`` of ``dtype`` (``steps`` needed when a step holds no value)."""
    twin = _RAW_TWIN.get(dtype)
    values = tf.io.decode_raw(raw, twin or tf.as_dtype(dtype), little_endian=True)
    if twin is not None:
        values = tf.bitcast(values, tf.as_dtype(dtype))
    return tf.reshape(values, [-1 if steps is None else steps, *shape])


def _join_chunks(records: tf.data.Dataset, names: Sequence[str], with_label: bool = False) -> tf.data.Dataset:
    """Parsed chunk records of one shard → one ``(meta, joined)`` per episode, each feature's bytes joined in order.

    ``meta``: the episode's id, length and source (and label), from its last chunk record.
    """
    meta_keys = ("id", "length", "source", "label") if with_label else ("id", "length", "source")
    empty = {n: tf.constant(b"") for n in names}

    def step(joined, record):
        first = tf.equal(record["episode/chunk"], 0)
        joined = {
            n: tf.strings.join([tf.where(first, tf.constant(b""), joined[n]), record[f"data/{n}"]]) for n in names
        }
        last = tf.equal(record["episode/chunk"], record["episode/chunks"] - 1)
        meta = {key: record[f"episode/{key}"] for key in meta_keys}
        return joined, (last, meta, joined)

    joined = records.scan(empty, step).filter(lambda last, meta, joined: last)
    return joined.map(lambda last, meta, joined: (meta, joined))


def _manifest_lookup(episodes: list[EpisodeInfo], label_dtype: tf.DType | None = None):
    """A graph function: episode id → ``(length, label)`` in the manifest; length -1 for an id it does not list.

    Sorted constants and a binary search: they serialise with the graph (a tf.data service ships it to its workers).
    ``label_dtype``: the labels' dtype (None: the dataset has none; the label is then 0).
    """
    order = sorted(episodes, key=lambda e: e.id)
    dtype = label_dtype or tf.int64
    if not order:
        return lambda episode_id: (tf.constant(-1, tf.int64), tf.zeros([], dtype))
    ids = tf.constant([e.id for e in order], tf.int64)
    lengths = tf.constant([e.length for e in order], tf.int64)
    labels = tf.constant(label_array([e.label for e in order]) if label_dtype else np.zeros(len(order), np.int64))

    def lookup(episode_id):
        i = tf.minimum(tf.searchsorted(ids, tf.reshape(episode_id, [1]))[0], len(order) - 1)
        return tf.where(tf.equal(ids[i], episode_id), lengths[i], tf.constant(-1, tf.int64)), labels[i]

    return lookup


def _decode_episode(schema, where: str, fix: str, manifest_lookup, with_keys: bool = False,
                    with_label: bool = False):
    """Decodes a joined episode, checking its rows against its records' length and that length (and its label)
    against the manifest.

    ``with_keys``: returns ``({"episode": id}, episode)``. ``with_label``: the episode gains ``"label"``.
    """

    def decode(meta, joined):
        expected, label = manifest_lookup(meta["id"])
        tf.debugging.Assert(
            tf.equal(meta["length"], expected),
            [f"{where}: episode", meta["id"], meta["source"], "has", meta["length"],
             "steps in its records, the manifest says (-1: it does not list this id)", expected, f"; {fix}"],
        )
        # A zero-width feature ([T, 0]) has no values to infer T from: give it the record's length.
        episode = {n: decode_feature(joined[n], *schema[n], meta["length"] if 0 in schema[n][1] else None)
                   for n in schema}
        for n, values in episode.items():
            tf.debugging.assert_equal(
                tf.shape(values, out_type=tf.int64)[0], meta["length"],
                message=f"{where}: feature {n!r} does not match the episode length; {fix}",
            )
        if with_label:
            tf.debugging.Assert(
                tf.equal(meta["label"], label),
                [f"{where}: episode", meta["id"], meta["source"], "has label", meta["label"],
                 "in its records, the manifest says", label, f"; {fix}"],
            )
            episode[LABEL] = meta["label"]
        return ({"episode": meta["id"]}, episode) if with_keys else episode

    return decode


def episodes(
    path: str,
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
) -> tf.data.Dataset:
    """Whole episodes as ``{feature: [T, ...]}``, in manifest order unless ``shuffle_files``.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``).
      split: which split.
      features: a name or names to read (default: all). Episodes are always dicts,
        even of one feature (``data``, from ``.npy`` files): an episode is a record
        of named features, unlike ``readers.windows``, whose single feature is
        a model's input tensor.
      shuffle_files: read shards in a new seeded order each epoch, several at once
        (otherwise one shard after another, so the order is the manifest's).
      seed: seed of the file order.
      input_context: FILE sharding across input pipelines (``tf.distribute``).
      num_parallel_reads: shards read at once when ``shuffle_files`` (default up to 16).
      read_buffer_bytes: read buffer per shard.
      with_keys: yield ``(keys, episode)`` with ``keys = {"episode": id}``: the
        episode's id, its place in the sorted source files.
      shard_cache: a local folder keeping verified copies of the shards (for ``gs://`` data), fetched ahead in
        the epoch's file order and read from disk from then on (docs/guide/shard-cache.md).
      shard_cache_limit: the most that folder may hold, e.g. ``"200GB"`` (None: 90% of the disk's free space).

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
    read_buffer_bytes, num_parallel_reads = check_reading(path, read_buffer_bytes=read_buffer_bytes,
                                                          num_parallel_reads=num_parallel_reads)
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
    decode = _decode_episode(schema, f"{path}: split {split!r}", repair_hint(path),
                             _manifest_lookup(files_lib.split_info(dataset, split).episodes, label_dtype),
                             with_keys, with_label)
    checks = ShardGuard(shards, strict=True)

    def open_records(shard):
        return tf.data.TFRecordDataset(shard, compression_type=compression, buffer_size=read_buffer_bytes)

    def read_remote(index, shard):
        return checks.read(index, shard, open_records) if local else open_records(shard)

    def read_one(index, shard, cached=None):  # chunks are joined per shard: a join never sees another episode's chunk
        records = read_remote(index, shard) if cached is None else session.read(index, shard, cached, open_records,
                                                                                read_remote)
        return _join_chunks(records.map(lambda r: tf.io.parse_single_example(r, spec)), list(schema), with_label)

    files = tf.data.Dataset.from_tensor_slices((tf.range(len(shards), dtype=tf.int64), [s.path for s in shards]))
    cycle = (num_parallel_reads or min(len(shards), 16)) if shuffle_files else 1
    if shuffle_files:
        files = files.shuffle(len(shards), seed=seed, reshuffle_each_iteration=True)
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
    joined = joined.map(decode, num_parallel_calls=AUTOTUNE, deterministic=not shuffle_files)
    if not local:  # the service's client runs the epoch check (``streamed.py``)
        return joined
    # Each epoch first checks OUT still holds the dataset this pipeline was built on (a shard cache's copies would
    # otherwise serve the old one: readers/epoch_guard.py).
    guard = EpochGuard(dataset, split, shards)
    joined = guard.ahead(joined)
    # A checkpoint of it restores only into a pipeline of the same shards (readers/epoch_guard.py).
    return checkpointable(guard.stamp.lead(joined.apply(tf.data.experimental.assert_cardinality(count))))


def repair_hint(path: str) -> str:
    """How to fix a dataset whose records disagree with its manifest."""
    return f"run `tfshard verify {path}`; rewrite the dataset with --overwrite"
