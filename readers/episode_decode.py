"""An episode dataset's feature schema, and its chunk records joined and decoded: what ``readers.episodes``' two
paths (shards streamed in order, ``episodes.py``; episodes read by position, ``indexed/episodes.py``) share.

An episode is one record, or several chunk records written one after another in the same shard, joined here in
order (``join_chunks``). Feature bytes are raw little-endian, read with ``tf.io.decode_raw`` (no per-element
parsing). Each episode is checked against the manifest as it is decoded (``decode_episode``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from ..format.manifest import EpisodeInfo
from ..format.records import data_features
from . import files as files_lib
from .windowing.targets import LABEL, label_array

SOURCE = "source"  # the key with_source adds to each episode: its dataset's index in the reader's paths

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


def assert_that(condition: tf.Tensor, data: Sequence) -> tf.Operation:
    """``tf.debugging.Assert(condition, [message])``, the message ``data``'s parts (Python strings, numeric and string
    tensors) joined by spaces (none before one starting with ``;``, ``,`` or ``)``) in a few ops: each run of strings
    and numbers is one ``tf.strings.format`` (the strings in its template), string tensors are joined in as they are
    (``format`` would quote them, and Assert escape the quotes). An Assert's data of a constant per word and an
    ``as_string`` per number (or a number, whose Assert is guarded by a ``cond`` of two functions) was ~10 ops per
    check to trace for every pipeline."""
    pieces, template, inputs = [], "", []
    for k, part in enumerate(data):
        text = part if isinstance(part, str) else None
        template += "" if k == 0 or (text or "").startswith((";", ",", ")")) else " "
        if text is not None and PLACEHOLDER not in text:
            template += text
        elif text is None and part.dtype != tf.string:
            template, inputs = template + PLACEHOLDER, inputs + [part]
        else:  # a string tensor, or a string holding the placeholder: joined in as it is
            pieces += [tf.strings.format(template, inputs, summarize=16)] if template else []
            pieces.append(part)
            template, inputs = "", []
    pieces += [tf.strings.format(template, inputs, summarize=16)] if template else []
    return tf.debugging.Assert(condition, [pieces[0] if len(pieces) == 1 else tf.strings.join(pieces)])


PLACEHOLDER = "{}"  # tf.strings.format's; a string holding it is joined in as a tensor instead


def decode_feature(raw: tf.Tensor, dtype: np.dtype, shape: tuple[int, ...],
                   steps: tf.Tensor | None = None) -> tf.Tensor:
    """Raw little-endian bytes → ``[steps, *shape]`` of ``dtype`` (``steps`` needed when a step holds no value)."""
    twin = _RAW_TWIN.get(dtype)
    values = tf.io.decode_raw(raw, twin or tf.as_dtype(dtype), little_endian=True)
    if twin is not None:
        values = tf.bitcast(values, tf.as_dtype(dtype))
    return tf.reshape(values, [-1 if steps is None else steps, *shape])


def join_chunks(records: tf.data.Dataset, names: Sequence[str], with_label: bool = False,
                carry: Sequence[str] = (), parse: Callable | None = None) -> tf.data.Dataset:
    """Parsed chunk records, each episode's one after another → one ``(last, meta, joined)`` per episode, each
    feature's bytes joined in order (``last`` is always True: the flag the join filters on, left in place because a
    map to drop it would be one more function to set up for every shard read; ``decode_episode`` takes the triple).

    ``meta``: the episode's id, length and source (and label), from its last chunk record; and the record's keys
    ``carry`` as they are (what a reader put beside the parsed keys). ``parse``: records' elements → parsed records,
    run in the join's own function (a map of its own costs one more function).
    """
    meta_keys = ("id", "length", "source", "label") if with_label else ("id", "length", "source")
    empty = {n: tf.constant(b"") for n in names}

    def step(joined, record):
        record = record if parse is None else parse(record)
        first = tf.equal(record["episode/chunk"], 0)
        joined = {
            n: tf.strings.join([tf.where(first, tf.constant(b""), joined[n]), record[f"data/{n}"]]) for n in names
        }
        last = tf.equal(record["episode/chunk"], record["episode/chunks"] - 1)
        meta = {key: record[f"episode/{key}"] for key in meta_keys}
        meta.update({key: record[key] for key in carry})
        return joined, (last, meta, joined)

    return records.scan(empty, step).filter(lambda last, meta, joined: last)


def whole_record(names: Sequence[str], where: str, fix: str, with_label: bool = False,
                 parse: Callable | None = None) -> Callable:
    """A graph function: a record → ``join_chunks``' triple, for shards whose every episode is one record (the
    manifest counts as many records in them as episodes): no join, no copy of an episode's bytes, and it can run in
    the decode's own parallel map (``readers.episodes``: one function fewer). A record that is a chunk of a longer
    episode fails, naming it: the manifest's counts and the records disagree.
    """
    meta_keys = ("id", "length", "source", "label") if with_label else ("id", "length", "source")

    def whole(element):  # a serialized record (``parse`` parses it), or a parsed one
        record = element if parse is None else parse(element)
        chunk, chunks = record["episode/chunk"], record["episode/chunks"]
        check = assert_that(tf.logical_and(tf.equal(chunk, 0), tf.equal(chunks, 1)), [
            f"{where}: episode", record["episode/id"], record["episode/source"], "has a record of chunk", chunk, "of",
            chunks, f"where the manifest counts one record per episode; {fix}"])
        with tf.control_dependencies([check]):
            last = tf.constant(True)
        return last, {key: record[f"episode/{key}"] for key in meta_keys}, {n: record[f"data/{n}"] for n in names}

    return whole


def manifest_lookup(episodes: list[EpisodeInfo], label_dtype: tf.DType | None = None):
    """A graph function: an episode's ``meta`` → ``(length, label)`` the manifest lists for its id; length -1 for an
    id it does not list.

    Sorted constants and a binary search: they serialise with the graph (a tf.data service ships it to its workers).
    ``label_dtype``: the labels' dtype (None: the dataset has none; the label is then 0).
    """
    order = sorted(episodes, key=lambda e: e.id)
    dtype = label_dtype or tf.int64
    if not order:
        return lambda meta: (tf.constant(-1, tf.int64), tf.zeros([], dtype))
    ids = tf.constant([e.id for e in order], tf.int64)
    rows = tf.reshape(ids, [1, -1])  # LowerBound's sorted rows: one
    lengths = tf.constant([e.length for e in order], tf.int64)
    labels = tf.constant(label_array([e.label for e in order]) if label_dtype else np.zeros(len(order), np.int64))

    def lookup(meta):  # gathers and the raw search: a third of the ops of searchsorted and indexing
        episode_id = meta["id"]
        at = tf.raw_ops.LowerBound(sorted_inputs=rows, values=tf.reshape(episode_id, [1, 1]), out_type=tf.int32)
        i = tf.minimum(tf.gather_nd(at, [0, 0]), len(order) - 1)  # GatherNd: no T to set up (image_ops)
        listed = tf.equal(tf.gather(ids, i), episode_id)
        return tf.where(listed, tf.gather(lengths, i), tf.constant(-1, tf.int64)), tf.gather(labels, i)

    return lookup


def decode_episode(schema, where: str, fix: str, manifest_lookup, with_keys: bool = False,
                   with_label: bool = False, source_key: str | None = None):
    """Decodes a joined episode, checking its rows against its records' length and that length (and its label)
    against the manifest (``manifest_lookup(meta) -> (length, label)``).

    ``with_keys``: returns ``({"episode": id}, episode)``. ``with_label``: the episode gains ``"label"``.
    ``source_key``: the episode gains ``"source"``, ``meta[source_key]`` (a mixture's dataset index).
    """

    def decode(last, meta, joined):  # a join_chunks triple
        expected, label = manifest_lookup(meta)
        assert_that(
            tf.equal(meta["length"], expected),
            [f"{where}: episode", meta["id"], meta["source"], "has", meta["length"],
             "steps in its records, the manifest says (-1: it does not list this id)", expected, f"; {fix}"],
        )
        # A zero-width feature ([T, 0]) has no values to infer T from: give it the record's length.
        episode = {n: decode_feature(joined[n], *schema[n], meta["length"] if 0 in schema[n][1] else None)
                   for n in schema}
        for n, values in episode.items():  # Assert, not assert_equal: a tenth of the ops to set up per shard read
            rows = tf.gather(tf.shape(values, out_type=tf.int64), 0)  # no strided slice to set up
            assert_that(tf.equal(rows, meta["length"]), [
                f"{where}: feature {n!r} does not match the episode length (got", rows, "steps, the records say",
                meta["length"], f"); {fix}"])
        if with_label:
            assert_that(
                tf.equal(meta["label"], label),
                [f"{where}: episode", meta["id"], meta["source"], "has label", meta["label"],
                 "in its records, the manifest says", label, f"; {fix}"],
            )
            episode[LABEL] = meta["label"]
        if source_key is not None:
            episode[SOURCE] = meta[source_key]
        return ({"episode": meta["id"]}, episode) if with_keys else episode

    return decode


def repair_hint(path: str) -> str:
    """How to fix a dataset whose records disagree with its manifest."""
    return f"run `tfshard verify {path}`; rewrite the dataset with --overwrite"
