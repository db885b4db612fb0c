"""The checked bulk load of a split's episodes into one array per feature, laid out for resident windows.

Shards are read in parallel, in any order: each chunk record is copied straight to its place in the arrays (the
episode's offset from the manifest's lengths + its start step), so nothing is sorted and no intermediate list of
episodes is kept; every chunk is checked against the manifest on the way (``_Placer``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from ...format.manifest import EpisodeInfo
from ...format.names import printable
from ...format.records import DATA_PREFIX, EPISODE_FEATURES, LABEL_KEY
from .. import bulk_read
from .. import files as files_lib
from ..arguments import DEFAULT_READ_BUFFER_BYTES
from ..episode_decode import feature_schema
from ..episodes import repair_hint
from ..options import quiet_options
from ..shard_cache.pipeline import ShardCacheArg
from ..windowing.starts import WindowSpec
from ..windowing.targets import label_array
from .layout import Concatenated, aligned_empty, pad_fill

AUTOTUNE = tf.data.AUTOTUNE
_LISTS = {"int64": "int64_list", "float32": "float_list", "string": "bytes_list"}
MAX_CHUNK_KEYS_BYTES = 1 << 16  # a chunk record's episode/* keys, label and their framing: ~200 bytes
MAX_FEATURE_FRAMING = 32  # the protobuf framing of one data/<name> feature around its key and bytes: at most ~26


class _Placer:
    """Copies chunk records straight to their place in the concatenated arrays, checking each against the manifest.

    The episodes are laid out as ``layout`` says (in its order; each episode's ``time_range`` slice after its
    history padding, then zeros to whole rows). The arrays are made with ``aligned_empty`` and only the padding is
    filled: every chunk must belong to an episode the manifest lists for the shards read, carry that episode's
    length (and label), lie inside it, hold ``steps`` rows of every feature and be seen once, and ``arrays()`` then
    checks that each episode's chunks tile it exactly, so a row that no chunk filled is never handed out.
    """

    def __init__(self, where: str, fix: str, episodes: list[EpisodeInfo], layout: Concatenated, schema: dict,
                 shards: Sequence[int], pad_value=0):
        self.where, self.fix, self.schema, self.shards = where, fix, schema, list(shards)
        spec, pad = layout.spec, layout.pad
        offsets = layout.offsets.tolist()
        # id -> (entry, where its slice starts in the arrays, its slice [lo, hi))
        self.episodes = {e.id: (e, offset + pad, *spec.bounds(e.length)) for e, offset in zip(episodes, offsets)}
        self.spans: dict[int, list[tuple[int, int]]] = {e.id: [] for e in episodes}
        self.seen: set[tuple[int, int]] = set()
        # each episode's label as its records hold it (int64 or float32), made once, not per chunk record
        labelled = [e for e in episodes if e.label is not None]
        self.labels = dict(zip([e.id for e in labelled], label_array([e.label for e in labelled]))) if labelled else {}
        self._arrays = {n: aligned_empty((layout.steps, *shape), dtype) for n, (dtype, shape) in schema.items()}
        fills = {n: pad_fill(pad_value, dtype, n, where) if pad else 0 for n, (dtype, _) in schema.items()}
        for (_, begin, lo, hi), next_start in zip(self.episodes.values(), offsets[1:] + [layout.steps]):
            for n, array in self._arrays.items():
                array[begin - pad : begin] = fills[n]
                array[begin + hi - lo : next_start] = 0
        self._row_bytes = {n: _row_bytes(dtype, shape) for n, (dtype, shape) in schema.items()}

    def most_record_bytes(self, record_schema: dict) -> int:
        """The most bytes a chunk record of these episodes can hold: a whole episode of the longest one's steps of
        every feature of ``record_schema`` (the manifest's, all of them: a record holds every feature, whichever
        ``features=`` the reader loads), each feature's key and framing, its source, and the episode's own keys
        (``MAX_CHUNK_KEYS_BYTES``). A longer record's length is refused unread: in a gzip shard, a forged one could
        otherwise inflate to gigabytes from a few megabytes."""
        longest = max((entry.length for entry, *_ in self.episodes.values()), default=0)
        source = max((len(entry.source.encode("utf-8", "surrogateescape")) for entry, *_ in self.episodes.values()),
                     default=0)
        data = longest * sum(_row_bytes(dtype, shape) for dtype, shape in record_schema.values())
        keys = sum(len(f"{DATA_PREFIX}{name}".encode("utf-8", "surrogateescape")) + MAX_FEATURE_FRAMING
                   for name in record_schema)
        return data + keys + source + MAX_CHUNK_KEYS_BYTES

    def _error(self, episode_id: int, source: str, problem: str) -> ValueError:
        return ValueError(f"{self.where}: episode {episode_id} ({source}): {problem}; {self.fix}")

    def place(self, record: dict) -> None:
        """``record``: one parsed chunk, ``episode/*`` as Python ints and bytes, ``data/<name>`` as bytes."""
        episode_id, chunk = record["episode/id"], record["episode/chunk"]
        start, steps, length = record["episode/start"], record["episode/steps"], record["episode/length"]
        if episode_id not in self.episodes:
            source = printable(record["episode/source"].decode("utf-8", "surrogateescape"))
            raise self._error(episode_id, source, f"not an episode the manifest lists for shards {self.shards} "
                                                  f"(got episode/id={episode_id})")
        entry, begin, lo, hi = self.episodes[episode_id]
        fail = lambda problem: self._error(episode_id, entry.source, problem)  # noqa: E731
        if (episode_id, chunk) in self.seen:
            raise fail(f"chunk {chunk} appears twice (got a second record with episode/chunk={chunk})")
        self.seen.add((episode_id, chunk))
        if length != entry.length:
            raise fail(f"its records say {length} steps, the manifest says {entry.length} "
                       f"(got episode/length={length})")
        if LABEL_KEY in record and record[LABEL_KEY] != self.labels.get(episode_id):
            raise fail(f"its records say label {record[LABEL_KEY]!r}, the manifest says {entry.label!r} "
                       f"(got episode/label={record[LABEL_KEY]!r})")
        if start < 0 or steps < 0 or start + steps > length:
            raise fail(f"chunk {chunk} lies outside the episode's {length} steps (got episode/start={start}, "
                       f"episode/steps={steps})")
        for n, (dtype, shape) in self.schema.items():
            raw = record[f"data/{n}"]
            if len(raw) != steps * self._row_bytes[n]:
                raise fail(f"chunk {chunk} feature {n!r} holds {len(raw)} bytes, not {steps} steps of "
                           f"{dtype.name}{list(shape)} (got {len(raw)} != {steps * self._row_bytes[n]})")
        first, last = max(start, lo), min(start + steps, hi)  # the part of the chunk inside the slice
        if first < last:
            at = begin + first - lo
            for n, (dtype, shape) in self.schema.items():
                values = np.frombuffer(record[f"data/{n}"], dtype).reshape(steps, *shape)
                self._arrays[n][at : at + last - first] = values[first - start : last - start]
        self.spans[episode_id].append((start, steps))

    def arrays(self) -> dict[str, np.ndarray]:
        """The filled arrays, once every episode's chunks tile its steps exactly (else a ValueError naming it)."""
        for episode_id, spans in self.spans.items():
            entry = self.episodes[episode_id][0]
            covered = 0
            for start, steps in sorted(spans):
                if start != covered:
                    problem = "overlap" if start < covered else "are covered by no chunk"
                    steps_ = f"{min(start, covered)}..{max(start, covered)}"
                    raise self._error(episode_id, entry.source,
                                      f"steps {steps_} {problem} (got chunks (start, steps) {sorted(spans)})")
                covered = start + steps
            if covered != entry.length:
                raise self._error(episode_id, entry.source, f"steps {covered}..{entry.length} are covered by "
                                                               f"no chunk (got chunks (start, steps) {sorted(spans)})")
        return self._arrays


def load_concatenated(
    dataset: files_lib.DatasetInfo,
    split: str,
    schema: dict[str, tuple[np.dtype, tuple[int, ...]]],
    *,
    shards: Sequence[int] | None = None,
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    row: int = 1,
    spec: WindowSpec | None = None,
    pad_value=0,
    labels: bool = False,
    shard_cache: ShardCacheArg | None = None,
) -> Concatenated:
    """The episodes of a split (or of some of its shards) laid end to end in source (episode id) order, as the
    windows of ``spec`` need them (``Concatenated``: each episode's ``time_range`` slice after its history padding
    of ``pad_value``, then zeros to whole rows of ``row`` steps); ``spec`` None: whole episodes.

    Shards are read in parallel, in any order: each chunk is copied straight to
    its place (episode offset from the manifest's lengths + its start step), so
    nothing is sorted and no intermediate list of episodes is kept. Only a slice's
    steps are copied: a ``time_range`` of 20% holds 20% of the data.

    ``labels``: also every episode's label from the manifest (each record's checked against it).
    ``shard_cache``: read the shards through a shard cache (``readers/shard_cache``).

    Raises:
      FileNotFoundError: a shard is missing.
      ValueError: a shard that is not a regular file or not the manifest's size, or a chunk record that
        disagrees with the manifest (see ``_Placer``), naming the episode.
    """
    spec = spec or WindowSpec(1)
    info = files_lib.split_info(dataset, split)
    chosen = range(len(info.shards)) if shards is None else sorted(set(shards))
    shards = files_lib.check_shards(dataset, split, list(chosen))
    wanted = set(chosen)
    episodes = sorted((e for e in info.episodes if e.shard in wanted), key=lambda e: e.id)
    layout = Concatenated({}, [e.length for e in episodes], [e.id for e in episodes], row, spec,
                          label_array([e.label for e in episodes]) if labels else None)
    placer = _Placer(f"{dataset.path}: split {split!r}", repair_hint(dataset.path), episodes, layout, schema, chosen,
                     pad_value)
    kinds = {**{key: spec["dtype"] for key, spec in EPISODE_FEATURES.items()},
             **{f"{DATA_PREFIX}{n}": "string" for n in schema}}
    if labels:
        kinds[LABEL_KEY] = dataset.manifest.features[LABEL_KEY]["dtype"]

    def place(record: bytes, source: str) -> None:
        placer.place(chunk_fields(record, kinds, source, placer.fix))

    session = (shard_cache or ShardCacheArg()).session(dataset.path, shards)
    compression = dataset.manifest.compression
    if session is None:  # read once, now: plain file reads, nothing to trace
        bulk_read.read_now(shards, place, compression=compression, fix=placer.fix,
                           most_record_bytes=placer.most_record_bytes(feature_schema(dataset)))
    else:  # through the shard cache's pipeline
        records = files_lib.interleave_records(
            shards, compression=compression, shuffle_files=False, seed=None, cycle_length=None,
            read_buffer_bytes=read_buffer_bytes, deterministic=False, shard_cache=session)
        for batch in records.batch(16).prefetch(AUTOTUNE).with_options(quiet_options()):
            for record in batch.numpy():
                place(record, f"{dataset.path}: split {split!r}")
    layout.arrays = placer.arrays()
    return layout


def _row_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """The bytes one step of a feature of ``dtype`` and trailing ``shape`` takes."""
    return dtype.itemsize * int(np.prod(shape, dtype=np.int64))


def chunk_fields(record: bytes, kinds: dict[str, str], source: str, fix: str) -> dict:
    """The values of one chunk record (a ``tf.train.Example`` of scalar features), ``{key: int, float or bytes}``
    for each key of ``kinds`` (``"int64"``, ``"float32"`` or ``"string"``), each exactly one value of its kind.

    Raises:
      ValueError: not an Example, or a key missing, of another kind or not one value, naming ``source``.
    """
    try:
        features = tf.train.Example.FromString(record).features.feature
    except DecodeError as e:
        raise ValueError(f"{source}: a record that is not a tf.train.Example ({e}); {fix}") from None
    fields = {}
    for key, kind in kinds.items():
        found = features[key] if key in features else None
        held = None if found is None else found.WhichOneof("kind")
        values = [] if held is None else getattr(found, held).value
        if held != _LISTS[kind] or len(values) != 1:
            got = "no such key" if found is None else f"{len(values)} {held} values" if held else "an empty feature"
            raise ValueError(f"{source}: a chunk record whose {key!r} is not one {kind} value (got {got}); {fix}")
        fields[key] = values[0]
    return fields
