"""Plain helpers the tests share: tiny seeded inputs, conversions in-process, reading a dataset back as documented,
comparing folders, and the skip policy for what a machine may not offer. Fixtures live in conftest.py.

TensorFlow and tfshard are imported inside the helpers that need them, so a test process that only makes inputs (or
a child script run from this folder) never loads them.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import tempfile
import threading
from typing import Any, NoReturn

import numpy as np
import pytest
from PIL import Image

MANIFEST = "dataset.json"


# --- the skip policy -----------------------------------------------------------------------------------------------


def skip_unless_ci(reason: str) -> NoReturn:
    """Skips a test this machine cannot run (no ``unshare``, no mount namespace, ...), or fails it under
    ``TFSHARD_CI=1``: CI provides every such feature, so a skip there would let it pass without running the test."""
    if os.environ.get("TFSHARD_CI") == "1":
        pytest.fail(f"{reason} (CI must run this test: TFSHARD_CI=1)")
    pytest.skip(reason)


def require(condition: bool, reason: str) -> None:
    """``skip_unless_ci(reason)`` unless ``condition`` holds: ``require(shutil.which("unshare"), "no unshare(1)")``."""
    if not condition:
        skip_unless_ci(reason)


def within(timeout_s, function, *args):
    """``function(*args)`` in a thread; fails the test, instead of hanging it, if it takes over ``timeout_s``."""
    result, errors = [], []

    def run():
        try:
            result.append(function(*args))
        except BaseException as e:  # noqa: BLE001 (raised again in the test's thread)
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"{function.__name__} did not return within {timeout_s} s"
    if errors:
        raise errors[0]
    return result[0]


# --- small seeded inputs -------------------------------------------------------------------------------------------


def ignoring_ctrl_c() -> None:
    """A ``preexec_fn``: the child starts with Ctrl-C ignored, inherited, as a shell script's background job
    (``tfshard ... &``, or ``make test &``, and all they start) does. ``make test`` run that way saw conversions
    and ``tfshard bench`` go on after Ctrl-C: Python keeps an inherited ignored SIGINT unless told otherwise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def jpeg_bytes(seed: int, size=(16, 16), mode="RGB", quality=90, **save_kwargs) -> bytes:
    """A seeded random-noise JPEG of ``size`` (width, height), RGB or ``"L"``."""
    rng = np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    image = Image.fromarray(pixels if channels == 3 else pixels[..., 0], mode)
    return saved_bytes(image, "JPEG", quality=quality, **save_kwargs)


def write_jpeg(path, seed: int, size=(16, 16), mode="RGB", quality=90, **save_kwargs) -> bytes:
    """Writes ``jpeg_bytes(seed, ...)`` to ``path`` (making its folder) and returns them."""
    data = jpeg_bytes(seed, size, mode, quality, **save_kwargs)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return data


def saved_bytes(image: Image.Image, fmt: str, **save_kwargs) -> bytes:
    """``image`` encoded by Pillow as ``fmt`` ("PNG", "TIFF", ...)."""
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_kwargs)
    return buffer.getvalue()


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


def flat_jpegs(root, names) -> None:
    """Writes ``root/<name>.jpg`` for each name, seeded by its position: a flat folder for a labels file."""
    for i, name in enumerate(names):
        write_jpeg(os.path.join(root, f"{name}.jpg"), i)


def write_text(path, text: str) -> str:
    """Writes UTF-8 ``text`` to ``path``; returns the path as a string (a labels file, a CSV)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


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


def npy_bytes(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    """``array`` as the bytes of a .npy file (a member of a hand-made .npz, say)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


class Tripwire:
    """Unpickling this creates the folder ``marker``: proof that something loaded a pickle."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


# --- conversions in-process ----------------------------------------------------------------------------------------


def convert_image_tree(src, out, *, image=None, workers: int = 0, overwrite: bool = False, **options):
    """convert_images in-process (``workers=0``) with the library's ``on_error`` default; ``image``: ImageOptions."""
    from tfshard.ingest import ConvertOptions, ImageOptions, convert_images

    config = ConvertOptions(image=image or ImageOptions(), **options)
    return convert_images(str(src), str(out), config, workers=workers, overwrite=overwrite, progress=False)


def convert_episode_tree(src, out, *, episode=None, workers: int = 0, overwrite: bool = False, **options):
    """convert_episodes in-process (``workers=0``), ``on_error="fail"`` unless given; ``episode``: EpisodeOptions."""
    from tfshard.ingest import ConvertOptions, EpisodeOptions, convert_episodes

    options.setdefault("on_error", "fail")
    config = ConvertOptions(episode=episode or EpisodeOptions(), **options)
    return convert_episodes(str(src), str(out), config, workers=workers, overwrite=overwrite, progress=False)


def convert_obs_episodes(root, lengths, *, seed: int, num_shards: int) -> str:
    """Episodes ``root/src/runs/epNN.npz`` holding ``obs`` float32 [T, 2] of ``lengths`` (seeded normal values, all
    distinct, so every window is), converted into ``root/out`` in ``num_shards`` shards; returns ``root/out``."""
    rng = np.random.default_rng(seed)
    save_episodes(os.path.join(str(root), "src"), {
        f"runs/ep{i:02d}.npz": {"obs": rng.normal(size=(t, 2)).astype(np.float32)} for i, t in enumerate(lengths)})
    out = os.path.join(str(root), "out")
    convert_episode_tree(os.path.join(str(root), "src"), out, num_shards=num_shards)
    return out


def numbered_episodes(root, name, lengths, base, *, classes=None, **options) -> str:
    """Episodes ``root/{name}-src/e{i}.npz`` of ``lengths`` (under class folders ``classes[i]`` when given): ``t``
    int64 [T] counting from ``base + 1000·i`` (every step numbered uniquely across datasets of other ``base``), ``obs``
    float32 [T, 2]; converted into ``root/{name}`` (2 shards unless ``num_shards`` is given); returns it."""
    src, out = os.path.join(str(root), f"{name}-src"), os.path.join(str(root), name)
    save_episodes(src, {(f"{classes[i]}/" if classes else "") + f"e{i}.npz": {
        "t": np.arange(base + 1000 * i, base + 1000 * i + t, dtype=np.int64),
        "obs": np.full((t, 2), i, np.float32)} for i, t in enumerate(lengths)})
    options.setdefault("num_shards", 2)
    convert_episode_tree(src, out, **options)
    return out


def wide_episodes(root) -> str:
    """Two episodes (12 and 10 steps) of ``t`` int64 and ``obs`` float64 [T, 3], converted into ``root/wide`` in one
    shard: ``obs`` disagrees with ``numbered_episodes``' (a mixture's features that differ); returns it."""
    src = os.path.join(str(root), "wide-src")
    save_episodes(src, {f"e{i}.npz": {"t": np.arange(t, dtype=np.int64), "obs": np.zeros((t, 3))}
                        for i, t in enumerate([12, 10])})
    convert_episode_tree(src, os.path.join(str(root), "wide"), num_shards=1)
    return os.path.join(str(root), "wide")


# --- a dataset read back as documented -----------------------------------------------------------------------------


def read_manifest(out) -> dict:
    """``OUT/dataset.json`` as plain JSON, for a test to inspect or tamper with (no validation)."""
    with open(os.path.join(str(out), MANIFEST), "rb") as f:
        return json.loads(f.read())


def write_manifest(out, raw: dict) -> None:
    with open(os.path.join(str(out), MANIFEST), "w") as f:
        json.dump(raw, f)


def edit_manifest(out, change) -> None:
    """Rewrites ``OUT/dataset.json`` after ``change(raw)`` edits its JSON in place."""
    raw = read_manifest(out)
    change(raw)
    write_manifest(out, raw)


def image_features() -> dict:
    """tf.io parse spec for every key the manifest's feature table lists (read the records as documented)."""
    import tensorflow as tf
    from tfshard.format.manifest import IMAGE_FEATURES

    dtypes = {"string": tf.string, "int64": tf.int64}
    return {key: tf.io.FixedLenFeature([], dtypes[spec["dtype"]]) for key, spec in IMAGE_FEATURES.items()}


def shard_files(out) -> list[str]:
    """The names in OUT that are shards (or their index files), sorted."""
    return sorted(name for name in os.listdir(out) if ".tfrecord" in name)


def read_records(path, compression_type: str = "") -> list[bytes]:
    """The raw records of one TFRecord file, read by tf.data (``compression_type``: TensorFlow's, "" or "GZIP")."""
    import tensorflow as tf

    return list(tf.data.TFRecordDataset(str(path), compression_type=compression_type).as_numpy_iterator())


def tfrecord_bytes(records, compression_type: str = "") -> bytes:
    """The bytes ``tf.io.TFRecordWriter`` writes for ``records``: what a shard must be, byte for byte."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "tensorflow.tfrecord")
        with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression_type)) as writer:
            for record in records:
                writer.write(record)
        with open(path, "rb") as f:
            return f.read()


def labels_of(ds) -> list[int]:
    """Every label of an ``(images, labels)`` dataset, batch after batch."""
    return [int(v) for _, labels in ds for v in labels.numpy()]


def first_batches(ds, count) -> list[tuple[list[int], np.ndarray]]:
    """``(labels, images)`` of the first ``count`` batches of an ``(images, labels)`` dataset."""
    iterator = iter(ds)
    return [(labels.numpy().tolist(), images.numpy()) for images, labels in (next(iterator) for _ in range(count))]


def window_keys(batch) -> list[tuple[int, int]]:
    """``(episode, step)`` of every window of a ``with_keys=True`` batch ``(keys, windows)``."""
    keys, _ = batch
    return list(zip(keys["episode"].numpy().tolist(), keys["step"].numpy().tolist()))


# --- folders compared ----------------------------------------------------------------------------------------------


def files_under(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes, by relative path; folders are not listed."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def snapshot(root, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything under ``root`` but the top-level entries in ``skip``: a file's bytes, a folder None, a symlink its
    target and any other file its kind. Never follows a link nor opens a FIFO or device."""
    found: dict[str, Any] = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder == ".":
            dirs[:] = [d for d in dirs if d not in skip]
            files = [f for f in files if f not in skip]
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.normpath(os.path.join(rel_folder, name))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("symlink", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = None
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    found[rel] = f.read()
            else:
                found[rel] = ("special", stat.S_IFMT(st.st_mode))
    return found


def assert_same_tree(actual: dict, expected: dict, what: str = "") -> None:
    """Two ``snapshot``/``files_under`` results hold the same names, then the same content name by name (a readable
    failure rather than a diff of two dicts of bytes)."""
    prefix = f"{what}: " if what else ""
    assert sorted(actual) == sorted(expected), f"{prefix}names {sorted(actual)} != {sorted(expected)}"
    for name in expected:
        assert actual[name] == expected[name], f"{prefix}{name} differs"


def run_gcs_scenario(script: str, root, *, timeout: float, passed: str) -> str:
    """Runs ``script ROOT`` inside the private GCS emulator's namespace (``tests/gcs_emulator.py``); fails unless it
    exits 0 with ``passed`` as its last line; skips where namespaces are not permitted (fails there under CI).
    Returns its stdout."""
    import sys
    import time

    import gcs_emulator

    reason = gcs_emulator.unavailable_reason()
    require(reason is None, f"no private GCS emulator: {reason}")
    started = time.monotonic()
    done = gcs_emulator.run([sys.executable, os.path.abspath(script), str(root)], timeout=timeout,
                            env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, f"scenario failed:\n{done.stdout}\n{done.stderr[-8000:]}"
    assert done.stdout.strip().endswith(passed), done.stdout
    print(f"{done.stdout}{passed}; took {time.monotonic() - started:.1f} s")
    return done.stdout

