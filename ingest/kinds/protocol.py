"""What a kind of input (images, episodes) must bring to the shared conversion engine: the ``Kind`` protocol.

The engine (``ingest/engine.py``, and ``ingest/beam_runner.py`` for Beam) plans,
runs workers, commits shards, resumes and writes the manifest once for every
kind; a kind (``ingest/kinds/images.py``, ``ingest/kinds/episodes.py``) scans its
source and answers these questions. A new kind of input is a new class with these
members, and nothing else changes. Also here: the checks every kind's
``stats_from_dict`` applies to the numbers of a commit record, which is untrusted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ...format.manifest import is_count, is_finite_number
from ..scan import Rejection


def checked_count(value, low: int = 0, high: float = math.inf) -> int:
    """``value`` when it is an int in ``[low, high]``; a ValueError otherwise."""
    if not is_count(value, low, high):
        raise ValueError(f"a count out of range (got {value!r})")
    return value


def checked_numbers(values, length: int) -> tuple:
    """``values`` as a tuple when they are ``length`` finite numbers; a ValueError otherwise."""
    values = tuple(values)
    if len(values) != length or not all(map(is_finite_number, values)):
        raise ValueError(f"not {length} finite numbers (got {values!r:.80})")
    return values


class ShardStats(Protocol):
    """A kind's per-shard statistics: merged into the split's manifest entry, kept in commit records for resume."""

    def to_dict(self) -> dict: ...


@runtime_checkable
class Kind(Protocol):
    """One scanned source, ready to convert.

    Attributes:
      kind: the manifest's ``kind`` ("images" or "episodes").
      unit: what the progress bar counts ("img", "episode").
      nothing_found: the error's problem-and-fix text when no split has a usable input.
      src: the source folder.
      items: per split, the inputs in sorted order (before the write-time shuffle).
      rejected: inputs left out at scan time, each with its reason (and the first bad rows of a labels file).
      rejected_unlisted: the bad rows of a labels file left out of ``rejected`` (the manifest's field).
      ignored: counts of files that are not inputs ({"hidden": n, "other": n}).
      ignored_files: the first of those "other" files, by path relative to ``src`` (capped).
      class_names: the label names (episodes: only with ``labels == "class"``).
      labels: the manifest's ``labels``: None, or for episodes ``"class"`` / ``"value"``, for images (a labels file)
        ``"class"`` / ``"multi"`` / ``"value"``.
      label_columns: the value columns of image value labels (the manifest's ``label_columns``), else empty.
      split_rule: how held-out splits were made (``Holdout.rule()``, the manifest's ``split_rule``), or None.
      features: the manifest's ``features`` table (record keys, dtypes, shapes).
      prepare: a picklable ``item -> EncodedItem | Rejection`` (``ingest/examples.py``), run in worker
        processes without TensorFlow: the item read, checked and turned into framed TFRecord bytes.
    """

    kind: str
    unit: str
    nothing_found: str
    src: str
    items: dict[str, list[Any]]
    rejected: list[Rejection]
    rejected_unlisted: int
    ignored: dict[str, int]
    ignored_files: list[str]
    class_names: list[str]
    labels: str | None
    label_columns: list[str]
    split_rule: dict[str, Any] | None
    features: dict[str, Any]
    prepare: Callable[[Any], Any]

    def size_of(self, item: Any) -> int:
        """Bytes the item adds to its shard: what the shard plan and the in-flight memory budget count."""

    def source_key(self, item: Any) -> tuple:
        """What identifies the item's content in the fingerprint (path, size, mtime, ctime, ...)."""

    def identity(self) -> dict:
        """Kind-wide facts that change the output (class names, episode schema), for the fingerprint."""

    def new_stats(self) -> ShardStats:
        """Empty statistics for one shard."""

    def stats_from_dict(self, raw: dict, records: int) -> ShardStats:
        """Statistics read back from a commit record (``ShardStats.to_dict``'s output), checked against the
        shard's ``records`` and the kind's schema: a ValueError for anything a tampered record could hold."""

    def count(self, item_stats: Any, stats: ShardStats) -> None:
        """Adds one item's statistics (``EncodedItem.stats``, made in the worker) to its shard's ``stats``."""

    def split_fields(self, parts: list[ShardStats]) -> dict[str, Any]:
        """The kind's fields of one split's manifest entry, from its shards' statistics in order."""

    def summary(self, parts: list[ShardStats]) -> dict[str, Any]:
        """Entries the kind adds to the manifest's ``options`` summary."""
