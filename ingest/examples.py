"""Prepared inputs → framed TFRecord bytes, in the worker processes (no TensorFlow).

A worker reads and checks one input (``prepare_image``, ``prepare_episode``),
builds its ``tf.train.Example`` records with the keys ``tfshard.format.records``
declares, frames them as TFRecord bytes (gzip-compressed, one member per input,
when asked) and sends the parent an ``EncodedItem``. The parent only appends its
bytes to the shard and adds its statistics (``ingest/write.py``'s ``write_shard``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..format.records import DATA_PREFIX, IMAGE_FEATURES, LABEL_KEY, MULTI_LABEL_KEY, VALUE_KEY, serialize
from ..format.tfrecord import DeflatePiece, deflate_piece, frame_records
from .episodes import PreparedEpisode
from .images import PreparedImage
from .scan import Rejection


@dataclasses.dataclass(frozen=True)
class EncodedItem:
    """One input's records, ready to append to its shard.

    Attributes:
      data: the framed records back to back; when the shards are compressed, as a piece of the shard's gzip
        member (``format.tfrecord.DeflatePiece``).
      record_sizes: each record's framed size before compression (the offsets of DALI index files).
      stats: the input's share of its shard's statistics (the kind's own type; see ``Kind.count``).
    """

    data: bytes | DeflatePiece
    record_sizes: tuple[int, ...]
    stats: Any


def encode_item(item: Any, *, prepare: Callable, to_records: Callable,
                compression: str | None) -> EncodedItem | Rejection:
    """``prepare(item)``, then its records framed (and compressed): the function the workers run."""
    prepared = prepare(item)
    if isinstance(prepared, Rejection):
        return prepared
    records, stats = to_records(prepared)
    data, sizes = frame_records(records)
    return EncodedItem(deflate_piece(data) if compression == "gzip" else data, sizes, stats)


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")  # file names that are not valid UTF-8 round-trip


@dataclasses.dataclass(frozen=True)
class ImageItemStats:
    """What one image adds to its shard's statistics."""

    label: int | tuple  # a class index; multi-label: the class indices; value labels: the floats
    pixels: Any  # PixelSums
    converted: bool
    source: str = ""  # the image's path relative to SRC, and the SHA-256 of its bytes (duplicates, --dedupe)
    sha256: str = ""


def image_records(image: PreparedImage, class_names: tuple[str, ...], labels: str | None = None,
                  features: dict | None = None) -> tuple[list[list[bytes]], ImageItemStats]:
    """One record with the keys TF's reference input pipelines read (see ``IMAGE_FEATURES``).

    ``labels``: the manifest's ``labels`` (None or ``"class"``: ``image/class/label``; ``"multi"``:
    ``image/class/labels``; ``"value"``: ``image/value``), with ``features`` its table (``image_features``).
    """
    label = image.source.label
    values = {
        "image/encoded": image.encoded,
        "image/format": b"jpeg",
        "image/height": image.height,
        "image/width": image.width,
        "image/channels": image.channels,
        "image/filename": _text(image.source.relpath),
    }
    if labels == "multi":
        values[MULTI_LABEL_KEY] = label
        values["image/class/text"] = _text(";".join(class_names[i] for i in label))
    elif labels == "value":
        values[VALUE_KEY] = label
    else:
        values["image/class/label"] = label
        values["image/class/text"] = _text(class_names[label])
    record = serialize(features or IMAGE_FEATURES, values)
    return [record], ImageItemStats(label, image.pixels, image.converted is not None, image.source.relpath,
                                    image.sha256)


def episode_records(episode: PreparedEpisode, features: dict) -> tuple[list[list[bytes]], tuple[dict, dict]]:
    """One record per chunk (see ``EPISODE_FEATURES``; the reader joins them by id), and the episode's
    manifest entry and feature sums.

    ``features``: the dataset's feature table (``EPISODE_FEATURES`` plus a ``data/<name>`` entry per feature, and
    ``episode/label`` in a labelled dataset: the episode's label is then in every chunk record).
    """
    labelled = LABEL_KEY in features
    records = []
    for index, (start, steps, data) in enumerate(episode.chunks):
        values = {
            "episode/id": episode.episode_id,
            "episode/length": episode.length,
            "episode/chunk": index,
            "episode/chunks": len(episode.chunks),
            "episode/start": start,
            "episode/steps": steps,
            "episode/source": _text(episode.source.relpath),
            **{f"{DATA_PREFIX}{name}": raw for name, raw in data.items()},
        }
        if labelled:
            values[LABEL_KEY] = episode.label
        records.append(serialize(features, values))
    entry = {"id": episode.episode_id, "source": episode.source.relpath, "length": episode.length,
             "label": episode.label}
    return records, (entry, episode.sums)
