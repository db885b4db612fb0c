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
from typing import Any

from .errors import ManifestError
from .names import INDEX_NAME, MANIFEST_NAME, SHARD_NAME, SPLIT_NAME, is_output_name, is_shard_name  # noqa: F401
from .records import (  # noqa: F401  (the tables the manifest holds)
    EPISODE_FEATURES,
    IMAGE_FEATURES,
    IMAGE_LABEL_KINDS,
    episode_features,
    image_features,
)

FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 1 << 30  # checked before a manifest or state file is read into memory
KINDS = ("images", "episodes")
# What an episode dataset's labels are: "class" (an int index into class_names) or "value" (a float); None: none.
LABEL_KINDS = ("class", "value")
# Every episode data dtype the readers decode (tf.io.decode_raw, plus a bitcast for <u4/<u8), spelt as the
# writer spells it: little-endian, '|' for one byte. Plain strings, so the scan checks inputs against them without
# TensorFlow; anything else (float128 '<f16', complex256 '<c32', big-endian) converts but no reader can load.
EPISODE_DTYPES = frozenset({"|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8",
                            "<f2", "<f4", "<f8", "<c8", "<c16"})
_DTYPES = frozenset({"string", "int64", "float32"}) | EPISODE_DTYPES  # float32: a value label


def check_format_version(version: Any, source: str) -> None:
    """Raises ``ManifestError`` unless ``version`` is the one this tfshard reads and writes."""
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ManifestError(
            f"{source}: format_version {version!r} is not supported (this tfshard reads {FORMAT_VERSION}); "
            "upgrade tfshard or rewrite the dataset"
        )


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
class EpisodeInfo:
    """One episode of an episode split: its id, source file, length in steps, its shard's index in the split, and
    its label (an index into ``class_names`` or a float, as the manifest's ``labels`` says; None when unlabelled).

    A value label is the float32 the records hold, as a Python float, so the two agree exactly.
    """

    id: int
    source: str
    length: int
    shard: int
    label: int | float | None = None


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """What every split has: its shards in order and totals over them."""

    shards: list[ShardInfo]
    records: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class ImageSplitInfo(SplitInfo):
    """An image split: per-class counts and per-RGB-channel pixel statistics in [0, 1].

    ``class_counts``: images per class; with multi-label, the images holding each class (a count per class, so
    they may sum to more or less than ``records``); empty for value labels.

    The statistics are measured on the decode done for validation (1/8-scale for
    passthrough JPEGs, which leaves the mean exact and understates the std by the
    variance inside 8x8 blocks); None with ``validate=False``.
    """

    class_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    pixel_mean: list[float] | None = None
    pixel_std: list[float] | None = None


@dataclasses.dataclass(frozen=True)
class EpisodeSplitInfo(SplitInfo):
    """An episode split: every episode in record order, and per-feature statistics per trailing element."""

    episodes: list[EpisodeInfo] = dataclasses.field(default_factory=list)
    feature_mean: dict[str, list[float | None]] | None = None
    feature_std: dict[str, list[float | None]] | None = None

    @property
    def episode_lengths(self) -> list[int]:
        """Time steps of every episode in record order, so window counts are known without a data pass."""
        return [e.length for e in self.episodes]


SPLIT_TYPES = {"images": ImageSplitInfo, "episodes": EpisodeSplitInfo}


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The whole of ``dataset.json``."""

    kind: str
    fingerprint: str
    compression: str | None
    features: dict[str, Any]
    class_names: list[str]
    splits: dict[str, ImageSplitInfo | EpisodeSplitInfo]  # by kind
    options: dict[str, Any]
    rejected: list[dict[str, str]]
    ignored: dict[str, int]
    format_version: int = FORMAT_VERSION
    ignored_files: list[str] = dataclasses.field(default_factory=list)
    # Episodes: None (unlabelled), or one of LABEL_KINDS. Images: None (class folders), or one of IMAGE_LABEL_KINDS
    # (a labels file): "class" and None read alike; "multi" and "value" change the label key (records.image_features).
    labels: str | None = None
    label_columns: list[str] = dataclasses.field(default_factory=list)  # images, labels "value": the value columns
    split_rule: dict[str, Any] | None = None  # held-out splits decided at conversion (ingest/holdout.py), else None
    duplicates: dict[str, Any] | None = None  # images only: identical source images (``format/duplicates.py``)
    appends: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one per --append (format/appends.py)
    # Rejections left out of ``rejected``: a labels file's bad rows naming no input past the first 100 (only the
    # file's size bounds them), so a manifest stays small whatever the file claims.
    rejected_unlisted: int = 0
    # Images: the sha256 of the inputs.json written with this manifest, which --append believes only while its bytes
    # are these (a path renamed or a sha256 edited there would duplicate a record or drop a new image as a copy);
    # None for episodes and for a manifest written before it was recorded.
    inputs_sha256: str | None = None

    def __post_init__(self):
        check_format_version(self.format_version, MANIFEST_NAME)

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


def is_count(value: Any, low: int = 0, high: float = math.inf) -> bool:
    """An int (not a bool) in ``[low, high]``: what every count in a manifest or state file must be."""
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is finite: what every statistic in a manifest or state file must be."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def fingerprint(payload: Any) -> str:
    """A stable hash of a JSON-able description of the inputs and output-affecting options."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
