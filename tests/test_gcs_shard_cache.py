"""The shard cache (``shard_cache=DIR``, ``tfshard cache``) end to end on ``gs://``: TensorFlow's own GCS client
against the local emulator of ``tests/gcs_emulator.py``, in one private namespace run (see ``tests/test_gcs.py``).

Inside, this file converts a 6-shard image dataset and a gzip episodes dataset into ``gs://tfshard``, then checks
that every reader with a shard cache yields what it yields without one; that a second epoch reads no shard byte from
GCS and the copies have the manifest's sha256; that a ``tfshard cache`` SIGKILLed mid-download leaves no partial
copy, and the next reader removes its stale part and caches everything; that a re-converted dataset never gets an
old shard, and a pipeline built before it fails its next epoch; and that ``tfshard cache --limit`` fills half the
folder, says what it left out, and never holds more than the limit on disk (sampled while it runs). It skips only
where namespaces are not permitted, and fails there instead under ``TFSHARD_CI=1``.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import threading
import time

import gcs_emulator
import pytest
from helpers import run_gcs_scenario

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "gs://tfshard"
IMAGES, EPISODES = f"{BUCKET}/ds", f"{BUCKET}/runs"
LIMIT = "50MB"  # far above the datasets: nothing is evicted unless a step says so


def test_shard_cache_on_gcs(tmp_path):
    """Readers and ``tfshard cache`` through a shard cache of gs:// shards, a killed downloader, a limit."""
    run_gcs_scenario(__file__, tmp_path, timeout=240, passed="shard cache scenario passed")


# Everything below runs inside the namespace, as `python tests/test_gcs_shard_cache.py ROOT`.


def _tfshard_cli(*args: str):
    """The real CLI in this process (TensorFlow is loaded already): (exit code, output)."""
    from tfshard import cli
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli.app, list(args))
    return result.exit_code, result.output


def _manifest_shas(path: str) -> dict[str, int]:
    """sha256 -> size of every shard of the dataset at ``path``."""
    from tfshard.format.dataset import load_manifest

    return {s.sha256: s.bytes for split in load_manifest(path).splits.values() for s in split.shards}


def _copies(directory: str) -> dict[str, str]:
    """name stem -> sha256 of the bytes of every file under ``directory/shards``."""
    found = {}
    for path in glob.glob(os.path.join(directory, "shards", "*")):
        with open(path, "rb") as f:
            found[os.path.basename(path).split(".")[0]] = hashlib.sha256(f.read()).hexdigest()
    return found


def _assert_verified(directory: str, path: str, *, complete: bool) -> None:
    """Every copy under ``directory/shards`` has the bytes its name (a manifest sha256 of ``path``) says; with
    ``complete``, every shard of ``path`` has one."""
    copies, wanted = _copies(directory), _manifest_shas(path)
    for name, digest in copies.items():
        assert name == digest, f"{directory}/shards/{name}: a copy whose bytes have sha256 {digest}"
    if complete:
        assert set(wanted) <= set(copies), f"{directory}: not every shard of {path} is cached ({sorted(copies)})"


def gcs_emulator_object_size(url: str) -> int:
    from tfshard.format.storage import stat_regular

    return stat_regular(url)[0]


def _image_batches(ds) -> list:
    return [(x.numpy(), y.numpy()) for x, y in ds]


def _assert_same(got, want, what: str) -> None:
    import numpy as np

    assert len(got) == len(want) > 0, f"{what}: {len(got)} batches, not {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        for gp, wp in zip(g, w):
            assert np.array_equal(gp, wp), f"{what}: batch {i} differs"


def _same_batches(got, want) -> bool:
    import numpy as np

    return len(got) == len(want) and all(np.array_equal(g, w) for gb, wb in zip(got, want) for g, w in zip(gb, wb))


def _read_images(path, **kwargs):
    from tfshard import readers

    return readers.images(path, batch_size=8, image_size=(32, 32), seed=0, **kwargs)


def _convert_images(src: str, seed: int, overwrite: bool = False) -> None:
    from helpers import convert_image_tree, make_tree

    make_tree(src, classes=("cat", "dog", "owl"), per_class=20, size=(96, 96), seed=seed)
    convert_image_tree(src, IMAGES, num_shards=6, overwrite=overwrite)


def _two_epochs(root: str) -> list:
    """Two epochs through DIR equal the uncached reader's; the second reads no byte from GCS; copies verified."""
    from tfshard.format.sizes import parse_size
    from tfshard.readers.shard_cache.pipeline import store_for

    _convert_images(os.path.join(root, "photos"), seed=0)
    sizes = _manifest_shas(IMAGES)
    assert len(sizes) == 6 and all(50_000 <= s <= 200_000 for s in sizes.values()), sizes
    plain = _read_images(IMAGES)
    want = [_image_batches(plain), _image_batches(plain)]
    assert not _same_batches(want[0], want[1]), "the two epochs are not shuffled apart"

    directory = os.path.join(root, "cache")
    cached = _read_images(IMAGES, shard_cache=directory, shard_cache_limit=LIMIT)
    store = store_for(directory, parse_size(LIMIT))
    _assert_same(_image_batches(cached), want[0], "epoch 1 through the shard cache")
    assert store.downloaded_bytes == sum(sizes.values()), (store.downloaded_bytes, sizes)
    _assert_verified(directory, IMAGES, complete=True)

    requests = gcs_emulator.configure()["requests"]
    _assert_same(_image_batches(cached), want[1], "epoch 2 through the shard cache")
    after = gcs_emulator.configure()["requests"]
    assert store.downloaded_bytes == sum(sizes.values()), "epoch 2 downloaded shard bytes again"
    # No shard byte, and no shard request beyond metadata (a verified copy is read without the remote guard's
    # stat): only the epoch check's (readers/epoch_guard.py), dataset.json's read and the shards' stats (which
    # TensorFlow's GCS client may answer from its stat cache). The bytes sent are the manifest's and the first
    # configure()'s answer (one shard is ~100 KB).
    sent = after.pop("bytes_sent") - requests.pop("bytes_sent")
    new = {method: after[method] - requests.get(method, 0) for method in after}
    assert 1 <= new.pop("GET") <= 1 + len(sizes) and new.pop("connections") <= 2 + len(sizes), (requests, after)
    assert set(new.values()) <= {0}, (requests, after)
    manifest_bytes = gcs_emulator_object_size(f"{IMAGES}/dataset.json")
    assert manifest_bytes < sent < manifest_bytes + 2000 + 500 * len(sizes), (sent, manifest_bytes)
    assert os.listdir(os.path.join(directory, "parts")) == []
    return want[0]


def _episodes(root: str) -> None:
    """Streamed and resident windows and whole episodes of gzip shards: the same through the cache as without."""
    import numpy as np
    from helpers import convert_episode_tree, random_episodes, save_episodes
    from tfshard import readers

    src = os.path.join(root, "runs")
    save_episodes(src, {f"ep{i}.npy": e for i, e in enumerate(random_episodes([40, 7, 25, 60, 33, 52] * 2, seed=3))})
    convert_episode_tree(src, EPISODES, num_shards=4, compression="gzip")
    directory = os.path.join(root, "cache")
    cache = {"shard_cache": directory, "shard_cache_limit": LIMIT}

    def windows(**kwargs):
        ds = readers.windows(EPISODES, length=8, shift=3, batch_size=4, features="data", targets=2, seed=0,
                             drop_remainder=False, **kwargs)
        return [(x.numpy(), y.numpy()) for x, y in ds]

    for kwargs in ({"resident": False, "shuffle": False}, {"resident": True}):
        _assert_same(windows(**kwargs, **cache), windows(**kwargs), f"windows {kwargs} through the shard cache")

    def episodes(**kwargs):
        return [(int(k["episode"]), {n: v.numpy() for n, v in e.items()})
                for k, e in readers.episodes(EPISODES, with_keys=True, **kwargs)]

    # In manifest order without shuffle_files; with it, the same episodes (its parallel reads keep no order).
    for kwargs, order in (({}, list), ({"shuffle_files": True, "seed": 0}, sorted)):
        got, want = episodes(**kwargs, **cache), episodes(**kwargs)
        assert order(k for k, _ in got) == order(k for k, _ in want), f"episodes {kwargs}: {[k for k, _ in got]}"
        got, want = dict(got), dict(want)
        for key in want:
            assert all(np.array_equal(got[key][n], want[key][n]) for n in want[key]), f"episode {key} differs"
    _assert_verified(directory, EPISODES, complete=True)


def _killed_download(root: str, want: list) -> None:
    """A ``tfshard cache`` SIGKILLed while a shard streams in: no partial copy; the next reader starts it over."""
    directory = os.path.join(root, "cache2")
    # ~100 KB shards at 0.08 MB/s and 0.3 s a response: over a second a shard, the kill lands mid-transfer.
    gcs_emulator.configure(latency_ms=300, stream_mb_per_s=0.08)
    child = subprocess.Popen([sys.executable, "-m", "tfshard", "cache", IMAGES, directory, "--fetches", "1"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (glob.glob(os.path.join(directory, "parts", "*.part"))
                   and glob.glob(os.path.join(directory, "shards", "*.tfrecord"))):
            assert child.poll() is None, f"tfshard cache ended before it was killed:\n{child.communicate()}"
            assert time.monotonic() < deadline, "tfshard cache never had a copy and a download at once"
            time.sleep(0.01)
        time.sleep(0.3)  # into the shard's transfer
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -9, child.returncode
    gcs_emulator.configure(latency_ms=0, stream_mb_per_s=0)
    stale = glob.glob(os.path.join(directory, "parts", "*.part"))
    assert len(stale) == 1, stale
    _assert_verified(directory, IMAGES, complete=False)
    assert 1 <= len(_copies(directory)) < 6, sorted(_copies(directory))

    _assert_same(_image_batches(_read_images(IMAGES, shard_cache=directory, shard_cache_limit=LIMIT)), want,
                 "a reader after the killed download")
    assert os.listdir(os.path.join(directory, "parts")) == [], "the killed download's part file is still there"
    _assert_verified(directory, IMAGES, complete=True)

    code, output = _tfshard_cli("cache", IMAGES, directory)
    assert code == 0 and f"{os.path.abspath(directory)}: 6 shards" in output, output
    assert "0.0 MB downloaded" in output and "not cached" not in output, output


def _reconverted(root: str, old: list) -> list:
    """The dataset converted again (other images, the same shard names) reads as the new one through the same DIR;
    a pipeline built before, on a shard cache or a memory cache, fails its next epoch naming the dataset."""
    import tensorflow as tf

    built_before = [_read_images(IMAGES, shard_cache=os.path.join(root, "cache"), shard_cache_limit=LIMIT),
                    _read_images(IMAGES, cache="memory")]
    _assert_same(_image_batches(built_before[0]), old, "a pipeline built before the reconversion")
    assert len(_image_batches(built_before[1])) == len(old)
    _convert_images(os.path.join(root, "photos-2"), seed=1000, overwrite=True)
    for ds in built_before:
        try:
            _image_batches(ds)
        except tf.errors.InvalidArgumentError as e:
            assert f"{IMAGES}: the dataset changed since the pipeline" in e.message, e.message
        else:
            raise AssertionError("the epoch after an --overwrite read the old dataset from a cache")
    want = _image_batches(_read_images(IMAGES))
    assert not _same_batches(want, old), "the re-converted dataset reads as the old one"
    directory = os.path.join(root, "cache")
    _assert_same(_image_batches(_read_images(IMAGES, shard_cache=directory, shard_cache_limit=LIMIT)), want,
                 "the re-converted dataset through the old cache")
    _assert_verified(directory, IMAGES, complete=True)
    return want


def _limited(root: str, want: list) -> None:
    """``tfshard cache --limit`` of half the dataset: about half cached, the rest named; never over the limit."""
    directory = os.path.join(root, "cache3")
    sizes = _manifest_shas(IMAGES)
    limit = sum(sizes.values()) // 2
    seen, done = [], threading.Event()

    def sample():  # shards/ before parts/: a copy renamed in between is missed, never counted twice
        while not done.is_set():
            total = 0
            for folder in ("shards", "parts", "locks", "pins"):
                for path in glob.glob(os.path.join(directory, folder, "*")):
                    try:
                        total += os.lstat(path).st_size
                    except FileNotFoundError:
                        pass
            seen.append(total)
            time.sleep(0.002)

    gcs_emulator.configure(stream_mb_per_s=0.5)  # downloads last a while, for the sampler to see them
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        code, output = _tfshard_cli("cache", IMAGES, directory, "--limit", str(limit))
    finally:
        done.set()
        sampler.join()
        gcs_emulator.configure(stream_mb_per_s=0)
    assert code == 0, output
    copies = _copies(directory)
    assert 2 <= len(copies) <= 3 and sum(sizes[s] for s in copies) <= limit, (sorted(copies), limit)
    assert f": {len(copies)} shards" in output and f"{6 - len(copies)} shards not cached" in output, output
    assert len(seen) > 10 and max(seen) <= limit, (max(seen), limit, len(seen))
    assert max(seen) > 0
    _assert_verified(directory, IMAGES, complete=False)

    # A reader under that limit: what it cannot cache it reads remotely, and the folder stays under the limit.
    _assert_same(_image_batches(_read_images(IMAGES, shard_cache=directory, shard_cache_limit=limit)), want,
                 "a reader with a limit of half the dataset")
    assert 1 <= len(_copies(directory)) <= 3 and sum(sizes[s] for s in _copies(directory)) <= limit
    _assert_verified(directory, IMAGES, complete=False)


if __name__ == "__main__":
    root = sys.argv[1]

    def timed(step, *args):
        began = time.monotonic()
        result = step(root, *args)
        print(f"{step.__name__[1:]}: {time.monotonic() - began:.1f} s", flush=True)
        return result

    first = timed(_two_epochs)
    timed(_episodes)
    timed(_killed_download, first)
    second = timed(_reconverted, first)
    timed(_limited, second)
    print("shard cache scenario passed")
