"""Benchmark: ``readers.images()`` side by side with keras and with the bare JPEG-decode floors.

On one generated set of 500x375 photo-like JPEGs (``benchmarks/ingest.py``'s
``image_set``: ~83 KB, ImageNet-like) in class folders, converted once with
``convert_images`` (not timed), each method yields batches of ``--batch-size``
224x224 images and is timed as one full pass over the data:

  1. floors: the same JPEG bytes already in RAM, on all cores, batched and prefetched:
     the reader's own fused random-crop decode + resize (the floor of training), and a
     full ``decode_jpeg`` + resize (the floor of evaluation and of keras);
  2. keras: ``image_dataset_from_directory`` on the source folder, plus ``.prefetch``;
  3. tfshard evaluation (``training=False``: centre crop, file order);
  4. tfshard training without a cache: ``augment=None`` (the fused crop alone), the
     default (crop + flip), ``dtype="uint8"``, and ``augment="color"``;
  5. tfshard training with a file cache: the first epoch (decodes, fills the cache)
     and a second, cached epoch of the same pipeline;
  6. unless ``--no-fit``: a small conv net's ``model.fit`` on the default reader, for the
     gaps between epochs and the input overhead against the same batch repeated.

Evaluation is also set against its own floor: the reader's fused centre-crop decode to float32 over the same
bytes in RAM, with fixed parallelism (one decode per core, autotune off, as the readers run) and with autotune
(which made it bimodal on 2 cores): img/s and CPU per image as ratios (targets >= 0.95x, <= 1.05x). A third floor
reads the shards themselves with tf.data and no checks (``bench.floor_read_center_crop``): the two shares it gives
split evaluation's gap into what reading the shards costs and what the reader's checks cost.

First batch (unless ``--first-batch-rounds 0``): each reader in a fresh process (``--first-batch-child``),
imports done and TensorFlow's eager context up, timed from the call that builds it to its first batch:
keras' ``image_dataset_from_directory``, ``readers.images`` training and evaluation, and ``readers.windows``,
``readers.model_windows(...).starts`` and ``readers.episodes`` on ``--episodes`` generated episodes
(``benchmarks/ingest.py``'s ``episode_set``: observation [T, 64], action [T, 8], reward [T]); the rounds are
interleaved, the best of each is shown, as ratios to keras' (targets: <= 0.3 s and <= keras') and to the first batch's
floor: a bare tf.data reader of the same shards (read, parse, the fused centre-crop decode fused with the batch; no
AutoGraph, no checks, no static rewrites), which no tf.data reader of these shards that decodes the centre crop can
beat. keras, both ``readers.images`` and that floor are timed again with ``TF_ENABLE_ONEDNN_OPTS=0`` in the child's
environment: TensorFlow's oneDNN graph rewrite, a fixed cost of each process's first pipelines (docs/design.md).

Each pass is ``time.perf_counter`` from creating the iterator to its end of data
(a batch is only counted, not touched further); building the dataset is not timed.
Passes are repeated and interleaved; the table shows the best and worst, the CPU time
per image, and the share of the CPUs that this process (busy) and other processes
(other load) took meanwhile: other load over ~10%, the figures are low. img/s counts
the images yielded (training drops the last partial batch). Every input is read once
first (warm page cache) and TensorFlow is imported before timing.

The clock stops at the end of the data, before the iterator is deleted: with autotune
on (TF 2.21), deleting an iterator often blocks until the autotuner's next optimisation
step, whose period doubles from 10 ms (steps ~2.55, 5.1, 10.2, 20.5, 41 s after the
iterator starts), which would add a random 0 to ~50% to every method's time.

Run it with ``.venv/bin/python benchmarks/images.py``, e.g.:
  .venv/bin/python benchmarks/images.py --images 1000 --repeats 3
Images are cached in ``--data-dir`` (default ./bench-data) and reused; the TFRecords
and reader caches go to a temporary folder that is deleted at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import json
import subprocess
import sys
import tempfile
import time
import typing

# benchmarks/ingest.py (this folder is sys.path[0] when a benchmark runs, so its worker processes find it
# too): the image generator, the page-cache warmer and CPU accounting.
import ingest as bench_ingest  # noqa: E402  (the package is tfshard.ingest, so the name is free)

# convert_images' forkserver workers re-import this module, so TensorFlow is imported only inside functions.
SIZE = (224, 224)


class Run(typing.NamedTuple):
    seconds: float
    images: int
    cpu: float  # CPU-seconds of this process
    other: float  # share of the CPUs that other processes took meanwhile


def timed_pass(dataset) -> Run:
    """Iterates ``dataset`` once to the end, counting images; the iterator is deleted after the clock stops."""
    (machine, own), start = bench_ingest.cpu_seconds(), time.perf_counter()
    images, iterator = 0, iter(dataset)
    for _, labels in iterator:
        images += int(labels.shape[0])
    seconds = time.perf_counter() - start
    machine, own = (a - b for a, b in zip(bench_ingest.cpu_seconds(), (machine, own)))
    del iterator  # may wait for the autotuner's next step (see the module docstring)
    return Run(seconds, images, own, max(machine - own, 0) / seconds / len(os.sched_getaffinity(0)))


def fit_figures(make_reader, batch_size: int, images: int, epochs: int = 3) -> dict:
    """A small conv net fit on the reader: the gaps between epochs, and the overhead against a repeated batch.

    The gap is the time from the end of one epoch's last step to the start of the next epoch's first step
    (Keras callbacks); the overhead compares one epoch of fit on the reader with one on the same first batch
    repeated from memory (``Dataset.from_tensors(batch).repeat(steps)``), so only the input differs.
    """
    import keras
    import tensorflow as tf

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends, self.starts, self.epochs = [], [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(time.perf_counter())
            self.starts.append(None)

        def on_train_batch_begin(self, batch, logs=None):
            if self.starts[-1] is None:
                self.starts[-1] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if len(self.ends) < len(self.starts):
                self.ends.append(None)
            self.ends[-1] = time.perf_counter()

    def model():
        net = keras.Sequential([
            keras.Input((*SIZE, 3)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ])
        net.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return net

    steps = images // batch_size
    reader = make_reader()
    clock = Clock()
    net = model()
    net.fit(reader, epochs=epochs, verbose=0, callbacks=[clock])
    gaps = [start - end for end, start in zip(clock.ends[:-1], clock.starts[1:])]

    def steady_epoch(c) -> float:  # the fastest epoch after the first (which traces and warms up), first to last step
        return min(end - start for start, end in zip(c.starts[1:], c.ends[1:]))

    first = next(iter(make_reader()))
    repeated = tf.data.Dataset.from_tensors(first).repeat(steps)
    clock_r = Clock()
    net.fit(repeated, epochs=epochs, verbose=0, callbacks=[clock_r])
    repeated_s, reader_s = steady_epoch(clock_r), steady_epoch(clock)
    return {"epochs": epochs, "steps": steps, "gap_max": max(gaps), "gap_mean": sum(gaps) / len(gaps),
            "reader_s": reader_s, "repeated_s": repeated_s, "overhead": reader_s / repeated_s - 1}


FIRST_BATCH = ("keras image_dataset_from_directory", "readers.images (training)", "readers.images (evaluation)",
               "readers.windows", "readers.model_windows .starts", "readers.episodes",
               "floor: tf.data read + centre crop")
# Also timed with TensorFlow's oneDNN graph rewrites off (TF_ENABLE_ONEDNN_OPTS=0 in the child's environment): the
# rewrite searches TensorFlow's whole kernel registry once per op type and thread, a fixed cost of every loader's
# first pipeline in a process (docs/design.md, "Where a first batch goes").
ONEDNN_OFF = (FIRST_BATCH[0], FIRST_BATCH[1], FIRST_BATCH[2], FIRST_BATCH[-1])
ONEDNN_OFF_SUFFIX = " [oneDNN off]"


def first_batch_child(name: str, src: str, images_out: str, episodes_out: str, batch_size: int) -> None:
    """In a fresh process: imports and the eager context first, then the seconds from building ``name``'s loader
    to its first batch, printed as JSON (``{"build": s, "first": s}``)."""
    import keras
    import tensorflow as tf
    from tfshard import readers
    from tfshard.tools import bench

    tf.constant(0)  # the eager context, which any first op of a process starts
    window = {"length": 64, "shift": 16, "batch_size": batch_size, "features": "observation", "seed": 0}
    make = {
        FIRST_BATCH[0]: lambda: keras.utils.image_dataset_from_directory(
            src, batch_size=batch_size, image_size=SIZE, verbose=False).prefetch(tf.data.AUTOTUNE),
        FIRST_BATCH[1]: lambda: readers.images(images_out, batch_size=batch_size, image_size=SIZE, seed=0),
        FIRST_BATCH[2]: lambda: readers.images(images_out, batch_size=batch_size, image_size=SIZE, training=False),
        FIRST_BATCH[3]: lambda: readers.windows(episodes_out, **window),
        FIRST_BATCH[4]: lambda: readers.model_windows(episodes_out, **window).starts,
        FIRST_BATCH[5]: lambda: readers.episodes(episodes_out),
        FIRST_BATCH[6]: lambda: bench.floor_read_center_crop(images_out, "train", batch_size, SIZE),
    }[name]
    start = time.perf_counter()
    dataset = make()
    built = time.perf_counter()
    next(iter(dataset))
    print(json.dumps({"build": built - start, "first": time.perf_counter() - start}))


def first_batches(rounds: int, src: str, images_out: str, episodes_out: str, batch_size: int) -> dict:
    """Name -> the seconds to the first batch of each round (``first_batch_child`` in a fresh process each)."""
    runs = [(name, name, {}) for name in FIRST_BATCH] + [
        (name + ONEDNN_OFF_SUFFIX, name, {"TF_ENABLE_ONEDNN_OPTS": "0"}) for name in ONEDNN_OFF]
    times = {key: [] for key, _, _ in runs}
    for _ in range(rounds):  # interleaved: drift on the machine hits every loader alike
        for key, name, env in runs:
            out = subprocess.run([sys.executable, __file__, "--first-batch-child", name, "--src", src,
                                  "--images-out", images_out, "--episodes-out", episodes_out,
                                  "--batch-size", str(batch_size)], capture_output=True, text=True, check=True,
                                 env={**os.environ, **env})
            times[key].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return times


def print_first_batches(times: dict) -> None:
    best = {name: min(runs, key=lambda run: run["first"]) for name, runs in times.items()}
    keras_s, floor_s = best[FIRST_BATCH[0]]["first"], best[FIRST_BATCH[-1]]["first"]
    print(f"\nfirst batch, from building the loader to its first batch (fresh process each, imports done; best of "
          f"{len(next(iter(times.values())))} interleaved rounds):")
    print(f"{'loader':<36} {'build s':>7} {'first s':>7} {'worst s':>7} {'/ keras':>7} {'/ floor':>7}  "
          "target <= 0.3 s and <= keras")
    for name in FIRST_BATCH:
        run = best[name]
        ratio = run["first"] / keras_s
        met = "" if name in (FIRST_BATCH[0], FIRST_BATCH[-1]) else (
            "met" if run["first"] <= 0.3 and ratio <= 1.0 else "MISSED")
        print(f"{name:<36} {run['build']:7.3f} {run['first']:7.3f} {max(r['first'] for r in times[name]):7.3f} "
              f"{ratio:6.2f}x {run['first'] / floor_s:6.2f}x  {met}")
    off = {name: best[name + ONEDNN_OFF_SUFFIX] for name in ONEDNN_OFF if name + ONEDNN_OFF_SUFFIX in best}
    if off:
        keras_off = off[FIRST_BATCH[0]]["first"]
        print("\nthe same with TF_ENABLE_ONEDNN_OPTS=0 in the process (TensorFlow's oneDNN graph rewrites off):")
        print(f"{'loader':<36} {'build s':>7} {'first s':>7} {'/ on':>7} {'/ keras':>7}")
        for name, run in off.items():
            print(f"{name:<36} {run['build']:7.3f} {run['first']:7.3f} {run['first'] / best[name]['first']:6.2f}x "
                  f"{run['first'] / keras_off:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="generated JPEGs (default 1000)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated images")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per method; the best is reported")
    parser.add_argument("--no-fit", dest="fit", action="store_false", help="skip the model.fit measurements")
    parser.add_argument("--episodes", type=int, default=64, help="generated episodes for the first batches")
    parser.add_argument("--first-batch-rounds", type=int, default=3, help="rounds of first batches (0: none)")
    parser.add_argument("--first-batch-child", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--images-out", help=argparse.SUPPRESS)
    parser.add_argument("--episodes-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_batch_child:
        first_batch_child(args.first_batch_child, args.src, args.images_out, args.episodes_out, args.batch_size)
        return
    if args.images < args.batch_size or args.batch_size < 1 or args.repeats < 1:
        parser.error("--batch-size and --repeats must be at least 1, --images at least --batch-size")

    import tensorflow as tf  # imported before timing, so no method pays for it
    from tfshard.ingest import ConvertOptions, convert_episodes, convert_images
    from tfshard.readers.images import images as read_images  # readers.images; this spelling never yields the module
    from tfshard.tools import bench

    src = bench_ingest.image_set(args.data_dir, args.images)
    total_bytes = bench_ingest.warm(src)
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-images-") as tmp:
        out = os.path.join(tmp, "tfr")
        manifest = convert_images(src, out, ConvertOptions(), progress=False)
        shards = len(manifest.splits["train"].shards)
        print(f"{args.images} JPEGs {bench_ingest.WIDTH}x{bench_ingest.HEIGHT}, "
              f"{total_bytes / args.images / 1e3:.1f} KB each, {shards} shard(s); {cpus} CPUs; "
              f"batch {args.batch_size}, {SIZE[0]}x{SIZE[1]}; best of {args.repeats} interleaved passes\n")
        for shard in tf.io.gfile.glob(os.path.join(out, "*")):  # warm the shards too
            tf.io.gfile.GFile(shard, "rb").read()
        first = None
        if args.first_batch_rounds > 0:
            episodes_out = os.path.join(tmp, "episodes")
            convert_episodes(bench_ingest.episode_set(args.data_dir, args.episodes), episodes_out, workers=0,
                             progress=False)
            first = first_batches(args.first_batch_rounds, src, out, episodes_out, args.batch_size)

        def tfshard(**kwargs):
            # A shuffle buffer smaller than the epoch, as in any real dataset: one as large as these 1,000 images
            # would hold back every augmentation until the whole epoch is decoded, instead of overlapping the two.
            kwargs.setdefault("shuffle_buffer", min(256, args.images // 4))
            return read_images(out, batch_size=args.batch_size, image_size=SIZE, seed=0, **kwargs)

        blobs, labels = bench.jpeg_records(out, "train")
        methods = bench.image_methods(out, "train", batch_size=args.batch_size, image_size=SIZE, blobs=blobs,
                                      labels=labels, src=src, shuffle_buffer=min(256, args.images // 4))
        for name in (bench.DEFAULT, bench.COLOR, bench.FLOOR_CROP):
            next(iter(methods[name]()))  # compile the XLA-fused ops once, before any clock runs
        names = list(methods) + [bench.CACHE_FIRST, bench.CACHE_AGAIN]
        runs = {name: [] for name in names}
        for repeat in range(args.repeats):  # interleaved, so drift on the machine hits every method alike
            for name, make in methods.items():
                runs[name].append(timed_pass(make()))
            cached = tfshard(cache=os.path.join(tmp, f"cache-{repeat}"))
            runs[bench.CACHE_FIRST].append(timed_pass(cached))
            runs[bench.CACHE_AGAIN].append(timed_pass(cached))
        fit = fit_figures(tfshard, args.batch_size, args.images) if args.fit else None

    best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
    rate = {name: run.images / run.seconds for name, run in best.items()}
    print(f"{'method':<42} {'images':>6} {'best s':>6} {'worst s':>7} {'img/s':>5} {'MB/s':>5} "
          f"{'CPU ms/img':>10} {'busy':>4} {'other load':>10}")
    for name, run in best.items():
        mb_per_s = total_bytes / args.images * run.images / run.seconds / 1e6
        print(f"{name:<42} {run.images:>6} {run.seconds:6.3f} {max(r.seconds for r in runs[name]):7.3f} "
              f"{rate[name]:5.0f} {mb_per_s:5.1f} {run.cpu / run.images * 1e3:10.2f} "
              f"{run.cpu / run.seconds / cpus:4.0%} {run.other:10.0%}")

    print()
    for label, value, target in bench.ratios(rate):
        print(f"{label:<40} {value:5.2f}x  (target >= {target:g}x: {'met' if value >= target else 'MISSED'})")
    cpu_per = {name: run.cpu / run.images for name, run in best.items()}
    for floor in (bench.FLOOR_EVAL, bench.FLOOR_EVAL_AUTOTUNE):
        value = cpu_per[bench.EVAL] / cpu_per[floor]
        print(f"{'eval CPU per image / ' + floor[7:]:<40} {value:5.2f}x  (target <= 1.05x: "
              f"{'met' if value <= 1.05 else 'MISSED'})")
    print(f"{'eval / ' + bench.FLOOR_EVAL_AUTOTUNE[7:]:<40} {rate[bench.EVAL] / rate[bench.FLOOR_EVAL_AUTOTUNE]:5.2f}x")
    for label, value in bench.shares(rate):
        print(f"{label:<40} {value:5.2f}x")
    print(f"{'training uint8 / training float32':<40} {rate[bench.UINT8] / rate[bench.DEFAULT]:5.2f}x")
    print(f"{'augment=color / default':<40} {rate[bench.COLOR] / rate[bench.DEFAULT]:5.2f}x")
    if fit is not None:
        print(f"\nmodel.fit of a small conv net, {fit['epochs']} epochs of {fit['steps']} steps:")
        print(f"  gap between epochs (last step of one to first of the next): max {fit['gap_max']:.3f} s, "
              f"mean {fit['gap_mean']:.3f} s  (target <= 0.2 s: {'met' if fit['gap_max'] <= 0.2 else 'MISSED'})")
        print(f"  input overhead, fit(reader) / fit(the same batch repeated) - 1: {fit['overhead']:+.1%} "
              f"({fit['reader_s']:.2f} s vs {fit['repeated_s']:.2f} s per epoch; target <= 10% where the model "
              "step is slower than the pipeline)")
    if first is not None:
        print_first_batches(first)
    print("\nMB/s: JPEG bytes of the images yielded per second. CPU ms/img: CPU time of this process per image.\n"
          "busy / other load: share of the CPUs that this process / other processes took during the best pass\n"
          "(other load over ~10% means the img/s figures are low).")


if __name__ == "__main__":
    main()
