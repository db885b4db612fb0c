"""Shared fixtures: tiny seeded image trees made in tmp_path, and a CLI runner."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import numpy as np
import pytest
from PIL import Image


def write_jpeg(path, seed: int, size=(16, 16), mode="RGB", quality=90, **save_kwargs) -> bytes:
    """Writes a seeded random JPEG and returns its bytes."""
    rng = np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    image = Image.fromarray(pixels if channels == 3 else pixels[..., 0], mode)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image.save(path, "JPEG", quality=quality, **save_kwargs)
    with open(path, "rb") as f:
        return f.read()


def make_tree(root, classes=("cat", "dog"), per_class=6, splits=None, size=(16, 16), seed=0) -> dict:
    """Writes ``root/[split/]class/NNN.jpg`` seeded JPEGs; returns {relpath: bytes}."""
    written = {}
    counter = seed
    for split in splits or [None]:
        for name in classes:
            for i in range(per_class):
                rel = "/".join(p for p in (split, name, f"{i:03d}.jpg") if p)
                written[rel] = write_jpeg(os.path.join(root, rel), counter, size)
                counter += 1
    return written


@pytest.fixture
def image_tree(tmp_path):
    """A two-class, one-split tree of 12 seeded 16x16 JPEGs: (src path, {relpath: bytes})."""
    src = tmp_path / "src"
    return str(src), make_tree(str(src))


@pytest.fixture
def cli():
    """Invokes the typer app in-process: cli("images", src, out, ...) -> click Result."""
    from typer.testing import CliRunner

    import cli as cli_module

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli_module.app, [str(a) for a in args])

    return invoke


def image_features() -> dict:
    """tf.io parse spec for every key the manifest's feature table lists (read the records as documented)."""
    import tensorflow as tf

    from ingest.manifest import IMAGE_FEATURES

    dtypes = {"string": tf.string, "int64": tf.int64}
    return {key: tf.io.FixedLenFeature([], dtypes[spec["dtype"]]) for key, spec in IMAGE_FEATURES.items()}
