"""``tfshard verify``'s checks of a manifest's own fields once every shard of a split is read: the class names and
label keys, and each split's totals, class counts and feature statistics against what its records added up to
(the ``Tally``), so the records say which side lies.
"""

from __future__ import annotations

import math

import numpy as np

from ..format import manifest as manifest_lib
from ..format.records import DATA_PREFIX, LABEL_FEATURES, LABEL_KEY, data_features, image_features_of, same_keys
from ..format.statistics import STATISTICS_KINDS, feature_problems
from ..ingest.episodes import FeatureSums
from .shard_read import REWRITE, Tally

# Statistics are summed again in the converter's order (chunks into episodes, episodes into shards, shards into
# the split), so only the manifest's rounding to 7 significant digits (at most 5e-7 of a value) separates them:
_STATS_RTOL = 2e-6  # a last digit rounded the other way moves a value by up to 1e-6 of it (1.000001 vs 1.000000)
_STATS_ATOL = 1e-12  # of the element's root mean square: for a mean or std that rounds near zero


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
    """A split's totals and statistics against what its shards hold (``format/untrusted.py`` checks them
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
