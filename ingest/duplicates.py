"""Identical images: found from the hashes the workers take, reported in the manifest, dropped with ``--dedupe``.

Each worker hashes the source file's bytes it already read (``prepare_image``). A shard's statistics keep the
``(path, sha256)`` of every image it holds (``hashes``) and of every copy ``--dedupe`` left out of it
(``dropped``), so its commit record holds them and a resumed run knows them without reading a file again;
the manifest's ``duplicates`` field (``format/duplicates.py``) is made from them.

``--dedupe`` keeps one copy of each content, in one pass: splits are written in ``write_order`` (test, then the
other held-out splits by name, then train), and each image is checked against the hashes of everything written
before it. So a copy in train loses to the one in val or test (evaluation stays clean and comparable), test
keeps its copy over val's (the final score's set stays as given), and inside one split the copy written first
is kept (the first in the split's record order, which ``--seed`` decides). A dropped copy is a ``rejected``
entry naming the copy kept, a skip the user chose, never an error. A rerun sees exactly the hashes of the
shards before each shard it writes, so it keeps and drops the same copies as an uninterrupted run.

The Beam runner writes shards in parallel workers, where "written before" has no meaning: ``--dedupe`` is
refused there (duplicates are still reported).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ..format.duplicates import SHA256, summarize
from ..format.errors import OptionError
from .plan import ShardSpec
from .scan import Rejection

HELD_OUT_FIRST = "test"  # kept over every other split's copy


def write_order(splits: Iterable[str]) -> list[str]:
    """The order ``--dedupe`` writes splits in, so held-out splits keep their copies.

    >>> write_order(["train", "val", "test"])
    ['test', 'val', 'train']
    """
    return sorted(splits, key=_rank)


def _rank(split: str) -> tuple:
    """Where a split comes in the write order: a copy in a split of lower rank is kept over this one's."""
    return split == "train", split != HELD_OUT_FIRST, split


def check_dedupe(kind: str, dedupe: bool, runner: Callable | None) -> None:
    """``--dedupe`` is for images, written by the local runner.

    Raises:
      InputError: naming the option and the fix.
    """
    if not dedupe:
        return
    if kind != "images":
        raise OptionError("{dedupe}: drops identical images; episodes are never deduplicated (got a {kind} "
                          "conversion); drop {dedupe}", kind=kind)
    if runner is not None:
        raise OptionError("{dedupe}: the Beam runner writes shards in parallel workers, so which copy is kept would "
                          "depend on timing (got {runner} beam); convert with the local runner (drop {runner} beam), "
                          "or drop {dedupe} to only report the duplicates")


def check_hashes(entries: Any, what: str) -> list[list[str]]:
    """A shard's ``hashes`` or ``dropped`` from an untrusted commit record: ``[[path, sha256], ...]``."""
    if not isinstance(entries, list):
        raise ValueError(f"{what}: not a list (got {entries!r:.60})")
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and SHA256.match(entry[1])):
            raise ValueError(f"{what}: not a [path, sha256] pair (got {entry!r:.80})")
    return entries


class Deduper:
    """The one-pass ``--dedupe``: what has been written so far, shard after shard in write order.

    Args:
      specs: every planned shard, in write order.
      results: the engine's committed shards by file name, filled in as shards commit; a shard's screen is
        asked for only once every shard before it is in there.
      existing: an append's images already in the dataset, ``sha256 -> (path, split)``. A new copy of one is
        dropped when the old copy's split comes no later in the write order (a new train copy of anything, a new
        val copy of a test image); otherwise both stay, since the old shard cannot lose its copy, and the pair is
        reported as a duplicate across splits.

    Example:
      deduper = Deduper(specs, results)
      write_shard(job, out, spec, pairs, options, screen=deduper.screen_for(spec))
    """

    def __init__(self, specs: list[ShardSpec], results: dict[str, Any],
                 existing: dict[str, tuple[str, str]] | None = None):
        self._names = [s.file_name for s in specs]
        self._results = results
        self._existing = existing or {}
        self._next = 0
        self._kept: dict[str, str] = {}  # sha256 -> the path of the copy kept

    def screen_for(self, spec: ShardSpec) -> Callable[[Any, Any], Rejection | None]:
        """The screen ``write_shard`` runs on each image of ``spec``, once the shards before it are known."""
        while self._names[self._next] != spec.file_name:
            for path, sha256 in self._results[self._names[self._next]].stats.hashes:
                self._kept.setdefault(sha256, path)
            self._next += 1
        return functools.partial(self._screen, split=spec.split)

    def _screen(self, item, shard_stats, split: str) -> Rejection | None:
        """None keeps the image (``item``: its ``ImageItemStats``); a copy of a kept one is a chosen Rejection."""
        old = self._existing.get(item.sha256)
        if old is not None and _rank(old[1]) <= _rank(split):
            kept = old[0]
        else:
            kept = self._kept.setdefault(item.sha256, item.source)
            if kept == item.source:
                return None
        shard_stats.dropped.append([item.source, item.sha256])
        return Rejection(item.source, f"duplicate of {kept} (identical bytes); left out by --dedupe, which keeps "
                         "one copy (held-out splits first)", chosen=True)


def report(specs: list[ShardSpec], results: dict[str, Any], earlier: dict[str, list[tuple[str, str]]] | None = None,
           earlier_dropped: int = 0) -> dict[str, Any]:
    """The manifest's ``duplicates`` field from the final shards' statistics, and for an append the
    ``(path, sha256)`` per split of the images the dataset already read (``earlier_dropped`` of them dropped)."""
    images: dict[str, list] = {split: list(found) for split, found in (earlier or {}).items()}
    dropped = earlier_dropped
    for spec in specs:
        stats = results[spec.file_name].stats
        images.setdefault(spec.split, []).extend(map(tuple, stats.hashes + stats.dropped))
        dropped += len(stats.dropped)
    return summarize(images, dropped)
