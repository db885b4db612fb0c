"""Benchmark: ``readers.windows()`` side by side with the usual ways to cut sliding windows from episodes.

The workload: ``--episodes`` float32 episodes ``[T, F]`` of 5,000-20,000 seeded
steps, windows of L steps every S steps that never cross an episode boundary, in
batches ``[B, L, F]`` float32 (defaults 200 episodes, L=256, S=16, B=64), run for each
``--features`` F in one invocation (default 1 and 8 channels). The episodes are ``.npy``
files cached in ``--data-dir/windows/<parameters>/`` and converted (timed) with
``convert_episodes`` into a temporary folder. For each F:

1. Iterated from Python (as a training loop or ``model.fit`` with workers=1 takes batches):

  1. tfshard resident: ``readers.windows(out, ...)`` (one array in memory, one gather per batch), and the same on
     the index-driven stream (``epoch_size=`` all the windows: each epoch's order computed by numpy, as mixtures,
     ``balance`` and elastic resume read it), printed after the table as a ratio of the two;
  2. Sequence: a ``keras.utils.PyDataset`` whose ``__getitem__`` stacks one batch with numpy
     from per-episode arrays and shuffled (episode, start) pairs, called in a Python loop;
  3. ``tf.data.Dataset.from_generator`` yielding one window at a time, then ``.batch(B)``;
  4. ``window(L, shift=S)`` + ``flat_map`` per episode, episodes concatenated, then ``.batch(B)``;
  5. ``keras.utils.timeseries_dataset_from_array`` per episode, concatenated, then ``.batch(B)``;
  6. per-window ``tf.slice`` of one in-memory tensor in a parallel ``map``, then ``.batch(B)``;
  7. numpy fancy-index gather ``array[starts[:, None] + arange(L)]`` per batch (a CPU gather bound);
  8. memcpy: ``np.copyto`` of B*L*F*4 contiguous bytes per batch into one buffer (for scale);
  9. the tf.data iteration floor: a dataset of precomputed int32 ``[B]`` zeros, prefetched,
     autotune off (as ``readers.windows`` runs), counted as B windows an element: what any
     tf.data pipeline costs a step before it does any work;
  10. ``readers.model_windows(...).starts``: the start rows alone, what crosses to the model
      when the gather runs in the model's step (the gather itself is timed in part 2);
  plus, for reference, tfshard streamed (``resident=False``) and the PyDataset as Keras 3's
  ``model.fit`` feeds it on TensorFlow (``from_generator`` over its batches, then ``prefetch``).

  A pass is ``time.perf_counter`` from creating the iterator to its end (batches are counted,
  not touched; the clock stops before the iterator is deleted, see ``benchmarks/images.py``).
  The fast contenders run one warm-up epoch, then ``--repeats`` full epochs, interleaved; the
  best is shown. The per-window tf.data ones (5, 6) run 20 warm-up batches, then one full epoch.
  The slowest (3, 4) run 20 warm-up batches, then only their first ``--slow-batches`` batches,
  and the table says so: nothing is extrapolated. Every contender drops the last partial batch.

2. Inside ``model.fit`` (unless ``--no-fit``): a small dense autoencoder (Flatten, Dense(16),
   Dense(L*F), Reshape; mse, Adam: small, so the input matters), a fresh one (same seed) for
   each of (a) ``readers.windows(..., targets="same")``, the gather in the pipeline; (b) the
   same pipeline's first batch, cached and repeated to the same number of steps (the
   no-input-cost reference); (c) the Sequence returning ``(x, x)``, passed to ``fit`` as is;
   (d) ``readers.model_windows(..., targets="same")``: ``mw.wrap(model)`` fitted on ``mw.starts``,
   the gather in the train step. Each model is compiled once and fitted one epoch per ``fit``
   call (verbose=0), the four interleaved, for ``--fit-epochs`` epochs each (full epochs of all
   the episodes); a callback times each epoch from ``on_epoch_begin`` to ``on_epoch_end``; the
   first epoch (tracing) is not counted, the best of the others is shown. Input overhead =
   epoch(a or d) / epoch(b) - 1.

Before timing, each contender's windows over the first few episodes, remainder kept, are checked
against numpy slicing: the same sequence (in-order contenders) or the same multiset (shuffled
ones); for ``model_windows``, the windows its start rows become through its gather layer; for the
fit inputs, also that targets equal inputs. Getting the data into memory is timed apart: np.load of
the sources, the raw bytes of the shards, and the whole ``readers.windows`` and
``readers.model_windows`` calls (the first call, and the best of ``--repeats``, at least 2).
Memory: the bytes of the resident variables against the episodes' own bytes (the rest is padding
to whole rows), and the start index's bytes per window. The run ends with a table of the windows reader's
ratios per channel count: measured in this one run, target, met or MISSED.

3. The tasks (unless ``--no-tasks``; ``benchmarks/window_tasks.py``), once, after the channel counts: the same
   ``--episodes`` with 10 channels saved as ``obs`` (8) and ``action`` (2) in 4 class folders, converted, so each
   episode is labelled. Iterated from Python, interleaved: the default ``readers.windows(..., features="obs")``,
   the same with ``sampling_rate=1, time_range=None, padding=None`` spelled out (the new options cost nothing on
   the default path), and both tasks' ``(x, y)``. Then, per task, part 2's four ``model.fit`` inputs with the
   task's targets: forecasting (``targets=readers.Targets("action", width=16, offset=16)``: obs -> the next 16
   steps of action, a dense forecaster, mse) and labelled classification (``targets="label"``: a dense classifier
   of the episode's class folder, sparse cross-entropy), the Sequence doing the same work with numpy. Each input's
   ``(x, y)`` over the first 3 episodes is checked against numpy slicing, as a multiset, exactly. Its goals get
   their own table at the end: the same ones as part 2's fit goals, per task.

Run it with ``.venv/bin/python benchmarks/windows.py`` (~3.5 minutes on 2 cores for F=1 and 8, ~100 s of it
model.fit, and ~4-5 minutes more for the tasks; ``--quick``: about 2-3 minutes, a minute or so of it the tasks;
``--no-fit`` skips the model.fit parts, ``--no-tasks`` part 3).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before anything imports TensorFlow

import argparse
import functools
import gc
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
STREAM = "tfshard resident, stream (epoch_size=)"
FROM_GENERATOR, MEMCPY = "from_generator", "memcpy"
FLOOR, STARTS = "tf.data iteration floor (int32 [B])", "tfshard model_windows: start rows only"
FIT_WINDOWS, FIT_SAME = "(a) readers.windows, targets=\"same\"", "(b) its first batch, repeated"
FIT_SEQUENCE, FIT_MODEL = "(c) Sequence (PyDataset of (x, x))", "(d) model_windows: gather in the step"
NOT_WINDOWS = ("bytes", "indices")  # contenders that yield no windows: nothing to check
INDEX_ROWS = (FLOOR, STARTS)  # they yield int32 [B] (counted as B windows), no window bytes


class Shape(typing.NamedTuple):
    length: int  # L
    shift: int  # S
    batch: int  # B
    features: int  # F
    seed: int


class Settings(typing.NamedTuple):
    episodes: int
    repeats: int
    slow_batches: int
    fit_epochs: int  # 0: no fit part
    data_dir: str


class Data(typing.NamedTuple):
    episodes: list  # [T_e, F] float32 arrays, in source order
    tfr: str  # the same episodes converted by tfshard


class Run(typing.NamedTuple):
    seconds: float
    windows: int
    cpu: float  # CPU-seconds of this process
    other: float  # share of the CPUs that other processes took meanwhile


class Target(typing.NamedTuple):
    label: str
    value: float | None  # None: not measured in this run
    target: float
    at_least: bool  # met when value >= target (else value <= target)
    shown: str  # how value is printed, e.g. "{:.2f}x"
    target_text: str


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


def resident_dataset(data: Data, shape: Shape, drop_remainder: bool, **kwargs):
    from tfshard.readers.windows.dataset import windows  # readers.windows; this spelling never yields the module

    return windows(data.tfr, length=shape.length, shift=shape.shift, batch_size=shape.batch, features="data",
                   seed=shape.seed, drop_remainder=drop_remainder, **kwargs)


def in_model(data: Data, shape: Shape, drop_remainder: bool, **kwargs):
    from tfshard import readers

    return readers.model_windows(data.tfr, length=shape.length, shift=shape.shift, batch_size=shape.batch,
                                 features="data", seed=shape.seed, drop_remainder=drop_remainder, **kwargs)


def tfshard(data: Data, shape: Shape, drop_remainder: bool, resident: bool = True):
    ds = resident_dataset(data, shape, drop_remainder, resident=resident)
    return lambda: iter(ds)


def tfshard_stream(data: Data, shape: Shape, drop_remainder: bool):
    """``readers.windows`` on the index-driven stream (issue 32): ``epoch_size`` set to all the windows, so the epoch
    is the default one's size, its order computed by numpy once per epoch instead of one ``stateless_shuffle``."""
    from tfshard.readers.windowing.starts import window_count

    every = window_count([len(e) for e in data.episodes], shape.length, shape.shift)
    ds = resident_dataset(data, shape, drop_remainder, epoch_size=every)
    return lambda: iter(ds)


def start_rows(data: Data, shape: Shape, drop_remainder: bool):
    """What ``model.fit`` gets from ``readers.model_windows``: int32 [B] start rows, no windows."""
    mw = in_model(data, shape, drop_remainder)
    return lambda: iter(mw.starts)


def start_rows_gathered(data: Data, shape: Shape, drop_remainder: bool):
    """For the check: the windows those start rows become through ``mw.layer``, the gather the model's step runs."""
    mw = in_model(data, shape, drop_remainder)
    return lambda: (mw.layer(starts) for starts in mw.starts)


def iteration_floor(data: Data, shape: Shape, drop_remainder: bool):
    """Precomputed int32 [B] batches, prefetched, autotune off: the per-element cost of tf.data iterated from Python."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    batches = len(_starts(data, shape)) // shape.batch
    ds = tf.data.Dataset.from_tensor_slices(np.zeros((batches, shape.batch), np.int32))
    ds = ds.prefetch(tf.data.AUTOTUNE).with_options(options)
    return lambda: iter(ds)


def window_sequence(data: Data, shape: Shape, drop_remainder: bool, pairs: bool = False):
    """The user's Keras Sequence; keras.utils.PyDataset is its Keras 3 name. ``pairs``: ``(x, x)``, for fit."""
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
            x = np.stack([self.episodes[e][s : s + self.length] for e, s in rows.tolist()])
            return (x, x) if pairs else x

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
    from tfshard.readers.windowing.starts import window_starts

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
    order: str  # "shuffled": a new order every epoch; "in order": source order; "bytes", "indices": not windows
    timing: str = "epochs"  # "epochs": warm-up epoch + best of --repeats; "epoch": one; "batches": --slow-batches
    check_build: typing.Callable | None = None  # what the check reads instead of ``build``'s epochs


CONTENDERS = [
    Contender(RESIDENT, tfshard, "shuffled"),
    Contender(STREAM, tfshard_stream, "shuffled"),
    Contender(SEQUENCE, sequence, "shuffled"),
    Contender(FROM_GENERATOR, from_generator, "shuffled", timing="batches"),
    Contender("window + flat_map", window_flat_map, "in order", timing="batches"),
    Contender("timeseries_dataset_from_array", timeseries, "in order", timing="epoch"),
    Contender("tf.slice per window (map)", tf_slice, "shuffled", timing="epoch"),
    Contender("numpy fancy-index gather", numpy_gather, "shuffled"),
    Contender(MEMCPY, memcpy, "bytes"),
    Contender(FLOOR, iteration_floor, "indices"),
    Contender(STARTS, start_rows, "shuffled", check_build=start_rows_gathered),
    Contender("ref: tfshard streamed", functools.partial(tfshard, resident=False), "shuffled"),
    Contender("ref: Sequence as model.fit feeds it", sequence_as_fit_feeds_it, "shuffled"),
]


# ---- model.fit inputs: each builds, from (data, shape, drop_remainder), what fit gets and how the model is wrapped --


class FitInput(typing.NamedTuple):
    x: typing.Any  # what model.fit gets
    batches: int  # steps per epoch
    wrap: typing.Callable | None  # model -> the model fitted on x (model_windows: the gather in its step)
    pairs: typing.Callable | None  # one epoch of (inputs, targets) as the train step sees them, for the check


def fit_windows(data: Data, shape: Shape, drop_remainder: bool) -> FitInput:
    ds = resident_dataset(data, shape, drop_remainder, targets="same")
    return FitInput(ds, len(ds), None, lambda: iter(ds))


def fit_same_batch(data: Data, shape: Shape, drop_remainder: bool) -> FitInput:
    import tensorflow as tf

    ds = resident_dataset(data, shape, drop_remainder, targets="same")
    # One batch of (a), held as a constant and repeated: same cardinality, no input work. (Not ds.take(1).cache():
    # that inherits the reader's symbolic-checkpoint option, under which it measured 2x slower than (a) itself.)
    options = tf.data.Options()
    options.autotune.enabled = False
    repeated = tf.data.Dataset.from_tensors(next(iter(ds))).repeat(len(ds)).with_options(options)
    return FitInput(repeated, len(ds), None, None)


def fit_sequence(data: Data, shape: Shape, drop_remainder: bool) -> FitInput:
    seq = window_sequence(data, shape, drop_remainder, pairs=True)
    return FitInput(seq, len(seq), None, lambda: (seq[i] for i in range(len(seq))))


def fit_model_windows(data: Data, shape: Shape, drop_remainder: bool) -> FitInput:
    mw = in_model(data, shape, drop_remainder, targets="same")
    return FitInput(mw.starts, len(mw.starts), mw.wrap, lambda: (mw.element(starts) for starts in mw.starts))


FIT_CONTENDERS = {FIT_WINDOWS: fit_windows, FIT_SAME: fit_same_batch, FIT_SEQUENCE: fit_sequence,
                  FIT_MODEL: fit_model_windows}


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


def same_windows(got: np.ndarray, expected: np.ndarray, order: str) -> str:
    """The sequence (in order) or the multiset (shuffled) of windows, exactly."""
    if got.shape != expected.shape:
        return f"FAILED: {got.shape[0]} windows, expected {expected.shape[0]}"
    if order == "shuffled":  # compare sorted raw bytes: a multiset comparison, exact
        as_bytes = np.dtype((np.void, got[0].nbytes))
        got, expected = (np.sort(np.ascontiguousarray(a).reshape(len(a), -1).view(as_bytes).ravel())
                         for a in (got, expected))
    ok = np.array_equal(got, expected)
    return ("ok" if ok else "FAILED") + (" (sequence)" if order == "in order" else " (multiset)")


def check(contender: Contender, data: Data, shape: Shape) -> str:
    """Windows of one epoch, remainder kept, against numpy slicing: the sequence, or the multiset if shuffled."""
    if contender.order in NOT_WINDOWS:
        return "n/a"
    epoch = (contender.check_build or contender.build)(data, shape, False)
    got = np.concatenate([np.asarray(batch) for batch in epoch()])
    return same_windows(got, reference_windows(data.episodes, shape), contender.order)


def check_fit(name: str, data: Data, shape: Shape) -> str:
    """Inputs of one epoch, remainder kept, as a multiset against numpy slicing, and targets equal to inputs."""
    fit_input = FIT_CONTENDERS[name](data, shape, False)
    if fit_input.pairs is None:  # the repeated batch: one batch of (a), x == y, as many steps as (a)
        x, y = next(iter(fit_input.x))
        if int(fit_input.x.cardinality()) != fit_windows(data, shape, False).batches:
            return "FAILED: not as many steps as (a)"
        return "ok: 1 batch of (a), x == y" if np.array_equal(x, y) else "FAILED: targets differ from inputs"
    pairs = [(np.asarray(x), np.asarray(y)) for x, y in fit_input.pairs()]
    if not all(np.array_equal(x, y) for x, y in pairs):
        return "FAILED: targets differ from inputs"
    return same_windows(np.concatenate([x for x, _ in pairs]), reference_windows(data.episodes, shape), "shuffled")


def seconds_each(fn, repeats: int) -> tuple[list[float], typing.Any]:
    """Times ``fn()`` ``repeats`` times; each result is freed outside the clock. Returns the times and the last."""
    times, result = [], None
    for _ in range(repeats):
        result = None  # free the previous one before the clock starts
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def resident_bytes(arrays: dict) -> int:
    return sum(v.shape.num_elements() * v.dtype.size for v in arrays.values())


def autoencoder(shape: Shape):
    """The same small model every time: dense, so the step is short and the input matters."""
    import keras

    keras.utils.set_random_seed(shape.seed)
    length, features = shape.length, shape.features
    return keras.Sequential([
        keras.Input((length, features)),
        keras.layers.Flatten(),
        keras.layers.Dense(16),
        keras.layers.Dense(length * features),
        keras.layers.Reshape((length, features)),
    ])


def fit_epochs(inputs: dict[str, FitInput], shape: Shape, epochs: int, make_model=None,
               loss="mse") -> dict[str, list[Run]]:
    """Per fit input, a fresh model compiled once and fitted one epoch per call, the inputs interleaved; the
    epochs' runs from ``on_epoch_begin`` to ``on_epoch_end`` (Keras' own iterator, steps and metric read).
    ``make_model(shape)``: the model (default the autoencoder), compiled with ``loss``."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self, windows: int):
            super().__init__()
            self.windows, self.runs = windows, []

        def on_epoch_begin(self, epoch, logs=None):
            self.begun = bench_ingest.cpu_seconds(), time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.begun[1]
            machine, own = (a - b for a, b in zip(bench_ingest.cpu_seconds(), self.begun[0]))
            self.runs.append(Run(seconds, self.windows, own,
                                 max(machine - own, 0) / seconds / len(os.sched_getaffinity(0))))

    models, clocks = {}, {}
    for name, fit_input in inputs.items():
        model = (make_model or autoencoder)(shape)  # same seed: the same initial weights for each
        model = fit_input.wrap(model) if fit_input.wrap else model
        model.compile(optimizer=keras.optimizers.Adam(), loss=loss)
        models[name], clocks[name] = model, Clock(fit_input.batches * shape.batch)
    for _ in range(epochs):  # one epoch of each in turn, so drift on the machine hits every input alike
        for name, fit_input in inputs.items():
            # shuffle=False for the tf.data inputs (they shuffle themselves; Keras would only warn that it ignores it);
            # the Sequence gets fit's default, as users pass it.
            shuffle = {} if isinstance(fit_input.x, keras.utils.PyDataset) else {"shuffle": False}
            models[name].fit(fit_input.x, epochs=1, verbose=0, callbacks=[clocks[name]], **shuffle)
    return {name: clock.runs for name, clock in clocks.items()}


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


# ---- one comparison (one channel count) -----------------------------------------------------------------------------


def compare(shape: Shape, settings: Settings) -> list[Target]:
    """Everything for one channel count, printed as it goes; returns the goals' ratios measured."""
    import tensorflow as tf
    from tfshard.ingest import convert_episodes
    from tfshard.readers.windowing.starts import window_count, window_starts

    count, repeats = settings.episodes, settings.repeats
    print()
    src = episode_set(settings.data_dir, count, shape)
    paths = npy_paths(src)
    source_bytes = sum(os.path.getsize(p) for p in paths)
    episodes = [np.load(p) for p in paths]  # also warms the page cache
    lengths = [len(e) for e in episodes]
    data_bytes = sum(e.nbytes for e in episodes)
    n_windows = window_count(lengths, shape.length, shape.shift)
    window_mb = shape.length * shape.features * 4 / 1e6
    print(f"==== F={shape.features}: {count} episodes [T, {shape.features}] float32, T {min(lengths)}-{max(lengths)} "
          f"(total {sum(lengths)} steps, {source_bytes / 1e6:.0f} MB of .npy); L={shape.length}, S={shape.shift}, "
          f"B={shape.batch}: {n_windows} windows = {n_windows // shape.batch} full batches per epoch, "
          f"{n_windows * window_mb / 1e3:.2f} GB of windows ====\n")

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
        # The first readers.windows call in a process also pays for tracing tf.data's functions: at least two calls,
        # so the best is never only the first.
        calls = max(repeats, 2)
        load_s, _ = seconds_each(lambda: [np.load(p) for p in paths], calls)
        read_s, _ = seconds_each(read_shards, calls)
        windows_s, resident = seconds_each(lambda: resident_dataset(data, shape, True), calls)
        model_windows_s, mw = seconds_each(lambda: in_model(data, shape, True), calls)
        build = {
            "np.load of the .npy sources (list of arrays)": (load_s, source_bytes),
            "read all shard bytes (tf.io.gfile, no parsing)": (read_s, shard_bytes),
            "readers.windows(...) call: read, parse, resident": (windows_s, shard_bytes),
            "readers.model_windows(...) call": (model_windows_s, shard_bytes),
        }
        (arrays,) = resident.resident_arrays
        device_bytes, mw_bytes = resident_bytes(arrays), resident_bytes(mw.arrays)
        (array,) = arrays.values()
        row, device = int(array.shape[1]), array.device.rsplit("/", 1)[-1]
        padded_steps = int(array.shape[0]) * row - sum(lengths)
        index_bytes = window_starts(lengths, shape.length, shape.shift, 0, row).nbytes
        del resident, mw, arrays, array

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
                    runs[c.name].append(timed_pass(built[c.name], slow_batches(c, settings)))
        del built
        gc.collect()

        best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
        rate = {name: run.windows / run.seconds for name, run in best.items()}
        cpus = len(os.sched_getaffinity(0))
        print(f"iterated from Python, F={shape.features}")
        print(f"{'contender':<40} {'order':<8} {'timed':<12} {'windows/s':>10} {'GB/s':>5} {'vs Seq':>7} "
              f"{'vs f_gen':>8} {'of floor':>8} {'of memcpy':>9} {'busy':>4} {'other':>5}  check ({n_check} windows)")
        for c in CONTENDERS:
            run = best[c.name]
            timed = {"epochs": f"best of {len(runs[c.name])}", "epoch": "1 epoch",
                     "batches": f"{run.windows // shape.batch} batches"}[c.timing]
            gbs = "-" if c.name in INDEX_ROWS else f"{rate[c.name] * window_mb / 1e3:5.2f}"
            print(f"{c.name:<40} {c.order:<8} {timed:<12} {rate[c.name]:10.0f} {gbs:>5} "
                  f"{rate[c.name] / rate[SEQUENCE]:6.2f}x {rate[c.name] / rate[FROM_GENERATOR]:7.1f}x "
                  f"{rate[c.name] / rate[FLOOR]:8.1%} {rate[c.name] / rate[MEMCPY]:9.1%} "
                  f"{run.cpu / run.seconds / cpus:4.0%} {run.other:5.0%}  {checks[c.name]}")

        print(f"\nthe stream (mixtures, balance, elastic resume) / the default resident path, windows/s: "
              f"{rate[STREAM] / rate[RESIDENT]:.2f}x ({rate[STREAM]:.0f} vs {rate[RESIDENT]:.0f})")
        print(f"\ngetting the data into memory (not in the rates above)  first s  best of {calls} s  MB/s (best)")
        for name, (times, size) in build.items():
            print(f"{name:<52} {times[0]:8.3f} {min(times):12.3f} {size / min(times) / 1e6:11.0f}")
        build_ratio = min(windows_s) / min(read_s)
        print(f"readers.windows call / reading the shard bytes, best of {calls} each: {build_ratio:.2f}x")

        print(f"\nmemory{'':<46} {'MB':>8}")
        print(f"{'episode data (sum of the episode arrays)':<52} {data_bytes / 1e6:8.2f}")
        print(f"{'readers.windows resident_arrays (on ' + device + ')':<52} "
              f"{device_bytes / 1e6:8.2f}  = data + {device_bytes - data_bytes} B: rows of g={row} steps, "
              f"{padded_steps} padding steps = {padded_steps / sum(lengths):.3%} of the data (limit 1/64 = 1.563%)")
        print(f"{'readers.model_windows arrays':<52} {mw_bytes / 1e6:8.2f}")
        print(f"{'window start index (' + str(n_windows) + ' starts)':<52} {index_bytes / 1e6:8.2f}  "
              f"= {index_bytes / n_windows:.2f} B a window")

        fit_runs, fit_checks, fit_batches = {}, {}, {}
        if settings.fit_epochs:
            fit_checks = {name: check_fit(name, check_data, shape) for name in FIT_CONTENDERS}
            inputs = {name: build_input(data, shape, True) for name, build_input in FIT_CONTENDERS.items()}
            fit_batches = {name: fit_input.batches for name, fit_input in inputs.items()}
            fit_runs = fit_epochs(inputs, shape, settings.fit_epochs)
            del inputs
            import keras

            keras.backend.clear_session()
            gc.collect()

    fit_rate = {}
    if fit_runs:
        fit_rate = fit_table(
            f"model.fit of a dense autoencoder, F={shape.features}: each epoch = all {fit_batches[FIT_WINDOWS]} "
            f"batches of {shape.batch} ({fit_batches[FIT_WINDOWS] * shape.batch} windows); {settings.fit_epochs} "
            f"epochs each, the first not counted; best of the other {settings.fit_epochs - 1} shown, and the worst",
            fit_runs, fit_batches, fit_checks, n_check, FIT_SAME, FIT_SEQUENCE)

    def fit_ratio(name: str, against: str, overhead: bool) -> float | None:
        if not fit_rate:
            return None
        return fit_rate[against] / fit_rate[name] - 1 if overhead else fit_rate[name] / fit_rate[against]

    b = shape.batch
    return [
        Target(f"Python loop, B={b}: resident / Sequence", rate[RESIDENT] / rate[SEQUENCE], 1.0, True, "{:.2f}x",
               ">= 1x"),
        Target(f"Python loop, B={b}: resident / from_generator", rate[RESIDENT] / rate[FROM_GENERATOR], 100.0, True,
               "{:.1f}x", ">= 100x"),
        Target("fit input overhead: readers.windows (a)/(b) - 1", fit_ratio(FIT_WINDOWS, FIT_SAME, True), 0.05, False,
               "{:+.1%}", "<= +5%"),
        Target("fit input overhead: model_windows (d)/(b) - 1", fit_ratio(FIT_MODEL, FIT_SAME, True), 0.05, False,
               "{:+.1%}", "<= +5%"),
        Target("fit windows/s: readers.windows (a) / Sequence (c)", fit_ratio(FIT_WINDOWS, FIT_SEQUENCE, False), 1.5,
               True, "{:.2f}x", ">= 1.5x"),
        Target("fit windows/s: model_windows (d) / Sequence (c)", fit_ratio(FIT_MODEL, FIT_SEQUENCE, False), 1.5,
               True, "{:.2f}x", ">= 1.5x"),
        Target("build: readers.windows call / read shard bytes", build_ratio, 2.0, False, "{:.2f}x", "<= 2x"),
        Target("memory: resident bytes / episode bytes", device_bytes / data_bytes, 1 + 1 / 64, False, "{:.4f}x",
               "<= 1+1/64"),
        Target("memory: start index bytes a window", index_bytes / n_windows, 4.0, False, "{:.2f} B", "<= 4 B"),
    ]


def fit_table(title: str, runs: dict[str, list[Run]], steps: dict[str, int], checks: dict[str, str], n_check: int,
              same: str, sequence: str) -> dict[str, float]:
    """Prints one model.fit table (the first epoch of each input not counted: it traces); returns windows/s of the
    best epoch of each. ``same``/``sequence``: the rows the overhead and the ratio are measured against."""
    timed = {name: r[1:] for name, r in runs.items()}
    best = {name: min(r, key=lambda run: run.seconds) for name, r in timed.items()}
    rate = {name: run.windows / run.seconds for name, run in best.items()}
    cpus = len(os.sched_getaffinity(0))
    print(f"\n{title}")
    print(f"{'fit input':<40} {'steps':>5} {'best s':>7} {'worst s':>7} {'ms/step':>7} {'windows/s':>10} "
          f"{'vs (b)':>7} {'vs (c)':>6} {'busy':>4} {'other':>5}  check ({n_check} windows)")
    for name, run in best.items():
        overhead = run.seconds / best[same].seconds - 1
        worst = max(r.seconds for r in timed[name])
        print(f"{name:<40} {steps[name]:5d} {run.seconds:7.3f} {worst:7.3f} "
              f"{run.seconds / steps[name] * 1e3:7.3f} {rate[name]:10.0f} {overhead:+7.1%} "
              f"{rate[name] / rate[sequence]:5.2f}x {run.cpu / run.seconds / cpus:4.0%} "
              f"{run.other:5.0%}  {checks[name]}")
    return rate


def slow_batches(contender: Contender, settings: Settings) -> int | None:
    return settings.slow_batches if contender.timing == "batches" else None


def print_targets(part: str, targets: list[Target]) -> None:
    """The goals' table of one part (``"F=8"``, ``"tasks"``): measured, target, met or MISSED."""
    title = f"the windows reader's goals, {part}, measured in this run"
    width = max(52, *(len(t.label) for t in targets))
    print(f"\n{title:<{width}} {'measured':>9}  {'target':<10}")
    for t in targets:
        if t.value is None:
            print(f"{t.label:<{width}} {'-':>9}  {t.target_text:<10} not run (--no-fit)")
            continue
        met = t.value >= t.target if t.at_least else t.value <= t.target
        print(f"{t.label:<{width}} {t.shown.format(t.value):>9}  {t.target_text:<10} {'met' if met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smaller run: 50 episodes, 1 timed pass, 50 slow batches, 3 fit epochs")
    parser.add_argument("--episodes", type=int, default=None, help="episodes (default 200; --quick 50)")
    parser.add_argument("--features", type=int, nargs="+", default=[1, 8],
                        help="channels per time step F: one or more, each compared in turn (default 1 8)")
    parser.add_argument("--length", type=int, default=256, help="window length L (default 256)")
    parser.add_argument("--shift", type=int, default=16, help="steps between window starts S (default 16)")
    parser.add_argument("--batch-size", type=int, default=64, help="windows per batch B (default 64)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed passes of the fast contenders (default 3; --quick 1)")
    parser.add_argument("--slow-batches", type=int, default=None,
                        help="batches timed for from_generator and window+flat_map (default 200; --quick 50)")
    parser.add_argument("--fit-epochs", type=int, default=None,
                        help="model.fit epochs per input, the first not counted (default 4; --quick 3)")
    parser.add_argument("--no-fit", dest="fit", action="store_false", help="skip the model.fit measurements")
    parser.add_argument("--no-tasks", dest="tasks", action="store_false",
                        help="skip part 3: forecasting and labelled classification (benchmarks/window_tasks.py)")
    parser.add_argument("--data-dir", default="bench-data", help="cache folder for generated episodes")
    args = parser.parse_args()
    settings = Settings(
        episodes=args.episodes or (50 if args.quick else 200),
        repeats=args.repeats or (1 if args.quick else 3),
        slow_batches=args.slow_batches or (50 if args.quick else 200),
        fit_epochs=(args.fit_epochs or (3 if args.quick else 4)) if args.fit else 0,
        data_dir=args.data_dir,
    )
    if min(settings.episodes, *args.features, args.length, args.shift, args.batch_size, settings.repeats,
           settings.slow_batches) < 1:
        parser.error("--episodes, --features, --length, --shift, --batch-size, --repeats, --slow-batches must be >= 1")
    if args.fit and settings.fit_epochs < 2:
        parser.error("--fit-epochs must be at least 2 (the first is not counted)")
    if args.tasks:
        import window_tasks  # benchmarks/window_tasks.py, beside this file (no TensorFlow at import)

    longest = MIN_STEPS - (window_tasks.HORIZON if args.tasks else 0)  # the forecast's span: window and horizon
    if args.length > longest:
        parser.error(f"--length must be at most {longest} (the shortest episode"
                     f"{', less the forecast horizon' if args.tasks else ''})")
    started = time.perf_counter()

    import keras  # noqa: F401  (imported before timing, so no contender pays for it)
    import tensorflow as tf  # noqa: F401

    print(machine_facts())
    results = {}
    for features in dict.fromkeys(args.features):  # each channel count once, in the order given
        shape = Shape(args.length, args.shift, args.batch_size, features, seed=0)
        results[f"F={features}"] = compare(shape, settings)
    if args.tasks:
        results["tasks"] = window_tasks.run(settings, args.length, args.shift, args.batch_size)

    print("\n".join([
        "",
        "Iterated from Python: best of N = full epochs (last partial batch dropped) after a warm-up epoch; 1 epoch =",
        "one full epoch after 20 warm-up batches; K batches = the first K batches only, after 20 warm-up batches (not",
        "extrapolated). order: shuffled = a new order every epoch; in order = source order (no shuffle cost). Sequence",
        "is called in a Python loop, as model.fit does with workers=1; on TensorFlow, Keras 3's fit also wraps it in",
        "from_generator + prefetch (the last row). The iteration floor and the start rows yield int32 [B], counted as",
        "B windows an element (no window bytes: GB/s '-'). GB/s: window bytes yielded. busy / other: share of the CPUs",
        "this process / other processes took in the best pass (other over ~10%: the figures are low).",
        "model.fit: one epoch per fit call, the four inputs interleaved, timed on_epoch_begin -> on_epoch_end; vs (b):",
        "input overhead against the same model fed one repeated batch; vs (c): windows/s against the Sequence in fit.",
    ]))
    for part, targets in results.items():
        print_targets(part, targets)
    print(f"\nwhole benchmark: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
