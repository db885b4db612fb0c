"""``readers.episodes()``: whole episodes from ``tfshard episodes`` shards, and the bulk loader for resident windows.

An episode is one record, or several chunk records written one after another
in the same shard; chunks are joined per shard file before files are
interleaved, so a join never sees another episode's chunk. Feature bytes are
raw little-endian, read with ``tf.io.decode_raw`` (no per-element parsing).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from readers import files as files_lib

AUTOTUNE = tf.data.AUTOTUNE
_META = {
    "episode/id": tf.io.FixedLenFeature([], tf.int64),
    "episode/length": tf.io.FixedLenFeature([], tf.int64),
    "episode/chunk": tf.io.FixedLenFeature([], tf.int64),
    "episode/chunks": tf.io.FixedLenFeature([], tf.int64),
    "episode/start": tf.io.FixedLenFeature([], tf.int64),
}
# decode_raw has no unsigned 32/64-bit output: read the signed twin and bitcast (same bytes).
_RAW_TWIN = {np.dtype("<u4"): tf.int32, np.dtype("<u8"): tf.int64}


def feature_schema(dataset: files_lib.DatasetInfo) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Feature name → (numpy dtype, trailing shape), from the manifest of an episode dataset."""
    if dataset.manifest.kind != "episodes":
        raise ValueError(
            f"{dataset.path}: an {dataset.manifest.kind!r} dataset, not episodes; "
            "write one with `tfshard episodes SRC OUT`, or read images with readers.images"
        )
    return {
        key[len("data/"):]: (np.dtype(spec["dtype"]), tuple(spec["shape"]))
        for key, spec in dataset.manifest.features.items()
        if key.startswith("data/")
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


def decode_feature(raw: tf.Tensor, dtype: np.dtype, shape: tuple[int, ...]) -> tf.Tensor:
    """Raw little-endian bytes → ``[steps, *shape]`` of ``dtype``."""
    twin = _RAW_TWIN.get(dtype)
    values = tf.io.decode_raw(raw, twin or tf.as_dtype(dtype), little_endian=True)
    if twin is not None:
        values = tf.bitcast(values, tf.as_dtype(dtype))
    return tf.reshape(values, [-1, *shape])


def _parse_spec(names: Sequence[str]) -> dict:
    return {**_META, **{f"data/{n}": tf.io.FixedLenFeature([], tf.string) for n in names}}


def _join_chunks(records: tf.data.Dataset, names: Sequence[str]) -> tf.data.Dataset:
    """Parsed chunk records of one shard → one element per episode, with each feature's bytes joined in order."""
    empty = {n: tf.constant(b"") for n in names}

    def step(joined, record):
        first = tf.equal(record["episode/chunk"], 0)
        joined = {
            n: tf.strings.join([tf.where(first, tf.constant(b""), joined[n]), record[f"data/{n}"]]) for n in names
        }
        last = tf.equal(record["episode/chunk"], record["episode/chunks"] - 1)
        return joined, (last, record["episode/length"], joined)

    joined = records.scan(empty, step).filter(lambda last, length, joined: last)
    return joined.map(lambda last, length, joined: (length, joined))


def _decode_episode(schema, source: str):
    def decode(length, joined):
        episode = {n: decode_feature(joined[n], *schema[n]) for n in schema}
        for n, values in episode.items():
            tf.debugging.assert_equal(
                tf.shape(values, out_type=tf.int64)[0], length,
                message=f"{source}: feature {n!r} does not match the episode length; run `tfshard verify`",
            )
        return episode

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
    read_buffer_bytes: int = files_lib.DEFAULT_READ_BUFFER_BYTES,
) -> tf.data.Dataset:
    """Whole episodes as ``{feature: [T, ...]}``, in manifest order unless ``shuffle_files``.

    Args:
      path: a ``tfshard episodes`` output folder (local or ``gs://``).
      split: which split.
      features: a name or names to read (default: all).
      shuffle_files: read shards in a new seeded order each epoch, several at once
        (otherwise one shard after another, so the order is the manifest's).
      seed: seed of the file order.
      input_context: FILE sharding across input pipelines (``tf.distribute``).
      num_parallel_reads: shards read at once when ``shuffle_files`` (default up to 16).
      read_buffer_bytes: read buffer per shard.

    Returns:
      A dataset of dicts, one per episode.

    Example:
      ep = next(iter(readers.episodes("runs-tfr")))
      {k: v.shape for k, v in ep.items()}  # {'action': [5120], 'obs': [5120, 3]}
    """
    dataset = files_lib.info(path)
    schema = select_features(dataset, features)
    paths = files_lib.shard_files(dataset, split, input_context=input_context)
    spec = _parse_spec(list(schema))
    compression = "GZIP" if dataset.manifest.compression == "gzip" else ""
    decode = _decode_episode(schema, path)

    def read_one(shard):
        records = tf.data.TFRecordDataset(shard, compression_type=compression, buffer_size=read_buffer_bytes)
        return _join_chunks(records.map(lambda r: tf.io.parse_single_example(r, spec)), list(schema))

    files = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle_files:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
        joined = files.interleave(read_one, cycle_length=num_parallel_reads or min(len(paths), 16),
                                  num_parallel_calls=AUTOTUNE, deterministic=False)
    else:
        joined = files.flat_map(read_one)
    return joined.map(decode, num_parallel_calls=AUTOTUNE, deterministic=not shuffle_files)


def load_concatenated(
    dataset: files_lib.DatasetInfo,
    split: str,
    schema: dict[str, tuple[np.dtype, tuple[int, ...]]],
    *,
    shards: Sequence[int] | None = None,
    read_buffer_bytes: int = files_lib.DEFAULT_READ_BUFFER_BYTES,
) -> tuple[dict[str, np.ndarray], list[int]]:
    """The episodes of a split (or of some of its shards) laid end to end in manifest order.

    Returns one numpy array per feature, and the episodes' lengths. Shards are
    read in parallel, in any order: each chunk is copied straight to its place
    (episode offset from the manifest's lengths + its start step), so nothing
    is sorted and no intermediate list of episodes is kept.
    """
    info = files_lib.split_info(dataset, split)
    chosen = range(len(info.shards)) if shards is None else sorted(set(shards))
    wanted = set(chosen)
    episodes = [e for e in info.episodes if e["shard"] in wanted]
    lengths = [e["length"] for e in episodes]
    offsets = dict(zip((e["id"] for e in episodes), np.concatenate([[0], np.cumsum(lengths)])[:-1].tolist()))
    total = int(sum(lengths))
    arrays = {n: np.empty((total, *shape), dtype) for n, (dtype, shape) in schema.items()}
    filled = dict.fromkeys(schema, 0)
    paths = dataset.shard_paths(split)
    records = files_lib.interleave_records(
        [paths[i] for i in chosen], compression=dataset.manifest.compression, shuffle_files=False, seed=None,
        cycle_length=None, read_buffer_bytes=read_buffer_bytes, deterministic=False,
    )
    spec = _parse_spec(list(schema))
    parsed = records.batch(16).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=AUTOTUNE)
    for batch in parsed.prefetch(AUTOTUNE).as_numpy_iterator():
        for i, episode_id in enumerate(batch["episode/id"].tolist()):
            at = offsets[episode_id] + int(batch["episode/start"][i])
            for n, (dtype, shape) in schema.items():
                values = np.frombuffer(batch[f"data/{n}"][i], dtype).reshape(-1, *shape)
                arrays[n][at : at + len(values)] = values
                filled[n] += len(values)
    for n, count in filled.items():
        if count != total:
            raise ValueError(
                f"{dataset.path}: split {split!r} feature {n!r} has {count} time steps in its shards, the manifest "
                f"says {total}; run `tfshard verify {dataset.path}`"
            )
    return arrays, lengths
