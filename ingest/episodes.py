"""Numpy episodes (``.npy`` / ``.npz``, time on axis 0) → the bytes of episode records.

Pure numpy, no TensorFlow: the scan reads array headers only (schema and length
of every episode without loading data); the workers load one episode each with
``allow_pickle=False``, check it, and cut it into raw little-endian chunks.

A ``.npy`` file is one episode with one feature named ``data``; a ``.npz`` file
is one episode whose named arrays share the time axis.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import zipfile

import numpy as np

from ingest.errors import InputError
from ingest.scan import SPLIT_NAMES, Rejection, SourceFile

EPISODE_EXTENSIONS = (".npy", ".npz")
NPY_FEATURE = "data"
ON_NAN = ("fail", "skip", "keep")
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: what tf.io.decode_raw (+ bitcast) reads back
DEFAULT_MAX_RECORD_BYTES = 64 * 2**20
EMPTY_EPISODE = "empty episode (0 time steps); left out"


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature's little-endian dtype (e.g. ``'<f4'``) and shape after the time axis."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def step_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


Schema = dict  # feature name -> FeatureSpec


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """How episodes are checked and cut.

    Attributes:
      on_nan: ``"fail"`` (default) stops at a NaN/inf, naming file and index;
        ``"skip"`` leaves the episode out with that reason; ``"keep"`` writes it.
      max_record_bytes: an episode larger than this is split into chunk records
        (whole time steps), joined again by the reader.
    """

    on_nan: str = "fail"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def __post_init__(self):
        if self.on_nan not in ON_NAN:
            raise ValueError(f"on_nan: must be one of {ON_NAN} (got {self.on_nan!r})")
        if self.max_record_bytes < 1:
            raise ValueError(f"max_record_bytes: must be positive (got {self.max_record_bytes!r})")


@dataclasses.dataclass(frozen=True)
class EpisodeSource:
    """An episode file with what its header says: schema and length."""

    file: SourceFile
    schema: Schema
    length: int
    episode_id: int = -1  # position in the sorted list of every episode file under SRC


@dataclasses.dataclass(frozen=True)
class FeatureSums:
    """Exact-enough float64 sums per trailing element, merged across workers in plan order."""

    count: int = 0
    sums: tuple = ()
    squares: tuple = ()

    def __add__(self, other: "FeatureSums") -> "FeatureSums":
        if not self.count:
            return other
        if not other.count:
            return self
        return FeatureSums(
            self.count + other.count,
            tuple(a + b for a, b in zip(self.sums, other.sums)),
            tuple(a + b for a, b in zip(self.squares, other.squares)),
        )

    def mean_std(self) -> tuple[list[float], list[float]] | tuple[None, None]:
        """Mean and standard deviation per trailing element (flattened), to 7 significant digits.

        Elements whose sums are not finite (NaN/inf kept with ``on_nan="keep"``, or float64
        overflow) get None, so the manifest stays strict JSON.
        """
        if not self.count:
            return None, None
        mean = [s / self.count for s in self.sums]
        std = [max(q / self.count - m * m, 0.0) ** 0.5 for q, m in zip(self.squares, mean)]

        def canonical(v: float) -> float | None:  # None (JSON null) where NaN/inf were kept or float64 overflowed
            return float(f"{v:.7g}") if np.isfinite(v) else None

        return [canonical(m) for m in mean], [canonical(v) for v in std]


@dataclasses.dataclass(frozen=True)
class PreparedEpisode:
    """One checked episode, cut into chunks of whole time steps: ``[(start, length, {name: bytes})]``."""

    source: SourceFile
    episode_id: int
    length: int
    chunks: list
    sums: dict  # name -> FeatureSums


def _header(path: str) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Feature name → (dtype, full shape) from the .npy/.npz headers, reading no data."""

    def read(f):
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = reader(f)
        return dtype, tuple(shape)

    if path.lower().endswith(".npy"):
        with open(path, "rb") as f:
            return {NPY_FEATURE: read(f)}
    with zipfile.ZipFile(path) as archive:
        found = {}
        for member in sorted(archive.namelist()):
            if member.endswith(".npy"):
                with archive.open(member) as f:
                    found[member[: -len(".npy")]] = read(f)
        return found


def _describe(schema: Schema) -> str:
    return ", ".join(f"{name}: {spec.dtype}{list(spec.shape)}" for name, spec in sorted(schema.items()))


def read_episode_header(file: SourceFile) -> EpisodeSource | Rejection:
    """Schema and length of one episode from its headers; a Rejection for unreadable or unusable files."""
    try:
        header = _header(file.path)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        return Rejection(file.relpath, f"not a readable numpy file ({type(e).__name__}: {e}); re-export it")
    if not header:
        return Rejection(file.relpath, "no arrays in the .npz; re-export it with at least one named array")
    schema, lengths = {}, set()
    for name, (dtype, shape) in header.items():
        if dtype.hasobject:
            return Rejection(
                file.relpath, f"feature {name!r} is an object array (would need pickle, never loaded); save numeric arrays"
            )
        if dtype.kind not in NUMERIC_KINDS:
            return Rejection(
                file.relpath, f"feature {name!r} has dtype {dtype.str} (not numeric); save bool, int, float or complex arrays"
            )
        if not shape:
            return Rejection(file.relpath, f"feature {name!r} is a scalar; every feature needs a time axis (axis 0)")
        schema[name] = FeatureSpec(dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str, shape[1:])
        lengths.add(shape[0])
    if len(lengths) != 1:
        detail = ", ".join(f"{n}: {s[0]}" for n, (_, s) in sorted(header.items()))
        return Rejection(file.relpath, f"features disagree on the time axis length ({detail}); they must share axis 0")
    length = lengths.pop()
    if length == 0:
        return Rejection(file.relpath, EMPTY_EPISODE, chosen=True)
    return EpisodeSource(file, schema, length)


def common_schema(episodes: list[EpisodeSource]) -> tuple[Schema, list[Rejection]]:
    """The schema most episodes share, and a Rejection naming what differs for every other one."""
    if not episodes:
        return {}, []
    key = lambda e: _describe(e.schema)  # noqa: E731
    majority = collections.Counter(key(e) for e in episodes).most_common(1)[0][0]
    schema = next(e.schema for e in episodes if key(e) == majority)
    odd = []
    for episode in episodes:
        if key(episode) == majority:
            continue
        names = set(episode.schema) ^ set(schema)
        if names:
            problem = f"feature names differ (got {sorted(episode.schema)}, expected {sorted(schema)})"
        else:
            diffs = [f"{n}: {episode.schema[n].dtype}{list(episode.schema[n].shape)} vs expected "
                     f"{schema[n].dtype}{list(schema[n].shape)}" for n in sorted(schema) if episode.schema[n] != schema[n]]
            problem = "features differ: " + "; ".join(diffs)
        odd.append(Rejection(episode.file.relpath, f"{problem}; convert it to match, or move it out of SRC"))
    return schema, odd


def scan_episode_files(root: str) -> tuple[dict[str, list[SourceFile]], int, int]:
    """Every ``.npy``/``.npz`` below ``root`` (recursively, sorted), by split; plus hidden and other file counts.

    Splits are detected as for images: every top-level folder named train/val/validation/test.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: source folder not found; pass a folder of .npy/.npz episodes")
    top = sorted(e for e in os.listdir(root) if not e.startswith("."))
    top_dirs = [e for e in top if os.path.isdir(os.path.join(root, e))]
    use_splits = bool(top_dirs) and all(d in SPLIT_NAMES for d in top_dirs)
    files: dict[str, list[SourceFile]] = {}
    hidden = other = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        hidden += sum(n.startswith(".") for n in filenames)
        for name in sorted(n for n in filenames if not n.startswith(".")):
            path = os.path.join(dirpath, name)
            relpath = os.path.relpath(path, root).replace(os.sep, "/")
            if not name.lower().endswith(EPISODE_EXTENSIONS):
                other += 1
                continue
            split = relpath.split("/", 1)[0] if use_splits else "train"
            if use_splits and "/" not in relpath:
                other += 1
                continue
            st = os.stat(path)
            files.setdefault(split, []).append(SourceFile(path, relpath, split, -1, st.st_size, st.st_mtime_ns))
    if not files:
        raise InputError(f"{root}: no .npy or .npz episodes found; put one episode per file under SRC")
    return {s: sorted(f, key=lambda x: x.relpath) for s, f in sorted(files.items())}, hidden, other


def _sums(array: np.ndarray) -> FeatureSums:
    values = array.astype(np.float64, copy=False).reshape(array.shape[0], -1)
    return FeatureSums(int(values.shape[0]), tuple(values.sum(0).tolist()), tuple(np.square(values).sum(0).tolist()))


def prepare_episode(source: EpisodeSource, schema: Schema, options: EpisodeOptions) -> PreparedEpisode | Rejection:
    """Loads, checks and chunks one episode; never raises for bad input."""
    relpath = source.file.relpath
    try:
        loaded = np.load(source.file.path, allow_pickle=False)
        arrays = {NPY_FEATURE: loaded} if isinstance(loaded, np.ndarray) else {n: loaded[n] for n in schema}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as e:
        return Rejection(relpath, f"cannot load ({type(e).__name__}: {e}); re-export it")
    for name, array in arrays.items():
        if array.shape[0] != source.length:
            return Rejection(relpath, f"feature {name!r} changed since the scan (length {array.shape[0]}); run again")
        if options.on_nan != "keep" and array.dtype.kind in "fc":
            bad = ~np.isfinite(array)
            if bad.any():
                index = tuple(int(i) for i in np.argwhere(bad)[0])
                reason = f"non-finite value {array[index]} in feature {name!r} at index {list(index)}"
                if options.on_nan == "fail":
                    raise InputError(f"{source.file.path}: {reason}; clean the data or pass --on-nan skip|keep")
                return Rejection(relpath, f"{reason}; left out (--on-nan skip)", chosen=True)
    step_bytes = sum(spec.step_bytes for spec in schema.values())
    steps_per_chunk = max(1, options.max_record_bytes // max(step_bytes, 1))
    little = {name: np.ascontiguousarray(arrays[name], dtype=np.dtype(spec.dtype)) for name, spec in schema.items()}
    chunks = [
        (start, min(steps_per_chunk, source.length - start), {n: a[start : start + steps_per_chunk].tobytes() for n, a in little.items()})
        for start in range(0, source.length, steps_per_chunk)
    ]
    sums = {name: _sums(array) for name, array in little.items() if array.dtype.kind in "biuf"}
    return PreparedEpisode(source.file, source.episode_id, source.length, chunks, sums)
