"""What each kind of input brings to the shared conversion engine in ``ingest/engine.py``.

A job scans its source once, then tells the engine: the items per split in
sorted order, how big each is (for shard planning and the memory budget), a
picklable ``prepare`` run in worker processes that turns an item into its framed
records (``ingest/examples.py``), how an item's statistics count into its shard's,
how per-shard statistics merge into the split's manifest entry, and
what the scan left out (``rejected``, the ``ignored`` counts, ``ignored_files``).
Planning, parallelism, atomic commits, resume and the manifest are the
engine's, written once for both kinds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Any

from ..format.errors import InputError
from ..format.inputs import InputRecord
from ..format.labels import label_problem
from ..format.manifest import EpisodeInfo, is_count, is_finite_number
from ..format.records import LABEL_NAME, episode_features, image_features_of
from ..format.statistics import pixel_sums_problem
from . import duplicates
from . import labels as labels_lib
from .episodes import (
    EpisodeSource,
    FeatureSums,
    class_folder_labels,
    common_schema,
    prepare_episode,
    read_episode_header,
    scan_episode_files,
)
from .examples import ImageItemStats, encode_item, episode_records, image_records
from .holdout import hold_out
from .images import PixelSums, prepare_image
from .scan import (
    IMAGE_EXTENSIONS,
    MAX_LISTED_IGNORED,
    Rejection,
    SourceFile,
    SourceTree,
    scan_image_files,
    scan_image_folders,
)

log = logging.getLogger(__name__)


def _fail_on(src: str, rejected: list[Rejection], on_error: str) -> None:
    if rejected and on_error == "fail":
        first = rejected[0]
        raise InputError(f"{os.path.join(src, first.relpath)}: {first.reason}; or pass --on-error skip")


@dataclasses.dataclass
class ImageShardStats:
    class_counts: list[int]
    pixels: PixelSums = PixelSums()
    converted: int = 0
    # [path, sha256] of each image written, and of each copy --dedupe left out (ingest/duplicates.py)
    hashes: list[list[str]] = dataclasses.field(default_factory=list)
    dropped: list[list[str]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> ImageShardStats:
        p = raw["pixels"]
        return cls(raw["class_counts"], PixelSums(p["count"], tuple(p["sums"]), tuple(p["squares"])), raw["converted"],
                   duplicates.check_hashes(raw["hashes"], "hashes"), duplicates.check_hashes(raw["dropped"], "dropped"))


def _count(value, low: int = 0, high: float = math.inf) -> int:
    if not is_count(value, low, high):
        raise ValueError(f"a count out of range (got {value!r})")
    return value


def _numbers(values, length: int) -> tuple:
    values = tuple(values)
    if len(values) != length or not all(map(is_finite_number, values)):
        raise ValueError(f"not {length} finite numbers (got {values!r:.80})")
    return values


def _read_labels(src: str, labels_file: str, tree: SourceTree, on_error: str, *, images: bool,
                 forced: str | None = None):
    """A labels file applied to the inputs of a scanned tree, readable or not (``labels.decide``).

    Returns:
      ``(labels, rejected, unlisted, unlabelled)``: a ``labels.Labels``, the bad rows as Rejections (the first of
      those naming no input; ``unlisted`` counts the rest), and the inputs no row labels that no bad row names
      (sorted).

    Raises:
      InputError: a bad labels file; a bad row with ``on_error="fail"``.
    """
    found = [f.relpath for files in tree.files.values() for f in files] + [r.relpath for r in tree.rejected]
    kinds = labels_lib.LABEL_KINDS if images else ("class", "value")
    with labels_lib.open_rows(labels_file, splits=images, columns=images) as rows:
        labels, problems = labels_lib.decide(rows, src, found, kinds=kinds, forced=forced)
    if problems and on_error == "fail":
        raise problems[0].error(labels_file)
    log.info("%s (%s): label kind %s: %s", labels_file, rows.dialect, labels.kind, labels.rule)
    rejected = [Rejection(p.path or p.text, p.reason(labels_file)) for p in problems]
    left_out = set(labels.by_path) | {p.path for p in problems}
    return labels, rejected, problems.unlisted, sorted(p for p in found if p not in left_out)


def _labelled_images(src: str, tree: SourceTree, image_options, on_error: str):
    """A scanned tree labelled by ``image_options.labels_file``: its files (split and label set), and what
    ``_read_labels`` returns."""
    labels, *rest = _read_labels(src, image_options.labels_file, tree, on_error, images=True,
                                 forced=image_options.label_kind)
    files: dict[str, list[SourceFile]] = {}
    for source in sorted((f for fs in tree.files.values() for f in fs), key=lambda f: f.relpath):
        if source.relpath in labels.by_path:
            label = labels.by_path[source.relpath]
            label = (label,) if labels.kind == "value" and not isinstance(label, tuple) else label
            split = labels.splits.get(source.relpath, source.split)
            files.setdefault(split, []).append(dataclasses.replace(source, split=split, label=label))
    return files, labels, *rest


def _after_known(items: dict[str, list[SourceFile]], found: list[str], known: list[str], labels: str | None):
    """``items`` relabelled so that the ``known`` classes keep their indices and the classes ``found`` that are new
    follow them (an append's: no existing label changes); returns the items and the class names."""
    if labels == "value":
        return items, []
    merged = list(known) + [name for name in found if name not in set(known)]
    position = {name: i for i, name in enumerate(merged)}
    moved = [position[name] for name in found]

    def relabel(source: SourceFile) -> SourceFile:
        label = tuple(sorted(moved[i] for i in source.label)) if labels == "multi" else moved[source.label]
        return dataclasses.replace(source, label=label)

    return {split: [relabel(f) for f in files] for split, files in items.items()}, merged


class ImageJob:
    """Images: one record per image, labelled by class folder or by a labels file (``ImageOptions.labels_file``).

    ``known_classes`` (an append): the dataset's class names, which keep their indices; new classes follow them.
    """

    kind = "images"
    unit = "img"
    nothing_found = f"no images found (extensions {', '.join(IMAGE_EXTENSIONS)}); check SRC"

    def __init__(self, src: str, options, known_classes: list[str] | None = None):
        labels_file = options.image.labels_file
        tree = scan_image_files(src) if labels_file is not None else scan_image_folders(src)
        self.src = src
        self.ignored = {"hidden": tree.ignored_hidden, "other": tree.ignored_other}
        self.ignored_files = tree.ignored_files
        self.labels, self.label_columns = None, []  # class folders: labels None, as before labels files
        self.label_rule, self.rejected_unlisted = None, 0
        items, unreadable, label_rejects = tree.files, tree.rejected, []
        self.class_names = tree.class_names
        if labels_file is not None:  # only labelled images are read (an unlabelled one is left out, even unreadable)
            items, labels, label_rejects, self.rejected_unlisted, unlabelled = _labelled_images(
                src, tree, options.image, options.on_error)
            unreadable = [r for r in unreadable if r.relpath in labels.by_path]
            self.labels, self.class_names, self.label_rule = labels.kind, labels.class_names, labels.rule
            self.label_columns = labels.columns if labels.kind == "value" else []
            self.ignored["unlabelled"] = len(unlabelled)
            self.ignored_files = sorted(tree.ignored_files + unlabelled)[:MAX_LISTED_IGNORED]
            if not labels.by_path:  # images there may be plenty: say what the labels file did instead
                first = f"; first: {label_rejects[0].reason}" if label_rejects else ""
                bad = len(label_rejects) + self.rejected_unlisted
                self.nothing_found = (f"no image is labelled by {labels_file} (got {len(unlabelled)} images without "
                                      f"a row, {bad} bad rows{first}); fix the labels file's paths "
                                      "(relative to SRC) or its labels")
        _fail_on(src, unreadable, options.on_error)
        if known_classes is not None:
            items, self.class_names = _after_known(items, self.class_names, known_classes, self.labels)
        rejected = unreadable + label_rejects
        class_of = (lambda f: f.label) if self.labels in (None, "class") else None
        self.items: dict[str, list[SourceFile]] = hold_out(items, options.holdout, path_of=lambda f: f.relpath,
                                                           class_of=class_of, src=src)
        self.split_rule = options.holdout.rule()
        self.rejected = sorted(rejected, key=lambda r: r.relpath)
        self.features = image_features_of(self.labels, self.label_columns)
        self.prepare = functools.partial(
            encode_item,
            prepare=functools.partial(prepare_image, options=options.image),
            to_records=functools.partial(image_records, class_names=tuple(self.class_names), labels=self.labels,
                                         features=self.features),
            compression=options.compression,
        )

    @staticmethod
    def size_of(item: SourceFile) -> int:
        return item.size

    def source_key(self, item: SourceFile) -> tuple:
        key = item.relpath, item.size, item.mtime_ns, item.ctime_ns
        return key if self.labels is None else (*key, item.label)  # a relabelled image is another input

    def identity(self) -> dict:
        found = {"class_names": self.class_names}
        if self.labels is not None:
            found.update(labels=self.labels, label_columns=self.label_columns)
        if self.split_rule is not None:
            found["split_rule"] = self.split_rule
        return found

    def new_stats(self) -> ImageShardStats:
        return ImageShardStats([0] * len(self.class_names))

    def stats_from_dict(self, raw: dict, records: int) -> ImageShardStats:
        """Statistics from a commit record, checked against the shard's record count (a tampered record is refused)."""
        stats = ImageShardStats.from_dict(raw)
        counts = [_count(c, high=records) for c in stats.class_counts]
        adds_up = sum(counts) == records or self.labels in ("multi", "value")  # multi: an image in each of its classes
        if len(counts) != len(self.class_names) or not adds_up:
            raise ValueError(f"class counts {counts!r:.80} do not add up to the shard's {records} records")
        _count(stats.converted, high=records)
        if len(stats.hashes) != records:
            raise ValueError(f"{len(stats.hashes)} image hashes in a shard of {records} records")
        pixels = stats.pixels
        _count(pixels.count)
        sums, squares = _numbers(pixels.sums, 3), _numbers(pixels.squares, 3)
        problem = pixel_sums_problem(pixels.count, sums, squares)
        if problem is not None:
            raise ValueError(f"pixel sums out of range for 8-bit pixels ({problem})")
        return stats

    def count(self, item: ImageItemStats, stats: ImageShardStats) -> None:
        if self.labels == "multi":
            for index in item.label:
                stats.class_counts[index] += 1
        elif self.labels != "value":
            stats.class_counts[item.label] += 1
        stats.pixels += item.pixels
        stats.converted += item.converted
        stats.hashes.append([item.source, item.sha256])

    def split_fields(self, parts: list[ImageShardStats]) -> dict[str, Any]:
        counts = [sum(p.class_counts[i] for p in parts) for i in range(len(self.class_names))]
        mean, std = sum((p.pixels for p in parts), PixelSums()).mean_std()
        return {"class_counts": dict(zip(self.class_names, counts)), "pixel_mean": mean, "pixel_std": std}

    def summary(self, parts: list[ImageShardStats]) -> dict[str, Any]:
        found = {"converted_images": sum(p.converted for p in parts)}
        return found if self.label_rule is None else {**found, "label_rule": self.label_rule}

    def label_of(self, item: SourceFile) -> str | list:
        """An input's label as ``inputs.json`` holds it: its class name, its class names, or its floats."""
        if self.labels == "multi":
            return [self.class_names[i] for i in item.label]
        if self.labels == "value":
            return list(item.label)
        return self.class_names[item.label]

    def input_records(self, specs, ordered: dict[str, list], results: dict) -> list[InputRecord]:
        """Every input the planned shards read (``format/inputs.py``): written, dropped by ``--dedupe``, or rejected."""
        records = []
        for spec in specs:
            stats = results[spec.file_name].stats
            hashes, dropped = dict(map(tuple, stats.hashes)), dict(map(tuple, stats.dropped))
            for item in ordered[spec.split][spec.start:spec.stop]:
                path = item.relpath
                state = "written" if path in hashes else "dropped" if path in dropped else "rejected"
                records.append(InputRecord(path, spec.split, self.label_of(item), item.size, item.mtime_ns,
                                           item.ctime_ns, hashes.get(path, dropped.get(path)), state))
        return records

    @staticmethod
    def pixel_sums(parts: list[ImageShardStats]) -> dict[str, Any]:
        """A split's exact pixel sums from its shards' statistics, as ``inputs.json`` holds them."""
        total = sum((p.pixels for p in parts), PixelSums())
        return {"count": total.count, "sums": list(total.sums), "squares": list(total.squares)}


@dataclasses.dataclass
class EpisodeShardStats:
    episodes: list[dict] = dataclasses.field(default_factory=list)  # {"id", "source", "length", "label"}
    sums: dict[str, FeatureSums] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> EpisodeShardStats:
        sums = {n: FeatureSums(s["count"], tuple(s["sums"]), tuple(s["squares"])) for n, s in raw["sums"].items()}
        return cls(raw["episodes"], sums)




def _episode_labels(src: str, tree: SourceTree, options, on_error: str):
    """The labels of a scanned episode tree: from ``options.labels_file``, else its class folders, else none.

    Returns:
      ``(labels, rejected, unlisted, unlabelled)``: a ``labels.Labels`` (None: unlabelled), and for a labels file
      what ``_read_labels`` returns.

    Raises:
      InputError: a bad labels file; a bad row with ``on_error="fail"``.
    """
    if options.labels_file is not None:
        return _read_labels(src, options.labels_file, tree, on_error, images=False, forced=options.label_kind)
    folders = class_folder_labels(tree) if options.class_folders else None
    if folders is None:
        return None, [], 0, []
    class_names, by_path = folders
    return labels_lib.Labels("class", class_names, by_path), [], 0, []


class EpisodeJob:
    """Numpy episodes: one record per episode chunk (most episodes are one chunk)."""

    kind = "episodes"
    unit = "episode"
    nothing_found = "no usable .npy/.npz episodes found; check SRC"

    def __init__(self, src: str, options):
        tree = scan_episode_files(src)
        labels, label_rejects, self.rejected_unlisted, unlabelled = _episode_labels(src, tree, options.episode,
                                                                                    options.on_error)
        by_path = {} if labels is None else labels.by_path
        self.label_rule = None if options.episode.labels_file is None else labels.rule
        found, unreadable = tree.files, tree.rejected
        every = sorted((f for files in found.values() for f in files), key=lambda f: f.relpath)
        # An id is the file's position among every episode file found, readable or not, so leaving one out
        # never renumbers the others.
        ids = {rel: i for i, rel in enumerate(sorted([f.relpath for f in every] + [r.relpath for r in unreadable]))}
        if labels is not None:  # only the labelled episodes are read (an unlabelled one is left out, even unreadable)
            every = [f for f in every if f.relpath in by_path]
            unreadable = [r for r in unreadable if r.relpath in by_path]
        headers = [read_episode_header(f, options.episode.max_episode_bytes) for f in every]
        episodes = [dataclasses.replace(h, episode_id=ids[h.file.relpath], label=by_path.get(h.file.relpath))
                    for h in headers if isinstance(h, EpisodeSource)]
        schema, odd = common_schema(episodes)
        if labels is not None and LABEL_NAME in schema:
            holder = next(e for e in episodes if e.schema == schema)
            raise InputError(
                f"{holder.file.path}: has an array named {LABEL_NAME!r}, but a labelled dataset yields each "
                f"episode's label as {LABEL_NAME!r} (got features {sorted(schema)!r:.100}); rename the array, "
                "or convert without labels (--no-class-folders, or drop --labels)"
            )
        unusable = unreadable + [h for h in headers if isinstance(h, Rejection)] + odd
        # An empty episode is not an error (nothing is lost): it is always skipped, with its reason recorded.
        _fail_on(src, [r for r in unusable if not r.chosen], options.on_error)
        odd_paths = {r.relpath for r in odd}
        self.src = src
        self.schema = schema
        self.labels = None if labels is None else labels.kind
        items = {
            split: [e for e in episodes if e.file.split == split and e.file.relpath not in odd_paths] for split in found
        }
        class_of = (lambda e: e.label) if self.labels == "class" else None
        self.items: dict[str, list[EpisodeSource]] = hold_out(items, options.holdout,
                                                              path_of=lambda e: e.file.relpath, class_of=class_of,
                                                              src=src)
        self.split_rule = options.holdout.rule()
        self.label_columns: list[str] = []
        self.rejected = sorted(unusable + label_rejects, key=lambda r: r.relpath)
        self.ignored = {"hidden": tree.ignored_hidden, "other": tree.ignored_other}
        self.ignored_files = tree.ignored_files
        if options.episode.labels_file is not None:
            self.ignored["unlabelled"] = len(unlabelled)
            self.ignored_files = sorted(tree.ignored_files + unlabelled)[:MAX_LISTED_IGNORED]
        self.class_names: list[str] = [] if labels is None else labels.class_names
        self.features = episode_features({n: (s.dtype, s.shape) for n, s in schema.items()}, self.labels)
        self.prepare = functools.partial(
            encode_item,
            prepare=functools.partial(prepare_episode, schema=schema, options=options.episode),
            to_records=functools.partial(episode_records, features=self.features),
            compression=options.compression,
        )
        self._step_bytes = max(1, sum(spec.step_bytes for spec in schema.values()))

    def size_of(self, item: EpisodeSource) -> int:
        """The record bytes the episode becomes: what the shard plan and the memory budget count."""
        return item.length * self._step_bytes

    @staticmethod
    def source_key(item: EpisodeSource) -> tuple:
        key = item.file.relpath, item.file.size, item.file.mtime_ns, item.file.ctime_ns, item.episode_id
        return key if item.label is None else (*key, item.label)  # a relabelled episode is another input

    def identity(self) -> dict:
        found = {"schema": self.features}
        if self.labels is not None:
            found.update(labels=self.labels, class_names=self.class_names)
        if self.split_rule is not None:
            found["split_rule"] = self.split_rule
        return found

    @staticmethod
    def new_stats() -> EpisodeShardStats:
        return EpisodeShardStats()

    def stats_from_dict(self, raw: dict, records: int) -> EpisodeShardStats:
        """Statistics from a commit record, checked against the shard's record count and the episode schema."""
        stats = EpisodeShardStats.from_dict(raw)
        if len(stats.episodes) > records or (records and not stats.episodes):  # 0 and 0: every input rejected
            raise ValueError(f"{len(stats.episodes)} episodes in a shard of {records} records")
        steps = 0
        for episode in stats.episodes:
            if set(episode) != {"id", "source", "length", "label"} or not isinstance(episode["source"], str):
                raise ValueError(f"not an episode entry (got {episode!r:.80})")
            _count(episode["id"])
            problem = label_problem(episode["label"], self.labels, len(self.class_names))
            if problem is not None:
                raise ValueError(f"episode {episode['id']!r:.20}: label {problem} (got {episode['label']!r:.40})")
            steps += _count(episode["length"], low=1)
        for name, sums in stats.sums.items():
            if name not in self.schema or _count(sums.count) != steps:
                raise ValueError(f"feature sums of {name!r:.40} do not cover the shard's {steps} steps")
            width = max(1, math.prod(self.schema[name].shape))
            _numbers(sums.sums, width)
            if any(v < 0 for v in _numbers(sums.squares, width)):
                raise ValueError("negative sums of squares")
        return stats

    @staticmethod
    def count(item: tuple[dict, dict], stats: EpisodeShardStats) -> None:
        entry, sums = item
        stats.episodes.append(entry)
        for name, feature_sums in sums.items():
            stats.sums[name] = stats.sums.get(name, FeatureSums()) + feature_sums

    def split_fields(self, parts: list[EpisodeShardStats]) -> dict[str, Any]:
        mean, std = {}, {}
        for name in sorted(self.schema):
            total = sum((p.sums[name] for p in parts if name in p.sums), FeatureSums())
            if total.count:
                mean[name], std[name] = total.mean_std()
        episodes = [EpisodeInfo(**e, shard=i) for i, p in enumerate(parts) for e in p.episodes]  # i: index in the split
        return {"episodes": episodes, "feature_mean": mean, "feature_std": std}

    def summary(self, parts: list[EpisodeShardStats]) -> dict[str, Any]:
        return {} if self.label_rule is None else {"label_rule": self.label_rule}
