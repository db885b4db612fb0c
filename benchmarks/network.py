"""Benchmark: reading ``gs://`` shards through TensorFlow's own GCS client, over a slow network.

Runs inside the private namespace of ``tests/gcs_emulator.py``: a local GCS emulator
over TLS, reached through TensorFlow's built-in ``gs://`` filesystem (which opens a
new connection for every request). ``tfshard episodes`` writes ``--shards`` shards
(default 16 of ~2 MB: 16 KiB float32 records) straight to ``gs://``; then, on two
networks,

  * ``--latency-ms`` (default 30) added to every response, like a distant server;
  * the same plus ``--stream-mb-per-s`` (default 12) per connection: one stream's
    bandwidth is a small share of what many streams get together, as on real GCS
    (the emulator, on this machine's CPUs, serves ~100-200 MB/s in all);

each contender reads every record once, as serialized records (the I/O stage every
tfshard reader starts with, before parsing), side by side in one run:

  1. tfshard's reader with its defaults: ``readers.files.interleave_records`` over the
     manifest's shards, up to 16 files at once, one reader thread per open file
     (``num_parallel_calls`` = the cycle length), 8 MiB read buffer per file;
  2. the same, sequential: ``cycle_length=1`` (tf.data still opens the next file early);
  3. a plain ``tf.data.TFRecordDataset(files)``: one file after another, 256 KiB buffer;
  4. the same with ``num_parallel_calls=AUTOTUNE`` (what tfshard did before: tf.data's
     CPU-budgeted autotuner starts every iterator with few parallel reads);
  5. with TF's defaults and the slower network, ``cycle_length=4`` and a 256 KiB read buffer.

TensorFlow reads its ``GCS_*`` variables once, when its GCS filesystem starts, so each
client setting runs in its own process: TF's defaults (a 64 MiB read-ahead buffer per
open file, no block cache), ``GCS_READ_CACHE_BLOCK_SIZE_MB=8``, and the block cache on
(``GCS_READ_CACHE_MAX_SIZE_MB=256``: a cold epoch, then a cached one).

Each pass counts records in batches of 64 and is timed from creating the iterator to
its end of data (not its deletion: see ``benchmarks/images.py``); passes are repeated
and interleaved and the best is shown, with the peak growth of resident memory during
the pass. The emulator is a Python server on the same CPUs as the reader, so only
ratios within one run mean much.

The shard cache (``shard_cache=DIR``) gets a section of its own, on the paced network, in one more process
(``GCS_READ_CACHE_BLOCK_SIZE_MB=8``): the reader above with files reshuffled each epoch, with and without a cache,
side by side in rounds of rotated order (``--repeats`` rounds, best pass shown):

  a. epoch 1 from an empty DIR (a fresh one each round, limit = the dataset) against the same reader without one;
  b. epoch 2 through the same pipeline against the reader of a local copy of the shards (copied first), on both
     dataset sizes (an epoch of the small one lasts ~0.3 s: the larger one's ratio is the steadier);
  c. a limit of half the dataset: epochs 1-3, with the bytes downloaded into the cache in each
     (``ShardStore.downloaded_bytes``) and every byte the emulator served (what crossed the network): the copies
     the pipeline holds stay, the rest are read remotely;
  d. the peak RSS growth of the cache's passes on the dataset and on one ``--cache-growth`` (3) times larger, and
     the most DIR held (the sum of its file sizes, sampled every 4 ms by a child process) against the limit;

then one line per target, met or not. ``--only cache`` runs just that section (about 1 minute), ``--only
network`` just the table above.

S3 gets a section of its own, outside the namespace (``--only s3``, about 1 minute): moto's ``ThreadedMotoServer``
on 127.0.0.1 behind ``tests/fault_proxy.py`` with the same ``--latency-ms`` and ``--stream-mb-per-s`` (both in a
child process, as the emulator is, so their threads do not take the reader's GIL; the pacing holds for what each
connection sends too, so an upload crosses the same network). The dataset and one
``--cache-growth`` times larger are converted locally and uploaded (the local folder is then the reader's local
copy); in rounds of rotated order (``--repeats``, best pass shown), on each:

  * a plain parallel download of the same shards with the same client library, s3fs with its own defaults:
    ``fs.get`` of the shard list into a folder, and a thread pool of ``fs.cat_file`` (one thread per shard);
  * tfshard's reader as above (``interleave_records``, files reshuffled each epoch) through a shard cache, epoch 1
    from an empty DIR and epoch 2 through the same pipeline;
  * the same reader on the local copy;

then one line per target: epoch 1 >= 0.9x the faster plain download, epoch 2 >= 0.9x the local copy, and
``tfshard push`` of the converted dataset >= 0.9x s3fs's own parallel ``put`` of the same folder.

Run it with ``.venv/bin/python benchmarks/network.py`` (about 4 minutes), e.g.:
  .venv/bin/python benchmarks/network.py --latency-ms 50 --stream-mb-per-s 20
It needs what ``tests/test_gcs.py`` needs: ``unshare`` (namespaces permitted) and
``gcp-storage-emulator`` (``pip install -e '.[test]'``); the S3 section what ``tests/test_object_stores.py`` needs
(s3fs and moto's server: the ``test`` and ``cloud`` extras).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location("gcs_emulator", os.path.join(REPO, "tests", "gcs_emulator.py"))
gcs_emulator = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gcs_emulator)

BUCKET = "gs://bench"
STEPS, WIDTH = 512, 8  # float32 [512, 8] per episode: a 16 KiB record, about a small JPEG's size
MiB = 2**20
DEFAULTS = "tfshard defaults (16 files, 16 reader threads, 8 MiB buffer)"
SEQUENTIAL = "tfshard sequential (cycle_length=1)"
PLAIN = "plain TFRecordDataset(files)"
FIXED = "tfshard defaults but num_parallel_calls=AUTOTUNE"
CACHE = "shard_cache"  # the kind of the shard-cache process: its network's name
# The shard cache's process: tfshard's recommended GCS blocks. They must be in the environment before TensorFlow
# starts: its GCS file system reads them when it is registered, at import, so readers.info's default comes too late.
CACHE_CLIENT = {"GCS_READ_CACHE_BLOCK_SIZE_MB": "8"}

# The reader processes: (label, environment, contenders per network). TensorFlow reads the GCS_* variables once,
# when its GCS filesystem starts, so each setting gets its own process; the network changes under it.
PROCESSES = [
    ("TF defaults (64 MiB read-ahead/file)", {}, {"latency": "basic", "paced": "full"}),
    ("GCS_READ_CACHE_BLOCK_SIZE_MB=8", {"GCS_READ_CACHE_BLOCK_SIZE_MB": "8"}, {"latency": "basic", "paced": "basic"}),
    ("+ GCS_READ_CACHE_MAX_SIZE_MB=256", {"GCS_READ_CACHE_BLOCK_SIZE_MB": "8", "GCS_READ_CACHE_MAX_SIZE_MB": "256"},
     {"paced": "cache"}),
]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The peak growth of this process's resident memory while the ``with`` block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.growth = self.peak - self.base


def folder_bytes(folder: str) -> int:
    """The sum of the sizes of the files under ``folder`` (a download counts at the full size it reserves), each
    file once: one renamed from ``parts/`` to ``shards/`` during the walk can be listed in both."""
    sizes = {}
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:  # renamed or evicted between the listing and the stat
                continue
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


def sample_folder(folder: str, interval_s: float) -> None:
    """The ``--folder-size`` child: samples until its stdin closes, then prints the peak and the sample count."""
    peak, samples = folder_bytes(folder), 1
    print("ready", flush=True)
    while not select.select([sys.stdin], [], [], interval_s)[0]:
        peak, samples = max(peak, folder_bytes(folder)), samples + 1
    print(max(peak, folder_bytes(folder)), samples + 1, flush=True)


class FolderSize:
    """The most ``folder`` held while the ``with`` block runs, sampled every 4 ms by a child process (a thread
    here would take the GIL from the cache's fetches); ``folder`` None samples nothing."""

    def __init__(self, folder: str | None):
        self.folder, self.peak, self.samples = folder, 0, 0

    def __enter__(self):
        if self.folder is not None:
            self._child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--folder-size", self.folder],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._child.stdout.readline()  # "ready": it has taken its first sample
        return self

    def __exit__(self, *exc):
        if self.folder is not None:
            out, _ = self._child.communicate()  # closing its stdin is the signal to stop
            self.peak, self.samples = (int(v) for v in out.split())


def _contenders(info, kind: str) -> dict:
    """label → a function that builds the dataset; ``kind``: "basic", "full" (with variations) or "cache"."""
    import tensorflow as tf
    from tfshard.readers.arguments import DEFAULT_READ_BUFFER_BYTES
    from tfshard.readers.files import check_shards, interleave_records

    paths = info.shard_paths("train")
    shards = check_shards(info, "train", list(range(len(paths))))  # what a reader checks (and guards) every epoch

    def tfshard(cycle_length=None, read_buffer_bytes=DEFAULT_READ_BUFFER_BYTES):
        return lambda: interleave_records(shards, compression=None, shuffle_files=False, seed=None,
                                          cycle_length=cycle_length, read_buffer_bytes=read_buffer_bytes,
                                          deterministic=None)

    contenders = {DEFAULTS: tfshard(), SEQUENTIAL: tfshard(cycle_length=1)}
    if kind == "cache":
        return {DEFAULTS: contenders[DEFAULTS]}
    contenders[PLAIN] = lambda: tf.data.TFRecordDataset(paths)
    cycle = min(len(paths), 16)
    contenders[FIXED] = lambda: tf.data.Dataset.from_tensor_slices(paths).interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=DEFAULT_READ_BUFFER_BYTES),
        cycle_length=cycle, block_length=1, num_parallel_calls=tf.data.AUTOTUNE)  # interleave_records, one change
    if kind == "full":
        contenders["tfshard cycle_length=4"] = tfshard(cycle_length=4)
        contenders["tfshard read buffer 256 KiB"] = tfshard(read_buffer_bytes=256 * 2**10)
    return contenders


def _timed_pass(build, folder: str | None = None, store=None, bytes_served=None) -> dict:
    """One pass over ``build()`` in batches of 64; with a shard cache, also the most its ``folder`` held (sampled
    by another process) and what its ``store`` downloaded during the pass. ``bytes_served``: what the server has
    sent so far (default: the GCS emulator's count)."""
    bytes_served = bytes_served or _bytes_served
    dataset = build().batch(64)
    downloaded = store.downloaded_bytes if store is not None else 0
    served = bytes_served()
    with FolderSize(folder) as disk, PeakRSS() as memory:
        started, cpu = time.perf_counter(), time.process_time()
        records = 0
        iterator = iter(dataset)
        for batch in iterator:
            records += int(batch.shape[0])
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    del iterator  # after the clock: deleting an autotuned iterator can block (benchmarks/images.py)
    run = {"records": records, "seconds": seconds, "rss_growth": memory.growth, "cpu": cpu,
           "network": bytes_served() - served}
    if store is not None:
        run.update(downloaded=store.downloaded_bytes - downloaded, folder_peak=disk.peak)
    return run


def _bytes_served() -> int:
    """Every byte the emulator has sent so far (object bytes, metadata, these calls): what crossed the network."""
    return gcs_emulator.configure()["requests"].get("bytes_sent", 0)


def _copy_dataset(source: str, target: str) -> None:
    """Copies a dataset's files (manifest and shards) from ``gs://`` to a local folder, as ``gsutil cp -r`` would."""
    import tensorflow as tf

    for root, _, names in tf.io.gfile.walk(source):
        folder = os.path.join(target, root[len(source):].strip("/"))
        os.makedirs(folder, exist_ok=True)
        for name in names:
            tf.io.gfile.copy(f"{root.rstrip('/')}/{name}", os.path.join(folder, name), overwrite=True)


def _train_bytes(info) -> int:
    return sum(shard.bytes for shard in info.manifest.splits["train"].shards)


def _cache_reader(info, folder: str | None = None, limit: int | None = None):
    """``interleave_records`` over the train split as a training reader calls it (files reshuffled each epoch),
    through a shard cache in ``folder`` (None: none); returns the dataset and the cache's ``ShardStore``."""
    from tfshard.readers.arguments import DEFAULT_READ_BUFFER_BYTES
    from tfshard.readers.files import check_shards, interleave_records
    from tfshard.readers.shard_cache.pipeline import ShardCache

    shards = check_shards(info, "train", list(range(len(info.shard_paths("train")))))
    session = None if folder is None else ShardCache(folder, limit, "benchmarks/network.py").session(shards)
    dataset = interleave_records(shards, compression=None, shuffle_files=True, seed=0, cycle_length=None,
                                 read_buffer_bytes=DEFAULT_READ_BUFFER_BYTES, deterministic=None,
                                 shard_cache=session)
    return dataset, None if session is None else session.cache.store


def _cache_groups(small, large, local, local_large, work: str) -> list:
    """The shard-cache section's contenders: functions that each run one or more passes, → {row label: run}.
    Every cache contender starts from an empty folder and reads its epochs through one pipeline."""

    def epochs(info, tag, limit, count):
        def run():
            folder = tempfile.mkdtemp(dir=work)
            dataset, store = _cache_reader(info, folder, limit)
            runs = {f"{tag}, epoch {e}": _timed_pass(lambda: dataset, folder, store) for e in range(1, count + 1)}
            shutil.rmtree(folder)
            return runs
        return run

    def plain(info, label):
        return lambda: {label: _timed_pass(lambda: _cache_reader(info)[0])}

    size, big = _train_bytes(small), _train_bytes(large)
    return [plain(small, "1x|no cache"), epochs(small, "1x|shard_cache", size, 2), plain(local, "1x|local copy"),
            epochs(small, "1x|shard_cache limit 1/2", size // 2, 3), plain(large, "Nx|no cache"),
            epochs(large, "Nx|shard_cache", big, 2), plain(local_large, "Nx|local copy")]


def cache_process(args, network: tuple[float, float]) -> dict:
    """The shard-cache section, on one network: each repeat runs every contender once, in a rotated order."""
    from tfshard import readers

    gcs_emulator.configure(latency_ms=network[0], stream_mb_per_s=network[1])
    small, large = readers.info(f"{BUCKET}/ds"), readers.info(f"{BUCKET}/ds-large")
    results: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="tfshard-net-cache-") as work:
        _copy_dataset(f"{BUCKET}/ds", os.path.join(work, "local"))
        _copy_dataset(f"{BUCKET}/ds-large", os.path.join(work, "local-large"))
        local, local_large = readers.info(os.path.join(work, "local")), readers.info(os.path.join(work, "local-large"))
        for info, cached in ((small, True), (large, True), (local, False), (local_large, False)):  # warm-up
            folder = tempfile.mkdtemp(dir=work) if cached else None
            _timed_pass(lambda info=info, folder=folder: _cache_reader(info, folder, _train_bytes(info))[0].take(1))
        groups = _cache_groups(small, large, local, local_large, work)
        for repeat in range(args.repeats):
            for group in groups[repeat % len(groups):] + groups[:repeat % len(groups)]:
                for label, run in group().items():
                    results.setdefault(label, []).append(run)
    return {"bytes": {"1x": _train_bytes(small), "Nx": _train_bytes(large)}, "runs": results}


def reader_process(args) -> None:
    """Runs in each reader process: on each network in turn, times its contenders; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfshard import readers

    info = readers.info(f"{BUCKET}/ds")
    kinds = json.loads(args.kinds)
    if CACHE in kinds:
        print(json.dumps(cache_process(args, json.loads(args.networks)[kinds[CACHE]])), flush=True)
        return
    results = {}
    for network, (latency_ms, stream_mb_per_s) in json.loads(args.networks).items():
        if network not in kinds:
            continue
        gcs_emulator.configure(latency_ms=latency_ms, stream_mb_per_s=stream_mb_per_s)
        contenders = _contenders(info, kinds[network])
        if kinds[network] == "cache":  # one cold epoch, then one from the block cache (a warm-up would fill it)
            build = contenders[DEFAULTS]
            results[network] = {f"{DEFAULTS}, epoch 1": [_timed_pass(build)],
                                f"{DEFAULTS}, epoch 2": [_timed_pass(build)]}
            continue
        for build in contenders.values():  # warm-up: TensorFlow's GCS client, tf.data start-up
            _timed_pass(lambda build=build: build().take(1))
        results[network] = {label: [] for label in contenders}
        for _ in range(args.repeats):
            for label, build in contenders.items():
                results[network][label].append(_timed_pass(build))
    print(json.dumps({"bytes": info.manifest.total_bytes, "results": results}), flush=True)


def _write_dataset(shards: int, records_per_shard: int, name: str = "ds") -> tuple[float, dict]:
    """Writes the benchmark's episodes to gs://bench/NAME with tfshard (no added latency); returns seconds,
    requests."""
    from tfshard.ingest import ConvertOptions, convert_episodes

    with tempfile.TemporaryDirectory(prefix="tfshard-net-") as src:
        _write_episodes(src, shards * records_per_shard)
        started = time.perf_counter()
        convert_episodes(src, f"{BUCKET}/{name}", ConvertOptions(num_shards=shards), workers=0, progress=False)
        return time.perf_counter() - started, gcs_emulator.configure()["requests"]


def _write_episodes(src: str, count: int) -> None:
    """The benchmark's source: ``count`` seeded float32 episodes of [STEPS, WIDTH] as .npy files in ``src``."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(count):
        np.save(os.path.join(src, f"ep{i:05d}.npy"), rng.normal(size=(STEPS, WIDTH)).astype(np.float32))


def _print_table(rows: list[tuple[str, str, str, dict]], total_bytes: int) -> None:
    """rows: (network, GCS client settings, reader, best run); vs seq. is against the network's first sequential."""
    print(f"| {'network':<21} | {'GCS client':<36} | {'reader':<62} | {'records/s':>9} | {'MB/s':>5} | "
          f"{'vs seq.':>7} | {'peak RSS +':>10} |")
    print(f"|{'-' * 23}|{'-' * 38}|{'-' * 64}|{'-' * 10}:|{'-' * 6}:|{'-' * 8}:|{'-' * 11}:|")
    sequential = {}
    for network, _, reader, run in rows:
        if reader == SEQUENTIAL:
            sequential.setdefault(network, run["seconds"])
    for network, client, reader, run in rows:
        print(f"| {network:<21} | {client:<36} | {reader:<62} | {run['records'] / run['seconds']:>9,.0f} | "
              f"{total_bytes / run['seconds'] / 1e6:>5.1f} | {sequential[network] / run['seconds']:>6.2f}x | "
              f"{run['rss_growth'] / MiB:>6.0f} MiB |")


def _run_reader(client: str, env: dict, kinds: dict, networks: dict, args) -> dict:
    """Runs one reader process (its own GCS client settings) and returns what it printed."""
    command = [sys.executable, os.path.abspath(__file__), "--reader", "--networks", json.dumps(networks),
               "--kinds", json.dumps(kinds), "--repeats", str(args.repeats)]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{client}: reader process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _network_section(args, networks: dict, names: dict, write_seconds: float, write_requests: dict) -> None:
    """The readers and GCS client settings side by side, on both networks."""
    best, total_bytes = {}, 0
    for client, env, kinds in PROCESSES:
        result = _run_reader(client, env, kinds, networks, args)
        total_bytes = result["bytes"]
        for network, readers_ in result["results"].items():
            for reader, runs in readers_.items():
                best[(network, client, reader)] = min(runs, key=lambda r: r["seconds"])
    rows = [(names[n], c, r, run) for network in networks for (n, c, r), run in best.items() if n == network]
    records = rows[0][3]["records"]
    print(f"\n{records:,} records of 16 KiB in {args.shards} shards ({total_bytes / 1e6:.1f} MB) on gs://, "
          f"written by `tfshard episodes` in {write_seconds:.1f} s with no added latency "
          f"({write_requests.get('connections', 0)} requests).")
    print(f"Best of {args.repeats} interleaved passes (block cache: a cold epoch, then a cached one); "
          "vs seq.: against tfshard sequential with TF's defaults on the same network.\n")
    _print_table(rows, total_bytes)
    print()
    for network in networks:
        for client in (PROCESSES[0][0], PROCESSES[1][0]):
            seconds = {reader: best[(network, client, reader)]["seconds"]
                       for reader in (DEFAULTS, SEQUENTIAL, PLAIN, FIXED)}
            ratio, fixed = seconds[SEQUENTIAL] / seconds[DEFAULTS], seconds[SEQUENTIAL] / seconds[FIXED]
            print(f"{names[network]}, {client}: tfshard defaults {ratio:.2f}x sequential (target >= 3x: "
                  f"{'met' if ratio >= 3 else 'NOT met'}), {seconds[PLAIN] / seconds[DEFAULTS]:.2f}x plain "
                  f"TFRecordDataset; with num_parallel_calls=AUTOTUNE: {fixed:.2f}x sequential")


def _cache_reference(label: str) -> str | None:
    """The row a shard-cache row is compared with: epoch 1 with the same reader without a cache; a later epoch
    with a full cache, with the reader of a local copy (else without a cache)."""
    tag, reader = label.split("|")
    if reader == "no cache":
        return None
    if reader == "shard_cache, epoch 2":
        return f"{tag}|local copy"
    return f"{tag}|no cache"


def _cache_section(args, result: dict, network: str) -> None:
    """The shard cache's table (best pass of each row; RSS, folder and downloads: the most of any pass) and one
    line per target."""
    runs, sizes = result["runs"], result["bytes"]
    best = {label: min(r, key=lambda run: run["seconds"]) for label, r in runs.items()}
    most = {label: {k: max(run.get(k, 0) for run in r) for k in ("rss_growth", "folder_peak", "downloaded",
                                                                   "network")}
            for label, r in runs.items()}
    speed = {label: sizes[label.split("|")[0]] / run["seconds"] for label, run in best.items()}  # bytes/s

    def limit_of(label):
        tag, reader = label.split("|")
        return None if "shard_cache" not in reader else sizes[tag] // (2 if "1/2" in reader else 1)

    print(f"\nShard cache (`shard_cache=DIR`, DIR empty at each epoch 1), {network}, GCS_READ_CACHE_BLOCK_SIZE_MB=8: "
          f"interleave_records over {args.shards} and {args.shards * args.cache_growth} shards, files reshuffled "
          f"each epoch, batches of 64. Best of {args.repeats} rounds in rotated order; vs: epoch 1 against no "
          "cache, epoch 2 against a local copy of the shards; peak RSS +, DIR max (sum of file sizes, sampled every "
          "4 ms), downloaded (into the cache) and from gs:// (every byte the emulator served): the most of any pass; "
          "CPU s: the reader process's in the best pass "
          "(the emulator serving it shares the 2 cores).\n")
    print(f"| {'dataset':>8} | {'reader':<35} | {'limit':>8} | {'records/s':>9} | {'MB/s':>5} | {'vs':<19} | "
          f"{'CPU s':>5} | {'peak RSS +':>10} | {'DIR max':>8} | {'downloaded':>10} | {'from gs://':>10} |")
    print(f"|{'-' * 9}:|{'-' * 37}|{'-' * 9}:|{'-' * 10}:|{'-' * 6}:|{'-' * 21}|{'-' * 6}:|{'-' * 11}:|{'-' * 9}:|"
          f"{'-' * 11}:|{'-' * 11}:|")
    for label, run in best.items():
        tag, reader = label.split("|")
        reference, limit = _cache_reference(label), limit_of(label)
        versus = "" if reference is None else f"{speed[label] / speed[reference]:.2f}x {reference.split('|')[1]}"
        limit_text = folder_text = downloaded_text = ""
        if limit is not None:
            limit_text, folder_text = f"{limit / 1e6:.0f} MB", f"{most[label]['folder_peak'] / 1e6:.0f} MB"
            downloaded_text = f"{most[label]['downloaded'] / 1e6:.1f} MB"
        print(f"| {sizes[tag] / 1e6:>5.0f} MB | {reader:<35} | {limit_text:>8} | "
              f"{run['records'] / run['seconds']:>9,.0f} | {speed[label] / 1e6:>5.1f} | {versus:<19} | "
              f"{run['cpu']:>5.2f} | {most[label]['rss_growth'] / MiB:>6.0f} MiB | {folder_text:>8} | "
              f"{downloaded_text:>10} | {most[label]['network'] / 1e6:>7.1f} MB |")
    print()

    def verdict(ok):
        return "met" if ok else "NOT met"

    first = speed["1x|shard_cache, epoch 1"] / speed["1x|no cache"]
    print(f"a. epoch 1 with an empty shard_cache: {first:.2f}x no cache (target >= 0.95x: {verdict(first >= 0.95)})")
    second = {tag: speed[f"{tag}|shard_cache, epoch 2"] / speed[f"{tag}|local copy"] for tag in ("1x", "Nx")}
    print(f"b. epoch 2 with the shard_cache: {second['1x']:.2f}x a local copy at {sizes['1x'] / 1e6:.0f} MB, "
          f"{second['Nx']:.2f}x at {sizes['Nx'] / 1e6:.0f} MB (target >= 0.9x: {verdict(second['1x'] >= 0.9)}, "
          f"{verdict(second['Nx'] >= 0.9)})")
    half = "1x|shard_cache limit 1/2"
    again = [most[f"{half}, epoch {e}"]["downloaded"] for e in (2, 3)]
    remote = [most[f"{half}, epoch {e}"]["network"] for e in (2, 3)]
    half_speed = speed[f"{half}, epoch 2"] / speed["1x|no cache"]
    print(f"c. limit = half the dataset: epoch 2 {half_speed:.2f}x no cache, "
          f"{speed[f'{half}, epoch 2'] / speed['1x|local copy']:.2f}x a local copy; per epoch (epochs 2, 3) "
          f"{remote[0] / 1e6:.1f} MB, {remote[1] / 1e6:.1f} MB of {sizes['1x'] / 1e6:.1f} MB read from gs:// again "
          f"(the shards that did not fit), of it downloaded into the cache: {again[0] / 1e6:.1f} MB, "
          f"{again[1] / 1e6:.1f} MB (reported, no target)")
    rss = {tag: max(most[f"{tag}|shard_cache, epoch {e}"]["rss_growth"] for e in (1, 2)) for tag in ("1x", "Nx")}
    added = {tag: rss[tag] - most[f"{tag}|no cache"]["rss_growth"] for tag in ("1x", "Nx")}
    flat = added["Nx"] <= max(added["1x"], 0) + 16 * MiB
    print(f"d. peak RSS growth of a shard_cache pass: {rss['1x'] / MiB:.0f} MiB at {sizes['1x'] / 1e6:.0f} MB, "
          f"{rss['Nx'] / MiB:.0f} MiB at {sizes['Nx'] / 1e6:.0f} MB; over the same reader without a cache: "
          f"{added['1x'] / MiB:+.0f} MiB, {added['Nx'] / MiB:+.0f} MiB (target: what the cache adds stays flat, "
          f"within 16 MiB: {verdict(flat)})")
    over = [(most[label]["folder_peak"], limit_of(label)) for label in best if limit_of(label) is not None]
    print(f"   DIR max / limit: {max(peak / limit for peak, limit in over):.2f} at most (target <= 1: "
          f"{verdict(all(peak <= limit for peak, limit in over))})")


def inside(args) -> None:
    """Runs in the namespace: writes the dataset, then runs each reader process over both networks."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    write_seconds, write_requests = _write_dataset(args.shards, args.records_per_shard)
    networks = {"latency": (args.latency_ms, 0.0), "paced": (args.latency_ms, args.stream_mb_per_s)}
    names = {"latency": f"{args.latency_ms:g} ms",
             "paced": f"{args.latency_ms:g} ms, {args.stream_mb_per_s:g} MB/s/conn"}
    if args.only in (None, "network"):
        _network_section(args, networks, names, write_seconds, write_requests)
    if args.only in (None, "cache"):
        _write_dataset(args.shards * args.cache_growth, args.records_per_shard, "ds-large")
        result = _run_reader(CACHE, CACHE_CLIENT, {CACHE: "paced"}, networks, args)
        _cache_section(args, result, names["paced"])


S3_BUCKET = "bench"
S3_CLIENT = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def s3_server(latency_ms: float, stream_mb_per_s: float) -> None:
    """The ``--s3-server`` child: moto's S3 server and, in front of it, ``tests/fault_proxy.py`` with this latency
    and pacing (no fault rules); prints both URLs as one JSON line, serves until its stdin closes, then prints the
    body bytes the proxy sent. A process of its own, as the GCS emulator is: its threads do not take the reader's
    GIL."""
    import logging

    from moto.server import ThreadedMotoServer

    spec = importlib.util.spec_from_file_location("fault_proxy", os.path.join(REPO, "tests", "fault_proxy.py"))
    fault_proxy = sys.modules["fault_proxy"] = importlib.util.module_from_spec(spec)  # its dataclass looks it up
    spec.loader.exec_module(fault_proxy)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    proxy = fault_proxy.FaultProxy(f"http://{host}:{port}", latency_ms=latency_ms, stream_mb_per_s=stream_mb_per_s)
    print(json.dumps({"store": f"http://{host}:{port}", "proxy": proxy.url}), flush=True)
    for _ in sys.stdin:  # "bytes": what the proxy has sent so far; end of input: stop
        print(proxy.bytes_sent, flush=True)
    proxy.close()
    server.stop()


class S3Server:
    """The ``--s3-server`` child while the ``with`` block runs: ``store`` (moto itself, for setting up) and
    ``proxy`` (the slow network in front of it) URLs; ``bytes_sent()`` asks it what the proxy has sent."""

    def __init__(self, latency_ms: float, stream_mb_per_s: float):
        self.command = [sys.executable, os.path.abspath(__file__), "--s3-server", "--latency-ms", str(latency_ms),
                        "--stream-mb-per-s", str(stream_mb_per_s)]

    def __enter__(self):
        self._child = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._child.stdout.readline()
        while line and not line.startswith("{"):  # moto's "Starting a new Thread with MotoServer..."
            line = self._child.stdout.readline()
        urls = json.loads(line)
        self.store, self.proxy = urls["store"], urls["proxy"]
        return self

    def bytes_sent(self) -> int:
        self._child.stdin.write("bytes\n")
        self._child.stdin.flush()
        return int(self._child.stdout.readline())

    def __exit__(self, *exc):
        self._child.stdin.close()
        self._child.wait(timeout=60)


def _s3_download(fs, urls: list[str], work: str, how: str) -> dict:
    """One plain parallel download of ``urls`` with s3fs: ``get`` into a fresh folder, or a thread pool of
    ``cat_file`` (one thread per object) into memory; timed like ``_timed_pass`` (no records)."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tempfile.mkdtemp(dir=work)
    with PeakRSS() as memory:
        started, cpu = time.perf_counter(), time.process_time()
        if how == "get":
            fs.get(urls, folder + "/")
            got = folder_bytes(folder)
        else:
            with ThreadPoolExecutor(len(urls)) as pool:
                got = sum(len(b) for b in pool.map(fs.cat_file, urls))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    shutil.rmtree(folder)
    return {"records": 0, "seconds": seconds, "rss_growth": memory.growth, "cpu": cpu, "bytes": got}


def s3_section(args) -> None:
    """moto's S3 server behind the same latency and per-connection pacing as the GCS emulator: plain parallel
    downloads with s3fs, tfshard's reader through the shard cache (epochs 1 and 2) and on a local copy, on the
    dataset and one ``--cache-growth`` times larger, side by side in rounds of rotated order; then one line per
    target."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.update(S3_CLIENT)
    network = f"{args.latency_ms:g} ms, {args.stream_mb_per_s:g} MB/s/conn"
    with S3Server(args.latency_ms, args.stream_mb_per_s) as server, \
            tempfile.TemporaryDirectory(prefix="tfshard-net-s3-") as work:
        import s3fs
        from tfshard import readers
        from tfshard.ingest import ConvertOptions, convert_episodes

        os.environ["AWS_ENDPOINT_URL"] = server.proxy  # tfshard's s3:// file system, made at its first use
        setup = s3fs.S3FileSystem(endpoint_url=server.store, skip_instance_cache=True)  # moto itself, no latency
        setup.mkdir(S3_BUCKET)  # no LocationConstraint: moto's us-east-1
        # the plain client: s3fs with its own defaults, through the same slow network
        plain = s3fs.S3FileSystem(endpoint_url=server.proxy, skip_instance_cache=True)
        groups, sizes = [], {}
        for tag, shards in (("1x", args.shards), ("Nx", args.shards * args.cache_growth)):
            local, src = os.path.join(work, f"local-{tag}"), os.path.join(work, f"src-{tag}")
            os.makedirs(src)
            _write_episodes(src, shards * args.records_per_shard)
            convert_episodes(src, local, ConvertOptions(num_shards=shards), workers=0, progress=False)
            setup.put(local, f"{S3_BUCKET}/{tag}", recursive=True)  # the local copy: what was uploaded
            remote, local_info = readers.info(f"s3://{S3_BUCKET}/{tag}"), readers.info(local)
            sizes[tag] = _train_bytes(remote)
            groups += _s3_groups(tag, remote, local_info, plain, server, work)
        for group in groups:  # warm-up: connections, TensorFlow and tf.data start-up
            group()
        results: dict[str, list] = {}
        for repeat in range(args.repeats):
            for group in groups[repeat % len(groups):] + groups[:repeat % len(groups)]:
                for label, run in group().items():
                    results.setdefault(label, []).append(run)
    _s3_table(args, results, sizes, network)


def _s3_groups(tag: str, remote, local, plain, server: S3Server, work: str) -> list:
    """The S3 section's contenders on one dataset: functions that each run one or more passes, → {label: run}."""
    urls, size = remote.shard_paths("train"), _train_bytes(remote)

    def epochs():
        folder = tempfile.mkdtemp(dir=work)
        dataset, store = _cache_reader(remote, folder, size)
        runs = {f"{tag}|shard_cache, epoch {e}": _timed_pass(lambda: dataset, folder, store, server.bytes_sent)
                for e in (1, 2)}
        shutil.rmtree(folder)
        return runs

    uploads = itertools.count()  # a fresh prefix each pass: both uploads write an empty folder

    def upload(how: str) -> dict:
        from tfshard.tools.push import push

        target = f"{S3_BUCKET}/up-{tag}-{how}-{next(uploads)}"
        started, cpu = time.perf_counter(), time.process_time()
        if how == "push":
            push(local.path, f"s3://{target}")
        else:
            plain.put(local.path, target, recursive=True)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        return {"records": 0, "seconds": seconds, "rss_growth": 0, "cpu": cpu}

    return [lambda: {f"{tag}|tfshard push": upload("push")},
            lambda: {f"{tag}|s3fs put": upload("put")},
            lambda: {f"{tag}|s3fs get": _s3_download(plain, urls, work, "get")},
            lambda: {f"{tag}|s3fs cat_file threads": _s3_download(plain, urls, work, "cat_file")},
            epochs,
            lambda: {f"{tag}|local copy": _timed_pass(lambda: _cache_reader(local)[0], None, None, server.bytes_sent)}]


S3_ROWS = {
    "s3fs get": "s3fs `get` of the shard list (plain parallel download)",
    "s3fs cat_file threads": "s3fs `cat_file`, one thread per shard",
    "shard_cache, epoch 1": "tfshard reader, shard_cache epoch 1",
    "shard_cache, epoch 2": "tfshard reader, shard_cache epoch 2",
    "local copy": "tfshard reader, local copy",
    "s3fs put": "s3fs `put` of the dataset folder (plain parallel upload)",
    "tfshard push": "tfshard push (verified, dataset.json last)",
}


def _s3_table(args, results: dict, sizes: dict, network: str) -> None:
    """The S3 section's table (best pass of each row) and one line per target."""
    best = {label: min(runs, key=lambda run: run["seconds"]) for label, runs in results.items()}
    speed = {label: sizes[label.split("|")[0]] / run["seconds"] for label, run in best.items()}  # bytes/s
    print(f"\nS3 (moto's ThreadedMotoServer behind tests/fault_proxy.py: {network}), {args.shards} and "
          f"{args.shards * args.cache_growth} shards; tfshard: interleave_records, files reshuffled each epoch, "
          f"batches of 64, shard_cache DIR empty at each epoch 1. Best of {args.repeats} rounds in rotated order; "
          "CPU s: this process's (the server shares the 2 cores).\n")
    print(f"| {'dataset':>8} | {'contender':<54} | {'records/s':>9} | {'MB/s':>5} | {'seconds':>7} | {'CPU s':>5} | "
          f"{'peak RSS +':>10} |")
    print(f"|{'-' * 9}:|{'-' * 56}|{'-' * 10}:|{'-' * 6}:|{'-' * 8}:|{'-' * 6}:|{'-' * 11}:|")
    for tag in sizes:
        for row, text in S3_ROWS.items():
            run = best[f"{tag}|{row}"]
            records = f"{run['records'] / run['seconds']:,.0f}" if run["records"] else ""
            print(f"| {sizes[tag] / 1e6:>5.0f} MB | {text:<54} | {records:>9} | "
                  f"{speed[f'{tag}|{row}'] / 1e6:>5.1f} | {run['seconds']:>7.3f} | {run['cpu']:>5.2f} | "
                  f"{run['rss_growth'] / MiB:>6.0f} MiB |")
    print()

    def verdict(ok):
        return "met" if ok else "NOT met"

    for tag in sizes:
        download = max((f"{tag}|s3fs get", f"{tag}|s3fs cat_file threads"), key=lambda label: speed[label])
        first = speed[f"{tag}|shard_cache, epoch 1"] / speed[download]
        second = speed[f"{tag}|shard_cache, epoch 2"] / speed[f"{tag}|local copy"]
        print(f"S3 at {sizes[tag] / 1e6:.0f} MB: epoch 1 through the shard cache {first:.2f}x the faster plain "
              f"download ({download.split('|')[1]}) (target >= 0.9x: {verdict(first >= 0.9)}); epoch 2 "
              f"{second:.2f}x the same reader on a local copy (target >= 0.9x: {verdict(second >= 0.9)})")
        upload = speed[f"{tag}|tfshard push"] / speed[f"{tag}|s3fs put"]
        print(f"S3 upload at {sizes[tag] / 1e6:.0f} MB: tfshard push {upload:.2f}x s3fs's own parallel put of the "
              f"same files (target >= 0.9x: {verdict(upload >= 0.9)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added to every response (default 30)")
    parser.add_argument("--stream-mb-per-s", type=float, default=12.0,
                        help="bandwidth of each connection in the second setting, MB/s (default 12)")
    parser.add_argument("--shards", type=int, default=16, help="shards (default 16)")
    parser.add_argument("--records-per-shard", type=int, default=128, help="16 KiB records per shard (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per reader; the best is shown (default 3)")
    parser.add_argument("--only", choices=("network", "cache", "s3"),
                        help="run one section: the network table, the shard cache's, or S3's (default: all)")
    parser.add_argument("--cache-growth", type=int, default=3,
                        help="the shard cache's larger dataset has this many times --shards (default 3)")
    parser.add_argument("--folder-size", help=argparse.SUPPRESS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--networks", help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    parser.add_argument("--s3-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.s3_server:
        return s3_server(args.latency_ms, args.stream_mb_per_s)
    if args.folder_size is not None:
        return sample_folder(args.folder_size, 0.004)
    if args.reader:
        return reader_process(args)
    if args.inside:
        return inside(args)
    if args.only == "s3":
        return s3_section(args)
    reason = gcs_emulator.unavailable_reason()
    if reason is not None:
        sys.exit(f"benchmarks/network.py: cannot run the GCS emulator here: {reason}")
    command = [sys.executable, os.path.abspath(__file__), "--inside", "--latency-ms", str(args.latency_ms),
               "--stream-mb-per-s", str(args.stream_mb_per_s), "--shards", str(args.shards),
               "--records-per-shard", str(args.records_per_shard), "--repeats", str(args.repeats),
               "--cache-growth", str(args.cache_growth)] + (["--only", args.only] if args.only else [])
    code = gcs_emulator.run(command, buckets=["bench"], capture=False).returncode
    if code == 0 and args.only is None:
        s3_section(args)
    sys.exit(code)


if __name__ == "__main__":
    main()
