"""Benchmark: ``readers.windows()`` side by side with the usual ways to cut sliding windows from episodes.

The issue's shape: ``--episodes`` float32 episodes ``[T, F]`` of 5,000-20,000 seeded
steps, windows of L steps every S steps that never cross an episode boundary, in
batches ``[B, L, F]`` float32 (defaults 200 episodes, F=8, L=256, S=16, B=64).
The episodes are ``.npy`` files cached in ``--data-dir/windows/<parameters>/`` and
converted (timed) with ``convert_episodes`` into a temporary folder. Contenders:

  1. tfshard resident: ``readers.windows(out, ...)`` (one array in memory, one gather per batch);
  2. Sequence: a ``keras.utils.PyDataset`` whose ``__getitem__`` stacks one batch with numpy
     from per-episode arrays and shuffled (episode, start) pairs, called in a Python loop;
  3. ``tf.data.Dataset.from_generator`` yielding one window at a time, then ``.batch(B)``;
  4. ``window(L, shift=S)`` + ``flat_map`` per episode, episodes concatenated, then ``.batch(B)``;
  5. ``keras.utils.timeseries_dataset_from_array`` per episode, concatenated, then ``.batch(B)``;
  6. per-window ``tf.slice`` of one in-memory tensor in a parallel ``map``, then ``.batch(B)``;
  7. numpy fancy-index gather ``array[starts[:, None] + arange(L)]`` per batch (a CPU gather bound);
  8. memcpy: ``np.copyto`` of B*L*F*4 contiguous bytes per batch into one buffer (the ceiling);
plus, for reference, tfshard streamed (``resident=False``) and the PyDataset as Keras 3's
``model.fit`` feeds it on TensorFlow (``from_generator`` over its batches, then ``prefetch``).

A pass is ``time.perf_counter`` from creating the iterator to its end (batches are counted,
not touched; the clock stops before the iterator is deleted, see ``benchmarks/images.py``).
The fast contenders run one warm-up epoch, then ``--repeats`` full epochs, interleaved; the
best is shown. The per-window tf.data ones (5, 6) run 20 warm-up batches, then one full epoch.
The slowest (3, 4) run 20 warm-up batches, then only their first ``--slow-batches`` batches,
and the table says so: nothing is extrapolated. Every contender drops the last partial batch.
Before timing, each one's windows over the first few episodes, remainder kept, are checked
against numpy slicing: the same sequence (in-order contenders) or the same multiset (shuffled
ones). Getting the data into memory is timed apart: np.load of the sources, the raw bytes of
the shards, and the whole ``readers.windows`` call (first call and best).

Run it with ``.venv/bin/python benchmarks/windows.py`` (~3 minutes on 2 cores; ``--quick``: under a minute).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import functools
import json
import platform
import shutil
import tempfile
import time
import typing

import numpy as np

# benchmarks/ingest.py (this folder is sys.path[0] when a benchmark runs, so its worker processes find it
# too): the image generator, the page-cache warmer and CPU accounting.
import ingest as bench_ingest  # noqa: E402  (the package is tfshard.ingest, so the name is free)

# convert_episodes' forkserver workers re-import this module: TensorFlow and keras are imported only inside functions.
MIN_STEPS, MAX_STEPS = 5_000, 20_000
CHECK_EPISODES = 3
RESIDENT, SEQUENCE = "tfshard resident", "Sequence (keras PyDataset)"
FROM_GENERATOR, MEMCPY = "from_generator", "memcpy"


class Shape(typing.NamedTuple):
    length: int  # L
    shift: int  # S
    batch: int  # B
    features: int  # F
    seed: int


class Data(typing.NamedTuple):
    episodes: list  # [T_e, F] float32 arrays, in source order
    tfr: str  # the same episodes converted by tfshard


class Run(typing.NamedTuple):
    seconds: float
    windows: int
    cpu: float  # CPU-seconds of this process
    other: float  # share of the CPUs that other processes took meanwhile


# ---- data ---------------------------------------------------------------------------------------------------------


def episode(index: int, shape: Shape) -> np.ndarray:
    """A seeded episode of 5,000-20,000 steps: a random walk plus noise, [T, F] float32."""
    rng = np.random.default_rng([shape.seed, index])
    steps = int(rng.integers(MIN_STEPS, MAX_STEPS + 1))
    noise = rng.standard_normal((steps, shape.features), dtype=np.float32)
    return (np.cumsum(noise, axis=0, dtype=np.float32) * np.float32(0.05) + noise).astype(np.float32)


def episode_set(data_dir: str, count: int, shape: Shape) -> str:
    """``data_dir/windows/<parameters>/ep_<i>.npy``, made once; ``params.json``, written last, marks it complete."""
    params = {"episodes": count, "steps": [MIN_STEPS, MAX_STEPS], "features": shape.features, "seed": shape.seed,
              "dtype": "float32", "generator": 1}
    root = os.path.join(data_dir, "windows", f"e{count}-t{MIN_STEPS}-{MAX_STEPS}-f{shape.features}-seed{shape.seed}")
    marker = os.path.join(root, "params.json")
    try:
        with open(marker) as f:
            if json.load(f) == params and len(os.listdir(root)) == count + 1:
                return root
    except (OSError, ValueError):
        pass
    print(f"generating {count} episodes in {root} ...", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for i in range(count):
        np.save(os.path.join(root, f"ep_{i:05d}.npy"), episode(i, shape))
    with open(marker, "w") as f:
        json.dump(params, f)
    return root


def npy_paths(src: str) -> list[str]:
    return sorted(os.path.join(src, n) for n in os.listdir(src) if n.endswith(".npy"))


def reference_windows(episodes: list, shape: Shape) -> np.ndarray:
    """Every window, episode by episode, by plain slicing: the oracle of the correctness check."""
    length = shape.length
    return np.stack([e[s : s + length] for e in episodes for s in range(0, len(e) - length + 1, shape.shift)])


# ---- contenders: each builds, from (data, shape, drop_remainder), a function that starts one epoch -----------------


def tfshard(data: Data, shape: Shape, drop_remainder: bool, resident: bool = True):
    from tfshard.readers.windows import windows  # readers.windows; this spelling never yields the module

    ds = windows(data.tfr, length=shape.length, shift=shape.shift, batch_size=shape.batch, features="data",
                 seed=shape.seed, drop_remainder=drop_remainder, resident=resident)
    return lambda: iter(ds)


def window_sequence(data: Data, shape: Shape, drop_remainder: bool):
    """The user's Keras Sequence; keras.utils.PyDataset is its Keras 3 name."""
    import keras

    class WindowSequence(keras.utils.PyDataset):
        def __init__(self, episodes, length, shift, batch_size, seed):
            super().__init__()  # workers=1, no multiprocessing: the default
            self.episodes, self.length, self.batch_size = episodes, length, batch_size
            self.pairs = np.array(
                [(e, s) for e, ep in enumerate(episodes) for s in range(0, len(ep) - length + 1, shift)]
            )
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(len(self.pairs))

        def __len__(self):
            whole, tail = divmod(len(self.pairs), self.batch_size)
            return whole + (0 if drop_remainder or not tail else 1)

        def __getitem__(self, i):
            rows = self.pairs[self.order[i * self.batch_size : (i + 1) * self.batch_size]]
            return np.stack([self.episodes[e][s : s + self.length] for e, s in rows.tolist()])

        def on_epoch_end(self):
            self.order = self.rng.permutation(len(self.pairs))

    return WindowSequence(data.episodes, shape.length, shape.shift, shape.batch, shape.seed)


def sequence(data: Data, shape: Shape, drop_remainder: bool):
    seq = window_sequence(data, shape, drop_remainder)

    def epoch():  # what model.fit(workers=1) does each epoch, without the conversion to tensors
        for i in range(len(seq)):
            yield seq[i]
        seq.on_epoch_end()

    return epoch


def sequence_as_fit_feeds_it(data: Data, shape: Shape, drop_remainder: bool):
    """Keras 3's PyDatasetAdapter.get_tf_dataset with workers=1: from_generator over the batches, then prefetch."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_generator(
        sequence(data, shape, drop_remainder),
        output_signature=tf.TensorSpec([None, shape.length, shape.features], tf.float32),
    ).prefetch(tf.data.AUTOTUNE)
    return lambda: iter(ds)


def from_generator(data: Data, shape: Shape, drop_remainder: bool):
    import tensorflow as tf

    episodes, length = data.episodes, shape.length
    pairs = [(e, s) for e, ep in enumerate(episodes) for s in range(0, len(ep) - length + 1, shape.shift)]
    rng = np.random.default_rng(shape.seed)

    def one_window_at_a_time():
        for k in rng.permutation(len(pairs)).tolist():
            e, s = pairs[k]
            yield episodes[e][s : s + length]

    ds = tf.data.Dataset.from_generator(one_window_at_a_time,
                                        output_signature=tf.TensorSpec([length, shape.features], tf.float32))
    ds = ds.batch(shape.batch, drop_remainder=drop_remainder)
    return lambda: iter(ds)


def window_flat_map(data: Data, shape: Shape, drop_remainder: bool):
    import tensorflow as tf

    length = shape.length
    per_episode = [
        tf.data.Dataset.from_tensor_slices(ep).window(length, shift=shape.shift, drop_remainder=True)
        .flat_map(lambda w: w.batch(length))
        for ep in data.episodes
    ]
    ds = functools.reduce(tf.data.Dataset.concatenate, per_episode).batch(shape.batch, drop_remainder=drop_remainder)
    return lambda: iter(ds)


def timeseries(data: Data, shape: Shape, drop_remainder: bool):
    import keras
    import tensorflow as tf

    per_episode = [
        keras.utils.timeseries_dataset_from_array(ep, None, sequence_length=shape.length,
                                                  sequence_stride=shape.shift, batch_size=None)
        for ep in data.episodes
    ]
    ds = functools.reduce(tf.data.Dataset.concatenate, per_episode).batch(shape.batch, drop_remainder=drop_remainder)
    return lambda: iter(ds)


def _starts(data: Data, shape: Shape) -> np.ndarray:
    from tfshard.readers.starts import window_starts

    return window_starts([len(e) for e in data.episodes], shape.length, shape.shift)


def tf_slice(data: Data, shape: Shape, drop_remainder: bool):
    import tensorflow as tf

    array, starts = tf.constant(np.concatenate(data.episodes)), _starts(data, shape)
    ds = tf.data.Dataset.from_tensor_slices(starts).shuffle(len(starts), seed=shape.seed)
    ds = ds.map(lambda s: tf.slice(array, [s, 0], [shape.length, shape.features]), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(shape.batch, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
    return lambda: iter(ds)


def numpy_gather(data: Data, shape: Shape, drop_remainder: bool):
    array, starts, offsets = np.concatenate(data.episodes), _starts(data, shape), np.arange(shape.length)
    rng, b = np.random.default_rng(shape.seed), shape.batch
    batches = len(starts) // b if drop_remainder else -(-len(starts) // b)

    def epoch():
        order = rng.permutation(starts)
        for i in range(batches):
            yield array[order[i * b : (i + 1) * b, None] + offsets]

    return epoch


def memcpy(data: Data, shape: Shape, drop_remainder: bool):
    """The same bytes per batch, copied from contiguous memory into one preallocated buffer."""
    flat, b = np.concatenate(data.episodes).reshape(-1), shape.batch
    size = b * shape.length * shape.features
    buffer = np.empty(size, np.float32)
    batches, spots = len(_starts(data, shape)) // b, len(flat) - size + 1

    def epoch():
        for i in range(batches):
            at = i * size % spots  # walk through the whole array, so the source is not always in cache
            np.copyto(buffer, flat[at : at + size])
            yield buffer.reshape(b, shape.length, shape.features)

    return epoch


class Contender(typing.NamedTuple):
    name: str
    build: typing.Callable
    order: str  # "shuffled": a new order every epoch; "in order": source order; "bytes": not windows at all
    timing: str = "epochs"  # "epochs": warm-up epoch + best of --repeats; "epoch": one; "batches": --slow-batches


CONTENDERS = [
    Contender(RESIDENT, tfshard, "shuffled"),
    Contender(SEQUENCE, sequence, "shuffled"),
    Contender(FROM_GENERATOR, from_generator, "shuffled", timing="batches"),
    Contender("window + flat_map", window_flat_map, "in order", timing="batches"),
    Contender("timeseries_dataset_from_array", timeseries, "in order", timing="epoch"),
    Contender("tf.slice per window (map)", tf_slice, "shuffled", timing="epoch"),
    Contender("numpy fancy-index gather", numpy_gather, "shuffled"),
    Contender(MEMCPY, memcpy, "bytes"),
    Contender("ref: tfshard streamed", functools.partial(tfshard, resident=False), "shuffled"),
    Contender("ref: Sequence as model.fit feeds it", sequence_as_fit_feeds_it, "shuffled"),
]


# ---- measuring ----------------------------------------------------------------------------------------------------


def timed_pass(start_epoch, max_batches: int | None = None) -> Run:
    """One epoch (or its first ``max_batches`` batches), counting windows; the iterator is deleted after the clock."""
    (machine, own), start = bench_ingest.cpu_seconds(), time.perf_counter()
    windows, iterator = 0, start_epoch()
    for batches, batch in enumerate(iterator, 1):
        windows += int(batch.shape[0])
        if batches == max_batches:
            break
    seconds = time.perf_counter() - start
    machine, own = (a - b for a, b in zip(bench_ingest.cpu_seconds(), (machine, own)))
    del iterator  # may wait for tf.data's autotuner (see benchmarks/images.py)
    return Run(seconds, windows, own, max(machine - own, 0) / seconds / len(os.sched_getaffinity(0)))


def check(contender: Contender, data: Data, shape: Shape) -> str:
    """Windows of one epoch, remainder kept, against numpy slicing: the sequence, or the multiset if shuffled."""
    if contender.order == "bytes":
        return "n/a"
    got = np.concatenate([np.asarray(batch) for batch in contender.build(data, shape, False)()])
    expected = reference_windows(data.episodes, shape)
    if got.shape != expected.shape:
        return f"FAILED: {got.shape[0]} windows, expected {expected.shape[0]}"
    if contender.order == "shuffled":  # compare sorted raw bytes: a multiset comparison, exact
        as_bytes = np.dtype((np.void, got[0].nbytes))
        got, expected = (np.sort(np.ascontiguousarray(a).reshape(len(a), -1).view(as_bytes).ravel())
                         for a in (got, expected))
    ok = np.array_equal(got, expected)
    return ("ok" if ok else "FAILED") + (" (sequence)" if contender.order == "in order" else " (multiset)")


def seconds_each(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def machine_facts() -> str:
    import keras
    import tensorflow as tf

    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = len(tf.config.list_physical_devices("GPU"))
    return (f"{len(os.sched_getaffinity(0))} CPUs available ({os.cpu_count()} online, {model}), {gpus} GPU(s); "
            f"Python {platform.python_version()}, TensorFlow {tf.__version__}, keras {keras.__version__}, "
            f"numpy {np.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller run (under a minute): 50 episodes, 1 timed pass, 50 slow batches")
    parser.add_argument("--episodes", type=int, default=None, help="episodes (default 200; --quick 50)")
    parser.add_argument("--features", type=int, default=8, help="channels per time step F (default 8)")
    parser.add_argument("--length", type=int, default=256, help="window length L (default 256)")
    parser.add_argument("--shift", type=int, default=16, help="steps between window starts S (default 16)")
    parser.add_argument("--batch-size", type=int, default=64, help="windows per batch B (default 64)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed passes of the fast contenders (default 3; --quick 1)")
    parser.add_argument("--slow-batches", type=int, default=None,
                        help="batches timed for from_generator and window+flat_map (default 200; --quick 50)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated episodes")
    args = parser.parse_args()
    count = args.episodes or (50 if args.quick else 200)
    repeats = args.repeats or (1 if args.quick else 3)
    slow_batches = args.slow_batches or (50 if args.quick else 200)
    shape = Shape(args.length, args.shift, args.batch_size, args.features, seed=0)
    if min(count, args.features, args.length, args.shift, args.batch_size, repeats, slow_batches) < 1:
        parser.error("--episodes, --features, --length, --shift, --batch-size, --repeats, --slow-batches must be >= 1")
    if args.length > MIN_STEPS:
        parser.error(f"--length must be at most {MIN_STEPS} (the shortest episode)")
    started = time.perf_counter()

    import keras  # noqa: F401  (imported before timing, so no contender pays for it)
    import tensorflow as tf

    from tfshard.ingest import convert_episodes
    from tfshard.readers.starts import window_count

    src = episode_set(args.data_dir, count, shape)
    paths = npy_paths(src)
    source_bytes = sum(os.path.getsize(p) for p in paths)
    episodes = [np.load(p) for p in paths]  # also warms the page cache
    lengths = [len(e) for e in episodes]
    n_windows = window_count(lengths, shape.length, shape.shift)
    window_mb = shape.length * shape.features * 4 / 1e6
    print(machine_facts())
    print(f"{count} episodes [T, {shape.features}] float32, T {min(lengths)}-{max(lengths)} (total {sum(lengths)} "
          f"steps, {source_bytes / 1e6:.0f} MB of .npy); L={shape.length}, S={shape.shift}, B={shape.batch}: "
          f"{n_windows} windows = {n_windows // shape.batch} full batches per epoch, "
          f"{n_windows * window_mb / 1e3:.2f} GB of windows\n")

    with tempfile.TemporaryDirectory(prefix="tfshard-bench-windows-") as tmp:
        out = os.path.join(tmp, "tfr")
        start = time.perf_counter()
        manifest = convert_episodes(src, out, progress=False)  # workers: all CPUs (the default)
        convert_s = time.perf_counter() - start
        shards = [os.path.join(out, s.file) for s in manifest.splits["train"].shards]
        shard_bytes = sum(os.path.getsize(p) for p in shards)
        print(f"convert_episodes (default options, all CPUs, one run, worker start-up included): {convert_s:.2f} s, "
              f"{source_bytes / convert_s / 1e6:.0f} MB/s of .npy -> {len(shards)} shard(s), "
              f"{shard_bytes / 1e6:.0f} MB\n")

        def read_shards():
            for p in shards:
                with tf.io.gfile.GFile(p, "rb") as f:
                    f.read()

        read_shards()  # warm the page cache
        data = Data(episodes, out)
        build = {  # the first readers.windows call in a process also pays for tracing tf.data's functions
            "np.load of the .npy sources (list of arrays)": seconds_each(lambda: [np.load(p) for p in paths], repeats),
            "read all shard bytes (tf.io.gfile, no parsing)": seconds_each(read_shards, repeats),
            "readers.windows(...) call: read, parse, resident": seconds_each(lambda: tfshard(data, shape, True),
                                                                             repeats),
        }

        check_src, check_out = os.path.join(tmp, "check-src"), os.path.join(tmp, "check-tfr")
        os.makedirs(check_src)
        for i, e in enumerate(episodes[:CHECK_EPISODES]):
            np.save(os.path.join(check_src, f"ep_{i:05d}.npy"), e)
        convert_episodes(check_src, check_out, progress=False)
        check_data = Data(episodes[:CHECK_EPISODES], check_out)
        checks = {c.name: check(c, check_data, shape) for c in CONTENDERS}
        n_check = window_count(lengths[:CHECK_EPISODES], shape.length, shape.shift)

        built = {c.name: c.build(data, shape, True) for c in CONTENDERS}
        runs = {c.name: [] for c in CONTENDERS}
        for c in CONTENDERS:  # warm-up: one epoch of the fast ones, a few batches of the slower ones
            timed_pass(built[c.name], None if c.timing == "epochs" else 20)
        for repeat in range(repeats):  # interleaved, so drift on the machine hits every contender alike
            for c in CONTENDERS:
                if c.timing == "epochs" or not repeat:  # one pass of the slower ones
                    runs[c.name].append(timed_pass(built[c.name], slow_batches if c.timing == "batches" else None))

    best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
    rate = {name: run.windows / run.seconds for name, run in best.items()}
    cpus = len(os.sched_getaffinity(0))
    print(f"{'contender':<36} {'order':<8} {'timed':<12} {'windows/s':>10} {'GB/s':>5} {'vs Seq':>7} {'vs f_gen':>8} "
          f"{'of memcpy':>9} {'busy':>4} {'other':>5}  check ({n_check} windows)")
    for c in CONTENDERS:
        run = best[c.name]
        timed = {"epochs": f"best of {len(runs[c.name])}", "epoch": "1 epoch",
                 "batches": f"{run.windows // shape.batch} batches"}[c.timing]
        print(f"{c.name:<36} {c.order:<8} {timed:<12} {rate[c.name]:10.0f} {rate[c.name] * window_mb / 1e3:5.2f} "
              f"{rate[c.name] / rate[SEQUENCE]:6.2f}x {rate[c.name] / rate[FROM_GENERATOR]:7.1f}x "
              f"{rate[c.name] / rate[MEMCPY]:9.1%} {run.cpu / run.seconds / cpus:4.0%} {run.other:5.0%}  "
              f"{checks[c.name]}")

    print(f"\ngetting the data into memory (not in the rates above)  first s  best of {repeats} s  MB/s (best)")
    for (name, times), size in zip(build.items(), (source_bytes, shard_bytes, shard_bytes)):
        print(f"{name:<52} {times[0]:8.3f} {min(times):12.3f} {size / min(times) / 1e6:11.0f}")

    print()
    resident = rate[RESIDENT]
    for label, value, target, as_percent in [
        (f"{RESIDENT} / {SEQUENCE}", resident / rate[SEQUENCE], 2.0, False),
        (f"{RESIDENT} / {FROM_GENERATOR}", resident / rate[FROM_GENERATOR], 100.0, False),
        (f"{RESIDENT} / {MEMCPY}", resident / rate[MEMCPY], 0.10, True),
    ]:
        shown = (f"{value:7.1%}", f">= {target:.0%}") if as_percent else (f"{value:6.2f}x", f">= {target:.0f}x")
        print(f"{label:<48} measured {shown[0]}  target {shown[1]:<7} {'met' if value >= target else 'MISSED'}")

    print(f"\ntimed: best of N = full epochs ({n_windows // shape.batch} batches of {shape.batch}, last partial batch "
          "dropped) after a warm-up epoch; 1 epoch = one full epoch after 20 warm-up batches;\nK batches = the first K "
          "batches only, after 20 warm-up batches (not extrapolated). order: shuffled = a new order every epoch; "
          "in order = source order (no shuffle cost).\nSequence is called in a Python loop, as model.fit does "
          "with workers=1; on TensorFlow, Keras 3's fit also wraps it in from_generator + prefetch\n(the last row). "
          "GB/s: window bytes yielded. busy / other: share of the CPUs this process / other processes took in the best "
          f"pass.\nwhole benchmark: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
