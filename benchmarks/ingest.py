"""Benchmark: tfshard's converter, side by side with a naive loop, a plain byte copy and the validation floor.

Measured on one generated set of 500x375 photo-like JPEGs (gradients, shapes,
texture and sensor noise at quality 90, ~83 KB or ~0.44 bytes/pixel, like
ImageNet) in a few class folders, and on a set of ``.npz`` episodes:

  1. tfshard: ``convert_images`` with default options (all cores, full validation);
  1b. the same images labelled by a CSV (``--labels``, one row per image) instead of their class folders,
      with ``--dedupe``, and with ``--val-fraction 0.1``: each within 5% of 1. is the goal;
  2. tfshard with ``ImageOptions(validate=False)`` (header only);
  3. naive: one process, one loop: read bytes, full PIL decode to RGB, build a
     ``tf.train.Example`` with tfshard's keys, one ``tf.io.TFRecordWriter``;
  4. copy: read every file and write all the bytes into one file (the I/O floor);
  5. validation floor: one process per core decodes its share of the images at
     1/8 scale, as tfshard validates, from bytes already in its memory;
  6. the parent alone: ``write_shard`` (append, hash, count, commit) on records
     the workers' function framed beforehand, in memory: its ceiling in img/s;
  7. episodes: ``convert_episodes`` against reading + writing the same bytes.

Each timing is ``time.perf_counter`` over the whole call (tfshard's scan, worker
start-up and shard hashing included). Runs are repeated, interleaved and rotated (after one untimed
conversion); the table
shows the best and worst, the CPU-seconds of the best run (benchmark process and
its workers), the CPU of the converting process alone per image, and the share of
the CPUs that other processes took meanwhile: on a shared machine, over ~10% means
the wall-clock figures are low. TensorFlow is imported before any timing. tfshard's forkserver starts once
per process, so only the first tfshard run pays for it. Every input is read once
first (warm cache). The converter's goals are printed beside the ratios.

The scaling check runs tfshard at ``--images`` and ``--scale-images`` and reports
img/s and peak RSS, sampled every 20 ms from /proc: the parent alone, and the sum
over parent, forkserver and workers (an over-count: forked processes share pages).
Sets larger than 5,000 images link the same 5,000 files again under new names.

Run it with ``make bench`` (``.venv/bin/python benchmarks/ingest.py``), e.g.:
  .venv/bin/python benchmarks/ingest.py --images 1000 --scale-images 50000 --episodes 100 --repeats 3
Inputs are cached in ``--data-dir`` (default ./bench-data) and reused; outputs go
to a temporary folder that is deleted at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import concurrent.futures
import io
import multiprocessing
import shutil
import tempfile
import threading
import time
import typing

import numpy as np
from PIL import Image, ImageDraw

# Workers (forkserver) re-import this module, so TensorFlow is imported only inside functions.
WIDTH, HEIGHT, CLASSES = 500, 375, 4
POOL = 5000  # distinct images; a larger set links them again under new names (same bytes, converted anew)
_PAGE, _TICK = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def photo(index: int) -> bytes:
    """A seeded photo-like JPEG: smooth gradients, shapes, coarse texture and sensor noise."""
    rng = np.random.default_rng(index)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    base = np.stack(
        [rng.uniform(60, 190) + rng.uniform(-0.3, 0.3) * x + rng.uniform(-0.3, 0.3) * y
         + 25 * np.sin(x / rng.uniform(20, 80) + y / rng.uniform(30, 90)) for _ in range(3)], axis=-1)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(rng.integers(-50, WIDTH)), int(rng.integers(-50, HEIGHT))
        box = [x0, y0, x0 + int(rng.integers(20, 220)), y0 + int(rng.integers(20, 160))]
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    coarse = rng.standard_normal((HEIGHT // 2 + 1, WIDTH // 2 + 1), dtype=np.float32)
    texture = np.asarray(Image.fromarray(coarse, "F").resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR))
    pixels = np.asarray(image, np.float32) + 20 * texture[..., None]
    pixels += 8 * rng.standard_normal((HEIGHT, WIDTH, 1), dtype=np.float32)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def _write_photo(path_and_index: tuple[str, int]) -> None:
    path, index = path_and_index
    with open(path + ".part", "wb") as f:
        f.write(photo(index))
    os.replace(path + ".part", path)


def image_set(data_dir: str, count: int) -> str:
    """Returns ``data_dir/n<count>/class_<k>/<i>.jpg``, made (or reused) from a shared pool of images."""
    root, pool = os.path.join(data_dir, f"n{count}"), os.path.join(data_dir, "pool")
    if os.path.isdir(root) and sum(len(files) for _, _, files in os.walk(root)) == count:
        return root
    os.makedirs(pool, exist_ok=True)
    paths = [os.path.join(pool, f"{i:06d}.jpg") for i in range(min(count, POOL))]
    missing = [(p, i) for i, p in enumerate(paths) if not os.path.exists(p)]
    if missing:
        print(f"generating {len(missing)} images in {pool} ...", flush=True)
        with concurrent.futures.ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as ex:
            list(ex.map(_write_photo, missing, chunksize=64))
    shutil.rmtree(root, ignore_errors=True)
    for i in range(count):  # hard links: the sets share files, and so the page cache
        folder = os.path.join(root, f"class_{i % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        os.link(paths[i % len(paths)], os.path.join(folder, f"{i:06d}.jpg"))
    return root


def list_images(src: str) -> list[tuple[str, str, int]]:
    """(path, class name, label) for every file, in sorted order."""
    classes = sorted(os.listdir(src))
    return [(os.path.join(src, c, n), c, label) for label, c in enumerate(classes)
            for n in sorted(os.listdir(os.path.join(src, c)))]


def warm(src: str) -> int:
    """Reads every input once, so that all methods see a warm page cache; returns the total bytes."""
    return sum(len(_read(path)) for path, _, _ in list_images(src))


def _descendants(pid: int) -> list[int]:
    """``pid`` and all its descendants (tfshard's workers are children of the forkserver, not of us)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        children = [int(c) for t in tasks for c in _read(f"/proc/{pid}/task/{t}/children").split()]
    except OSError:  # it exited meanwhile
        children = []
    return [pid] + [q for child in children for q in _descendants(child)]


def _rss(pid: int) -> int:
    return int(_read(f"/proc/{pid}/statm").split()[1]) * _PAGE


class PeakRSS:
    """Samples the RSS of this process and of its descendants from a thread; keeps the peaks in bytes."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.parent, self.total = interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        me = os.getpid()
        command = _read(f"/proc/{me}/cmdline")
        while not self._stop.wait(self.interval):
            try:  # a child between (v)fork and exec shows our memory and our command line: skip it
                children = [pid for pid in _descendants(me)[1:] if _read(f"/proc/{pid}/cmdline") != command]
                parent, rss = _rss(me), sum(_rss(pid) for pid in children)
            except (OSError, IndexError, ValueError):  # a process exited mid-sample
                continue
            self.parent, self.total = max(self.parent, parent), max(self.total, parent + rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_tfshard(src: str, out: str, validate: bool, workers: int | None, labels_file: str | None = None,
                **options) -> None:
    from tfshard.ingest import ConvertOptions, ImageOptions, convert_images

    image = ImageOptions(validate=validate, labels_file=labels_file)
    convert_images(src, out, ConvertOptions(image=image, **options), workers=workers, progress=False)


def labels_csv(src: str, data_dir: str) -> str:
    """A labels file naming every image of ``src`` with its class (beside the set, never inside it)."""
    path = os.path.join(data_dir, os.path.basename(src) + "-labels.csv")
    with open(path, "w", encoding="utf-8") as f:
        f.write("path,label\n")
        f.writelines(f"{os.path.relpath(p, src)},{c}\n" for p, c, _ in list_images(src))
    return path


def run_naive(src: str, out: str) -> None:
    import tensorflow as tf

    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    os.makedirs(out)
    with tf.io.TFRecordWriter(os.path.join(out, "train.tfrecord")) as writer:
        for path, class_name, label in list_images(src):
            data = _read(path)
            image = Image.open(io.BytesIO(data)).convert("RGB")  # full decode: the validation
            keys = {"image/encoded": data, "image/format": b"jpeg", "image/height": image.height,
                    "image/width": image.width, "image/channels": 3, "image/class/label": label,
                    "image/class/text": class_name.encode(), "image/filename": os.path.relpath(path, src).encode()}
            example = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in keys.items()}))
            writer.write(example.SerializeToString())


def copy_into_one_file(paths: list[str], out: str) -> None:
    """Reads every file and writes all the bytes into ``out/all.bin``: the I/O floor of a conversion."""
    os.makedirs(out)
    with open(os.path.join(out, "all.bin"), "wb") as sink:
        for path in paths:
            sink.write(_read(path))


def run_copy(src: str, out: str) -> None:
    copy_into_one_file([path for path, _, _ in list_images(src)], out)


def cpu_seconds() -> tuple[float, float]:
    """CPU-seconds used so far by the whole machine (steal included) and by this process tree."""
    ticks = [int(v) for v in _read("/proc/stat").split(b"\n")[0].split()[1:9]]  # user nice system idle iowait ...
    machine = (sum(ticks) - ticks[3] - ticks[4]) / _TICK
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    for pid in _descendants(os.getpid())[1:]:
        try:
            own += sum(int(v) for v in _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()[11:15]) / _TICK
        except OSError:  # exited since the listing
            pass
    return machine, own


class Run(typing.NamedTuple):
    seconds: float
    cpu: float  # CPU-seconds of this process and its descendants
    parent_cpu: float  # CPU-seconds of this process alone (all its threads)
    peak: PeakRSS
    other: float  # share of the CPUs that other processes took meanwhile (noise on a shared machine)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def timed(fn, src: str, out: str) -> Run:
    """Runs ``fn(src, out)`` once into a fresh ``out``, then deletes ``out``."""
    (machine, own), parent, start = cpu_seconds(), _own_cpu(), time.perf_counter()
    with PeakRSS() as peak:
        fn(src, out)
    seconds = time.perf_counter() - start
    parent = _own_cpu() - parent
    machine, own = (a - b for a, b in zip(cpu_seconds(), (machine, own)))
    shutil.rmtree(out)
    return Run(seconds, own, parent, peak, max(machine - own, 0) / seconds / len(os.sched_getaffinity(0)))


def _decode_scaled(payload: tuple, barrier, done) -> None:
    """A validation-floor worker: holds its share of the JPEG bytes, then decodes them at 1/8 scale, strictly (libjpeg's
    warnings raise), with the decoder tfshard validates with."""
    import simplejpeg

    blobs = payload
    barrier.wait()
    for data in blobs:
        simplejpeg.decode_jpeg(data, strict=True, min_height=1, min_width=1)
    done.put(len(blobs))


def validation_floor(src: str, workers: int) -> float:
    """Seconds for ``workers`` processes to decode every image at 1/8 scale (as tfshard validates), the
    bytes already in their memory: the irreducible work of a validating conversion, on all cores."""
    blobs = [_read(path) for path, _, _ in list_images(src)]
    context = multiprocessing.get_context("forkserver")
    barrier, done = context.Barrier(workers + 1), context.Queue()
    procs = [context.Process(target=_decode_scaled, args=(tuple(blobs[i::workers]), barrier, done))
             for i in range(workers)]
    for proc in procs:
        proc.start()
    barrier.wait()  # every worker holds its bytes
    start = time.perf_counter()
    decoded = sum(done.get() for _ in procs)
    seconds = time.perf_counter() - start
    for proc in procs:
        proc.join()
    assert decoded == len(blobs)
    return seconds


def parent_alone(src: str, out: str, repeats: int) -> tuple[float, float]:
    """Seconds per record of the parent's part of a conversion alone (``write_shard``: append the framed
    bytes, hash, count statistics, commit), on records the workers' function made beforehand in memory.
    Returns (best wall-clock, CPU of this process including the hashing thread) per record."""
    from tfshard.ingest import ConvertOptions
    from tfshard.ingest.kinds.images import ImageJob
    from tfshard.ingest.plan import plan_split
    from tfshard.ingest.write import write_shard

    options = ConvertOptions(on_error="skip")
    job = ImageJob(src, options)
    items = job.items["train"]
    encoded = [job.prepare(item) for item in items]
    (spec,) = plan_split("train", [job.size_of(i) for i in items], target_bytes=2**40)
    os.makedirs(out)
    best = None
    for _ in range(repeats):
        cpu, start = _own_cpu(), time.perf_counter()
        write_shard(job, out, spec, zip(items, encoded), options)
        run = (time.perf_counter() - start, _own_cpu() - cpu)
        best = run if best is None or run[0] < best[0] else best
    shutil.rmtree(out)
    return best[0] / len(items), best[1] / len(items)


EPISODE_FEATURES = {"observation": ((64,), np.float32), "action": ((8,), np.float32), "reward": ((), np.float32)}


def _write_episode(path_and_index: tuple[str, int]) -> None:
    path, index = path_and_index
    rng = np.random.default_rng(index)
    steps = int(rng.integers(500, 3000))
    arrays = {name: rng.standard_normal((steps, *shape), dtype=dtype)
              for name, (shape, dtype) in EPISODE_FEATURES.items()}
    with open(path + ".part", "wb") as f:
        np.savez(f, **arrays)
    os.replace(path + ".part", path)


def episode_set(data_dir: str, count: int) -> str:
    """``data_dir/episodes<count>/<i>.npz``: float32 observation [T, 64], action [T, 8], reward [T];
    T in [500, 3000)."""
    root = os.path.join(data_dir, f"episodes{count}")
    paths = [os.path.join(root, f"{i:05d}.npz") for i in range(count)]
    missing = [(p, i) for i, p in enumerate(paths) if not os.path.exists(p)]
    if missing:
        os.makedirs(root, exist_ok=True)
        print(f"generating {len(missing)} episodes in {root} ...", flush=True)
        with concurrent.futures.ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")) as ex:
            list(ex.map(_write_episode, missing, chunksize=16))
    return root


def run_tfshard_episodes(src: str, out: str, workers: int | None) -> None:
    from tfshard.ingest import convert_episodes

    convert_episodes(src, out, workers=workers, progress=False)


def run_copy_episodes(src: str, out: str) -> None:
    copy_into_one_file([os.path.join(src, name) for name in sorted(os.listdir(src))], out)


def validation_decode_ms(src: str, limit: int = 300) -> tuple[float, float]:
    """Milliseconds per image, one process: PIL's full decode vs the strict 1/8-scale (DCT-scaled) decode tfshard
    validates with (simplejpeg). Both entropy-decode every byte; only the IDCT work differs."""
    import simplejpeg

    blobs = [_read(p) for p, _, _ in list_images(src)[:limit]]
    times = []
    for scaled in (False, True):
        start = time.perf_counter()
        for data in blobs:
            if scaled:
                simplejpeg.decode_jpeg(data, strict=True, min_height=1, min_width=1)
            else:
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
        times.append((time.perf_counter() - start) / len(blobs) * 1e3)
    return times[0], times[1]


def _ratio(value: float, target: float) -> str:
    return f"{value:.2f}x (goal >= {target}x: {'met' if value >= target else 'missed'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="images in the side-by-side run (default 1000)")
    parser.add_argument("--scale-images", type=int, default=5000, help="larger count for the scaling check; 0 skips it")
    parser.add_argument("--episodes", type=int, default=100,
                        help="episodes in the episode run (default 100); 0 skips it")
    parser.add_argument("--workers", type=int, default=None, help="tfshard worker processes (default: all CPUs)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated inputs")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is reported")
    args = parser.parse_args()
    if args.images < 1 or args.repeats < 1 or args.scale_images < 0 or args.episodes < 0:
        parser.error("--images and --repeats must be at least 1, --scale-images and --episodes at least 0")

    import tensorflow as tf  # noqa: F401  (imported before timing, so no method pays for it)

    cpus = len(os.sched_getaffinity(0))
    sets = {n: image_set(args.data_dir, n) for n in (args.images, args.scale_images) if n}
    episodes = episode_set(args.data_dir, args.episodes) if args.episodes else None
    total_bytes = warm(sets[args.images])
    warm_episodes = sum(len(_read(os.path.join(episodes, n))) for n in os.listdir(episodes)) if episodes else 0
    print(f"{args.images} JPEGs {WIDTH}x{HEIGHT}, {total_bytes / args.images / 1e3:.1f} KB each "
          f"({total_bytes / args.images / (WIDTH * HEIGHT):.2f} bytes/pixel); {cpus} CPUs; "
          f"tfshard workers={args.workers or 'all'}; best of {args.repeats} interleaved runs\n")
    from tfshard.ingest.holdout import Holdout

    labels = labels_csv(sets[args.images], args.data_dir)
    methods = {
        "tfshard": lambda s, o: run_tfshard(s, o, True, args.workers),
        "tfshard --labels FILE": lambda s, o: run_tfshard(s, o, True, args.workers, labels),
        "tfshard --dedupe": lambda s, o: run_tfshard(s, o, True, args.workers, dedupe=True),
        "tfshard --val-fraction 0.1": lambda s, o: run_tfshard(s, o, True, args.workers,
                                                               holdout=Holdout(val_fraction=0.1)),
        "tfshard validate=False": lambda s, o: run_tfshard(s, o, False, args.workers),
        "naive loop (1 process)": run_naive,
        "copy bytes (I/O floor)": run_copy,
    }
    episode_methods = {
        "tfshard episodes": lambda s, o: run_tfshard_episodes(s, o, args.workers),
        "read + write the bytes": run_copy_episodes,
    }
    baseline_rss = _rss(os.getpid())
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-") as tmp:
        out = os.path.join(tmp, "out")
        runs = {name: [] for name in methods}
        floors = []
        episode_runs = {name: [] for name in episode_methods}
        timed(methods["tfshard"], sets[args.images], out)  # untimed: the forkserver starts, caches warm
        order = list(methods.items())
        for repeat in range(args.repeats):  # interleaved and rotated, so drift and position hit every method alike
            for name, fn in order[repeat % len(order):] + order[:repeat % len(order)]:
                runs[name].append(timed(fn, sets[args.images], out))
            floors.append(validation_floor(sets[args.images], args.workers or cpus))
            if episodes:
                for name, fn in episode_methods.items():
                    episode_runs[name].append(timed(fn, episodes, out))
        parent_s, parent_cpu = parent_alone(sets[args.images], out, args.repeats)
        scaling = {args.images: runs["tfshard"]}
        if args.scale_images:
            warm(sets[args.scale_images])
            scaling[args.scale_images] = [timed(methods["tfshard"], sets[args.scale_images], out)
                                          for _ in range(args.repeats)]

    best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
    rate = {name: args.images / run.seconds for name, run in best.items()}
    floor_rate = args.images / min(floors)
    print(f"{'method':<26} {'best s':>7} {'worst s':>7} {'img/s':>7} {'MB/s':>7} {'CPU s':>7} {'parent ms/img':>13} "
          f"{'other load':>10}")
    for name, run in best.items():
        print(f"{name:<26} {run.seconds:7.3f} {max(r.seconds for r in runs[name]):7.3f} {rate[name]:7.0f} "
              f"{total_bytes / run.seconds / 1e6:7.1f} {run.cpu:7.2f} {run.parent_cpu / args.images * 1e3:13.3f} "
              f"{run.other:10.0%}")
    print(f"{'validation floor':<26} {min(floors):7.3f} {max(floors):7.3f} {floor_rate:7.0f} "
          f"{total_bytes / min(floors) / 1e6:7.1f}      (1/8-scale decode of bytes in memory, {args.workers or cpus} "
          f"processes)")
    print(f"\ntfshard / validation floor:          {_ratio(rate['tfshard'] / floor_rate, 0.8)}")
    print(f"tfshard validate=False / copy bytes: "
          f"{_ratio(rate['tfshard validate=False'] / rate['copy bytes (I/O floor)'], 0.5)}")
    print(f"tfshard / naive loop:                {rate['tfshard'] / rate['naive loop (1 process)']:.2f}x")
    for name in ("tfshard --labels FILE", "tfshard --dedupe", "tfshard --val-fraction 0.1"):
        print(f"{name + ' / class folders:':<46}{_ratio(rate[name] / rate['tfshard'], 0.95)}")
    print(f"parent alone (write_shard on pre-framed records): {parent_s * 1e3:.4f} ms/record wall, "
          f"{parent_cpu * 1e3:.4f} ms/record CPU (with its hashing thread); ceiling {1 / parent_s:,.0f} img/s "
          f"(goal <= 0.05 ms/record, >= 20,000 img/s: {'met' if parent_s <= 5e-5 else 'missed'})")
    if episodes:
        eb = {name: min(r, key=lambda run: run.seconds) for name, r in episode_runs.items()}
        print(f"\n{args.episodes} episodes (.npz: float32 observation [T, 64], action [T, 8], reward [T]; "
              f"{warm_episodes / 1e6:.0f} MB)")
        for name, run in eb.items():
            print(f"{name:<26} {run.seconds:7.3f} {max(r.seconds for r in episode_runs[name]):7.3f} "
                  f"{warm_episodes / run.seconds / 1e6:7.1f} MB/s {run.cpu:7.2f} CPU s "
                  f"{run.parent_cpu / args.episodes * 1e3:8.3f} parent ms/episode {run.other:6.0%} other load")
        print(f"tfshard episodes / read + write: "
              f"{_ratio(eb['read + write the bytes'].seconds / eb['tfshard episodes'].seconds, 0.5)}")
    full_ms, scaled_ms = validation_decode_ms(sets[args.images])
    print(f"\nvalidation decode, 1 process: full {full_ms:.2f} ms/img, 1/8-scale {scaled_ms:.2f} ms/img "
          f"({full_ms / scaled_ms:.2f}x)")
    print("CPU s: CPU-seconds of the benchmark and its workers in the best run; parent ms/img: CPU of the\n"
          "converting process alone (all its threads: receiving the workers' bytes, writing, hashing), per image;\n"
          "other load: share of the CPUs that other processes took meanwhile (over ~10%, wall-clock figures\n"
          "understate the cores)")

    print(f"\ntfshard scaling; parent RSS before any run (Python + TensorFlow): {baseline_rss / 2**20:.0f} MiB")
    print(f"{'images':>8} {'img/s':>7} {'peak RSS parent':>16} {'parent+workers':>15} {'other load':>10}")
    for count, r in scaling.items():
        run = min(r, key=lambda run: run.seconds)
        print(f"{count:>8} {count / run.seconds:7.0f} {max(x.peak.parent for x in r) / 2**20:12.0f} MiB "
              f"{max(x.peak.total for x in r) / 2**20:11.0f} MiB {run.other:10.0%}")
    if len(scaling) == 2:
        small, large = (min(x.seconds for x in r) for r in scaling.values())
        change = (args.images / small) / (args.scale_images / large)
        print(f"img/s at {args.images} / at {args.scale_images}: {change:.2f} (goal: within 0.8-1.2: "
              f"{'met' if 0.8 <= change <= 1.2 else 'missed'})")


if __name__ == "__main__":
    main()
