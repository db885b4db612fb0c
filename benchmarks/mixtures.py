"""Benchmark: the index-driven stream of ``readers.images`` (issue 32) side by side with what it replaces.

On ``benchmarks/ingest.py``'s photo-like JPEGs (500x375, ~83 KB), converted once (not timed), each method yields one
epoch of training batches (``--batch-size`` 224x224, random crop and flip), timed from creating the iterator to its
end, best of ``--repeats`` interleaved passes:

  1. mixture: ``readers.images([a, b], weights=[0.7, 0.3])`` against one reader over one dataset of the same images,
     and against the hand-written ``unbatch`` / ``sample_from_datasets`` / ``batch`` over two readers;
  2. balance: ``balance="class"`` on a 10:1 set against the unbalanced reader of it, and against
     ``rejection_resample`` to a uniform class distribution (batched after it, as its docs do);
  3. global shuffle: ``shuffle="global"`` against today's file + buffer shuffle of the same dataset;
  4. resume: the input state ``readers.BackupAndRestore`` saves (its state file, after one step of ``model.fit``)
     and a TensorFlow iterator checkpoint of the index-driven reader, in bytes; and the time to the first batch
     with ``start_step`` at 90% of an epoch against at 0 (building the pipeline included), for ``shuffle="global"``
     and for the default reader (which reads the records before the step again, undecoded).
  5. augmentation: ``augment="color"`` on a batch of ``--batch-size`` 224x224 images, one seed for the batch (the
     default reader) against one seed per image (the stream's), and the per-image draw alone, in ms per batch.
  6. with ``--shard-cache``: the same images converted to ``gs://`` on the GCS emulator (``tests/gcs_emulator.py``,
     ``--latency-ms`` a response, ``--stream-mb-per-s`` a connection), read through ``shard_cache=`` (an empty
     folder each round): ``shuffle="global"`` against today's file + buffer shuffle, epoch 1 (building the reader
     and fetching the shards) and epoch 2 (the local copies) of one pipeline each.

Images per second are printed side by side with the ratios the issue sets as targets. Run it with
``.venv/bin/python benchmarks/mixtures.py --images 600 --repeats 2`` (add ``--shard-cache`` for 6. alone).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time

import ingest as bench_ingest  # noqa: E402  (benchmarks/ingest.py: the image generator)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location("gcs_emulator", os.path.join(REPO, "tests", "gcs_emulator.py"))
gcs_emulator = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gcs_emulator)


def _tree(src: str, dst: str, keep) -> str:
    """Hard links of the images of ``src`` whose index ``keep`` accepts, in their class folders."""
    for i, (path, name, _) in enumerate(bench_ingest.list_images(src)):
        if keep(i):
            os.makedirs(os.path.join(dst, name), exist_ok=True)
            os.link(path, os.path.join(dst, name, os.path.basename(path)))
    return dst


def _tilted(src: str, dst: str) -> str:
    """Two classes 10:1 of ``src``'s images (class 1 keeps every tenth image of its share)."""
    for i, (path, _, _) in enumerate(bench_ingest.list_images(src)):
        name = "many" if i % 11 else "few"
        os.makedirs(os.path.join(dst, name), exist_ok=True)
        os.link(path, os.path.join(dst, name, os.path.basename(path)))
    return dst


def _time(make) -> tuple[float, int]:
    ds = make()
    start, images = time.perf_counter(), 0
    for batch, _ in ds:
        images += int(batch.shape[0])
    return time.perf_counter() - start, images


def _first_batch(make) -> float:
    start = time.perf_counter()
    next(iter(make()))
    return time.perf_counter() - start


def _state_sizes(out: str, common: dict, work: str) -> tuple[int, int]:
    """Bytes of readers.BackupAndRestore's state file after one fit step, and of an iterator checkpoint, both of
    ``shuffle="global"`` on ``out``."""
    import keras
    import tensorflow as tf
    from tfshard import readers

    ds = readers.images(out, shuffle="global", repeat=True, **common)
    model = keras.Sequential([keras.Input((224, 224, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(len(readers.info(out).class_names))])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = readers.BackupAndRestore(f"{work}/backup", save_freq=1, delete_checkpoint=False, dataset=ds)
    model.fit(ds, epochs=1, steps_per_epoch=1, callbacks=[backup], verbose=0)
    state = os.path.getsize(f"{work}/backup/tfshard_state.json")
    iterator = iter(readers.images(out, shuffle="global", repeat=True, **common))
    next(iterator)
    prefix = tf.train.Checkpoint(input=iterator).write(f"{work}/iterator/ckpt")
    folder = os.path.dirname(prefix)
    checkpoint = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    return state, checkpoint


def shard_cache_section(args) -> None:
    """Section 6, inside the emulator's namespace: both shuffles through a shard cache, epochs 1 and 2."""
    from tfshard import readers
    from tfshard.ingest import ConvertOptions, ImageOptions, convert_images

    src = bench_ingest.image_set(args.data_dir, args.images)
    remote = "gs://bench/all"
    convert_images(src, remote, ConvertOptions(image=ImageOptions()), progress=False)
    gcs_emulator.configure(latency_ms=args.latency_ms, stream_mb_per_s=args.stream_mb_per_s)
    common = {"batch_size": args.batch_size, "seed": 0}
    methods = {"file+buffer shuffle": {}, "shuffle='global'": {"shuffle": "global"}}
    best = {(name, epoch): 0.0 for name in methods for epoch in (1, 2)}
    with tempfile.TemporaryDirectory(prefix="tfshard-mixtures-cache-") as work:
        for round_ in range(args.repeats):
            for name, extra in (list(methods.items())[::-1] if round_ % 2 else methods.items()):
                folder = tempfile.mkdtemp(dir=work)  # empty: epoch 1 fetches every shard
                start = time.perf_counter()  # epoch 1 counts the build: the stream fetches its copies there
                ds = readers.images(remote, shard_cache=folder, **extra, **common)
                for epoch in (1, 2):
                    images = sum(int(batch.shape[0]) for batch, _ in ds)
                    best[name, epoch] = max(best[name, epoch], images / (time.perf_counter() - start))
                    start = time.perf_counter()
                shutil.rmtree(folder)
    print(f"{args.images} images on gs:// ({args.latency_ms:g} ms a response, {args.stream_mb_per_s:g} MB/s a "
          f"connection) through shard_cache=, batch {args.batch_size}, best of {args.repeats}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for (name, epoch), rate in best.items():
        print(f"  {name:22s} epoch {epoch} {rate:8.1f} img/s")
    for epoch in (1, 2):
        ratio = best["shuffle='global'", epoch] / best["file+buffer shuffle", epoch]
        print(f"  global / file+buffer, epoch {epoch}: {ratio:5.2f}x (target >= 0.9x) "
              f"{'ok' if ratio >= 0.9 else 'MISSED'}")


def _augment_cost(batch_size: int, repeats: int) -> None:
    """Colour augmentation of one batch by a batch seed and by per-image seeds, and the per-image draw alone."""
    import numpy as np
    import tensorflow as tf
    from tfshard.readers import augment

    images = tf.constant(np.random.default_rng(0).integers(0, 256, (batch_size, 224, 224, 3), dtype=np.uint8))
    seeds = {"batch seed": tf.constant([3, 9], tf.int64),
             "per-image seeds": tf.stack([tf.fill([batch_size], tf.constant(3, tf.int64)),
                                          tf.range(batch_size, dtype=tf.int64)], axis=1)}
    runs = {name: (tf.function(lambda x, s: augment.color_augment(x, s)), images, seed) for name, seed in seeds.items()}
    runs["per-image draw alone"] = (tf.function(lambda x, s: augment._image_uniforms(s, 8)), images,
                                    seeds["per-image seeds"])
    best = {name: float("inf") for name in runs}
    for _ in range(max(repeats, 3)):
        for name, (function, x, seed) in runs.items():
            function(x, seed)  # traced and compiled before the clock
            start = time.perf_counter()
            for _ in range(20):
                tf.nest.map_structure(lambda t: t.numpy(), function(x, seed))
            best[name] = min(best[name], (time.perf_counter() - start) / 20 * 1e3)
    print(f"  augment='color', batch {batch_size} at 224x224: " + "; ".join(f"{name} {ms:.2f} ms"
                                                                          for name, ms in best.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--shard-cache", action="store_true",
                        help="only section 6: both shuffles through a shard cache on the GCS emulator")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="with --shard-cache (default 30)")
    parser.add_argument("--stream-mb-per-s", type=float, default=12.0, help="with --shard-cache (default 12)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return shard_cache_section(args)
    if args.shard_cache:
        reason = gcs_emulator.unavailable_reason()
        if reason is not None:
            sys.exit(f"benchmarks/mixtures.py: cannot run the GCS emulator here: {reason}")
        bench_ingest.image_set(args.data_dir, args.images)  # generated outside the namespace, once
        argv = [arg for arg in sys.argv[1:] if arg != "--shard-cache"]
        command = [sys.executable, os.path.abspath(__file__), "--inside", *argv]
        sys.exit(gcs_emulator.run(command, buckets=["bench"], capture=False).returncode)

    import tensorflow as tf
    from tfshard import readers
    from tfshard.ingest import ConvertOptions, ImageOptions, convert_images

    src = bench_ingest.image_set(args.data_dir, args.images)
    work = tempfile.mkdtemp(prefix="tfshard-mixtures-")
    try:
        trees = {"all": src, "a": _tree(src, f"{work}/a", lambda i: i % 10 < 7),
                 "b": _tree(src, f"{work}/b", lambda i: i % 10 >= 7), "tilted": _tilted(src, f"{work}/t")}
        outs = {}
        for name, tree in trees.items():
            outs[name] = f"{work}/{name}-tfr"
            convert_images(tree, outs[name], ConvertOptions(image=ImageOptions()), progress=False)
        bench_ingest.warm(src)  # the shards were just written: in the page cache too
        common = {"batch_size": args.batch_size, "seed": 0}
        total = readers.info(outs["all"]).num_records("train")
        tilted = readers.info(outs["tilted"]).num_records("train")
        steps = total // args.batch_size

        def hand_written():
            parts = [readers.images(outs[k], **common).unbatch() for k in ("a", "b")]
            mixed = tf.data.Dataset.sample_from_datasets([p.repeat() for p in parts], [0.7, 0.3], seed=0)
            return mixed.batch(args.batch_size, drop_remainder=True).take(steps).prefetch(tf.data.AUTOTUNE)

        def rejection():
            ds = readers.images(outs["tilted"], **common).unbatch()
            resampled = ds.rejection_resample(lambda image, label: tf.cast(label, tf.int32), [0.5, 0.5], seed=0)
            return resampled.map(lambda _, pair: pair).batch(args.batch_size, drop_remainder=True).take(
                tilted // args.batch_size).prefetch(tf.data.AUTOTUNE)

        methods = {
            "one reader": lambda: readers.images(outs["all"], **common),
            "mixture 70/30": lambda: readers.images([outs["a"], outs["b"]], weights=[0.7, 0.3], epoch_size=total,
                                                    **common),
            "hand-written mix": hand_written,
            "unbalanced 10:1": lambda: readers.images(outs["tilted"], **common),
            "balance='class'": lambda: readers.images(outs["tilted"], balance="class", **common),
            "rejection_resample": rejection,
            "file+buffer shuffle": lambda: readers.images(outs["all"], **common),
            "shuffle='global'": lambda: readers.images(outs["all"], shuffle="global", **common),
        }
        best = {name: 0.0 for name in methods}
        for _ in range(args.repeats):
            for name, make in methods.items():
                seconds, images = _time(make)
                best[name] = max(best[name], images / seconds)
        print(f"{args.images} images, batch {args.batch_size}, best of {args.repeats}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for name, rate in best.items():
            print(f"  {name:22s} {rate:8.1f} img/s")
        for what, num, den, target in [("mixture / one reader", "mixture 70/30", "one reader", 0.95),
                                       ("mixture / hand-written", "mixture 70/30", "hand-written mix", 1.5),
                                       ("balance / unbalanced", "balance='class'", "unbalanced 10:1", 0.95),
                                       ("balance / rejection_resample", "balance='class'", "rejection_resample", 3),
                                       ("global / file+buffer", "shuffle='global'", "file+buffer shuffle", 0.9)]:
            ratio = best[num] / best[den]
            print(f"  {what:30s} {ratio:5.2f}x (target >= {target}x) {'ok' if ratio >= target else 'MISSED'}")

        late = int(0.9 * steps)
        for name, extra in [("shuffle='global'", {"shuffle": "global"}), ("default reader", {})]:
            def at(step, extra=extra):
                return lambda: readers.images(outs["all"], repeat=True, start_step=step, **extra, **common)

            zero, resumed = (min(_first_batch(at(step)) for _ in range(args.repeats)) for step in (0, late))
            cost = resumed - zero
            print(f"  resume at step {late} of {steps} ({name}): first batch in {resumed:.3f} s, {zero:.3f} s at step "
                  f"0: {cost:+.3f} s (target <= 1 s) {'ok' if cost <= 1 else 'MISSED'}")
        state, checkpoint = _state_sizes(outs["all"], common, work)
        print(f"  input state: BackupAndRestore's state file {state} bytes (target <= 4096) "
              f"{'ok' if state <= 4096 else 'MISSED'}; an iterator checkpoint of shuffle='global' {checkpoint:,} bytes")
        _augment_cost(args.batch_size, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
