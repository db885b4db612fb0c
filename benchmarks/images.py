"""Benchmark: ``readers.images()`` side by side with keras and with the bare JPEG-decode limit.

On one generated set of 500x375 photo-like JPEGs (``benchmarks/ingest.py``'s
``image_set``: ~83 KB, ImageNet-like) in class folders, converted once with
``convert_images`` (not timed), each method yields batches of ``--batch-size``
224x224 images and is timed as one full pass over the data:

  1. tfshard, training with a file cache: the first epoch (decodes, fills the cache)
     and a second, cached epoch of the same pipeline;
  2. tfshard, training without a cache: the fused ``decode_and_crop_jpeg`` path;
  3. tfshard, evaluation (``training=False``: centre crop, file order);
  4. keras: ``image_dataset_from_directory`` on the source folder, plus ``.prefetch``;
  5. decode limit: the same JPEG bytes already in RAM, ``decode_jpeg`` + resize on all
     cores, batched and prefetched (no file reading, no parsing, no augmentation).

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
import importlib.util
import tempfile
import time
import typing

# benchmarks/ingest.py drops this folder from sys.path as it loads (so `import ingest` finds the package),
# and gives us its image generator, page-cache warmer and CPU accounting.
_SPEC = importlib.util.spec_from_file_location(
    "bench_ingest", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ingest.py")
)
bench_ingest = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_ingest)

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


def decode_limit(src: str, batch_size: int):
    """The same JPEG bytes from RAM, decoded and resized on all cores: what any reader's decode costs."""
    import tensorflow as tf

    blobs, labels = [], []
    for path, _, label in bench_ingest.list_images(src):
        with open(path, "rb") as f:
            blobs.append(f.read())
        labels.append(label)

    def decode(encoded, label):
        image = tf.io.decode_jpeg(encoded, channels=3)
        return tf.image.resize(image, SIZE), label

    ds = tf.data.Dataset.from_tensor_slices((blobs, labels))
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE)


def keras_dataset(src: str, batch_size: int):
    import keras
    import tensorflow as tf

    ds = keras.utils.image_dataset_from_directory(src, batch_size=batch_size, image_size=SIZE, verbose=False)
    return ds.prefetch(tf.data.AUTOTUNE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="generated JPEGs (default 1000)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated images")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="passes per method; the best is reported")
    args = parser.parse_args()
    if args.images < args.batch_size or args.batch_size < 1 or args.repeats < 1:
        parser.error("--batch-size and --repeats must be at least 1, --images at least --batch-size")

    import tensorflow as tf  # imported before timing, so no method pays for it

    from tfshard.ingest import ConvertOptions, convert_images
    from tfshard.readers.images import images as read_images  # readers.images; this spelling never yields the module

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

        def tfshard(**kwargs):
            return read_images(out, batch_size=args.batch_size, image_size=SIZE, seed=0, **kwargs)

        names = ["tfshard first epoch (fills cache)", "tfshard cached epoch", "tfshard fused crop (no cache)",
                 "tfshard eval (training=False)", "keras image_dataset_from_directory", "decode limit (bytes in RAM)"]
        runs = {name: [] for name in names}
        in_ram = decode_limit(src, args.batch_size)
        for repeat in range(args.repeats):  # interleaved, so drift on the machine hits every method alike
            cached = tfshard(training=True, cache=os.path.join(tmp, f"cache-{repeat}"))
            runs[names[0]].append(timed_pass(cached))
            runs[names[1]].append(timed_pass(cached))
            runs[names[2]].append(timed_pass(tfshard(training=True, cache=None)))
            runs[names[3]].append(timed_pass(tfshard(training=False)))
            runs[names[4]].append(timed_pass(keras_dataset(src, args.batch_size)))
            runs[names[5]].append(timed_pass(in_ram))

    best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
    rate = {name: run.images / run.seconds for name, run in best.items()}
    print(f"{'method':<36} {'images':>6} {'best s':>6} {'worst s':>7} {'img/s':>5} {'MB/s':>5} "
          f"{'CPU ms/img':>10} {'busy':>4} {'other load':>10}")
    for name, run in best.items():
        mb_per_s = total_bytes / args.images * run.images / run.seconds / 1e6
        print(f"{name:<36} {run.images:>6} {run.seconds:6.3f} {max(r.seconds for r in runs[name]):7.3f} "
              f"{rate[name]:5.0f} {mb_per_s:5.1f} {run.cpu / run.images * 1e3:10.2f} "
              f"{run.cpu / run.seconds / cpus:4.0%} {run.other:10.0%}")

    first, cached, fused, keras_, limit = (rate[names[i]] for i in (0, 1, 2, 4, 5))
    print()
    for label, value, target in [
        ("first epoch / decode limit", first / limit, 0.9),
        ("first epoch / keras", first / keras_, 1.4),
        ("cached epoch / first epoch", cached / first, 3.0),
        ("fused crop / keras", fused / keras_, 2.0),
    ]:
        print(f"{label:<28} {value:5.2f}x  (target >= {target:.1f}x: {'met' if value >= target else 'MISSED'})")
    print("\nMB/s: JPEG bytes of the images yielded per second. CPU ms/img: CPU time of this process per image.\n"
          "busy / other load: share of the CPUs that this process / other processes took during the best pass\n"
          "(other load over ~10% means the img/s figures are low).")


if __name__ == "__main__":
    main()
