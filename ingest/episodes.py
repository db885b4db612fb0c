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
import math
import os
import zipfile

import numpy as np

from ..format.errors import InputError
from ..format.manifest import EPISODE_DTYPES
from ..format.statistics import FEATURE_DIGITS, STATISTICS_KINDS
from ..format.storage import open_regular
from . import npy
from .npy import MAX_FEATURES, READ_ERRORS, BadFile
from .options import DEFAULT_MAX_EPISODE_BYTES, EpisodeOptions
from .scan import (
    Rejection,
    SourceFile,
    SourceTree,
    check_source_folder,
    not_regular_problem,
    split_folders,
    stat_problem,
)

EPISODE_EXTENSIONS = (".npy", ".npz")
NPY_FEATURE = "data"
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex; of these only EPISODE_DTYPES can be read back
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
class EpisodeSource:
    """An episode file with what its header says: schema and length."""

    file: SourceFile
    schema: Schema
    length: int
    episode_id: int = -1  # position in the sorted list of every episode file under SRC
    label: int | float | None = None  # an index into class_names, a value, or None (unlabelled)


@dataclasses.dataclass(frozen=True)
class FeatureSums:
    """Exact-enough float64 sums per trailing element, merged across workers in plan order."""

    count: int = 0
    sums: tuple = ()
    squares: tuple = ()

    def __add__(self, other: FeatureSums) -> FeatureSums:
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
            return float(f"{v:.{FEATURE_DIGITS}g}") if np.isfinite(v) else None

        return [canonical(m) for m in mean], [canonical(v) for v in std]


@dataclasses.dataclass(frozen=True)
class PreparedEpisode:
    """One checked episode, cut into chunks of whole time steps: ``[(start, length, {name: bytes})]``."""

    source: SourceFile
    episode_id: int
    length: int
    chunks: list
    sums: dict  # name -> FeatureSums
    label: int | float | None = None


def _describe(schema: Schema) -> str:
    return ", ".join(f"{name}: {spec.dtype}{list(spec.shape)}" for name, spec in sorted(schema.items()))


def read_episode_header(file: SourceFile, max_episode_bytes: int = DEFAULT_MAX_EPISODE_BYTES,
                        max_features: int = MAX_FEATURES) -> EpisodeSource | Rejection:
    """Schema and length of one episode from its headers; a Rejection for unreadable or unusable files.

    Every size a header declares is checked against the file before any data is loaded; every dtype against
    what the readers can decode (``EPISODE_DTYPES``). An ``.npz`` of more than ``max_features`` arrays
    (default ``MAX_FEATURES``, 1024) is refused before any header is read, so a scan is linear in members.

        read_episode_header(SourceFile.of(p, "ep.npy", "train", -1, os.stat(p)))  # EpisodeSource(..., length=7)
    """
    try:
        members = npy.members(file.path, file.size, max_features)
    except READ_ERRORS as e:
        return Rejection(file.relpath, f"{npy.problem(e)}; re-export it")
    if not members:
        return Rejection(file.relpath, "no arrays in the .npz; re-export it with at least one named array")
    header = {NPY_FEATURE if m.name is None else m.name[: -len(".npy")]: (m.dtype, m.shape) for m in members}
    declared = sum(m.declared_bytes for m in members if not m.dtype.hasobject)
    if declared > max_episode_bytes:
        return Rejection(
            file.relpath,
            f"episode of {declared:,} bytes (as its headers declare) is over --max-episode-bytes "
            f"({max_episode_bytes:,}); raise the limit if it is genuine and fits in memory",
        )
    schema, lengths = {}, set()
    for name, (dtype, shape) in header.items():
        if dtype.hasobject:
            return Rejection(
                file.relpath,
                f"feature {name!r} is an object array (would need pickle, never loaded); save numeric arrays"
            )
        if dtype.kind not in NUMERIC_KINDS:
            return Rejection(
                file.relpath,
                f"feature {name!r} has dtype {dtype.str} (not numeric); save bool, int, float or complex arrays"
            )
        little = dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str
        if little not in EPISODE_DTYPES:  # e.g. float128: it would convert and verify, then no reader could load it
            return Rejection(
                file.relpath, f"feature {name!r} has dtype {dtype.str} ({dtype.name}), which TensorFlow cannot hold; "
                "cast it to bool, (u)int8-64, float16/32/64 or complex64/128 and re-export it"
            )
        if not shape:
            return Rejection(file.relpath, f"feature {name!r} is a scalar; every feature needs a time axis (axis 0)")
        schema[name] = FeatureSpec(little, shape[1:])
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
                     f"{schema[n].dtype}{list(schema[n].shape)}"
                     for n in sorted(schema) if episode.schema[n] != schema[n]]
            problem = "features differ: " + "; ".join(diffs)
        odd.append(Rejection(episode.file.relpath, f"{problem}; convert it to match, or move it out of SRC"))
    return schema, odd


def scan_episode_files(root: str) -> SourceTree:
    """Every ``.npy``/``.npz`` below ``root`` (recursively, sorted), by split; the episode files that cannot be
    read (broken links, FIFOs, devices) as rejections; and the hidden and other files left out.

    Splits follow the one rule images follow too (``scan.split_folders``): ``SRC/<split>/...`` when every
    top-level folder is a split name; episode files beside split folders are refused.

    Raises:
      FileNotFoundError: ``root`` does not exist.
      InputError: split and other folders mixed, episode files beside split folders, or no episode file at all.
    """
    check_source_folder(root, ".npy/.npz episodes")
    top = sorted(e for e in os.listdir(root) if not e.startswith("."))
    top_dirs = [e for e in top if os.path.isdir(os.path.join(root, e))]
    top_episodes = [e for e in top if e not in top_dirs and e.lower().endswith(EPISODE_EXTENSIONS)]
    use_splits = bool(split_folders(root, top_dirs, top_episodes))
    tree = SourceTree(root=root, class_names=[], files={}, rejected=[], use_splits=use_splits)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        tree.ignored_hidden += sum(n.startswith(".") for n in filenames)
        for name in sorted(n for n in filenames if not n.startswith(".")):
            path = os.path.join(dirpath, name)
            relpath = os.path.relpath(path, root).replace(os.sep, "/")
            if not name.lower().endswith(EPISODE_EXTENSIONS):
                tree.ignore(relpath)
                continue
            split = relpath.split("/", 1)[0] if use_splits else "train"  # no episode file is beside split folders
            try:
                st = os.stat(path)
            except OSError as e:
                tree.rejected.append(Rejection(relpath, stat_problem(e)))
                continue
            problem = not_regular_problem(st.st_mode)
            if problem is not None:
                tree.rejected.append(Rejection(relpath, problem))
                continue
            tree.files.setdefault(split, []).append(SourceFile.of(path, relpath, split, -1, st))
    if not tree.files and not tree.rejected:
        raise InputError(f"{root}: no .npy or .npz episodes found; put one episode per file under SRC")
    tree.files = {s: sorted(f, key=lambda x: x.relpath) for s, f in sorted(tree.files.items())}
    tree.finish_ignored()
    return tree


def feature_sums(array: np.ndarray) -> tuple[FeatureSums, bool]:
    """Float64 sums and sums of squares per trailing element, and whether they are all finite (then so is every
    value: a NaN or inf always reaches them, and a float32 square cannot overflow float64)."""
    values = array.astype(np.float64, copy=False).reshape(array.shape[0], -1)
    sums, squares = values.sum(0), np.einsum("ij,ij->j", values, values)  # no [T, F] temporary for the squares
    finite = bool(np.isfinite(sums).all() and np.isfinite(squares).all())
    return FeatureSums(int(values.shape[0]), tuple(sums.tolist()), tuple(squares.tolist())), finite


def _read_member(stream, available: int, where: str, spec: FeatureSpec, length: int) -> np.ndarray:
    """One array read into memory its header declares, after checking that header against the scan's."""
    dtype, shape, fortran = npy.read_header(stream, available, where)
    expected = (np.dtype(spec.dtype), (length, *spec.shape))
    if (dtype.newbyteorder("<") if dtype.byteorder not in "|<" else dtype, shape) != expected:
        raise BadFile(f"{where}changed since the scan (now {dtype.str}{list(shape)}); run again")
    array = np.empty(math.prod(shape), dtype)
    view = memoryview(array).cast("B")
    filled = 0
    while filled < len(view):  # streamed straight into the array: nothing is inflated or copied on the way
        count = stream.readinto(view[filled:])
        if not count:
            raise BadFile(f"{where}truncated data")
        filled += count
    return array.reshape(shape, order="F" if fortran else "C")


def _load_arrays(source: EpisodeSource, schema: Schema) -> dict[str, np.ndarray]:
    """Every feature of an episode, its headers checked again on the open file (it may have changed since the scan)."""
    with open_regular(source.file.path) as f:
        size = os.fstat(f.fileno()).st_size
        if source.file.path.lower().endswith(".npy"):
            return {NPY_FEATURE: _read_member(f, size, "", schema[NPY_FEATURE], source.length)}
        arrays = {}
        with zipfile.ZipFile(f) as archive:
            for name, spec in schema.items():
                info = archive.getinfo(name + ".npy")
                with archive.open(info) as stream:
                    where = f"member {info.filename!r}: "
                    arrays[name] = _read_member(stream, info.file_size, where, spec, source.length)
        return arrays


def prepare_episode(source: EpisodeSource, schema: Schema, options: EpisodeOptions) -> PreparedEpisode | Rejection:
    """Loads, checks and chunks one episode; never raises for bad input (a NaN with ``on_nan="fail"`` excepted).

    Memory: the arrays and their record bytes, each about the episode's size; NaN checks and sums go chunk by chunk.
    """
    relpath = source.file.relpath
    try:
        arrays = _load_arrays(source, schema)
    except READ_ERRORS as e:
        return Rejection(relpath, f"cannot load: {npy.problem(e)}; re-export it")
    step_bytes = sum(spec.step_bytes for spec in schema.values())
    steps_per_chunk = max(1, options.max_record_bytes // max(step_bytes, 1))
    chunks, sums = [], {}
    for start in range(0, source.length, steps_per_chunk):
        stop = min(start + steps_per_chunk, source.length)
        data = {}
        for name, spec in schema.items():
            block = np.ascontiguousarray(arrays[name][start:stop], dtype=np.dtype(spec.dtype))  # little-endian
            finite = block.dtype.kind not in "fc"
            if block.dtype.kind in STATISTICS_KINDS:
                block_sums, finite = feature_sums(block)
                sums[name] = sums.get(name, FeatureSums()) + block_sums
            if options.on_nan != "keep" and not finite:  # look for the value only when the sums say there is one
                bad = ~np.isfinite(block)
                if bad.any():
                    index = tuple(int(i) for i in np.argwhere(bad)[0])
                    index = (index[0] + start, *index[1:])
                    reason = f"non-finite value {arrays[name][index]} in feature {name!r} at index {list(index)}"
                    if options.on_nan == "fail":
                        raise InputError(f"{source.file.path}: {reason}; clean the data or pass --on-nan skip|keep")
                    return Rejection(relpath, f"{reason}; left out (--on-nan skip)", chosen=True)
            data[name] = block.tobytes()
        chunks.append((start, stop - start, data))
    return PreparedEpisode(source.file, source.episode_id, source.length, chunks, sums, source.label)
