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

# Image labels other than classes (``tfshard images --labels FILE``): the manifest's ``labels`` names the kind, and
# the kind's key replaces ``image/class/label`` (``image_features``). Class folders, and a labels file of classes,
# keep ``IMAGE_FEATURES`` as they are.
IMAGE_LABEL_KINDS = ("class", "multi", "value")
MULTI_LABEL_KEY = "image/class/labels"  # multi-label: the sorted 0-based class indices of the image (any number)
VALUE_KEY = "image/value"  # regression: one float32 per label column
IMAGE_LABEL_KEYS = {None: "image/class/label", "class": "image/class/label", "multi": MULTI_LABEL_KEY,
                    "value": VALUE_KEY}

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


def image_features(labels: str | None = None, columns: int = 1) -> dict[str, Any]:
    """The record keys of an image dataset whose labels are of kind ``labels`` (the manifest's ``labels``).

    None or ``"class"``: ``IMAGE_FEATURES``. ``"multi"``: ``image/class/labels`` (int64, any number, sorted) in
    place of ``image/class/label``, and ``image/class/text`` the names joined by ``;``. ``"value"``:
    ``image/value`` (float32 ``[columns]``) in place of both class keys.

        list(image_features("value", 2))[-1], image_features("value", 2)["image/value"]["shape"]  # ('image/value', [2])
    """
    if labels not in IMAGE_LABEL_KEYS:
        raise ValueError(f"image labels: must be one of {IMAGE_LABEL_KINDS} or None (got {labels!r})")
    features = dict(IMAGE_FEATURES)
    if labels == "multi":
        del features["image/class/label"]
        features[MULTI_LABEL_KEY] = {"dtype": "int64", "shape": [-1],
                                     "description": "sorted 0-based indices into class_names (multi-label)"}
        features["image/class/text"] = {"dtype": "string", "shape": [], "description": "class names joined by ;"}
    elif labels == "value":
        del features["image/class/label"], features["image/class/text"]
        features[VALUE_KEY] = {"dtype": "float32", "shape": [columns],
                               "description": "the label columns' values (label_columns in dataset.json)"}
    return features


def image_features_of(labels: str | None, label_columns: Iterable[str] = ()) -> dict[str, Any]:
    """``image_features`` of a manifest's ``labels`` and ``label_columns``: what its records must hold."""
    return image_features(labels, max(1, len(list(label_columns))))


def same_keys(features: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether two feature tables declare the same keys with the same dtypes and shapes (descriptions aside)."""
    def kinds(table):
        return {key: (spec.get("dtype"), spec.get("shape")) for key, spec in table.items()}

    return kinds(features) == kinds(expected)


def data_features(features: dict[str, Any]) -> dict[str, dict]:
    """Feature name → its entry (``dtype``, ``shape``) for the ``data/<name>`` keys of an episode table."""
    return {key[len(DATA_PREFIX):]: spec for key, spec in features.items() if key.startswith(DATA_PREFIX)}


def _tensorflow():
    """TensorFlow, imported only by the parse specs: the workers use the tables and ``serialize`` without it."""
    import tensorflow as tf

    return tf


def parse_spec(table: dict[str, Any], keys: Iterable[str] | None = None) -> dict:
    """``tf.io.parse_*example`` spec for ``keys`` (default: all) of a feature table; raw episode data is bytes.

    A key of shape ``[-1]`` (any number of values) is a ``VarLenFeature``; ``[k]`` of int64 or float32, ``k``
    values; every other key one value (episode data: one bytes string of any shape).
    """
    tf = _tensorflow()

    def feature(spec):
        dtype = {"int64": tf.int64, "float32": tf.float32}.get(spec["dtype"], tf.string)
        shape = list(spec.get("shape", [])) if dtype != tf.string else []
        if shape == [-1]:
            return tf.io.VarLenFeature(dtype)
        return tf.io.FixedLenFeature(shape, dtype)

    return {key: feature(table[key]) for key in (table if keys is None else keys)}


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
        shape = table[key].get("shape", []) if kind is not bytes else []
        if shape:  # [-1]: any number of values; [k]: exactly k
            if type(value) is not tuple or any(type(v) is not kind for v in value) or (
                    shape != [-1] and len(value) != shape[0]):
                raise TypeError(f"{key}: {value!r:.60} for a {table[key]['dtype']} {shape} feature")
        elif type(value) is not kind:  # exactly: a bool is no int64, an int no float32
            raise TypeError(f"{key}: {type(value).__name__} value for a {table[key]['dtype']} feature")
    return example_parts(values.items())
