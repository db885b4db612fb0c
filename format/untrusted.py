"""Reading untrusted JSON: ``dataset.json`` and the converter's state files, validated field by field.

Nothing read from disk is believed until it is checked: any problem is one ``ManifestError`` naming the file and the
field's path (``splits['train'].shards[0].file``), the value, and the fix. Shard and index names must be plain
names tfshard writes (never a path), counts must be counts, and a split's totals must add up (readers rely on them).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any

from . import statistics
from .appends import check_appends
from .duplicates import check_duplicates
from .errors import ManifestError
from .manifest import (
    _DTYPES,
    EPISODE_DTYPES,
    FORMAT_VERSION,
    KINDS,
    LABEL_KINDS,
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
from .names import MANIFEST_NAME, SPLIT_NAME, is_shard_name, shard_file_name, shard_generation
from .records import (
    DATA_PREFIX,
    IMAGE_LABEL_KINDS,
    LABEL_FEATURES,
    LABEL_KEY,
    data_features,
    image_features_of,
    same_keys,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

SHA256 = _SHA256  # for the format modules that check their own files (format/inputs.py)

_REWRITE = "rewrite the dataset with `tfshard images|episodes SRC OUT --overwrite` (or remove OUT)"
REWRITE = _REWRITE  # the fix every problem found here ends with (tools/image_checks.py words it for verify)


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON text of an untrusted file → Python values; any problem is one ``ManifestError`` naming ``source``."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise ManifestError(f"{source}: not UTF-8 text (byte {e.start}); {_REWRITE}") from None
    except RecursionError:
        raise ManifestError(f"{source}: JSON nested too deeply to be a tfshard file; {_REWRITE}") from None
    except json.JSONDecodeError as e:
        where = f"{e.msg} at line {e.lineno} column {e.colno}"
        raise ManifestError(f"{source}: not valid JSON ({where}); {_REWRITE}") from None


class _Checker:
    """Type checks of untrusted JSON, each failing with the file and the field's path in the message."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, problem: str, value: Any = None) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ManifestError(f"{self.source}: field {where}: {problem} (got {shown}); {_REWRITE}")

    def of(self, value: Any, types, where: str, what: str) -> Any:
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            self.fail(where, f"must be {what}", value)
        if not isinstance(value, types):
            self.fail(where, f"must be {what}", value)
        return value

    def count(self, value: Any, where: str, low: int = 0) -> int:
        self.of(value, int, where, "an integer")
        if not is_count(value, low):
            self.fail(where, f"must be at least {low}", value)
        return value

    def text(self, value: Any, where: str) -> str:
        return self.of(value, str, where, "a string")

    def mapping(self, value: Any, where: str) -> dict:
        return self.of(value, dict, where, "an object")

    def sequence(self, value: Any, where: str) -> list:
        return self.of(value, list, where, "a list")

    def numbers(self, value: Any, where: str, nullable: bool = True) -> None:
        if value is None and nullable:
            return
        for i, v in enumerate(self.sequence(value, where)):
            if v is None and nullable:
                continue
            if not is_finite_number(v):
                self.fail(f"{where}[{i}]", "must be a finite number", v)

    def keys(self, value: dict, where: str, required: set, optional: set = frozenset()) -> None:
        missing = sorted(required - set(value))
        unknown = sorted(set(value) - required - set(optional))
        if missing:
            self.fail(where, f"lacks {', '.join(missing)}", sorted(value))
        if unknown:
            self.fail(where, f"has unknown keys {', '.join(unknown)}", sorted(value))


Checker = _Checker  # for the format modules that check their own files (format/inputs.py)

_MANIFEST_KEYS = {f.name for f in dataclasses.fields(Manifest)}


def shard_from_dict(raw: Any, source: str, where: str = "shard", expected_file: str | None = None) -> ShardInfo:
    """A validated ``ShardInfo``: its file is a plain shard name (``expected_file`` when given), never a path."""
    check = _Checker(source)
    check.keys(check.mapping(raw, where), where, {"file", "records", "bytes", "sha256"}, {"index_file", "index_sha256"})
    if not is_shard_name(raw["file"]) or (expected_file is not None and raw["file"] != expected_file):
        check.fail(f"{where}.file", f"must be {expected_file or 'a shard file name inside OUT'}", raw["file"])
    check.count(raw["records"], f"{where}.records")
    check.count(raw["bytes"], f"{where}.bytes")
    if not (isinstance(raw["sha256"], str) and _SHA256.match(raw["sha256"])):
        check.fail(f"{where}.sha256", "must be 64 lowercase hex digits", raw["sha256"])
    index_file, index_sha256 = raw.get("index_file"), raw.get("index_sha256")
    if index_file is not None or index_sha256 is not None:
        expected_index = raw["file"].rsplit(".tfrecord", 1)[0] + ".idx"
        if index_file != expected_index:
            check.fail(f"{where}.index_file", f"must be {expected_index!r} or null", index_file)
        if not (isinstance(index_sha256, str) and _SHA256.match(index_sha256)):
            check.fail(f"{where}.index_sha256", "must be 64 lowercase hex digits", index_sha256)
    return ShardInfo(**raw)


def _check_features(check: _Checker, features: Any) -> None:
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


def label_problem(label: Any, labels: str | None, classes: int) -> str | None:
    """What is wrong with an episode's ``label`` given the manifest's ``labels``, or None: it must be None without
    labels, an index into the ``classes`` class names for ``"class"``, a finite number for ``"value"``."""
    if labels is None and label is not None:
        return "must be null: the dataset has no labels (labels is null)"
    if labels == "class" and not is_count(label, 0, classes - 1):
        return f"must be an index into the {classes} class_names (labels is 'class')"
    if labels == "value" and not is_finite_number(label):
        return "must be a finite number (labels is 'value')"
    return None


def _episodes_from(check: _Checker, episodes: Any, where: str, shards: int, labels: str | None = None,
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


def _split_totals(check: _Checker, where: str, raw: dict, shards: list[ShardInfo]) -> None:
    # Readers take steps_per_epoch from the split's records: a total its own shards contradict is refused here.
    for total in ("records", "bytes"):
        held = sum(getattr(s, total) for s in shards)
        if raw[total] != held:
            check.fail(f"{where}.{total}", f"must equal the sum of its {len(shards)} shards' {total}, {held}",
                       raw[total])


def _class_counts(check: _Checker, where: str, counts: dict, class_names: list[str], records: int,
                  consistency: bool, labels: str | None = None) -> None:
    for key, value in counts.items():
        check.count(value, f"{where}[{key!r}]")
        if labels == "multi" and value > records:
            check.fail(f"{where}[{key!r}]", f"must be at most the split's {records} records", value)
    if not consistency:
        return
    if labels == "value":
        if counts:
            check.fail(where, "must be empty: value labels have no classes", sorted(counts)[:3])
        return
    if set(counts) != set(class_names):
        missing, extra = sorted(set(class_names) - set(counts)), sorted(set(counts) - set(class_names))
        check.fail(where, f"must name exactly the class_names (lacks {missing[:3]!r}, names {extra[:3]!r} "
                   "that are not classes)", sorted(counts))
    if labels != "multi" and sum(counts.values()) != records:  # multi-label: an image counts in each of its classes
        check.fail(where, f"must sum to the split's {records} records", sum(counts.values()))


def _check_shard_names(check: _Checker, where: str, split: str, files: list[str], compression: Any) -> None:
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


def _pixel_statistics(check: _Checker, where: str, raw: dict, consistency: bool) -> None:
    """``pixel_mean`` and ``pixel_std``: null (not measured), or three finite numbers each; with ``consistency``,
    both or neither, and values a conversion can write (``format/statistics.py``: what ``readers.normalization``
    divides by)."""
    for field in ("pixel_mean", "pixel_std"):
        values = raw.get(field)
        if values is not None and (len(check.sequence(values, f"{where}.{field}")) != 3
                                   or not all(map(is_finite_number, values))):
            check.fail(f"{where}.{field}", "must be null or 3 finite numbers (R, G, B)", values)
    mean, std = raw.get("pixel_mean"), raw.get("pixel_std")
    if not consistency or (mean is None and std is None):
        return
    if mean is None or std is None:
        check.fail(f"{where}.pixel_mean", "must be null exactly when pixel_std is (both measured, or neither)", mean)
    for field, problem, value in statistics.pixel_problems(mean, std):
        check.fail(f"{where}.{field}", problem, value)


def _feature_statistics(check: _Checker, where: str, raw: dict, features: dict, consistency: bool) -> None:
    """``feature_mean`` and ``feature_std``: null, or per feature null or a list of finite numbers or nulls; with
    ``consistency``, the same features in both, each a feature of the table, with values a conversion can write
    for its dtype and shape (``format/statistics.py``)."""
    for field in ("feature_mean", "feature_std"):
        if raw.get(field) is not None:
            for feature, values in check.mapping(raw[field], f"{where}.{field}").items():
                check.numbers(values, f"{where}.{field}[{feature!r}]")
    mean, std = raw.get("feature_mean") or {}, raw.get("feature_std") or {}
    if not consistency:
        return
    schema = data_features(features)
    for field, listed in (("feature_mean", mean), ("feature_std", std)):
        unknown = sorted(set(listed) - set(schema), key=str)
        if unknown:
            check.fail(f"{where}.{field}", f"must name only features of the table ({sorted(schema)!r:.80})", unknown)
    if set(mean) != set(std):
        check.fail(f"{where}.feature_std", f"must name the features feature_mean names ({sorted(mean)!r:.80})",
                   sorted(std))
    for name in sorted(mean):
        spec = schema[name]
        for field, problem, value in statistics.feature_problems(name, spec["dtype"], spec["shape"], mean[name],
                                                                 std[name]):
            check.fail(f"{where}.{field}", problem, value)


def _split_from_dict(check: _Checker, name: str, raw: Any, compression: Any, kind: str, class_names: list[str],
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
        _class_counts(check, f"{where}.class_counts", counts, class_names, raw["records"], consistency, labels)
        _pixel_statistics(check, where, raw, consistency)
        return ImageSplitInfo(**fields, class_counts=raw.get("class_counts", {}), pixel_mean=raw.get("pixel_mean"),
                              pixel_std=raw.get("pixel_std"))
    episodes = _episodes_from(check, raw.get("episodes"), f"{where}.episodes", len(parsed), labels,
                              len(class_names))
    if len(episodes) > raw["records"]:
        check.fail(f"{where}.episodes", f"lists more episodes than the split's {raw['records']} records",
                   len(episodes))
    _feature_statistics(check, where, raw, features, consistency)
    return EpisodeSplitInfo(**fields, episodes=episodes, feature_mean=raw.get("feature_mean"),
                            feature_std=raw.get("feature_std"))


def _check_image_labels(check: _Checker, labels: Any, raw: dict, consistency: bool) -> None:
    """An image dataset's ``labels``: null (class folders) or one of ``IMAGE_LABEL_KINDS``, with class names except
    for ``"value"``, ``label_columns`` only for ``"value"``, and the kind's record keys in ``features``."""
    if labels is not None and (not isinstance(labels, str) or labels not in IMAGE_LABEL_KINDS):
        check.fail("labels", f"must be null or one of {IMAGE_LABEL_KINDS} for an images dataset", labels)
    columns = check.sequence(raw.get("label_columns", []), "label_columns")
    named: set[str] = set()
    for i, name in enumerate(columns):
        check.text(name, f"label_columns[{i}]")
        if name in named:
            check.fail(f"label_columns[{i}]", "names a column a second time", name)
        named.add(name)
    if (labels == "value") != bool(columns):
        check.fail("label_columns", "must name the value columns (labels is 'value')" if labels == "value" else
                   f"must be empty: only value labels have columns (labels is {labels!r})", columns)
    if (labels != "value") != bool(raw["class_names"]):
        check.fail("class_names", "must be empty: value labels have no classes" if labels == "value" else
                   "must name the classes", raw["class_names"])
    if consistency:
        expected = image_features_of(labels, columns)
        features = raw["features"]
        if not same_keys(features, expected):
            check.fail("features", f"must be the record keys of {labels or 'class'} labels "
                       f"({', '.join(sorted(expected))})", sorted(features))


def _check_labels(check: _Checker, labels: Any, raw: dict, consistency: bool) -> None:
    """``labels``: null, or for episodes ``"class"`` (with class_names) or ``"value"`` (without); its features key."""
    if raw["kind"] == "images":
        _check_image_labels(check, labels, raw, consistency)
        return
    if labels is not None and (not isinstance(labels, str) or labels not in LABEL_KINDS):
        check.fail("labels", f"must be null or one of {LABEL_KINDS}", labels)
    if raw.get("label_columns"):
        check.fail("label_columns", "must be empty for an episodes dataset (its labels have one value)",
                   raw["label_columns"])
    if raw["kind"] == "episodes" and (labels == "class") != bool(raw["class_names"]):
        need = "must name the classes (labels is 'class')" if labels == "class" else \
            f"must be empty: an episode dataset has class names only with labels 'class' (labels is {labels!r})"
        check.fail("class_names", need, raw["class_names"])
    if not consistency:
        return
    features = raw["features"]
    if labels is None and LABEL_KEY in features:
        check.fail(f"features[{LABEL_KEY!r}]", "must be absent: the dataset has no labels (labels is null)",
                   features[LABEL_KEY])
    if labels is not None and features.get(LABEL_KEY, {}).get("dtype") != LABEL_FEATURES[labels]["dtype"]:
        check.fail(f"features[{LABEL_KEY!r}]", f"must be a {LABEL_FEATURES[labels]['dtype']} feature "
                   f"(labels is {labels!r})", features.get(LABEL_KEY))


SPLIT_RULE_METHODS = ("hash", "stratified")


def _check_split_rule(check: _Checker, rule: Any) -> None:
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
    check = _Checker(source)
    optional = {"format_version", "ignored_files", "labels", "label_columns", "split_rule", "duplicates", "appends",
                "rejected_unlisted"}
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
    _check_labels(check, labels, raw, consistency)
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
    splits = {}
    for name, split in check.mapping(raw["splits"], "splits").items():
        if not SPLIT_NAME.match(name):
            check.fail("splits", "split names must be letters, digits or _", name)
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
