"""Shared fixtures (a tiny seeded image tree, the same tree converted once per run, a CLI runner, tf.distribute
strategies) and the logical CPU split.

The plain helpers the tests share are in helpers.py.
"""

from __future__ import annotations

import gc
import os
import shutil
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import pytest
from helpers import convert_image_tree, make_tree, snapshot

# The run's other Python processes (xdist workers, CLI children, killed jobs) skip TensorFlow's optional jax and
# matplotlib imports: ~1.8 CPU-seconds of each one's ~7.6 s `import tensorflow` (tests/child_site/sitecustomize.py).
_CHILD_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_site")
_PYTHONPATH_BEFORE: list = []  # the value pytest_unconfigure puts back (None: unset)


def _child_site_on() -> None:
    """PYTHONPATH with child_site for the processes the run starts (xdist's workers start after pytest_configure)."""
    before = os.environ.get("PYTHONPATH")
    _PYTHONPATH_BEFORE.append(before)
    if _CHILD_SITE not in (before or "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (before, _CHILD_SITE) if p)


def pytest_unconfigure(config):
    """PYTHONPATH as it was: a process that runs pytest.main() and goes on starts its later children unchanged."""
    if _PYTHONPATH_BEFORE:
        before = _PYTHONPATH_BEFORE.pop()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _split_the_cpu(count: int = 4) -> None:
    """Splits the CPU into ``count`` logical devices, so tf.distribute tests run real multi-replica strategies.

    TensorFlow fixes its logical devices when it first initialises them, so this must run before any test touches
    TensorFlow: here, as pytest configures, before it imports a test module. Nothing in the library changes; every
    test sees the same devices.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # already initialised: tests that need the devices say so (see test_windows_distributed.py)
        pass


def pytest_configure(config):
    """TensorFlow set up in the process that runs the tests; not in pytest-xdist's controller, which runs none (its
    `import tensorflow`, ~7 CPU-seconds, came before the workers started)."""
    _child_site_on()
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return
    _split_the_cpu()
    # Objects older than the current test module are frozen (never walked again by the collector): TensorFlow's own
    # from here, and, after each module, whatever outlived it (function caches, models Keras keeps). Unfrozen, a
    # worker's full collections (tests and the library call gc.collect() to check what a dropped pipeline leaves) grew
    # with the modules it had run: one test took 73 s in the suite and 8 s in its file alone on a busy 2-core machine.
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _older_objects_frozen():
    """After each module (its own fixtures torn down first): its garbage collected, what outlives it frozen."""
    yield
    gc.collect()
    gc.freeze()


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


class ConvertedImages(NamedTuple):
    """A converted image dataset: its source folder, its OUT folder and the source files ({relpath: bytes})."""

    src: str
    out: str
    written: dict[str, bytes]


@pytest.fixture(scope="session")
def converted_images(tmp_path_factory):
    """``image_tree``'s 12 JPEGs converted once per run, with the defaults, in-process: ``(src, out, written)``.

    Read-only, shared by every test that asks for it: a test that changes OUT takes ``converted_images_copy``
    instead (one that changes SRC makes its own tree). At the end of the run, SRC and OUT must be unchanged, byte for
    byte, or the teardown fails naming this fixture.
    """
    root = tmp_path_factory.mktemp("converted_images")
    src, out = str(root / "src"), str(root / "out")
    written = make_tree(src)
    convert_image_tree(src, out)
    before = snapshot(str(root))
    yield ConvertedImages(src, out, written)
    assert snapshot(str(root)) == before, "a test changed converted_images (SRC or OUT): use converted_images_copy"


@pytest.fixture
def converted_images_copy(converted_images, tmp_path):
    """``converted_images`` with OUT copied to ``tmp_path/out`` (files, hidden ones and links as they are), for a test
    that changes it; SRC is the shared, read-only one."""
    out = str(tmp_path / "out")
    shutil.copytree(converted_images.out, out, symlinks=True)
    return converted_images._replace(out=out)


@pytest.fixture
def cli():
    """Invokes the typer app in-process: cli("images", src, out, ...) -> click Result."""
    from tfshard import cli as cli_module
    from typer.testing import CliRunner

    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli_module.app, cli_module.global_flags_first([str(a) for a in args]))

    return invoke
