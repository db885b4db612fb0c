"""Numpy episodes as a kind of input (``kinds/protocol.py``'s ``Kind``): ``EpisodeJob``, its per-shard
statistics, and class-folder labels.

One record per episode chunk (most episodes are one chunk). The scan and the header reading are
``ingest/episodes.py``'s, which also prepares an episode in the workers; ``ingest/examples.py`` builds and frames
its records.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from ...format.errors import InputError
from ...format.labels import label_problem
from ...format.manifest import EpisodeInfo
from ...format.records import LABEL_KEY, LABEL_NAME, episode_features
from .. import labels as labels_lib
from ..episodes import (
    EpisodeSource,
    FeatureSums,
    common_schema,
    prepare_episode,
    read_episode_header,
    scan_episode_files,
)
from ..examples import encode_item, episode_records
from ..holdout import hold_out
from ..scan import MAX_LISTED_IGNORED, Rejection, SourceTree
from .protocol import checked_count, checked_numbers
from .scanning import fail_on, read_labels


@dataclasses.dataclass
class EpisodeShardStats:
    """One episode shard's statistics (``ShardStats``): its episodes' manifest entries and per-feature sums."""

    episodes: list[dict] = dataclasses.field(default_factory=list)  # {"id", "source", "length", "label"}
    sums: dict[str, FeatureSums] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> EpisodeShardStats:
        sums = {n: FeatureSums(s["count"], tuple(s["sums"]), tuple(s["squares"])) for n, s in raw["sums"].items()}
        return cls(raw["episodes"], sums)


def class_folder_labels(tree: SourceTree) -> tuple[list[str], dict[str, int]] | None:
    """Class names and each episode file's label when the tree is class folders, else None.

    The rule, decided on the files the scan found (unreadable ones too) before any header is read: every episode
    file is exactly one folder below its split root (``SRC/<class>/<ep>.npy``, or ``SRC/<split>/<class>/<ep>.npy``
    when the top folders are splits), and there are at least two class folders over all splits. The class names
    are sorted; a label is its folder's index.

        class_folder_labels(scan_episode_files("src"))  # (['run', 'sit', 'walk'], {'run/0.npy': 0, ...})
    """
    paths = [f.relpath for files in tree.files.values() for f in files] + [r.relpath for r in tree.rejected]
    folders = {}
    for path in paths:
        parts = path.split("/")[1:] if tree.use_splits else path.split("/")
        if len(parts) != 2:
            return None
        folders[path] = parts[0]
    class_names = sorted(set(folders.values()))
    if len(class_names) < 2:
        return None
    index = {name: i for i, name in enumerate(class_names)}
    return class_names, {path: index[folder] for path, folder in folders.items()}


def _episode_labels(src: str, tree: SourceTree, options, on_error: str):
    """The labels of a scanned episode tree: from ``options.labels_file``, else its class folders, else none.

    Returns:
      ``(labels, rejected, unlisted, unlabelled)``: a ``labels.Labels`` (None: unlabelled), and for a labels file
      what ``read_labels`` returns.

    Raises:
      InputError: a bad labels file; a bad row with ``on_error="fail"``.
    """
    if options.labels_file is not None:
        return read_labels(src, options.labels_file, tree, on_error, images=False, forced=options.label_kind)
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
        taken = [name for name in (LABEL_NAME, LABEL_KEY) if name in schema] if labels is not None else []
        if taken:
            holder = next(e for e in episodes if e.schema == schema)
            raise InputError(
                f"{holder.file.path}: has an array named {taken[0]!r}, but a labelled dataset keeps each episode's "
                f"label under that name (readers yield it as {LABEL_NAME!r}, records and resident arrays hold it as "
                f"{LABEL_KEY!r}; got features {sorted(schema)!r:.100}); rename the array, or convert without labels "
                "(--no-class-folders, or drop --labels)"
            )
        unusable = unreadable + [h for h in headers if isinstance(h, Rejection)] + odd
        # An empty episode is not an error (nothing is lost): it is always skipped, with its reason recorded.
        fail_on(src, [r for r in unusable if not r.chosen], options.on_error)
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
            checked_count(episode["id"])
            problem = label_problem(episode["label"], self.labels, len(self.class_names))
            if problem is not None:
                raise ValueError(f"episode {episode['id']!r:.20}: label {problem} (got {episode['label']!r:.40})")
            steps += checked_count(episode["length"], low=1)
        for name, sums in stats.sums.items():
            if name not in self.schema or checked_count(sums.count) != steps:
                raise ValueError(f"feature sums of {name!r:.40} do not cover the shard's {steps} steps")
            width = max(1, math.prod(self.schema[name].shape))
            checked_numbers(sums.sums, width)
            if any(v < 0 for v in checked_numbers(sums.squares, width)):
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
