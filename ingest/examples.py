"""Building ``tf.train.Example`` records from prepared inputs."""

from __future__ import annotations

import tensorflow as tf

from .episodes import PreparedEpisode
from .images import PreparedImage


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def image_example(image: PreparedImage, class_name: str) -> bytes:
    """Serialises one image with the keys TF's reference input pipelines read (see ``IMAGE_FEATURES``)."""
    feature = {
        "image/encoded": _bytes(image.encoded),
        "image/format": _bytes(b"jpeg"),
        "image/height": _int(image.height),
        "image/width": _int(image.width),
        "image/channels": _int(image.channels),
        "image/class/label": _int(image.source.label),
        "image/class/text": _bytes(class_name.encode("utf-8", "surrogateescape")),
        "image/filename": _bytes(image.source.relpath.encode("utf-8", "surrogateescape")),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def episode_chunk_examples(episode: PreparedEpisode) -> list[bytes]:
    """Serialises one episode as one record per chunk (see ``EPISODE_FEATURES``); the reader joins them by id."""
    records = []
    for index, (start, steps, data) in enumerate(episode.chunks):
        feature = {
            "episode/id": _int(episode.episode_id),
            "episode/length": _int(episode.length),
            "episode/chunk": _int(index),
            "episode/chunks": _int(len(episode.chunks)),
            "episode/start": _int(start),
            "episode/steps": _int(steps),
            "episode/source": _bytes(episode.source.relpath.encode("utf-8", "surrogateescape")),
        }
        feature.update({f"data/{name}": _bytes(raw) for name, raw in data.items()})
        records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True))
    return records
