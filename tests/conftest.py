"""Shared fixtures: tiny seeded image trees and numpy episodes made in tmp_path, a CLI runner, logical CPUs."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import numpy as np
import pytest
from PIL import Image


def _split_the_cpu(count: int = 4) -> None:
    """Splits the CPU into ``count`` logical devices, so tf.distribute tests run real multi-replica strategies.

    TensorFlow fixes its logical devices when it first initialises them, so this must run before any test touches
    TensorFlow: here, at conftest import. Nothing in the library changes; every test sees the same devices.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # already initialised: tests that need the devices say so (see test_windows_distributed.py)
        pass


_split_the_cpu()


@pytest.fixture(scope="session")
def strategies():
    """MirroredStrategy over 2 and over 3 logical CPUs, one of each for the whole run: strategies on the same devices
    number their collectives alike, so a second one's all-reduce could meet a first one's of another shape."""
    import tensorflow as tf

    devices = tf.config.list_logical_devices("CPU")
    assert len(devices) >= 3, f"conftest.py should split the CPU into 4 logical devices (got {devices})"
    return {2: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
            3: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])}


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
    from tfshard import cli as cli_module
    from typer.testing import CliRunner

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli_module.app, cli_module.global_flags_first([str(a) for a in args]))

    return invoke


def image_features() -> dict:
    """tf.io parse spec for every key the manifest's feature table lists (read the records as documented)."""
    import tensorflow as tf
    from tfshard.format.manifest import IMAGE_FEATURES

    dtypes = {"string": tf.string, "int64": tf.int64}
    return {key: tf.io.FixedLenFeature([], dtypes[spec["dtype"]]) for key, spec in IMAGE_FEATURES.items()}


def save_episodes(root, episodes: dict) -> None:
    """Writes ``{relpath: array}`` as .npy and ``{relpath: {name: array}}`` as .npz under ``root``."""
    for rel, value in episodes.items():
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(value, dict):
            np.savez(path, **value)
        else:
            np.save(path, value)


def random_episodes(lengths, seed: int = 0, width: int = 2) -> list[np.ndarray]:
    """Seeded float32 episodes ``[T, width]`` of the given lengths; every value distinct, so windows are too."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(t, width)).astype(np.float32) for t in lengths]


def convert_episode_tree(src, out, *, episode=None, workers: int = 0, overwrite: bool = False, **options):
    """convert_episodes in-process (``workers=0``), ``on_error="fail"`` unless given; ``episode``: EpisodeOptions."""
    from tfshard.ingest import ConvertOptions, EpisodeOptions, convert_episodes

    options.setdefault("on_error", "fail")
    config = ConvertOptions(episode=episode or EpisodeOptions(), **options)
    return convert_episodes(str(src), str(out), config, workers=workers, overwrite=overwrite, progress=False)
