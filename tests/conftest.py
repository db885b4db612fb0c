"""Shared fixtures (a tiny seeded image tree, a CLI runner, tf.distribute strategies) and the logical CPU split.

The plain helpers the tests share are in helpers.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import pytest
from helpers import make_tree


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
