"""What the shard cache tests share: a small image dataset, a reader's epochs as numpy, the copies in a cache
folder, and shards to fetch without a dataset (tests/test_shard_cache*.py)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
from helpers import convert_image_tree, make_tree, read_manifest

LIMIT = 10**6  # far above the ~26 KB of each test dataset: nothing is evicted unless a test says so


def photo_dataset(root) -> str:
    """24 seeded 16x16 JPEGs in two classes, converted into ``root/out`` in 6 shards of ~4 KB."""
    make_tree(str(root / "src"), per_class=12)
    convert_image_tree(root / "src", root / "out", num_shards=6)
    return str(root / "out")


def images(path, **kwargs):
    """``readers.images`` in training, seeded: its batches are the same on every run."""
    from tfshard import readers

    return readers.images(path, batch_size=4, image_size=(16, 16), seed=0, **kwargs)


def epochs(ds, count: int = 2) -> list[list]:
    """Every element of ``count`` epochs, as numpy (nested structures flattened), epoch by epoch."""
    import tensorflow as tf

    return [[[np.asarray(x) for x in tf.nest.flatten(element)] for element in ds.as_numpy_iterator()]
            for _ in range(count)]


def assert_same_epochs(actual: list, expected: list) -> None:
    assert len(actual) == len(expected) and len(expected[0]) > 0
    for epoch, (got, want) in enumerate(zip(actual, expected)):
        assert len(got) == len(want), f"epoch {epoch + 1}: {len(got)} elements, not {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"epoch {epoch + 1}, element {i} differs"


def manifest_shards(path, split: str = "train") -> list:
    """The split's shards as the cache sees them: ``Shard(sha256, bytes, path)`` from the manifest."""
    from tfshard.readers.shard_cache.store import Shard

    raw = read_manifest(path)["splits"][split]["shards"]
    return [Shard(s["sha256"], s["bytes"], os.path.join(path, s["file"])) for s in raw]


def copies(directory) -> set[str]:
    """The sha256s named under ``DIR/shards``."""
    folder = os.path.join(str(directory), "shards")
    return {name.removesuffix(".tfrecord") for name in os.listdir(folder)} if os.path.isdir(folder) else set()


def remote_shards(folder, count: int = 8, size: int = 1000) -> list:
    """``count`` files of ``size`` bytes (each of one repeated byte) in ``folder``, as ``Shard``s."""
    from tfshard.readers.shard_cache.store import Shard

    os.makedirs(folder, exist_ok=True)
    shards = []
    for i in range(count):
        data = bytes([i]) * size
        path = os.path.join(str(folder), f"s{i}")
        with open(path, "wb") as f:
            f.write(data)
        shards.append(Shard(hashlib.sha256(data).hexdigest(), size, path))
    return shards


def fetched(store, shard) -> str:
    """``store.fetch(shard)``, which must give a copy, then unpinned."""
    found = store.fetch(shard)
    assert found is not None, f"{shard.remote} was not cached"
    store.unpin(shard.sha256)
    return found
