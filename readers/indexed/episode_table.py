"""Where each episode's records are: the manifest's episodes of a split, each mapped to its run of consecutive
chunk records in the record table. Pure numpy, no TensorFlow.

The converter writes an episode of ``T`` steps as ``ceil(T / c)`` chunk records, one after another in its shard,
the shard's episodes in the manifest's order, with one ``c`` (steps per chunk) for every episode of a shard. The
manifest lists each episode's length and shard and each shard's record count, so the chunk counts follow: each
``ceil(T / c)`` only falls as ``c`` grows, so two ``c`` giving a shard its record count give every episode the same
count, and a binary search finds one. The reader still checks every record it reads (its episode id, chunk and
chunk count) against what this table says.

    chunk_counts([5, 2, 3], 4, "a-tfr")            # array([2, 1, 1]): c = 3 or 4 (c = 2 would give 3 + 1 + 2)
    table = episode_table(split.episodes, [4], "a-tfr", labelled=False)
    table.first, table.chunks                     # (array([0, 2, 3]), array([2, 1, 1]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..windowing.targets import label_array


@dataclasses.dataclass(frozen=True, eq=False)
class EpisodeTable:
    """Every episode of a split (or of several, laid end to end), in manifest order.

    Attributes:
      first: int64 [episodes], its first chunk record's index in the record table.
      chunks: int64 [episodes], its chunk records (consecutive).
      ids: int64 [episodes], its id in its dataset.
      lengths: int64 [episodes], its steps, as the manifest says.
      labels: [episodes], its label as the reader yields it (int64 class, float32 value); zeros when unlabelled.
    """

    first: np.ndarray
    chunks: np.ndarray
    ids: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def records(self, episodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(record, episode, chunk)`` of every chunk record of ``episodes`` (int64 indices into this table), in
        order: the record's index in the record table, the episode it belongs to, and its chunk index."""
        episodes = np.asarray(episodes, np.int64)
        counts = self.chunks[episodes]
        episode = np.repeat(episodes, counts)
        chunk = np.arange(len(episode), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.first[episode] + chunk, episode, chunk


def chunk_counts(lengths: Sequence[int], records: int, where: str) -> np.ndarray:
    """The chunk records of each episode of one shard, from their lengths and the shard's record count.

    Raises:
      ValueError: no steps per chunk gives the shard that record count (the manifest disagrees with itself).
    """
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) == 0 and records == 0:
        return np.zeros(0, np.int64)

    def count(c: int) -> int:
        return int((-(-lengths // c)).sum())

    low, high = 1, int(lengths.max()) if len(lengths) else 1
    while low < high:  # the smallest c whose count is at most ``records``
        middle = (low + high) // 2
        if count(middle) <= records:
            high = middle
        else:
            low = middle + 1
    if count(low) != records:
        raise ValueError(f"{where}: no chunking of its {len(lengths)} episodes gives the {records} records the "
                         f"manifest counts (got lengths summing to {int(lengths.sum())}); run `tfshard verify` on the "
                         "dataset, then convert it again")
    return -(-lengths // low)


def episode_table(episodes, shard_records: Sequence[int], where: str, *, labelled: bool) -> EpisodeTable:
    """The table of a split: ``episodes`` (the manifest's ``EpisodeInfo``s, in its order), ``shard_records`` each
    shard's record count in split order; ``labelled``: the episodes carry labels."""
    by_shard = [[] for _ in shard_records]
    for e in episodes:
        by_shard[e.shard].append(e)
    ordered = [e for shard in by_shard for e in shard]
    chunks = np.concatenate([chunk_counts([e.length for e in shard], records, f"{where}: shard {i}")
                             for i, (shard, records) in enumerate(zip(by_shard, shard_records))] or
                            [np.zeros(0, np.int64)]).astype(np.int64)
    shard_starts = np.cumsum([0, *shard_records])[:-1]
    first = np.zeros(len(ordered), np.int64)
    k = 0
    for shard, start in zip(by_shard, shard_starts):  # each shard's episodes from its first record on
        n = len(shard)
        first[k:k + n] = start + np.cumsum(chunks[k:k + n]) - chunks[k:k + n]
        k += n
    labels = label_array([e.label for e in ordered]) if labelled else np.zeros(len(ordered), np.int64)
    return EpisodeTable(first, chunks, np.array([e.id for e in ordered], np.int64),
                        np.array([e.length for e in ordered], np.int64), labels)


def concatenated(tables: list[EpisodeTable], record_starts: Sequence[int]) -> EpisodeTable:
    """The episodes of ``tables`` one after another, each table's records starting at ``record_starts[i]``."""
    return EpisodeTable(np.concatenate([t.first + start for t, start in zip(tables, record_starts)]),
                        *(np.concatenate([getattr(t, f) for t in tables]) for f in ("chunks", "ids", "lengths",
                                                                                      "labels")))
