"""``gs://`` end to end, for real: TensorFlow's own GCS client against a local GCS emulator.

The test runs this file as a program inside a private network and mount namespace
where ``storage.googleapis.com`` and ``www.googleapis.com`` are a local
``gcp-storage-emulator`` over TLS (``tests/gcs_emulator.py``). There it converts
images with the real ``tfshard`` CLI into ``gs://tfshard/...`` after a conversion
killed between a shard's upload and its commit, verifies, reads back with
``readers.images`` and ``readers.windows``, and compares every object, byte for byte,
with the same conversion written to a local folder. It skips only where
namespaces are not permitted, and fails there instead under ``TFSHARD_CI=1``.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
import time

import pytest
from helpers import assert_same_tree, run_gcs_scenario

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "gs://tfshard"
SHARDS = [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]

# Killed like `kill -9` after the third shard's temporary object is uploaded, before it is committed (copied).
CRASH = """
import os, sys
import tensorflow as tf
from tfshard.ingest import ConvertOptions, convert_images

rename = tf.io.gfile.rename
def crash_before_commit(src, dst, overwrite=False):
    if dst.endswith(sys.argv[3]):
        os._exit(9)
    return rename(src, dst, overwrite)
tf.io.gfile.rename = crash_before_commit
convert_images(sys.argv[1], sys.argv[2], ConvertOptions(num_shards=4, index=True), workers=0, progress=False)
"""


def test_gs_urls_end_to_end(tmp_path):
    """Convert (after a crash), resume, verify, read back, overwrite; images and episodes; all on gs://."""
    run_gcs_scenario(__file__, tmp_path, timeout=300, passed="gs:// scenario passed")


# Everything below runs inside the namespace, as `python tests/test_gcs.py ROOT`.


def _tree(folder: str) -> dict[str, bytes]:
    """Every object (file) below ``folder`` by relative path, with its bytes; local paths and gs:// alike."""
    import tensorflow as tf

    found = {}
    for top, _, files in tf.io.gfile.walk(folder):
        rel = top[len(folder):].strip("/")
        for name in files:
            with tf.io.gfile.GFile(posixpath.join(top, name), "rb") as f:
                found[posixpath.join(rel, name) if rel else name] = f.read()
    return found


def _mtimes(folder: str) -> dict[str, int]:
    import tensorflow as tf

    return {name: tf.io.gfile.stat(posixpath.join(folder, name)).mtime_nsec for name in tf.io.gfile.listdir(folder)
            if not name.endswith("/")}


def _tfshard(*args: str) -> subprocess.CompletedProcess:
    """The real CLI in its own process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tfshard", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def _images(root: str) -> None:
    import numpy as np
    import tensorflow as tf
    from helpers import make_tree
    from tfshard import cli, readers
    from tfshard.ingest import ConvertOptions, OutputExistsError, VerifyError, convert_images, verify
    from typer.testing import CliRunner

    src, local, out = os.path.join(root, "photos"), os.path.join(root, "photos-tfr"), f"{BUCKET}/photos"
    make_tree(src, classes=("cat", "dog", "owl"), per_class=8)
    options = ConvertOptions(num_shards=4, index=True)
    convert_images(src, local, options, workers=0, progress=False)

    # A conversion killed between the third shard's upload and its commit leaves that temporary object.
    crashed = subprocess.run([sys.executable, "-c", CRASH, src, out, SHARDS[2]], cwd=REPO, capture_output=True,
                             text=True, timeout=120, check=False)
    assert crashed.returncode == 9, crashed.stderr
    names = set(tf.io.gfile.listdir(out))
    assert {SHARDS[0], SHARDS[1], ".tmp-" + SHARDS[2]} <= names and "dataset.json" not in names, names
    kept = {name: tf.io.gfile.stat(f"{out}/{name}").mtime_nsec for name in SHARDS[:2]}

    # The same command again, through the real CLI: keeps the committed shards, ends as an uninterrupted run.
    resumed = _tfshard("images", src, out, "--num-shards", "4", "--index", "--workers", "2", "-q")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_tree(_tree(out), _tree(local), "resumed gs:// conversion")  # no .tmp- object, no state left
    mtimes = _mtimes(out)
    assert all(mtimes[name] == kept[name] for name in kept), "a committed shard was rewritten on resume"
    assert all(mtimes["dataset.json"] > t for name, t in mtimes.items() if name != "dataset.json"), mtimes

    checked = CliRunner().invoke(cli.app, ["verify", out])  # the CLI in this process: TensorFlow is loaded
    assert checked.exit_code == 0 and f"{out}: OK, 24 records in 4 shards" in checked.output, checked.output
    shard = f"{out}/{SHARDS[1]}"
    original = tf.io.gfile.GFile(shard, "rb").read()
    with tf.io.gfile.GFile(shard, "wb") as f:
        f.write(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    try:
        verify(out)
        raise AssertionError("verify missed a flipped byte in a gs:// shard")
    except VerifyError as e:
        assert any(p.startswith(f"{shard}: corrupted shard") for p in e.problems), e.problems
    with tf.io.gfile.GFile(shard, "wb") as f:
        f.write(original)

    # A missing bucket is a one-line error, not TensorFlow's endless makedirs retry (the CLI in this process: a
    # process of its own would only import TensorFlow again).
    missing = CliRunner().invoke(cli.app, cli.global_flags_first(["images", src, "gs://no-such-bucket/out", "-q"]))
    assert missing.exit_code == 1 and isinstance(missing.exception, SystemExit), (missing.exception, missing.output)
    assert "bucket gs://no-such-bucket does not exist" in missing.output, missing.output
    assert len(missing.output.strip().splitlines()) == 1, missing.output

    # A finished conversion run again is a no-op: nothing is rewritten.
    before = _mtimes(out)
    convert_images(src, out, options, workers=0, progress=False)
    assert _mtimes(out) == before

    # Read back: evaluation equals the local read exactly; a training epoch yields every record once.
    def batches(path, **kwargs):
        ds = readers.images(path, batch_size=5, image_size=(16, 16), **kwargs)
        images, labels = zip(*((x.numpy(), y.numpy()) for x, y in ds))
        return np.concatenate(images), np.concatenate(labels)

    gs_images, gs_labels = batches(out, training=False)
    local_images, local_labels = batches(local, training=False)
    assert np.array_equal(gs_labels, local_labels) and np.array_equal(gs_images, local_images)
    _, train_labels = batches(out, training=True, seed=0, drop_remainder=False, augment=None)
    assert sorted(train_labels) == sorted(local_labels) and len(train_labels) == 24

    # Other options into the same prefix: refused without --overwrite; with it, the old shards are gone.
    other = ConvertOptions(num_shards=2)
    try:
        convert_images(src, out, other, workers=0, progress=False)
        raise AssertionError("a gs:// dataset of other options was replaced without overwrite")
    except OutputExistsError as e:
        assert "--overwrite" in str(e)
    convert_images(src, out, other, workers=0, progress=False, overwrite=True)
    convert_images(src, local + "-2", other, workers=0, progress=False)
    assert_same_tree(_tree(out), _tree(local + "-2"), "overwritten gs:// conversion")


def _episodes(root: str) -> None:
    import numpy as np
    from helpers import convert_episode_tree, random_episodes, save_episodes
    from tfshard import readers

    src, local, out = os.path.join(root, "runs"), os.path.join(root, "runs-tfr"), f"{BUCKET}/runs/tfr"
    save_episodes(src, {f"ep{i}.npy": e for i, e in enumerate(random_episodes([40, 7, 25, 60, 33], seed=3))})
    convert_episode_tree(src, out, num_shards=3)
    convert_episode_tree(src, local, num_shards=3)
    assert_same_tree(_tree(out), _tree(local), "gs:// episodes")

    def windows(path, **kwargs):
        ds = readers.windows(path, length=8, shift=3, batch_size=4, features="data", targets=2, seed=0,
                             drop_remainder=False, **kwargs)
        return [(x.numpy(), y.numpy()) for x, y in ds]

    for kwargs in ({}, {"resident": False, "shuffle": False}):
        gs_windows, local_windows = windows(out, **kwargs), windows(local, **kwargs)
        assert len(gs_windows) == len(local_windows) > 0
        for (gx, gy), (lx, ly) in zip(gs_windows, local_windows):
            assert np.array_equal(gx, lx) and np.array_equal(gy, ly), f"windows differ ({kwargs})"


if __name__ == "__main__":
    for step in (_images, _episodes):
        began = time.monotonic()
        step(sys.argv[1])
        print(f"{step.__name__[1:]}: {time.monotonic() - began:.1f} s", flush=True)
    print("gs:// scenario passed")
