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
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "dataset.json"

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


def from_json(text: str, source: str = MANIFEST_NAME) -> Manifest:
    """Parses ``dataset.json`` text; ``source`` names the file in error messages.

    Raises:
      ValueError: the text is not a tfshard manifest of a supported version.
    """
    try:
        raw = json.loads(text)
        splits = {
            name: SplitInfo(**{**split, "shards": [ShardInfo(**shard) for shard in split["shards"]]})
            for name, split in raw.pop("splits").items()
        }
        return Manifest(splits=splits, **raw)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{source}: not a tfshard manifest ({type(e).__name__}: {e}); rewrite the dataset with `tfshard images` or `tfshard episodes`"
        ) from e


def fingerprint(payload: Any) -> str:
    """A stable hash of a JSON-able description of the inputs and output-affecting options."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
