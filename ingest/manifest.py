"""``dataset.json``: what was written, as plain dataclasses and canonical JSON.

No TensorFlow, no file I/O: callers pass strings in and out, so the same code
serves local folders, ``gs://`` and tests. The JSON is canonical (sorted keys,
fixed float rounding, no timestamps) so an interrupted-then-resumed run writes
the very same bytes as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "dataset.json"
MAX_MANIFEST_BYTES = 1 << 30  # checked before a manifest or state file is read into memory
KINDS = ("images", "episodes")
SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord(?P<gz>\.gz)?$")
INDEX_NAME = re.compile(r"^[A-Za-z0-9_]+-\d{5}-of-\d{5}\.idx$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DTYPE = re.compile(r"^(string|int64|[<>|=][biufc]\d{1,2})$")

IMAGE_FEATURES = {
    "image/encoded": {"dtype": "string", "shape": [], "description": "JPEG bytes"},
    "image/format": {"dtype": "string", "shape": [], "description": "always 'jpeg'"},
    "image/height": {"dtype": "int64", "shape": []},
    "image/width": {"dtype": "int64", "shape": []},
    "image/channels": {"dtype": "int64", "shape": [], "description": "1 (grayscale) or 3 (RGB)"},
    "image/class/label": {"dtype": "int64", "shape": [], "description": "0-based index into class_names"},
    "image/class/text": {"dtype": "string", "shape": [], "description": "class name"},
    "image/filename": {"dtype": "string", "shape": [], "description": "path relative to the source folder"},
}

EPISODE_FEATURES = {
    "episode/id": {"dtype": "int64", "shape": [], "description": "position of the source file in sorted order"},
    "episode/length": {"dtype": "int64", "shape": [], "description": "time steps of the whole episode"},
    "episode/chunk": {"dtype": "int64", "shape": [], "description": "0-based index of this record's chunk"},
    "episode/chunks": {"dtype": "int64", "shape": [], "description": "records the episode was split into"},
    "episode/start": {"dtype": "int64", "shape": [], "description": "first time step of this chunk"},
    "episode/steps": {"dtype": "int64", "shape": [], "description": "time steps in this chunk"},
    "episode/source": {"dtype": "string", "shape": [], "description": "path relative to the source folder"},
}


def episode_features(schema: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, Any]:
    """``EPISODE_FEATURES`` plus one ``data/<name>`` entry per feature: numpy dtype string and trailing shape."""
    features = dict(EPISODE_FEATURES)
    for name, (dtype, shape) in sorted(schema.items()):
        features[f"data/{name}"] = {
            "dtype": dtype,
            "shape": list(shape),
            "description": f"raw little-endian bytes of [steps, {', '.join(map(str, shape))}]".replace(", ]", "]"),
        }
    return features


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One written shard, as recorded when it was committed."""

    file: str
    records: int
    bytes: int
    sha256: str
    index_file: str | None = None
    index_sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split: its shards in order and totals over them.

    Image splits fill ``class_counts`` and the pixel statistics; episode splits
    fill ``episodes`` and the per-feature statistics.

    ``pixel_mean``/``pixel_std`` are per RGB channel in [0, 1], measured on the
    decode done for validation (1/8-scale for passthrough JPEGs, which leaves the
    mean exact and understates the std by the variance inside 8x8 blocks).
    """

    shards: list[ShardInfo]
    records: int
    bytes: int
    class_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    pixel_mean: list[float] | None = None  # None with validate=False: no pixels were decoded
    pixel_std: list[float] | None = None
    episodes: list[dict[str, Any]] | None = None  # {"id", "source", "length", "shard"} in record order (episodes)
    feature_mean: dict[str, list[float]] | None = None  # per feature, per trailing element (flattened)
    feature_std: dict[str, list[float]] | None = None

    @property
    def episode_lengths(self) -> list[int]:
        """Time steps of every episode in record order, so window counts are known without a data pass."""
        return [e["length"] for e in self.episodes or []]


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The whole of ``dataset.json``."""

    kind: str
    fingerprint: str
    compression: str | None
    features: dict[str, Any]
    class_names: list[str]
    splits: dict[str, SplitInfo]
    options: dict[str, Any]
    rejected: list[dict[str, str]]
    ignored: dict[str, int]
    format_version: int = FORMAT_VERSION
    ignored_files: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.format_version != FORMAT_VERSION:
            raise ValueError(
                f"{MANIFEST_NAME}: format_version {self.format_version!r} is not supported (this tfshard reads "
                f"{FORMAT_VERSION}); upgrade tfshard or rewrite the dataset"
            )

    @property
    def total_records(self) -> int:
        return sum(s.records for s in self.splits.values())

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.splits.values())


def to_json(manifest: Manifest) -> str:
    """Canonical JSON text of a manifest (sorted keys, 2-space indent, trailing newline).

    ASCII-escaped, so file names that are not valid UTF-8 (kept as surrogates) survive the round trip.
    """
    return json.dumps(dataclasses.asdict(manifest), indent=2, sort_keys=True) + "\n"


class ManifestError(ValueError):
    """A manifest or state file that is not what tfshard wrote: the message names the file and the field."""


def is_shard_name(name: Any) -> bool:
    """A plain shard file name inside OUT (``train-00000-of-00004.tfrecord[.gz]``): no folder, no ``..``."""
    return isinstance(name, str) and SHARD_NAME.match(name) is not None


def is_output_name(name: Any) -> bool:
    """A file name tfshard writes in OUT: a shard, an index file or the manifest (never a path)."""
    return is_shard_name(name) or (isinstance(name, str) and INDEX_NAME.match(name) is not None) or name == MANIFEST_NAME


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
        raise ManifestError(f"{source}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); {_REWRITE}") from None


_REWRITE = "rewrite the dataset with `tfshard images|episodes SRC OUT --overwrite` (or remove OUT)"


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
        if value < low:
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
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                self.fail(f"{where}[{i}]", "must be a finite number", v)

    def keys(self, value: dict, where: str, required: set, optional: set = frozenset()) -> None:
        missing = sorted(required - set(value))
        unknown = sorted(set(value) - required - set(optional))
        if missing:
            self.fail(where, f"lacks {', '.join(missing)}", sorted(value))
        if unknown:
            self.fail(where, f"has unknown keys {', '.join(unknown)}", sorted(value))


_SHARD_KEYS = {f.name for f in dataclasses.fields(ShardInfo)}
_SPLIT_KEYS = {f.name for f in dataclasses.fields(SplitInfo)}
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
        if not (isinstance(spec["dtype"], str) and _DTYPE.match(spec["dtype"])):
            check.fail(f"{where}.dtype", "must be a numeric dtype such as '<f4', or 'string'/'int64'", spec["dtype"])
        for i, dim in enumerate(check.sequence(spec["shape"], f"{where}.shape")):
            check.count(dim, f"{where}.shape[{i}]")


def _check_episodes(check: _Checker, episodes: Any, where: str, shards: int) -> None:
    ids = set()
    for i, episode in enumerate(check.sequence(episodes, where)):
        at = f"{where}[{i}]"
        check.keys(check.mapping(episode, at), at, {"id", "source", "length", "shard"})
        check.count(episode["id"], f"{at}.id")
        check.text(episode["source"], f"{at}.source")
        check.count(episode["length"], f"{at}.length", low=1)
        if check.count(episode["shard"], f"{at}.shard") >= shards:
            check.fail(f"{at}.shard", f"must be below the split's {shards} shards", episode["shard"])
        if episode["id"] in ids:
            check.fail(f"{at}.id", "appears twice", episode["id"])
        ids.add(episode["id"])


def _split_from_dict(check: _Checker, name: str, raw: Any, compression: Any, kind: str) -> SplitInfo:
    where = f"splits[{name!r}]"
    check.keys(check.mapping(raw, where), where, {"shards", "records", "bytes"}, _SPLIT_KEYS)
    shards = check.sequence(raw["shards"], f"{where}.shards")
    if not shards:
        check.fail(f"{where}.shards", "must list at least one shard", shards)
    parsed = []
    for i, shard in enumerate(shards):
        at = f"{where}.shards[{i}]"
        info = shard_from_dict(shard, check.source, at)
        match = SHARD_NAME.match(info.file)
        expected = (name, i, len(shards), compression == "gzip")
        got = (match["split"], int(match["index"]), int(match["count"]), match["gz"] is not None)
        if got != expected:
            check.fail(f"{at}.file", f"must be shard {i} of {len(shards)} of split {name!r}", info.file)
        parsed.append(info)
    check.count(raw["records"], f"{where}.records")  # totals that disagree with the shards: `verify` names the shard
    check.count(raw["bytes"], f"{where}.bytes")
    for key, value in check.mapping(raw.get("class_counts", {}), f"{where}.class_counts").items():
        check.count(value, f"{where}.class_counts[{key!r}]")
    check.numbers(raw.get("pixel_mean"), f"{where}.pixel_mean")
    check.numbers(raw.get("pixel_std"), f"{where}.pixel_std")
    episodes = raw.get("episodes")
    if kind == "episodes" or episodes is not None:
        _check_episodes(check, episodes, f"{where}.episodes", len(parsed))
        if len(episodes) > raw["records"]:
            check.fail(f"{where}.episodes", f"lists more episodes than the split's {raw['records']} records",
                       len(episodes))
    for field in ("feature_mean", "feature_std"):
        if raw.get(field) is not None:
            for feature, values in check.mapping(raw[field], f"{where}.{field}").items():
                check.numbers(values, f"{where}.{field}[{feature!r}]")
    return SplitInfo(**{**raw, "shards": parsed})


def manifest_from_dict(raw: Any, source: str = MANIFEST_NAME) -> Manifest:
    """A validated ``Manifest`` from parsed JSON: every field's type, every shard name, every count that adds up.

    Raises:
      ManifestError: the first field that is wrong, named with its path, e.g. ``splits['train'].shards[0].file``.
    """
    check = _Checker(source)
    optional = {"format_version", "ignored_files"}
    check.keys(check.mapping(raw, "(top level)"), "(top level)", _MANIFEST_KEYS - optional, optional)
    version = raw.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ManifestError(
            f"{source}: format_version {version!r} is not supported (this tfshard reads {FORMAT_VERSION}); "
            "upgrade tfshard or rewrite the dataset"
        )
    if raw["kind"] not in KINDS:
        check.fail("kind", f"must be one of {KINDS}", raw["kind"])
    check.text(raw["fingerprint"], "fingerprint")
    if raw["compression"] not in (None, "gzip"):
        check.fail("compression", "must be null or 'gzip'", raw["compression"])
    _check_features(check, raw["features"])
    for i, name in enumerate(check.sequence(raw["class_names"], "class_names")):
        check.text(name, f"class_names[{i}]")
    check.mapping(raw["options"], "options")
    for i, item in enumerate(check.sequence(raw["rejected"], "rejected")):
        check.keys(check.mapping(item, f"rejected[{i}]"), f"rejected[{i}]", {"path", "reason"})
        check.text(item["path"], f"rejected[{i}].path")
        check.text(item["reason"], f"rejected[{i}].reason")
    for key, value in check.mapping(raw["ignored"], "ignored").items():
        check.count(value, f"ignored[{key!r}]")
    for i, path in enumerate(check.sequence(raw.get("ignored_files", []), "ignored_files")):
        check.text(path, f"ignored_files[{i}]")
    splits = {}
    for name, split in check.mapping(raw["splits"], "splits").items():
        if not SPLIT_NAME.match(name):
            check.fail("splits", "split names must be letters, digits or _", name)
        splits[name] = _split_from_dict(check, name, split, raw["compression"], raw["kind"])
    return Manifest(**{**raw, "splits": splits})


def from_json(text: str | bytes, source: str = MANIFEST_NAME) -> Manifest:
    """Parses and validates ``dataset.json`` text; ``source`` names the file in error messages.

    Raises:
      ManifestError (a ValueError): not valid JSON, or not a tfshard manifest of a supported version;
        the message names the field.
    """
    return manifest_from_dict(parse_json(text, source), source)


def fingerprint(payload: Any) -> str:
    """A stable hash of a JSON-able description of the inputs and output-affecting options."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
