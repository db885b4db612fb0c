"""``tfshard verify``'s checks of episode records, in the one read of each shard: every chunk record against the
manifest's episode entries (ids, sources, order, lengths, chunks, byte counts, labels), and each feature's bytes,
decoded with the manifest's dtype and shape, added to the sums its statistics are weighed against
(``tools/split_checks.py``).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from ..format import manifest as manifest_lib
from ..format.records import DATA_PREFIX, LABEL_KEY, data_features
from ..format.statistics import STATISTICS_KINDS
from ..ingest.episodes import FeatureSums, feature_sums
from .shard_read import LIES, ParsedShard, Tally, record_text


def step_bytes(features: dict) -> dict[str, int]:
    """Bytes per time step of each episode feature, by feature name."""
    return {name: int(np.dtype(spec["dtype"]).itemsize * int(np.prod(spec["shape"], dtype=np.int64)))
            for name, spec in data_features(features).items()}


def label_spec(labels: str | None):
    """``episode/label`` as the manifest's ``labels`` says; NaN when absent. Without labels it is read as float32:
    a label the manifest does not know is then a number (a float label) or a type error (an int64 one)."""
    if labels == "class":
        return tf.io.FixedLenFeature([], tf.int64, default_value=-1)
    return tf.io.FixedLenFeature([], tf.float32, default_value=math.nan)


def _label_problem(held, label, labels: str | None) -> str | None:
    """What a record's ``episode/label`` (``held``, parsed by ``label_spec``) says against the manifest's entry."""
    if labels is None:
        return None if math.isnan(held) else f"has a label ({float(held)!r}) in its records, the manifest has none"
    missing = held == -1 if labels == "class" else math.isnan(held)
    if missing:
        return f"has no {LABEL_KEY} in its records, the manifest says label {label!r}"
    expected = label if labels == "class" else np.float32(label)
    if label is None or held != expected:
        return f"has label {held.item()!r} in its records, the manifest says {label!r}"
    return None


def episode_problems(parsed: ParsedShard, path: str, shard_index: int, split: manifest_lib.EpisodeSplitInfo,
                     manifest, tally: Tally) -> list[str]:
    """Every chunk record of one episode shard against the manifest: ids, sources, order, lengths, chunk numbers,
    coverage, byte counts; each feature's bytes, decoded with the manifest's dtype, are added to its sums."""
    specs = data_features(manifest.features)
    bytes_per_step = step_bytes(manifest.features)
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
                            f"{LIES}")
            continue
        name = f"episode {episode_id} ({entry.source})"
        if length != entry.length:
            problems.append(f"{path}: {name} has {length} steps, the manifest says {entry.length}; {LIES}")
        label_problem = _label_problem(record[LABEL_KEY], entry.label, manifest.labels)
        if label_problem is not None and episode_id not in mislabelled:  # once per episode
            mislabelled.add(episode_id)
            problems.append(f"{path}: {name} {label_problem}; {LIES}")
        if record_text(record["episode/source"]) != entry.source and episode_id not in misnamed:  # once per episode
            misnamed.add(episode_id)
            problems.append(f"{path}: {name} comes from {record_text(record['episode/source'])!r} in its records, "
                            f"the manifest says {entry.source!r}; {LIES}")
        if start < 0 or steps < 1 or start + steps > length or covered.get(episode_id, 0) != start:
            problems.append(f"{path}: {name} chunk {chunk} covers steps "
                            f"[{start}, {start + steps}), not the next steps of the episode; {LIES}")
        seen, declared = chunks.get(episode_id, (0, of))
        if chunk != seen or of != declared:
            problems.append(f"{path}: {name} record {seen} of its chunks says chunk {chunk} of {of}; {LIES}")
        chunks[episode_id] = (seen + 1, declared)
        for feature, per_step in bytes_per_step.items():
            data = record[f"{DATA_PREFIX}{feature}"]
            if len(data) != steps * per_step:
                problems.append(f"{path}: {name} feature {feature!r} holds {len(data)} bytes, "
                                f"{steps} steps need {steps * per_step}; {LIES}")
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
                            f"of its {entry.length} steps in the shard; {LIES}")
        elif chunks[entry.id][0] != chunks[entry.id][1]:
            problems.append(f"{path}: episode {entry.id} ({entry.source}) is {chunks[entry.id][0]} records, its "
                            f"records say {chunks[entry.id][1]} chunks; {LIES}")
    if not problems and seen_order != [e.id for e in listed]:
        problems.append(f"{path}: episodes are not in the manifest's order; {LIES}")
    return problems[:20]
