"""``ConvertOptions``: everything that decides what a conversion writes. Pure: no TensorFlow, no I/O."""

from __future__ import annotations

import dataclasses

from ..format.names import COMPRESSIONS
from .episodes import EpisodeOptions
from .holdout import Holdout
from .images import ImageOptions
from .plan import DEFAULT_SHARD_BYTES, parse_size

ON_ERROR = (None, "skip", "fail")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides what a conversion writes.

    Attributes:
      shard_bytes: target shard size in bytes (planned from input file sizes), or a size such as ``"64MiB"``.
      num_shards: exact shards per split; wins over ``shard_bytes``.
      min_shards: at least this many shards per split (one per reader worker).
      compression: None or ``"gzip"``.
      seed: seed of the write-time shuffle of record order; None keeps sorted order.
      on_error: ``"skip"`` records a bad file in the manifest and goes on;
        ``"fail"`` stops at the first; None: the kind's default (images skip,
        episodes fail). Not part of the output's identity.
      index: also write DALI ``tfrecord2idx`` index files.
      image: how images are validated and converted (image datasets).
      episode: how episodes are checked and cut into records (episode datasets).
      holdout: the shares of ``train`` held out as ``val``/``test`` (``ingest/holdout.py``).
      dedupe: keep one copy of images whose source bytes are identical (image datasets; see
        ``ingest/duplicates.py`` for which copy is kept). Duplicates are reported either way.
    """

    shard_bytes: int = DEFAULT_SHARD_BYTES
    num_shards: int | None = None
    min_shards: int = 1
    compression: str | None = None
    seed: int | None = 0
    on_error: str | None = None
    index: bool = False
    image: ImageOptions = ImageOptions()
    episode: EpisodeOptions = EpisodeOptions()
    holdout: Holdout = Holdout()
    dedupe: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shard_bytes", parse_size(self.shard_bytes, "shard_bytes"))  # "64MiB" as the CLI takes
        if self.num_shards is not None and self.num_shards < 1:
            raise ValueError(f"num_shards: must be at least 1 (got {self.num_shards!r}); or leave it unset")
        if self.min_shards < 1:
            raise ValueError(f"min_shards: must be at least 1 (got {self.min_shards!r})")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression: must be one of {COMPRESSIONS} (got {self.compression!r})")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error: must be one of {ON_ERROR} (got {self.on_error!r})")
        if self.index and self.compression is not None:
            raise ValueError(
                f"index: DALI index files need uncompressed shards (got compression={self.compression!r}); "
                "drop --index or --compression"
            )

    def identity(self, kind: str) -> dict:
        """The options that change the written bytes of a ``kind`` dataset (``on_error`` never does).

        How inputs are labelled (``labels_file``, ``class_folders``, ``label_kind``) and split (``holdout``) is left
        out: the labels and the rule are part of the inputs' identity (the jobs' ``identity``, ``source_key``),
        wherever the labels file lies. ``dedupe`` is in only when on, so datasets converted before it existed keep
        their fingerprint.
        """
        other_kind = {"images": "episode", "episodes": "image"}[kind]
        left_out = ("on_error", other_kind, "holdout") + (() if self.dedupe else ("dedupe",))
        found = {k: v for k, v in dataclasses.asdict(self).items() if k not in left_out}
        if "episode" in found:
            found["episode"] = {k: v for k, v in found["episode"].items()
                                if k not in ("labels_file", "class_folders", "label_kind")}
        if "image" in found:
            found["image"] = {k: v for k, v in found["image"].items() if k not in ("labels_file", "label_kind")}
        return found
