"""The ``tf.train.Example`` keys of each kind of dataset, and the parse specs built from them.

The tables are plain data (they are also written into ``dataset.json``'s
``features``); ``serialize`` builds a record without TensorFlow and ``parse_spec``
imports it only when called.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .tfrecord import example_parts

IMAGE_FEATURES = {
    "image/encoded": {"dtype": "string", "shape": [], "description": "JPEG bytes"},
    "image/format": {"dtype": "string", "shape": [], "description": "always 'jpeg'"},
    "image/height": {"dtype": "int64", "shape": []},
    "image/width": {"dtype": "int64", "shape": []},
    "image/channels": {"dtype": "int64", "shape": [], "description": "1 (grayscale) or 3 (RGB)"},
    "image/class/label": {"dtype": "int64", "shape": [], "description": "0-based index into class_names"},
    "image/class/text": {"dtype": "string", "shape": [], "description": "class name"},
    "image/filename": {"dtype": "string", "shape": [], "description": "path relative to the source folder"},
}

EPISODE_FEATURES = {
    "episode/id": {"dtype": "int64", "shape": [], "description": "position of the source file in sorted order"},
    "episode/length": {"dtype": "int64", "shape": [], "description": "time steps of the whole episode"},
    "episode/chunk": {"dtype": "int64", "shape": [], "description": "0-based index of this record's chunk"},
    "episode/chunks": {"dtype": "int64", "shape": [], "description": "records the episode was split into"},
    "episode/start": {"dtype": "int64", "shape": [], "description": "first time step of this chunk"},
    "episode/steps": {"dtype": "int64", "shape": [], "description": "time steps in this chunk"},
    "episode/source": {"dtype": "string", "shape": [], "description": "path relative to the source folder"},
}
DATA_PREFIX = "data/"  # episode feature ``obs`` is stored under ``data/obs``
LABEL_KEY = "episode/label"  # in every chunk record of a labelled episode dataset
LABEL_NAME = "label"  # what readers call an episode's label: no feature of a labelled dataset may be called so
LABEL_FEATURES = {  # by the manifest's ``labels``
    "class": {"dtype": "int64", "shape": [], "description": "0-based index into class_names"},
    "value": {"dtype": "float32", "shape": [], "description": "the episode's value label"},
}


def episode_features(schema: dict[str, tuple[str, tuple[int, ...]]], labels: str | None = None) -> dict[str, Any]:
    """``EPISODE_FEATURES`` plus one ``data/<name>`` entry per feature: numpy dtype string and trailing shape.

    ``labels``: None, or ``"class"``/``"value"``, which adds ``episode/label`` (int64 or float32).
    """
    features = dict(EPISODE_FEATURES)
    if labels is not None:
        features[LABEL_KEY] = dict(LABEL_FEATURES[labels])
    for name, (dtype, shape) in sorted(schema.items()):
        features[f"{DATA_PREFIX}{name}"] = {
            "dtype": dtype,
            "shape": list(shape),
            "description": f"raw little-endian bytes of [steps, {', '.join(map(str, shape))}]".replace(", ]", "]"),
        }
    return features


def data_features(features: dict[str, Any]) -> dict[str, dict]:
    """Feature name → its entry (``dtype``, ``shape``) for the ``data/<name>`` keys of an episode table."""
    return {key[len(DATA_PREFIX):]: spec for key, spec in features.items() if key.startswith(DATA_PREFIX)}


def _tensorflow():
    """TensorFlow, imported only by the parse specs: the workers use the tables and ``serialize`` without it."""
    import tensorflow as tf

    return tf


def parse_spec(table: dict[str, Any], keys: Iterable[str] | None = None) -> dict:
    """``tf.io.parse_*example`` spec for ``keys`` (default: all) of a feature table; raw episode data is bytes."""
    tf = _tensorflow()

    def dtype(spec):
        return {"int64": tf.int64, "float32": tf.float32}.get(spec["dtype"], tf.string)

    return {key: tf.io.FixedLenFeature([], dtype(table[key])) for key in (table if keys is None else keys)}


def episode_parse_spec(names: Iterable[str]) -> dict:
    """The spec of every ``episode/*`` key plus ``data/<name>`` (raw bytes) for each of ``names``."""
    tf = _tensorflow()
    data = {f"{DATA_PREFIX}{n}": tf.io.FixedLenFeature([], tf.string) for n in names}
    return {**parse_spec(EPISODE_FEATURES), **data}


def serialize(table: dict[str, Any], values: dict[str, Any]) -> list[bytes]:
    """One ``tf.train.Example`` holding exactly the keys of ``table``, as wire-format parts to join or frame.

    Integers are stored as int64, floats as float32, everything else (strings, raw episode data) as bytes; no
    TensorFlow is needed (``format/tfrecord.py``). Writing a key the table does not declare, or leaving one out, is a
    ``KeyError``: what is written is what the manifest says.
    """
    if set(values) != set(table):
        raise KeyError(f"record keys {sorted(set(values) ^ set(table))} differ from the feature table")
    for key, value in values.items():
        kind = {"int64": int, "float32": float}.get(table[key]["dtype"], bytes)
        if type(value) is not kind:  # exactly: a bool is no int64, an int no float32
            raise TypeError(f"{key}: {type(value).__name__} value for a {table[key]['dtype']} feature")
    return example_parts(values.items())
