"""What ``tfshard verify`` reads in a shard's records: each record once, against what the manifest says of it.

``read_shard`` is the one pass per shard (``tools/shard_read.py``): it checks the CRCs and counts the records, and
weighs what the readers take from the manifest against the records: here, image labels within ``class_names`` and
named by their class text (and each record handed to ``tools/image_checks.py``); episode ids, lengths, chunks,
byte counts and feature sums in ``tools/episode_checks.py``. The ``Tally`` it fills is what a split's totals are
then checked against (``tools/split_checks.py``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format.records import LABEL_KEY, MULTI_LABEL_KEY, VALUE_KEY, episode_parse_spec, image_features_of, parse_spec
from .episode_checks import episode_problems, label_spec, step_bytes
from .shard_read import (
    LIES,
    REWRITE,
    ParsedShard,
    Tally,
    count_records,
    first_finding,
    first_unparseable,
    record_text,
)

LABEL, _TEXT = "image/class/label", "image/class/text"
ENCODED, FILENAME, HEIGHT, WIDTH = "image/encoded", "image/filename", "image/height", "image/width"
_CONTENT = (ENCODED, FILENAME, HEIGHT, WIDTH)  # what tools/image_checks.py weighs of each image record
_IMAGE_BATCH = 16  # image records parse with their JPEG bytes: a batch holds 16 of them at most


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


def _other_label_problems(parsed: ParsedShard, path: str, manifest, tally: Tally, add) -> list[str]:
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
                        f"record {index}, {values!r:.60}); {LIES}")
    if "range" in found:
        count, (index, text) = found["range"]
        problems.append(f"{path}: {count} of {parsed.count} records have {MULTI_LABEL_KEY} outside the manifest's "
                        f"{len(names)} class_names or out of order (first: record {index}, class text {text!r}); "
                        f"{LIES}")
    if "text" in found:
        count, (index, text) = found["text"]
        problems.append(f"{path}: {count} of {parsed.count} records hold an {_TEXT} that is not their classes' "
                        f"names joined by ; (first: record {index}, {text!r}); {LIES}")
    return problems


def _image_problems(parsed: ParsedShard, path: str, manifest, tally: Tally) -> list[str]:
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
                        f"{LIES}")
    if "text" in found:
        count, (index, label, text) = found["text"]
        problems.append(f"{path}: {count} of {parsed.count} records hold an {_TEXT} that is not class_names[label] "
                        f"(first: record {index}, label {label} says {text!r}, class_names[{label}] is "
                        f"{class_names[label]!r}); {LIES}")
    return problems + (content.problems(parsed.count) if content is not None else [])


def read_shard(path: str, shard: manifest_lib.ShardInfo, shard_index: int, split, manifest,
                tally: Tally, read_from: str | None = None) -> list[str]:
    """The one read of a shard: every record (TensorFlow checks both CRCs of each), parsed, counted and checked.

    The record checks are reported only for a shard read whole with its listed count (else that is the problem).
    ``read_from``: a local copy of ``path`` to read (a shard on a store TensorFlow cannot open); messages name
    ``path``.
    """
    read = path if read_from is None else read_from
    if manifest.kind == "images":
        spec, then = _image_parse(manifest)
        parsed = ParsedShard(read, manifest.compression, spec, _IMAGE_BATCH, then)
        problems = _image_problems(parsed, path, manifest, tally)
    else:
        spec = {**episode_parse_spec(step_bytes(manifest.features)), LABEL_KEY: label_spec(manifest.labels)}
        parsed = ParsedShard(read, manifest.compression, spec, 1)
        problems = episode_problems(parsed, path, shard_index, split, manifest, tally)
    tally.records += parsed.count
    if parsed.error is not None:
        tally.intact = False
        _, read_error = count_records(read, manifest.compression)  # only now: a damaged file, or a foreign record?
        if read_error is not None:
            return [f"{path}: unreadable record ({read_error}); {REWRITE}"]
        index, error = first_unparseable(read, manifest.compression, parsed.spec, parsed.count)
        return [f"{path}: record {index} is not a tfshard {manifest.kind} record ({error}); {LIES}"]
    if parsed.count != shard.records:
        tally.intact = False
        return [f"{path}: {parsed.count} records, manifest says {shard.records}; {REWRITE}"]
    return problems
