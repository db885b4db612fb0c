"""What ``tfshard verify`` reads in a shard's records: each record once, against what the manifest says of it.

One pass per shard checks the CRCs and counts the records (TensorFlow's reader), and weighs what the readers take
from the manifest against the records: image labels within ``class_names`` and named by their class text, episode
ids, lengths, chunks and byte counts, and each feature's statistics decoded with the manifest's dtype and shape
(a dtype edited from ``<f4`` to ``<i4`` keeps the byte counts, not the statistics). A ``Tally`` carries what a
split's totals are then checked against.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format.names import tf_compression_type
from ..format.records import (
    DATA_PREFIX,
    LABEL_FEATURES,
    LABEL_KEY,
    MULTI_LABEL_KEY,
    VALUE_KEY,
    data_features,
    episode_parse_spec,
    image_features_of,
    parse_spec,
    same_keys,
)
from ..format.statistics import STATISTICS_KINDS, feature_problems
from ..ingest.episodes import FeatureSums, feature_sums
from .report import short_tf_error

LABEL, _TEXT = "image/class/label", "image/class/text"
ENCODED, FILENAME, HEIGHT, WIDTH = "image/encoded", "image/filename", "image/height", "image/width"
_CONTENT = (ENCODED, FILENAME, HEIGHT, WIDTH)  # what tools/image_checks.py weighs of each image record
_IMAGE_BATCH = 16  # image records parse with their JPEG bytes: a batch holds 16 of them at most
REWRITE = "rerun the conversion with --overwrite to rewrite it"
_LIES = "the manifest does not describe this shard's records; rerun the conversion with --overwrite"
# Statistics are summed again in the converter's order (chunks into episodes, episodes into shards, shards into
# the split), so only the manifest's rounding to 7 significant digits (at most 5e-7 of a value) separates them:
_STATS_RTOL = 2e-6  # a last digit rounded the other way moves a value by up to 1e-6 of it (1.000001 vs 1.000000)
_STATS_ATOL = 1e-12  # of the element's root mean square: for a mean or std that rounds near zero


def _records(path: str, compression: str | None):
    return tf.data.TFRecordDataset(path, compression_type=tf_compression_type(compression))


def _count_records(path: str, compression: str | None) -> tuple[int, str | None]:
    """Reads every record (TensorFlow checks both CRCs of each); returns the count and any read error."""
    try:
        return int(_records(path, compression).reduce(0, lambda n, _: n + 1)), None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return 0, short_tf_error(e.message)


def _first_unparseable(path: str, compression: str | None, spec: dict, start: int) -> tuple[int, str]:
    """The first record from ``start`` on that does not parse with ``spec``, and why: run only after a batch failed,
    so it parses at most one batch, one record at a time."""
    for index, record in enumerate(_records(path, compression).skip(start), start):
        try:
            tf.io.parse_single_example(record, spec)
        except tf.errors.InvalidArgumentError as e:
            return index, short_tf_error(e.message)[:160]  # TensorFlow quotes the record: not all of it
    return start, "no longer fails"


def record_text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")  # as ingest/examples.py encodes names: non-UTF-8 ones round-trip


class _Parsed:
    """Every record of a shard parsed with ``spec``, in order, as dicts of numpy values: the one read of a shard.

    A read or parse error ends the iteration: ``error`` keeps it, ``count`` the records yielded before it (the
    failing record is in the next batch).
    """

    def __init__(self, path: str, compression: str | None, spec: dict, batch: int, then=None):
        self.path, self.compression, self.spec, self.batch, self.then = path, compression, spec, batch, then
        self.count, self.error = 0, None

    def __iter__(self):
        spec, then = self.spec, self.then or (lambda parsed: parsed)
        dataset = _records(self.path, self.compression).map(lambda r: then(tf.io.parse_single_example(r, spec)))
        try:
            for columns in dataset.batch(self.batch).as_numpy_iterator():
                for i in range(len(next(iter(columns.values())))):
                    self.count += 1
                    yield {key: values[i] for key, values in columns.items()}
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            self.error = short_tf_error(e.message)


@dataclasses.dataclass
class Tally:
    """What one split's shards hold, added up as they are read. Its totals are weighed against the split's only
    when every shard is ``intact`` (there, of its listed size and sha256, read whole with its listed count);
    otherwise the damaged shard's own problem is the evidence, and the totals are not second-guessed."""

    labels: list[int]
    intact: bool = True
    records: int = 0
    bytes: int = 0
    sums: dict[str, FeatureSums] = dataclasses.field(default_factory=dict)
    split: str = ""
    images: Any = None  # an image dataset's ImageChecks (tools/image_checks.py): each record is added to it


def first_finding(found: dict, key: str, value) -> None:
    """Counts a finding of kind ``key``, keeping the first one's details: one problem per kind per shard."""
    found.setdefault(key, [0, value])[0] += 1


def _multi_label_summary(classes: int):
    """A parsed multi-label record → its class indices as counts per class, and whether they were all in range
    and strictly increasing (as the converter writes them): fixed shapes, so the records batch."""
    def summary(parsed: dict) -> dict:
        indices = parsed[MULTI_LABEL_KEY].values
        in_range = tf.reduce_all((indices >= 0) & (indices < classes))
        ordered = tf.reduce_all(indices[1:] > indices[:-1])
        kept = tf.cast(tf.boolean_mask(indices, (indices >= 0) & (indices < classes)), tf.int32)
        hot = tf.math.bincount(kept, minlength=classes, maxlength=classes, dtype=tf.int64)
        return {"hot": hot, "valid": in_range & ordered, _TEXT: parsed[_TEXT], **{k: parsed[k] for k in _CONTENT}}
    return summary


def _image_parse(manifest) -> tuple[dict, object]:
    """The parse spec of what ``verify`` checks of an image record, and what to make of it (or None)."""
    labels = manifest.labels
    features = image_features_of(labels, manifest.label_columns)
    if labels == "multi":
        return (parse_spec(features, (MULTI_LABEL_KEY, _TEXT, *_CONTENT)),
                _multi_label_summary(len(manifest.class_names)))
    if labels == "value":
        return parse_spec(features, (VALUE_KEY, *_CONTENT)), None
    return parse_spec(features, (LABEL, _TEXT, *_CONTENT)), None


def _other_label_problems(parsed: _Parsed, path: str, manifest, tally: Tally, add) -> list[str]:
    """Multi-label records: in-range, increasing class indices named by their class text (counted per class);
    value records: finite values (the converter refuses NaN and inf)."""
    found: dict[str, list] = {}
    names = manifest.class_names
    for index, record in enumerate(parsed):
        if manifest.labels == "value":
            add(index, record, record[VALUE_KEY])
            if not np.isfinite(record[VALUE_KEY]).all():
                first_finding(found, "value", (index, record[VALUE_KEY].tolist()))
            continue
        hot, text = record["hot"], record_text(record[_TEXT])
        if not record["valid"]:
            add(index, record, None)
            first_finding(found, "range", (index, text))
            continue
        add(index, record, [names[i] for i in np.flatnonzero(hot)])
        for i in np.flatnonzero(hot):
            tally.labels[i] += 1
        if ";".join(names[i] for i in np.flatnonzero(hot)) != text:
            first_finding(found, "text", (index, text))
    problems = []
    if "value" in found:
        count, (index, values) = found["value"]
        problems.append(f"{path}: {count} of {parsed.count} records have a {VALUE_KEY} that is not finite (first: "
                        f"record {index}, {values!r:.60}); {_LIES}")
    if "range" in found:
        count, (index, text) = found["range"]
        problems.append(f"{path}: {count} of {parsed.count} records have {MULTI_LABEL_KEY} outside the manifest's "
                        f"{len(names)} class_names or out of order (first: record {index}, class text {text!r}); "
                        f"{_LIES}")
    if "text" in found:
        count, (index, text) = found["text"]
        problems.append(f"{path}: {count} of {parsed.count} records hold an {_TEXT} that is not their classes' "
                        f"names joined by ; (first: record {index}, {text!r}); {_LIES}")
    return problems


def _image_problems(parsed: _Parsed, path: str, manifest, tally: Tally) -> list[str]:
    """Each record's label must index ``class_names`` and name the record's own class text; labels are counted.
    Each record, with its label, is also added to ``tally.images`` (pixel sums, inputs.json)."""
    content = tally.images.shard(path, tally.split) if tally.images is not None else None
    add = content.add if content is not None else lambda index, record, label: None
    if manifest.labels in ("multi", "value"):
        problems = _other_label_problems(parsed, path, manifest, tally, add)
        return problems + (content.problems(parsed.count) if content is not None else [])
    class_names = manifest.class_names
    found: dict[str, list] = {}
    for index, record in enumerate(parsed):
        label, text = int(record[LABEL]), record_text(record[_TEXT])
        if not 0 <= label < len(class_names):
            add(index, record, None)
            first_finding(found, "range", (index, label, text))
            continue
        add(index, record, class_names[label])
        tally.labels[label] += 1
        if class_names[label] != text:
            first_finding(found, "text", (index, label, text))
    problems = []
    if "range" in found:
        count, (index, label, text) = found["range"]
        problems.append(f"{path}: {count} of {parsed.count} records have an {LABEL} past the manifest's "
                        f"{len(class_names)} class_names (first: record {index}, label {label}, class text {text!r}); "
                        f"{_LIES}")
    if "text" in found:
        count, (index, label, text) = found["text"]
        problems.append(f"{path}: {count} of {parsed.count} records hold an {_TEXT} that is not class_names[label] "
                        f"(first: record {index}, label {label} says {text!r}, class_names[{label}] is "
                        f"{class_names[label]!r}); {_LIES}")
    return problems + (content.problems(parsed.count) if content is not None else [])


def _step_bytes(features: dict) -> dict[str, int]:
    """Bytes per time step of each episode feature, by feature name."""
    return {name: int(np.dtype(spec["dtype"]).itemsize * int(np.prod(spec["shape"], dtype=np.int64)))
            for name, spec in data_features(features).items()}


def _episode_problems(parsed: _Parsed, path: str, shard_index: int, split: manifest_lib.EpisodeSplitInfo,
                      manifest, tally: Tally) -> list[str]:
    """Every chunk record of one episode shard against the manifest: ids, sources, order, lengths, chunk numbers,
    coverage, byte counts; each feature's bytes, decoded with the manifest's dtype, are added to its sums."""
    specs = data_features(manifest.features)
    step_bytes = _step_bytes(manifest.features)
    listed = [e for e in split.episodes if e.shard == shard_index]
    expected = {e.id: e for e in listed}
    problems, seen_order, covered, chunks, misnamed, mislabelled = [], [], {}, {}, set(), set()
    shard_sums: dict[str, FeatureSums] = {}
    episode_sums: dict[str, FeatureSums] = {}

    def add(into: dict, sums: dict) -> None:  # as the converter adds them up (FeatureSums' own __add__, in order)
        for feature, value in sums.items():
            into[feature] = into.get(feature, FeatureSums()) + value

    for record in parsed:
        episode_id, length = int(record["episode/id"]), int(record["episode/length"])
        if not seen_order or seen_order[-1] != episode_id:
            add(shard_sums, episode_sums)
            episode_sums = {}
        start, steps = int(record["episode/start"]), int(record["episode/steps"])
        chunk, of = int(record["episode/chunk"]), int(record["episode/chunks"])
        entry = expected.get(episode_id)
        if entry is None:
            problems.append(f"{path}: holds episode {episode_id}, which the manifest does not list in this shard; "
                            f"{_LIES}")
            continue
        name = f"episode {episode_id} ({entry.source})"
        if length != entry.length:
            problems.append(f"{path}: {name} has {length} steps, the manifest says {entry.length}; {_LIES}")
        label_problem = _label_problem(record[LABEL_KEY], entry.label, manifest.labels)
        if label_problem is not None and episode_id not in mislabelled:  # once per episode
            mislabelled.add(episode_id)
            problems.append(f"{path}: {name} {label_problem}; {_LIES}")
        if record_text(record["episode/source"]) != entry.source and episode_id not in misnamed:  # once per episode
            misnamed.add(episode_id)
            problems.append(f"{path}: {name} comes from {record_text(record['episode/source'])!r} in its records, "
                            f"the manifest says {entry.source!r}; {_LIES}")
        if start < 0 or steps < 1 or start + steps > length or covered.get(episode_id, 0) != start:
            problems.append(f"{path}: {name} chunk {chunk} covers steps "
                            f"[{start}, {start + steps}), not the next steps of the episode; {_LIES}")
        seen, declared = chunks.get(episode_id, (0, of))
        if chunk != seen or of != declared:
            problems.append(f"{path}: {name} record {seen} of its chunks says chunk {chunk} of {of}; {_LIES}")
        chunks[episode_id] = (seen + 1, declared)
        for feature, per_step in step_bytes.items():
            data = record[f"{DATA_PREFIX}{feature}"]
            if len(data) != steps * per_step:
                problems.append(f"{path}: {name} feature {feature!r} holds {len(data)} bytes, "
                                f"{steps} steps need {steps * per_step}; {_LIES}")
                tally.intact = False  # its statistics cannot be weighed
                continue
            dtype = np.dtype(specs[feature]["dtype"])
            if dtype.kind in STATISTICS_KINDS:
                sums, _ = feature_sums(np.frombuffer(data, dtype).reshape(steps, *specs[feature]["shape"]))
                add(episode_sums, {feature: sums})
        covered[episode_id] = start + steps
        if not seen_order or seen_order[-1] != episode_id:
            seen_order.append(episode_id)
    add(shard_sums, episode_sums)
    add(tally.sums, shard_sums)
    for entry in listed:
        if covered.get(entry.id, 0) != entry.length:
            problems.append(f"{path}: episode {entry.id} ({entry.source}) has {covered.get(entry.id, 0)} "
                            f"of its {entry.length} steps in the shard; {_LIES}")
        elif chunks[entry.id][0] != chunks[entry.id][1]:
            problems.append(f"{path}: episode {entry.id} ({entry.source}) is {chunks[entry.id][0]} records, its "
                            f"records say {chunks[entry.id][1]} chunks; {_LIES}")
    if not problems and seen_order != [e.id for e in listed]:
        problems.append(f"{path}: episodes are not in the manifest's order; {_LIES}")
    return problems[:20]


def _label_spec(labels: str | None):
    """``episode/label`` as the manifest's ``labels`` says; NaN when absent. Without labels it is read as float32:
    a label the manifest does not know is then a number (a float label) or a type error (an int64 one)."""
    if labels == "class":
        return tf.io.FixedLenFeature([], tf.int64, default_value=-1)
    return tf.io.FixedLenFeature([], tf.float32, default_value=math.nan)


def _label_problem(held, label, labels: str | None) -> str | None:
    """What a record's ``episode/label`` (``held``, parsed by ``_label_spec``) says against the manifest's entry."""
    if labels is None:
        return None if math.isnan(held) else f"has a label ({float(held)!r}) in its records, the manifest has none"
    missing = held == -1 if labels == "class" else math.isnan(held)
    if missing:
        return f"has no {LABEL_KEY} in its records, the manifest says label {label!r}"
    expected = label if labels == "class" else np.float32(label)
    if label is None or held != expected:
        return f"has label {held.item()!r} in its records, the manifest says {label!r}"
    return None


def read_shard(path: str, shard: manifest_lib.ShardInfo, shard_index: int, split, manifest,
                tally: Tally) -> list[str]:
    """The one read of a shard: every record (TensorFlow checks both CRCs of each), parsed, counted and checked.

    The record checks are reported only for a shard read whole with its listed count (else that is the problem).
    """
    if manifest.kind == "images":
        spec, then = _image_parse(manifest)
        parsed = _Parsed(path, manifest.compression, spec, _IMAGE_BATCH, then)
        problems = _image_problems(parsed, path, manifest, tally)
    else:
        spec = {**episode_parse_spec(_step_bytes(manifest.features)), LABEL_KEY: _label_spec(manifest.labels)}
        parsed = _Parsed(path, manifest.compression, spec, 1)
        problems = _episode_problems(parsed, path, shard_index, split, manifest, tally)
    tally.records += parsed.count
    if parsed.error is not None:
        tally.intact = False
        _, read_error = _count_records(path, manifest.compression)  # only now: a damaged file, or a foreign record?
        if read_error is not None:
            return [f"{path}: unreadable record ({read_error}); {REWRITE}"]
        index, error = _first_unparseable(path, manifest.compression, parsed.spec, parsed.count)
        return [f"{path}: record {index} is not a tfshard {manifest.kind} record ({error}); {_LIES}"]
    if parsed.count != shard.records:
        tally.intact = False
        return [f"{path}: {parsed.count} records, manifest says {shard.records}; {REWRITE}"]
    return problems


def _stats_differ(mean, std, their_mean, their_std) -> bool:
    """Recomputed statistics contradict the manifest's beyond its rounding; None (not finite: NaN/inf kept, or
    float64 overflow) must be None on both sides."""
    pairs = ((mean, their_mean), (std, their_std))
    if any((a is None) != (b is None) for a, b in pairs):
        return True
    scale = max(math.hypot(mean or 0.0, std or 0.0), math.hypot(their_mean or 0.0, their_std or 0.0))
    return any(a is not None and abs(a - b) > _STATS_RTOL * max(abs(a), abs(b)) + _STATS_ATOL * scale
               for a, b in pairs)


def _statistics_problems(where: str, split: manifest_lib.EpisodeSplitInfo, features: dict, tally: Tally) -> list[str]:
    """Each feature's per-element mean and std, recomputed from its record bytes decoded with the manifest's dtype
    and shape, against the manifest's: a dtype of the same item size keeps every byte count right, not these.
    Where the records could not be weighed (a damaged shard), or agree within the rounding, statistics no
    conversion writes are still named (``format/statistics.py``: what readers.normalization would divide by)."""
    means, stds = split.feature_mean or {}, split.feature_std or {}
    schema = data_features(features)
    problems = []
    for field, listed in (("feature_mean", means), ("feature_std", stds)):
        unknown = sorted(set(listed) - set(schema), key=str)
        if unknown:
            problems.append(f"{where}.{field}: lists statistics of {unknown!r:.80}, which the features table does "
                            f"not declare; {REWRITE}")
    for name, spec in sorted(schema.items()):
        flagged = len(problems)
        feature = f"features[{DATA_PREFIX + name!r}]"
        at = f"{where}.feature_mean[{name!r}]"
        their_mean, their_std = means.get(name), stds.get(name)
        width = math.prod(spec["shape"])
        if np.dtype(spec["dtype"]).kind not in STATISTICS_KINDS:
            if their_mean is not None or their_std is not None:
                problems.append(f"{at}: lists statistics of {feature}, whose dtype {spec['dtype']!r} tfshard keeps "
                                f"none of; the dtype or the statistics are wrong: {REWRITE}")
        elif split.records and (their_mean is None or their_std is None or len(their_mean) != width
                                or len(their_std) != width):
            shown = None if their_mean is None else len(their_mean)
            problems.append(f"{at}: must list {width} element(s) for {feature} of shape {spec['shape']} "
                            f"(got {shown!r}); {REWRITE}")
        elif split.records and tally.intact:
            mean, std = tally.sums.get(name, FeatureSums()).mean_std()
            differ = [i for i in range(width) if _stats_differ(mean[i], std[i], their_mean[i], their_std[i])]
            if differ:
                i = differ[0]
                problems.append(f"{at}: the records of {feature}, read as its dtype {spec['dtype']!r}, have mean "
                                f"{mean[i]!r} and std {std[i]!r} at element {i}, the manifest says {their_mean[i]!r} "
                                f"and {their_std[i]!r} ({len(differ)} of {width} element(s) differ); the dtype or the "
                                f"statistics are wrong: {REWRITE}")
        if len(problems) == flagged:
            problems += [f"{where}.{field}: {problem} (got {value!r:.80}); {REWRITE}" for field, problem, value
                         in feature_problems(name, spec["dtype"], spec["shape"], their_mean, their_std)]
    return problems


def labels_problems(manifest_path: str, manifest) -> list[str]:
    """Each class named once (readers refuse a name twice); the features table must declare ``episode/label`` as
    the manifest's ``labels`` says (and only then)."""
    problems = []
    twice = sorted({n for n in manifest.class_names if manifest.class_names.count(n) > 1})
    if twice:
        problems.append(f"{manifest_path}: field class_names: names a class a second time (got {twice!r:.80}); "
                        f"{REWRITE}")
    if manifest.kind == "images":
        if not same_keys(manifest.features, image_features_of(manifest.labels, manifest.label_columns)):
            problems.append(f"{manifest_path}: field features: not the record keys of {manifest.labels or 'class'} "
                            f"labels (got {sorted(manifest.features)!r:.120}); {REWRITE}")
        return problems
    declared = manifest.features.get(LABEL_KEY)
    labels = manifest.labels
    if labels is None and declared is not None:
        problems.append(f"{manifest_path}: field features[{LABEL_KEY!r}]: declared, but labels is null; {REWRITE}")
    elif labels is not None and (declared or {}).get("dtype") != LABEL_FEATURES[labels]["dtype"]:
        problems.append(f"{manifest_path}: field features[{LABEL_KEY!r}]: must be {LABEL_FEATURES[labels]['dtype']} "
                        f"for labels {labels!r} (got {declared!r:.80}); {REWRITE}")
    return problems


def split_problems(manifest_path: str, name: str, split, manifest, tally: Tally) -> list[str]:
    """A split's totals and statistics against what its shards hold (``untrusted.manifest_from_dict`` checks them
    against the shards' entries when readers load it; here the records say which side lies)."""
    where = f"{manifest_path}: field splits[{name!r}]"
    problems = []
    names = manifest.class_names
    if manifest.kind == "images" and set(split.class_counts) != set(names):
        problems.append(f"{where}.class_counts: names {sorted(split.class_counts)!r:.100}, class_names are "
                        f"{names!r:.100}; {REWRITE}")
    if manifest.kind == "episodes":
        problems += _statistics_problems(where, split, manifest.features, tally)
    if not tally.intact:
        return problems
    for total, held in (("records", tally.records), ("bytes", tally.bytes)):
        if getattr(split, total) != held:
            problems.append(f"{where}.{total}: {getattr(split, total)}, but its {len(split.shards)} shard(s) hold "
                            f"{held}; {REWRITE}")
    if manifest.kind == "images" and set(split.class_counts) == set(names):
        wrong = {n: (split.class_counts[n], held) for n, held in zip(names, tally.labels)
                 if split.class_counts[n] != held}
        if wrong:
            says = {n: c for n, (c, _) in wrong.items()}
            hold = {n: h for n, (_, h) in wrong.items()}
            problems.append(f"{where}.class_counts: say {says!r:.100}, the records' labels hold {hold!r:.100}; "
                            f"{REWRITE}")
    return problems
