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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..format.records import data_features
from . import files as files_lib

# A std at most this share of its mean is constant to float32 (its eps is 1.2e-7): rounding noise, as the sums of a
# constant float feature leave (measured: up to 2.2e-7 of the mean over 3M steps), not a spread to scale up.
_CONSTANT = 8 * float(np.finfo(np.float32).eps)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def normalization(path: str, split: str = "train", *, dtype: str = "float32",
                  features: str | Sequence[str] | None = None, storage_options: Mapping[str, Any] | None = None):
    """A ``keras.layers.Normalization`` from the statistics in ``dataset.json``.

    Images: the split's per-channel pixel mean and std. Episodes: each feature's mean and std per trailing element
    (over every step of the split's episodes), for windows of that feature.

    Args:
      path: a ``tfshard images`` or ``tfshard episodes`` dataset.
      split: whose statistics to use (the training split's, normally, for every split).
      dtype: images: the dtype ``readers.images`` yields: ``"uint8"`` ([0, 255]) or ``"float32"`` ([0, 1]).
      features: episodes: a feature name (one layer), a list of names (a dict of layers, the structure
        ``readers.windows(features=[...])`` yields), or None: every feature (one layer when the dataset has one).
      storage_options: as for ``readers.images``.

    Returns:
      Images: a layer mapping ``[B, H, W, 3]`` images to ``(x - mean) / std`` per channel, as float32.
      Episodes: a layer mapping ``[B, L, *shape]`` windows of a feature to ``(x - mean) / std`` per trailing
      element, or a dict of them. A channel or element constant in the split (a std of 0, or within float32
      rounding of its mean) is only centred, ``x - mean``: never divided by a tiny std.

    Raises:
      ValueError: an images dataset converted with ``--no-validate`` (no statistics were measured); an unknown
        feature; a feature without statistics (complex, or NaN/inf kept at conversion), or whose statistics
        float32 cannot hold; ``features`` for images.
    """
    import keras

    dataset = files_lib.info(path, storage_options)
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
    mean, variance = _moments(path, f"split {split!r}'s pixels", np.asarray(info.pixel_mean) * scale,
                              np.asarray(info.pixel_std) * scale)
    return keras.layers.Normalization(axis=-1, mean=mean, variance=variance)


def _moments(path: str, what: str, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float32 mean and variance a ``keras.layers.Normalization`` is built from, for the manifest's mean and
    std (float64). A constant element (a std of 0, or one float32 cannot tell from the rounding of its mean) gets
    a variance of 1: it is centred, not scaled, as scikit-learn's ``StandardScaler`` does, where keras would divide
    by its epsilon (1e-7) and turn any value off the constant into millions.

    Raises:
      ValueError: a mean, or a variance, beyond float32 (a float64 feature of huge values): no float32 layer
        holds it.
    """
    constant = std <= _CONSTANT * np.abs(mean)
    fits = (np.abs(mean) <= _FLOAT32_MAX) & (np.where(constant, 0.0, std) <= np.sqrt(_FLOAT32_MAX))
    if not fits.all():
        i = int(np.flatnonzero(~fits)[0])
        raise ValueError(f"{path}: {what} have mean {float(mean.flat[i])!r} and std {float(std.flat[i])!r} at element "
                         f"{i}, beyond the float32 a keras Normalization layer holds; scale the feature first, or "
                         "normalise it yourself")
    return mean.astype(np.float32), np.where(constant, 1.0, std * std).astype(np.float32)


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
        mean, variance = _moments(dataset.path, f"split {split!r}'s feature {name!r}",
                                  np.asarray(mean, np.float64).reshape(shape),
                                  np.asarray(std, np.float64).reshape(shape))
        # One statistic per trailing element: the axes after [B, L]; a scalar feature has one for all.
        axis = tuple(range(-len(shape), 0)) if shape else None
        layers[name] = keras.layers.Normalization(axis=axis, mean=mean, variance=variance, name=f"normalize_{name}")
    single = isinstance(features, str) or (features is None and len(schema) == 1)
    return layers[names[0]] if single else layers
