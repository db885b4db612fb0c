"""Everything that decides what a conversion writes: ``ConvertOptions``, and within it ``ImageOptions`` (how images
are validated and converted) and ``EpisodeOptions`` (how episodes are checked and cut). Pure: no TensorFlow, no I/O.

Each checks itself in ``__post_init__``; the workers (``ingest/images.py``, ``ingest/episodes.py``) only read them.
"""

from __future__ import annotations

import dataclasses

from ..format.names import COMPRESSIONS
from .holdout import Holdout
from .plan import DEFAULT_SHARD_BYTES, parse_size

ON_ERROR = (None, "skip", "fail")
DEFAULT_QUALITY = 95
DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own decompression-bomb threshold
ON_NAN = ("fail", "skip", "keep")
DEFAULT_MAX_RECORD_BYTES = 64 * 2**20
DEFAULT_MAX_EPISODE_BYTES = 2**30


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How images are validated and converted.

    Attributes:
      quality: JPEG quality (1-95) for converted images; passthrough JPEGs keep theirs.
      rgb: convert grayscale to 3-channel RGB (otherwise it stays 1-channel).
      max_side: resize so the longer side is at most this many pixels (None: never).
      max_pixels: reject images with more pixels than this (decompression bombs).
      validate: decode every image in full to catch truncation and corruption.
        JPEGs are decoded at 1/8 scale (libjpeg's DCT scaling), which still reads
        every entropy-coded byte, and any libjpeg warning about corrupt data
        rejects the file; off, only the header is read.
      labels_file: a CSV or JSON Lines file labelling each image (``ingest/labels.py``) instead of class folders;
        SRC may then be a flat folder.
      label_kind: ``"class"``, ``"multi"`` or ``"value"`` for the labels file's values; None decides from them.
    """

    quality: int = DEFAULT_QUALITY
    rgb: bool = False
    max_side: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    validate: bool = True
    labels_file: str | None = None
    label_kind: str | None = None

    def __post_init__(self):
        if self.label_kind not in (None, "class", "multi", "value"):
            raise ValueError(f"label_kind: must be 'class', 'multi', 'value' or None (got {self.label_kind!r})")
        if self.label_kind is not None and self.labels_file is None:
            raise ValueError(f"label_kind: only with a labels file (got label_kind={self.label_kind!r} and no "
                             "labels_file); pass --labels FILE, or drop --label-kind")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality: must be in [1, 100] (got {self.quality!r}); 95 keeps nearly all detail")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"max_side: must be a positive number of pixels (got {self.max_side!r}); "
                             "or leave it unset")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels: must be positive (got {self.max_pixels!r})")


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """How episodes are checked and cut.

    Attributes:
      on_nan: ``"fail"`` (default) stops at a NaN/inf, naming file and index;
        ``"skip"`` leaves the episode out with that reason; ``"keep"`` writes it.
      max_record_bytes: an episode larger than this is split into chunk records
        (whole time steps), joined again by the reader.
      max_episode_bytes: an episode whose arrays the headers declare larger than
        this is rejected before anything is loaded (a worker holds about two
        copies of one episode; a small compressed ``.npz`` can declare gigabytes).
      labels_file: a CSV of ``path,label`` rows (``ingest/labels.py``) giving each episode a label;
        episodes it names no label for are left out and counted. Wins over ``class_folders``.
      class_folders: label episodes by their folder when every episode file is one folder below its split
        root (``SRC/<class>/<ep>.npy``) and there are at least two such folders (``class_folder_labels``).
      label_kind: ``"class"`` or ``"value"`` for the labels file's values; None decides from them
        (``ingest/label_kinds.py``).
    """

    on_nan: str = "fail"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_episode_bytes: int = DEFAULT_MAX_EPISODE_BYTES
    labels_file: str | None = None
    class_folders: bool = True
    label_kind: str | None = None

    def __post_init__(self):
        if self.label_kind not in (None, "class", "value"):
            raise ValueError(f"label_kind: must be 'class', 'value' or None for episodes (got {self.label_kind!r}); "
                             "multi-label is for images")
        if self.label_kind is not None and self.labels_file is None:
            raise ValueError(f"label_kind: only with a labels file (got label_kind={self.label_kind!r} and no "
                             "labels_file); pass --labels FILE, or drop --label-kind")
        if self.on_nan not in ON_NAN:
            raise ValueError(f"on_nan: must be one of {ON_NAN} (got {self.on_nan!r})")
        for name in ("max_record_bytes", "max_episode_bytes"):  # byte counts, or sizes such as "64MiB"
            object.__setattr__(self, name, parse_size(getattr(self, name), name))




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
