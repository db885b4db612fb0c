"""``readers.normalization()``: a Keras layer that normalises images on the device, from the manifest's statistics.

The fastest loaders ship uint8 to the accelerator and normalise there (FFCV,
DALI): a quarter of the bytes of float32 cross the host-device link, and the
arithmetic runs where it is cheapest. Put this layer first in the model:

    ds = readers.images("photos-tfr", batch_size=256, dtype="uint8")
    model = keras.Sequential([readers.normalization("photos-tfr", dtype="uint8"), backbone])
"""

from __future__ import annotations

import numpy as np

from . import files as files_lib


def normalization(path: str, split: str = "train", *, dtype: str = "float32"):
    """A ``keras.layers.Normalization`` with the split's per-channel pixel mean and std from ``dataset.json``.

    Args:
      path: a ``tfshard images`` dataset.
      split: whose statistics to use (the training split's, normally, for every split).
      dtype: the dtype ``readers.images`` yields: ``"uint8"`` ([0, 255]) or ``"float32"`` ([0, 1]).

    Returns:
      A layer mapping ``[B, H, W, 3]`` images to ``(x - mean) / std`` per channel, as float32.

    Raises:
      ValueError: not an images dataset, or converted with ``--no-validate`` (no statistics were measured).
    """
    import keras

    if dtype not in ("float32", "uint8"):
        raise ValueError(f"dtype: must be 'float32' or 'uint8' (got {dtype!r})")
    dataset = files_lib.info(path)
    if dataset.manifest.kind != "images":
        raise ValueError(f"{path}: an {dataset.manifest.kind!r} dataset has no pixel statistics (got kind="
                         f"{dataset.manifest.kind!r}); pass an images dataset")
    info = files_lib.split_info(dataset, split)
    if info.pixel_mean is None or info.pixel_std is None:
        raise ValueError(f"{path}: split {split!r} has no pixel statistics (converted with --no-validate); "
                         "convert again with validation, or build keras.layers.Normalization yourself")
    scale = 255.0 if dtype == "uint8" else 1.0
    mean = np.asarray(info.pixel_mean, np.float32) * scale
    std = np.maximum(np.asarray(info.pixel_std, np.float32) * scale, 1e-6)
    return keras.layers.Normalization(axis=-1, mean=mean, variance=std * std)
