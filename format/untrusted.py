"""``dataset.json`` validated field by field: the untrusted manifest believed only once every field is checked.

Nothing read from disk is believed until it is checked: any problem is one ``ManifestError`` naming the file and the
field's path (``splits['train'].shards[0].file``), the value, and the fix. Shard and index names must be plain
names tfshard writes (never a path), counts must be counts, and a split's totals must add up (readers rely on them).
Here: the top level, the features table, each split's shards, totals and episodes, and the split rule; the JSON
itself and its type checks are ``format/json_checks.py``, and the fields with rules of their own have their own
rooms: ``labels.py`` (label kinds, class names and counts), ``statistics.py``, ``duplicates.py``, ``appends.py``.

    from_json(text)  # Manifest, or ManifestError: dataset.json: field splits['train'].shards[0].file: ...
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

from .appends import check_appends
from .duplicates import check_duplicates
from .json_checks import SHA256, Checker, parse_json
from .labels import check_class_counts, check_labels, label_problem
from .manifest import (
    _DTYPES,
    EPISODE_DTYPES,
    FORMAT_VERSION,
    KINDS,
    SPLIT_TYPES,
    EpisodeInfo,
    EpisodeSplitInfo,
    ImageSplitInfo,
    Manifest,
    ShardInfo,
    SplitInfo,
    check_format_version,
    is_count,
    is_finite_number,
)
from .names import MANIFEST_NAME, MAX_SPLIT_CHARS, SPLIT_NAME, is_shard_name, shard_file_name, shard_generation
from .records import DATA_PREFIX, data_features
from .statistics import check_feature_statistics, check_pixel_statistics

_MANIFEST_KEYS = {f.name for f in dataclasses.fields(Manifest)}


def shard_from_dict(raw: Any, source: str, where: str = "shard", expected_file: str | None = None) -> ShardInfo:
    """A validated ``ShardInfo``: its file is a plain shard name (``expected_file`` when given), never a path."""
    check = Checker(source)
    check.keys(check.mapping(raw, where), where, {"file", "records", "bytes", "sha256"}, {"index_file", "index_sha256"})
    if not is_shard_name(raw["file"]) or (expected_file is not None and raw["file"] != expected_file):
        check.fail(f"{where}.file", f"must be {expected_file or 'a shard file name inside OUT'}", raw["file"])
    check.count(raw["records"], f"{where}.records")
    check.count(raw["bytes"], f"{where}.bytes")
    if not (isinstance(raw["sha256"], str) and SHA256.match(raw["sha256"])):
        check.fail(f"{where}.sha256", "must be 64 lowercase hex digits", raw["sha256"])
    index_file, index_sha256 = raw.get("index_file"), raw.get("index_sha256")
    if index_file is not None or index_sha256 is not None:
        expected_index = raw["file"].rsplit(".tfrecord", 1)[0] + ".idx"
        if index_file != expected_index:
            check.fail(f"{where}.index_file", f"must be {expected_index!r} or null", index_file)
        if not (isinstance(index_sha256, str) and SHA256.match(index_sha256)):
            check.fail(f"{where}.index_sha256", "must be 64 lowercase hex digits", index_sha256)
    return ShardInfo(**raw)


def _check_features(check: Checker, features: Any) -> None:
    for key, spec in check.mapping(features, "features").items():
        where = f"features[{key!r}]"
        check.keys(check.mapping(spec, where), where, {"dtype", "shape"}, {"description"})
        # raw episode data (data/<name>) is only ever a numpy dtype: 'float32' is a label's, no reader decodes it
        allowed = EPISODE_DTYPES if isinstance(key, str) and key.startswith(DATA_PREFIX) else _DTYPES
        if not (isinstance(spec["dtype"], str) and spec["dtype"] in allowed):
            check.fail(f"{where}.dtype", f"must be 'string', 'int64', 'float32' (a label) or a dtype the readers "
                       f"decode ({', '.join(sorted(EPISODE_DTYPES))})", spec["dtype"])
        shape = check.sequence(spec["shape"], f"{where}.shape")
        if shape == [-1] and not key.startswith(DATA_PREFIX):
            continue  # a list of any length (multi-label class indices)
        for i, dim in enumerate(shape):
            check.count(dim, f"{where}.shape[{i}]")


def _episodes_from(check: Checker, episodes: Any, where: str, shards: int, labels: str | None = None,
                   classes: int = 0) -> list[EpisodeInfo]:
    ids, parsed = set(), []
    for i, episode in enumerate(check.sequence(episodes, where)):
        at = f"{where}[{i}]"
        check.keys(check.mapping(episode, at), at, {"id", "source", "length", "shard"}, {"label"})
        problem = label_problem(episode.get("label"), labels, classes)
        if problem is not None:
            check.fail(f"{at}.label", problem, episode.get("label"))
        check.count(episode["id"], f"{at}.id")
        check.text(episode["source"], f"{at}.source")
        check.count(episode["length"], f"{at}.length", low=1)
        if check.count(episode["shard"], f"{at}.shard") >= shards:
            check.fail(f"{at}.shard", f"must be below the split's {shards} shards", episode["shard"])
        if episode["id"] in ids:
            check.fail(f"{at}.id", "appears twice", episode["id"])
        ids.add(episode["id"])
        parsed.append(EpisodeInfo(**episode))
    return parsed


def _split_totals(check: Checker, where: str, raw: dict, shards: list[ShardInfo]) -> None:
    # Readers take steps_per_epoch from the split's records: a total its own shards contradict is refused here.
    for total in ("records", "bytes"):
        held = sum(getattr(s, total) for s in shards)
        if raw[total] != held:
            check.fail(f"{where}.{total}", f"must equal the sum of its {len(shards)} shards' {total}, {held}",
                       raw[total])


MOST_INFLATED = 1032  # the most deflate (gzip) expands a byte to


def _check_episode_bytes(check: Checker, where: str, episodes: list[EpisodeInfo], shards: list[ShardInfo],
                         features: dict, compression: Any) -> None:
    """Each step of an episode is in its shard's records once, so a shard's bytes (gzip: inflated at most
    ``MOST_INFLATED``-fold) hold at least its episodes' steps of every feature: lengths past that lie, and a resident
    reader sizes its arrays by them before it reads a record (a length of 10**12 was numpy's MemoryError)."""
    step = sum(int(spec["dtype"][2:]) * math.prod(spec["shape"]) for spec in data_features(features).values())
    steps = [0] * len(shards)
    for episode in episodes:
        steps[episode.shard] += episode.length
    most = 1 if compression is None else MOST_INFLATED
    for i, (shard, held) in enumerate(zip(shards, steps)):
        if held * step > shard.bytes * most:
            check.fail(where, f"must give shard {i} ({shard.file}) no more steps than its {shard.bytes:,} bytes "
                              f"hold ({held:,} steps of {step:,} bytes)", held)


def _check_shard_names(check: Checker, where: str, split: str, files: list[str], compression: Any) -> None:
    """A split's shards in order: the conversion's ``i-of-n`` (generation 0), then each append's as its own
    ``i-of-n`` run, generations rising; every name the one ``shard_file_name`` gives its place."""
    generations = [shard_generation(f) for f in files]
    counts = collections.Counter(generations)
    first: dict[int, int] = {}
    for i, generation in enumerate(generations):
        if i and generation < generations[i - 1]:
            check.fail(f"{where}.shards[{i}].file", f"must come before the shards of generation {generations[i - 1]}",
                       files[i])
        index = i - first.setdefault(generation, i)
        expected = shard_file_name(split, index, counts[generation], "gzip" if compression == "gzip" else None,
                                   generation)
        if files[i] != expected:
            of = f" of generation {generation}" if generation else ""
            check.fail(f"{where}.shards[{i}].file",
                       f"must be shard {index} of {counts[generation]}{of} of split {split!r} ({expected})", files[i])


def _split_from_dict(check: Checker, name: str, raw: Any, compression: Any, kind: str, class_names: list[str],
                     consistency: bool = True, labels: str | None = None, features: dict | None = None) -> SplitInfo:
    where = f"splits[{name!r}]"
    split_type = SPLIT_TYPES[kind]
    own = {f.name for f in dataclasses.fields(split_type)}
    check.keys(check.mapping(raw, where), where, {"shards", "records", "bytes"}, own)
    shards = check.sequence(raw["shards"], f"{where}.shards")
    if not shards:
        check.fail(f"{where}.shards", "must list at least one shard", shards)
    parsed = [shard_from_dict(shard, check.source, f"{where}.shards[{i}]") for i, shard in enumerate(shards)]
    _check_shard_names(check, where, name, [info.file for info in parsed], compression)
    check.count(raw["records"], f"{where}.records")
    check.count(raw["bytes"], f"{where}.bytes")
    if consistency:
        _split_totals(check, where, raw, parsed)
    fields = {"shards": parsed, "records": raw["records"], "bytes": raw["bytes"]}
    if kind == "images":
        counts = check.mapping(raw.get("class_counts", {}), f"{where}.class_counts")
        check_class_counts(check, f"{where}.class_counts", counts, class_names, raw["records"], consistency, labels)
        check_pixel_statistics(check, where, raw, consistency)
        return ImageSplitInfo(**fields, class_counts=raw.get("class_counts", {}), pixel_mean=raw.get("pixel_mean"),
                              pixel_std=raw.get("pixel_std"))
    episodes = _episodes_from(check, raw.get("episodes"), f"{where}.episodes", len(parsed), labels,
                              len(class_names))
    if len(episodes) > raw["records"]:
        check.fail(f"{where}.episodes", f"lists more episodes than the split's {raw['records']} records",
                   len(episodes))
    if consistency:
        _check_episode_bytes(check, f"{where}.episodes", episodes, parsed, features, compression)
    check_feature_statistics(check, where, raw, features, consistency)
    return EpisodeSplitInfo(**fields, episodes=episodes, feature_mean=raw.get("feature_mean"),
                            feature_std=raw.get("feature_std"))


SPLIT_RULE_METHODS = ("hash", "stratified")


def _check_split_rule(check: Checker, rule: Any) -> None:
    """``split_rule``: null, or how held-out splits were decided (``ingest/holdout.py``)."""
    if rule is None:
        return
    check.keys(check.mapping(rule, "split_rule"), "split_rule", {"method", "seed", "from", "fractions"})
    if rule["method"] not in SPLIT_RULE_METHODS:
        check.fail("split_rule.method", f"must be one of {SPLIT_RULE_METHODS}", rule["method"])
    if not is_count(rule["seed"], 0, 2**63 - 1):
        check.fail("split_rule.seed", "must be a non-negative int64", rule["seed"])
    if not SPLIT_NAME.match(check.text(rule["from"], "split_rule.from")):
        check.fail("split_rule.from", "must be a split name (letters, digits or _)", rule["from"])
    fractions = check.mapping(rule["fractions"], "split_rule.fractions")
    for name, fraction in fractions.items():
        if not (isinstance(name, str) and SPLIT_NAME.match(name)) or not (
                is_finite_number(fraction) and 0 < fraction < 1):
            check.fail(f"split_rule.fractions[{name!r:.40}]", "must be a split name and a fraction in (0, 1)",
                       fraction)
    if sum(fractions.values()) >= 1:  # as ingest/holdout.py's Holdout: some of the split must be left
        check.fail("split_rule.fractions", "must add up to less than 1", fractions)


def manifest_from_dict(raw: Any, source: str = MANIFEST_NAME, consistency: bool = True) -> Manifest:
    """A validated ``Manifest`` from parsed JSON: every field's type, every shard name, every count that adds up.

    Args:
      raw: the parsed JSON.
      source: the file named in error messages.
      consistency: also check the fields against each other: each split's ``records`` and ``bytes`` are the sums
        of its shards', its ``class_counts`` name exactly the ``class_names`` and sum to its ``records``, and its
        statistics are ones a conversion can write (``format/statistics.py``). Readers need them; ``verify`` (which
        weighs them against the shards themselves, to name the field that lies) and ``--overwrite`` (which only
        needs the file list) pass False.

    Raises:
      ManifestError: the first field that is wrong, named with its path, e.g. ``splits['train'].shards[0].file``.
    """
    check = Checker(source)
    optional = {"format_version", "ignored_files", "labels", "label_columns", "split_rule", "duplicates", "appends",
                "rejected_unlisted", "inputs_sha256"}
    check.keys(check.mapping(raw, "(top level)"), "(top level)", _MANIFEST_KEYS - optional, optional)
    check_format_version(raw.get("format_version", FORMAT_VERSION), source)
    if raw["kind"] not in KINDS:
        check.fail("kind", f"must be one of {KINDS}", raw["kind"])
    check.text(raw["fingerprint"], "fingerprint")
    if raw["compression"] not in (None, "gzip"):
        check.fail("compression", "must be null or 'gzip'", raw["compression"])
    _check_features(check, raw["features"])
    seen: set[str] = set()
    for i, name in enumerate(check.sequence(raw["class_names"], "class_names")):
        check.text(name, f"class_names[{i}]")
        if consistency and name in seen:
            check.fail(f"class_names[{i}]", "names a class a second time", name)
        seen.add(name)
    labels = raw.get("labels")
    check_labels(check, labels, raw, consistency)
    _check_split_rule(check, raw.get("split_rule"))
    check.mapping(raw["options"], "options")
    for i, item in enumerate(check.sequence(raw["rejected"], "rejected")):
        check.keys(check.mapping(item, f"rejected[{i}]"), f"rejected[{i}]", {"path", "reason"})
        check.text(item["path"], f"rejected[{i}].path")
        check.text(item["reason"], f"rejected[{i}].reason")
    check.count(raw.get("rejected_unlisted", 0), "rejected_unlisted")
    for key, value in check.mapping(raw["ignored"], "ignored").items():
        check.count(value, f"ignored[{key!r}]")
    for i, path in enumerate(check.sequence(raw.get("ignored_files", []), "ignored_files")):
        check.text(path, f"ignored_files[{i}]")
    if raw.get("duplicates") is not None and raw["kind"] != "images":
        check.fail("duplicates", f"must be null for a {raw['kind']} dataset (image datasets only)", raw["duplicates"])
    check_duplicates(check, raw.get("duplicates"))
    inputs_sha256 = raw.get("inputs_sha256")
    if inputs_sha256 is not None and not (raw["kind"] == "images" and isinstance(inputs_sha256, str)
                                          and SHA256.match(inputs_sha256)):
        check.fail("inputs_sha256", "must be null, or for an images dataset 64 lowercase hex digits", inputs_sha256)
    splits = {}
    for name, split in check.mapping(raw["splits"], "splits").items():
        if not SPLIT_NAME.match(name):
            check.fail("splits", f"split names must be letters, digits or _, at most {MAX_SPLIT_CHARS}", name)
        splits[name] = _split_from_dict(check, name, split, raw["compression"], raw["kind"], raw["class_names"],
                                        consistency, labels, raw["features"])
    if raw.get("appends") and raw["kind"] != "images":
        check.fail("appends", f"must be empty for a {raw['kind']} dataset (image datasets only)", raw["appends"])
    check_appends(check, raw.get("appends", []), raw["class_names"],
                  sum(s.records for s in splits.values()) if consistency else None)
    return Manifest(**{**raw, "splits": splits})


def from_json(text: str | bytes, source: str = MANIFEST_NAME, consistency: bool = True) -> Manifest:
    """Parses and validates ``dataset.json`` text; ``source`` names the file in error messages.

    ``consistency``: see ``manifest_from_dict``.

    Raises:
      ManifestError (a ValueError): not valid JSON, or not a tfshard manifest of a supported version;
        the message names the field.
    """
    return manifest_from_dict(parse_json(text, source), source, consistency)
