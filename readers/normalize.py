"""``readers.normalization()``: a Keras layer that normalises images (or episode features) on the device, from the
manifest's statistics.

The fastest loaders ship uint8 to the accelerator and normalise there (FFCV,
DALI): a quarter of the bytes of float32 cross the host-device link, and the
arithmetic runs where it is cheapest. Put this layer first in the model:

    ds = readers.images("photos-tfr", batch_size=256, dtype="uint8")
    model = keras.Sequential([readers.normalization("photos-tfr", dtype="uint8"), backbone])

For episodes the statistics are per feature and per trailing element (a channel of ``obs [T, 8]``), measured over
every step at conversion: ``readers.normalization("runs-tfr", features="obs")`` normalises the windows
``readers.windows(features="obs")`` yields.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..format.records import data_features
from . import files as files_lib


def normalization(path: str, split: str = "train", *, dtype: str = "float32",
                  features: str | Sequence[str] | None = None):
    """A ``keras.layers.Normalization`` from the statistics in ``dataset.json``.

    Images: the split's per-channel pixel mean and std. Episodes: each feature's mean and std per trailing element
    (over every step of the split's episodes), for windows of that feature.

    Args:
      path: a ``tfshard images`` or ``tfshard episodes`` dataset.
      split: whose statistics to use (the training split's, normally, for every split).
      dtype: images: the dtype ``readers.images`` yields: ``"uint8"`` ([0, 255]) or ``"float32"`` ([0, 1]).
      features: episodes: a feature name (one layer), a list of names (a dict of layers, the structure
        ``readers.windows(features=[...])`` yields), or None: every feature (one layer when the dataset has one).

    Returns:
      Images: a layer mapping ``[B, H, W, 3]`` images to ``(x - mean) / std`` per channel, as float32.
      Episodes: a layer mapping ``[B, L, *shape]`` windows of a feature to ``(x - mean) / std`` per trailing
      element (a zero std counts as 1e-6), or a dict of them.

    Raises:
      ValueError: an images dataset converted with ``--no-validate`` (no statistics were measured); an unknown
        feature; a feature without statistics (complex, or NaN/inf kept at conversion); ``features`` for images.
    """
    import keras

    dataset = files_lib.info(path)
    info = files_lib.split_info(dataset, split)
    if dataset.manifest.kind == "episodes":
        if dtype != "float32":
            raise ValueError(f"{path}: dtype={dtype!r} is for images (the dtype readers.images yields); episode "
                             "windows keep their features' dtypes: drop dtype")
        return _episode_normalization(keras, dataset, info, split, features)
    if features is not None:
        raise ValueError(f"{path}: features={features!r} is for episode datasets; an images dataset has one "
                         "statistic per RGB channel: drop features")
    if dtype not in ("float32", "uint8"):
        raise ValueError(f"dtype: must be 'float32' or 'uint8' (got {dtype!r})")
    if info.pixel_mean is None or info.pixel_std is None:
        raise ValueError(f"{path}: split {split!r} has no pixel statistics (converted with --no-validate); "
                         "convert again with validation, or build keras.layers.Normalization yourself")
    scale = 255.0 if dtype == "uint8" else 1.0
    mean = np.asarray(info.pixel_mean, np.float32) * scale
    std = np.maximum(np.asarray(info.pixel_std, np.float32) * scale, 1e-6)
    return keras.layers.Normalization(axis=-1, mean=mean, variance=std * std)


def _episode_normalization(keras, dataset, info, split: str, features):
    schema = data_features(dataset.manifest.features)
    names = list(schema) if features is None else [features] if isinstance(features, str) else list(features)
    unknown = [n for n in names if n not in schema]
    if unknown or not names:
        raise ValueError(f"{dataset.path}: no feature(s) {unknown or names!r} (got features={features!r}); the "
                         f"dataset has {sorted(schema)}")
    layers = {}
    for name in names:
        shape = tuple(schema[name]["shape"])
        mean = (info.feature_mean or {}).get(name)
        std = (info.feature_std or {}).get(name)
        if mean is None or std is None or None in mean or None in std or len(mean) != max(1, int(np.prod(shape))):
            raise ValueError(f"{dataset.path}: split {split!r} has no statistics for feature {name!r} (complex "
                             "values, or NaN/inf kept at conversion); build keras.layers.Normalization yourself")
        mean = np.asarray(mean, np.float32).reshape(shape)
        std = np.maximum(np.asarray(std, np.float32).reshape(shape), 1e-6)
        # One statistic per trailing element: the axes after [B, L]; a scalar feature has one for all.
        axis = tuple(range(-len(shape), 0)) if shape else None
        layers[name] = keras.layers.Normalization(axis=axis, mean=mean, variance=std * std, name=f"normalize_{name}")
    single = isinstance(features, str) or (features is None and len(schema) == 1)
    return layers[names[0]] if single else layers
