"""Building ``tf.train.Example`` records from prepared inputs, with the keys ``tfshard.format.records`` declares."""

from __future__ import annotations

from ..format.records import DATA_PREFIX, IMAGE_FEATURES, serialize
from .episodes import PreparedEpisode
from .images import PreparedImage


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")  # file names that are not valid UTF-8 round-trip


def image_example(image: PreparedImage, class_name: str) -> bytes:
    """Serialises one image with the keys TF's reference input pipelines read (see ``IMAGE_FEATURES``)."""
    return serialize(IMAGE_FEATURES, {
        "image/encoded": image.encoded,
        "image/format": b"jpeg",
        "image/height": image.height,
        "image/width": image.width,
        "image/channels": image.channels,
        "image/class/label": image.source.label,
        "image/class/text": _text(class_name),
        "image/filename": _text(image.source.relpath),
    })


def episode_chunk_examples(episode: PreparedEpisode, features: dict) -> list[bytes]:
    """Serialises one episode as one record per chunk (see ``EPISODE_FEATURES``); the reader joins them by id.

    ``features``: the dataset's feature table (``EPISODE_FEATURES`` plus a ``data/<name>`` entry per feature).
    """
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
        records.append(serialize(features, values))
    return records

