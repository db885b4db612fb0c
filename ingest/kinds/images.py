"""Images as a kind of input (``kinds/protocol.py``'s ``Kind``): ``ImageJob`` and its per-shard statistics.

One record per image, labelled by class folder or by a labels file. The scan is ``ingest/scan.py``'s; in the
workers, ``ingest/images.py`` prepares an image and ``ingest/examples.py`` builds and frames its record.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ...format.inputs import InputRecord
from ...format.records import image_features_of
from ...format.statistics import pixel_sums_problem
from .. import duplicates
from ..examples import ImageItemStats, encode_item, image_records
from ..holdout import hold_out
from ..images import PixelSums, prepare_image
from ..scan import IMAGE_EXTENSIONS, MAX_LISTED_IGNORED, SourceFile, SourceTree, scan_image_files, scan_image_folders
from .protocol import checked_count, checked_numbers
from .scanning import fail_on, read_labels


@dataclasses.dataclass
class ImageShardStats:
    """One image shard's statistics (``ShardStats``): class counts, exact pixel sums, conversions, image hashes."""

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


def _labelled_images(src: str, tree: SourceTree, image_options, on_error: str):
    """A scanned tree labelled by ``image_options.labels_file``: its files (split and label set), and what
    ``read_labels`` returns."""
    labels, *rest = read_labels(src, image_options.labels_file, tree, on_error, images=True,
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
        self.unlabelled: set[str] = set()  # the images of SRC the labels file has no row for
        items, unreadable, label_rejects = tree.files, tree.rejected, []
        self.class_names = tree.class_names
        if labels_file is not None:  # only labelled images are read (an unlabelled one is left out, even unreadable)
            items, labels, label_rejects, self.rejected_unlisted, unlabelled = _labelled_images(
                src, tree, options.image, options.on_error)
            unreadable = [r for r in unreadable if r.relpath in labels.by_path]
            self.labels, self.class_names, self.label_rule = labels.kind, labels.class_names, labels.rule
            self.label_columns = labels.columns if labels.kind == "value" else []
            self.ignored["unlabelled"], self.unlabelled = len(unlabelled), set(unlabelled)
            self.ignored_files = sorted(tree.ignored_files + unlabelled)[:MAX_LISTED_IGNORED]
            if not labels.by_path:  # images there may be plenty: say what the labels file did instead
                first = f"; first: {label_rejects[0].reason}" if label_rejects else ""
                bad = len(label_rejects) + self.rejected_unlisted
                self.nothing_found = (f"no image is labelled by {labels_file} (got {len(unlabelled)} images without "
                                      f"a row, {bad} bad rows{first}); fix the labels file's paths "
                                      "(relative to SRC) or its labels")
        fail_on(src, unreadable, options.on_error)
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
        counts = [checked_count(c, high=records) for c in stats.class_counts]
        adds_up = sum(counts) == records or self.labels in ("multi", "value")  # multi: an image in each of its classes
        if len(counts) != len(self.class_names) or not adds_up:
            raise ValueError(f"class counts {counts!r:.80} do not add up to the shard's {records} records")
        checked_count(stats.converted, high=records)
        if len(stats.hashes) != records:
            raise ValueError(f"{len(stats.hashes)} image hashes in a shard of {records} records")
        pixels = stats.pixels
        checked_count(pixels.count)
        sums, squares = checked_numbers(pixels.sums, 3), checked_numbers(pixels.squares, 3)
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
