"""Everything that decides what a conversion writes: ``ConvertOptions``, and within it ``ImageOptions`` (how images
are validated and converted) and ``EpisodeOptions`` (how episodes are checked and cut). Pure: no TensorFlow, no I/O.

Each checks itself in ``__post_init__``; the workers (``ingest/images.py``, ``ingest/episodes.py``) only read them.
"""

from __future__ import annotations

import dataclasses

from ..format.errors import OptionError
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
            raise OptionError("{label_kind}: must be 'class', 'multi', 'value' or None (got {got!r})",
                              got=self.label_kind)
        _label_kind_needs_labels(self.label_kind, self.labels_file)
        if not 1 <= self.quality <= 100:
            raise OptionError("{quality}: must be in [1, 100] (got {got!r}); 95 keeps nearly all detail",
                              got=self.quality)
        if self.max_side is not None and self.max_side < 1:
            raise OptionError("{max_side}: must be a positive number of pixels (got {got!r}); or leave it unset",
                              got=self.max_side)
        if self.max_pixels < 1:
            raise OptionError("{max_pixels}: must be positive (got {got!r})", got=self.max_pixels)


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
            raise OptionError("{label_kind}: must be 'class', 'value' or None for episodes (got {got!r}); multi-label "
                              "is for images", got=self.label_kind)
        _label_kind_needs_labels(self.label_kind, self.labels_file)
        if self.on_nan not in ON_NAN:
            raise OptionError("{on_nan}: must be one of {allowed} (got {got!r})", allowed=ON_NAN, got=self.on_nan)
        for name in ("max_record_bytes", "max_episode_bytes"):  # byte counts, or sizes such as "64MiB"
            object.__setattr__(self, name, _size(getattr(self, name), name))


def _label_kind_needs_labels(label_kind: str | None, labels: str | None) -> None:
    if label_kind is not None and labels is None:
        raise OptionError("{label_kind}: only with a labels file (got {got!r} and no {labels}); pass {labels} FILE, "
                          "or drop {label_kind}", got=label_kind)


def _size(value: int | str, name: str) -> int:
    """``parse_size``, its ValueError an ``OptionError`` naming the option as the caller spelled it."""
    try:
        return parse_size(value, name)
    except TypeError:
        raise
    except ValueError as e:
        rest = str(e)[len(name):].replace("{", "{{").replace("}", "}}")
        raise OptionError("{" + name + "}" + rest) from None


@dataclasses.dataclass(frozen=True)
class _ConvertFields:
    """ConvertOptions' fields, whose dataclass ``__init__`` ConvertOptions wraps to take its old names too."""

    shard_size: int | str = DEFAULT_SHARD_BYTES
    num_shards: int | None = None
    min_shards: int = 1
    compression: str | None = None
    seed: int | None = 0
    shuffle: bool = True
    on_error: str | None = None
    index: bool = False
    dedupe: bool = False
    labels: str | None = None
    label_kind: str | None = None
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    split_seed: int = 0
    stratify: bool = False
    quality: int = DEFAULT_QUALITY
    rgb: bool = False
    max_side: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS
    validate: bool = True
    on_nan: str = "fail"
    max_record_bytes: int | str = DEFAULT_MAX_RECORD_BYTES
    max_episode_bytes: int | str = DEFAULT_MAX_EPISODE_BYTES
    class_folders: bool = True

    def __post_init__(self):  # so the dataclass __init__ calls ConvertOptions' checks
        pass


_IMAGE = ("quality", "rgb", "max_side", "max_pixels", "validate")  # ImageOptions' fields besides the labels'
_EPISODE = ("on_nan", "max_record_bytes", "max_episode_bytes", "class_folders")


class ConvertOptions(_ConvertFields):
    """Everything that decides what a conversion writes, under the names of ``tfshard images``/``episodes``' flags
    (``--val-fraction`` is ``val_fraction``); ``convert_images`` and ``convert_episodes`` take the same names as
    keyword arguments and build one. Each is checked here, and an error names it (``OptionError``).

    Attributes:
      shard_size: target shard size in bytes (planned from input file sizes), or a size such as ``"64MiB"``.
      num_shards: exact shards per split; wins over ``shard_size``.
      min_shards: at least this many shards per split (one per reader worker).
      compression: None (or ``"none"``) or ``"gzip"``.
      seed: seed of the write-time shuffle of record order.
      shuffle: False keeps sorted order (``seed`` is then None).
      on_error: ``"skip"`` records a bad file in the manifest and goes on; ``"fail"`` stops at the first; None: the
        kind's default (images skip, episodes fail). Not part of the output's identity.
      index: also write DALI ``tfrecord2idx`` index files.
      dedupe: keep one copy of images whose source bytes are identical (image datasets; see
        ``ingest/duplicates.py`` for which copy is kept). Duplicates are reported either way.
      labels: a CSV or JSON Lines file labelling each input (``ingest/labels.py``) instead of class folders.
      label_kind: ``"class"``, ``"multi"`` (images) or ``"value"`` for the labels file's values; None decides.
      val_fraction, test_fraction: the shares of ``train`` held out as ``val`` and ``test`` (``ingest/holdout.py``).
      split_seed: the seed of the held-out splits' per-path hash.
      stratify: exact per-class held-out counts instead of the per-path hash (class labels only).
      quality, rgb, max_side, max_pixels, validate: how images are validated and converted (``ImageOptions``).
      on_nan, max_record_bytes, max_episode_bytes, class_folders: how episodes are checked, cut and labelled
        (``EpisodeOptions``).

    The names before these flags' still work: ``shard_bytes=`` (also read back as ``.shard_bytes``), and
    ``image=ImageOptions(...)``, ``episode=EpisodeOptions(...)``, ``holdout=Holdout(...)``, whose fields land in
    the flat ones (``.image``, ``.episode`` and ``.holdout`` rebuild them).

    Example:
      ConvertOptions(labels="train.csv", val_fraction=0.1).holdout  # Holdout(val_fraction=0.1, ...)
      ConvertOptions(shard_size="64MiB").shard_size  # 67108864
    """

    def __init__(self, *args, shard_bytes: int | str | None = None, image: ImageOptions | None = None,
                 episode: EpisodeOptions | None = None, holdout: Holdout | None = None, **fields):
        old = {} if shard_bytes is None else {"shard_size": shard_bytes}
        for given in (image, episode):
            if given is not None:
                old.update({name: getattr(given, name) for name in _IMAGE + _EPISODE if hasattr(given, name)},
                           labels=given.labels_file, label_kind=given.label_kind)
        if holdout is not None:
            old.update(val_fraction=holdout.val_fraction, test_fraction=holdout.test_fraction,
                       split_seed=holdout.seed, stratify=holdout.stratify)
        defaults = {field.name: field.default for field in dataclasses.fields(_ConvertFields)}
        old = {name: value for name, value in old.items() if value != defaults[name]}  # a default says nothing
        for name, value in old.items():
            if name in fields and fields[name] != value:
                raise OptionError("{" + name + "}: given twice, as {got!r} and in an older argument as {old!r}; give "
                                  "it once", got=fields[name], old=value)
        super().__init__(*args, **{**fields, **old})

    def __post_init__(self):
        object.__setattr__(self, "shard_size", _size(self.shard_size, "shard_size"))  # "64MiB" as the CLI takes
        if self.compression == "none":
            object.__setattr__(self, "compression", None)
        if self.seed is None or not self.shuffle:  # one meaning: sorted order
            object.__setattr__(self, "seed", None)
            object.__setattr__(self, "shuffle", False)
        if self.num_shards is not None and self.num_shards < 1:
            raise OptionError("{num_shards}: must be at least 1 (got {got!r}); or leave it unset", got=self.num_shards)
        if self.min_shards < 1:
            raise OptionError("{min_shards}: must be at least 1 (got {got!r})", got=self.min_shards)
        if self.compression not in COMPRESSIONS:
            raise OptionError("{compression}: must be one of {allowed} (got {got!r})", allowed=COMPRESSIONS,
                              got=self.compression)
        if self.on_error not in ON_ERROR:
            raise OptionError("{on_error}: must be one of {allowed} (got {got!r})", allowed=ON_ERROR, got=self.on_error)
        if self.index and self.compression is not None:
            raise OptionError("{index}: DALI index files need uncompressed shards (got {compression}={got!r}); drop "
                              "{index} or {compression}", got=self.compression)
        self.holdout  # noqa: B018 (each checks itself: an error names the option)
        self.image  # noqa: B018
        episode = EpisodeOptions(**{name: getattr(self, name) for name in _EPISODE})  # label_kind: by .episode
        for name in ("max_record_bytes", "max_episode_bytes"):
            object.__setattr__(self, name, getattr(episode, name))

    @property
    def shard_bytes(self) -> int:
        """``shard_size`` in bytes, under its older name."""
        return self.shard_size

    @property
    def holdout(self) -> Holdout:
        """The held-out splits asked for."""
        return Holdout(self.val_fraction, self.test_fraction, self.split_seed, self.stratify)

    @property
    def image(self) -> ImageOptions:
        """How an image conversion validates, converts and labels its inputs."""
        return ImageOptions(**{name: getattr(self, name) for name in _IMAGE}, labels_file=self.labels,
                            label_kind=self.label_kind)

    @property
    def episode(self) -> EpisodeOptions:
        """How an episode conversion checks, cuts and labels its inputs (a ``multi`` label kind refused here)."""
        return EpisodeOptions(**{name: getattr(self, name) for name in _EPISODE}, labels_file=self.labels,
                              label_kind=self.label_kind)

    def identity(self, kind: str) -> dict:
        """The options that change the written bytes of a ``kind`` dataset (``on_error`` never does), in the
        manifest's shape: ``shard_bytes``, then the kind's own options under ``image`` or ``episode``.

        How inputs are labelled (``labels``, ``class_folders``, ``label_kind``) and split (the held-out options) is
        left out: the labels and the rule are part of the inputs' identity (the jobs' ``identity``,
        ``source_key``), wherever the labels file lies. ``dedupe`` is in only when on, so datasets converted
        before it existed keep their fingerprint.
        """
        found = {"shard_bytes": self.shard_size, "num_shards": self.num_shards, "min_shards": self.min_shards,
                 "compression": self.compression, "seed": self.seed, "index": self.index}
        if kind == "images":
            found["image"] = {name: getattr(self, name) for name in _IMAGE}
        else:
            found["episode"] = {name: getattr(self, name) for name in _EPISODE if name != "class_folders"}
        return {**found, "dedupe": True} if self.dedupe else found


def options_of(options: ConvertOptions | None = None, **flags) -> ConvertOptions:
    """``options`` (default ``ConvertOptions()``) with each of ``flags`` that is not its field's default: what
    ``convert_images``/``convert_episodes`` build of their keyword arguments, and the CLI of its flags.

    Example:
      options_of(ConvertOptions(num_shards=4), val_fraction=0.1, num_shards=None)  # num_shards=4, val_fraction=0.1
    """
    defaults = {field.name: field.default for field in dataclasses.fields(ConvertOptions)}
    changed = {name: value for name, value in flags.items() if value != defaults[name]}
    if options is None:
        return ConvertOptions(**changed)
    return dataclasses.replace(options, **changed) if changed else options
