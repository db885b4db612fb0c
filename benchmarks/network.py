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

Run it with ``.venv/bin/python benchmarks/network.py`` (about 2 minutes), e.g.:
  .venv/bin/python benchmarks/network.py --latency-ms 50 --stream-mb-per-s 20
It needs what ``tests/test_gcs.py`` needs: ``unshare`` (namespaces permitted) and
``gcp-storage-emulator`` (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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


def _contenders(info, kind: str) -> dict:
    """label → a function that builds the dataset; ``kind``: "basic", "full" (with variations) or "cache"."""
    import tensorflow as tf
    from tfshard.readers.files import DEFAULT_READ_BUFFER_BYTES, check_shards, interleave_records

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


def _timed_pass(build) -> dict:
    dataset = build().batch(64)
    with PeakRSS() as memory:
        started = time.perf_counter()
        records = 0
        iterator = iter(dataset)
        for batch in iterator:
            records += int(batch.shape[0])
        seconds = time.perf_counter() - started
    del iterator  # after the clock: deleting an autotuned iterator can block (benchmarks/images.py)
    return {"records": records, "seconds": seconds, "rss_growth": memory.growth}


def reader_process(args) -> None:
    """Runs in each reader process: on each network in turn, times its contenders; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfshard import readers

    info = readers.info(f"{BUCKET}/ds")
    kinds = json.loads(args.kinds)
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


def _write_dataset(shards: int, records_per_shard: int) -> tuple[float, dict]:
    """Writes the benchmark's episodes to gs://bench/ds with tfshard (no added latency); returns seconds, requests."""
    import numpy as np
    from tfshard.ingest import ConvertOptions, convert_episodes

    with tempfile.TemporaryDirectory(prefix="tfshard-net-") as src:
        rng = np.random.default_rng(0)
        for i in range(shards * records_per_shard):
            np.save(os.path.join(src, f"ep{i:05d}.npy"), rng.normal(size=(STEPS, WIDTH)).astype(np.float32))
        started = time.perf_counter()
        convert_episodes(src, f"{BUCKET}/ds", ConvertOptions(num_shards=shards), workers=0, progress=False)
        return time.perf_counter() - started, gcs_emulator.configure()["requests"]


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


def inside(args) -> None:
    """Runs in the namespace: writes the dataset, then runs each reader process over both networks."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    write_seconds, write_requests = _write_dataset(args.shards, args.records_per_shard)
    networks = {"latency": (args.latency_ms, 0.0), "paced": (args.latency_ms, args.stream_mb_per_s)}
    names = {"latency": f"{args.latency_ms:g} ms",
             "paced": f"{args.latency_ms:g} ms, {args.stream_mb_per_s:g} MB/s/conn"}
    best, total_bytes = {}, 0
    for client, env, kinds in PROCESSES:
        command = [sys.executable, os.path.abspath(__file__), "--reader", "--networks", json.dumps(networks),
                   "--kinds", json.dumps(kinds), "--repeats", str(args.repeats)]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{client}: reader process failed:\n{done.stderr[-4000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=30.0, help="added to every response (default 30)")
    parser.add_argument("--stream-mb-per-s", type=float, default=12.0,
                        help="bandwidth of each connection in the second setting, MB/s (default 12)")
    parser.add_argument("--shards", type=int, default=16, help="shards (default 16)")
    parser.add_argument("--records-per-shard", type=int, default=128, help="16 KiB records per shard (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per reader; the best is shown (default 3)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--networks", help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        return reader_process(args)
    if args.inside:
        return inside(args)
    reason = gcs_emulator.unavailable_reason()
    if reason is not None:
        sys.exit(f"benchmarks/network.py: cannot run the GCS emulator here: {reason}")
    command = [sys.executable, os.path.abspath(__file__), "--inside", "--latency-ms", str(args.latency_ms),
               "--stream-mb-per-s", str(args.stream_mb_per_s), "--shards", str(args.shards),
               "--records-per-shard", str(args.records_per_shard), "--repeats", str(args.repeats)]
    sys.exit(gcs_emulator.run(command, buckets=["bench"], capture=False).returncode)


if __name__ == "__main__":
    main()
