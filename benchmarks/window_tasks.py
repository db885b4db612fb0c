"""Part 3 of ``benchmarks/windows.py``: the windows reader's tasks, forecasting and labelled classification.

The workload: ``--episodes`` seeded episodes of 10 channels (``benchmarks/windows.py``'s generator), each saved as
``SRC/c{i % 4}/ep_{i:05d}.npz`` with ``obs`` = channels 0-7 and ``action`` = channels 8-9 (cached in
``--data-dir/window-tasks/<parameters>/``) and converted with ``convert_episodes``: four class folders, so every
episode is labelled with its folder's index. Two tasks, on windows of L steps of ``obs`` every S steps:

- forecast: ``targets=readers.Targets("action", width=16, offset=16)``: ``(obs [B, L, 8], action [B, 16, 2])``,
  the 16 steps of ``action`` after the window (a window's span is L + 16 steps);
- classify: ``targets="label"``: ``(obs [B, L, 8], label int64 [B])``.

1. Iterated from Python, interleaved, one warm-up epoch then the best of ``max(--repeats, 5)`` (cheap, and the point
   is a difference within noise): the default path ``readers.windows(out, ..., features="obs")``, the same call
   with ``sampling_rate=1, time_range=None, padding=None`` spelled out (the same code path: the same windows/s),
   and both tasks' ``(x, y)``; windows/s and the ratio to the default.
2. Inside ``model.fit`` (unless ``--no-fit``), per task, four inputs as in part 2: (a) ``readers.windows`` with
   the task's targets; (b) its first batch repeated to the same steps; (c) a ``keras.utils.PyDataset`` (workers=1)
   doing the same work with numpy from per-episode arrays and shuffled (episode, start) pairs; (d)
   ``readers.model_windows``, ``mw.wrap(model)`` fitted on ``mw.starts``. Small dense models, so the input
   matters: forecast Flatten, Dense(16), Dense(32), Reshape((16, 2)), mse; classify Flatten, Dense(16), Dense(4),
   sparse categorical cross-entropy from logits. Timed by ``windows.fit_epochs`` (first epoch not counted).

Before timing, every contender's ``(x, y)`` pairs over the first 3 episodes (classes c0, c1, c2), converted apart,
remainder kept, are checked against numpy slicing as a multiset of (x, y) rows, exactly.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import typing

import numpy as np

# benchmarks/windows.py (this folder is sys.path[0]): the generator, the timing and the goals' table. It imports
# this module only inside its main(), so the two do not import each other at load time.
import windows as bench  # noqa: E402

OBS, ACTION, CLASSES, HORIZON = 8, 2, 4, 16
CHECK_EPISODES = 3  # classes c0, c1, c2: still class folders (>= 2), so the check data is labelled too
FIT_WINDOWS, FIT_SAME = "(a) readers.windows", "(b) its first batch, repeated"
FIT_SEQUENCE, FIT_MODEL = "(c) Sequence (keras PyDataset)", "(d) model_windows: gather in the step"


class Task(typing.NamedTuple):
    name: str
    targets: typing.Any  # readers.windows' targets argument
    horizon: int  # steps the span reaches past the window: the forecast's 16, else 0
    make_model: typing.Callable  # shape -> a fresh keras model, the same initial weights every time
    loss: typing.Any
    what: str  # what the model does, for the table's title


class Episodes(typing.NamedTuple):
    obs: list  # [T_e, 8] float32, in generation order (i)
    action: list  # [T_e, 2] float32
    labels: list  # class index of each: i % 4 (c0 < c1 < c2 < c3, sorted)
    tfr: str  # the same episodes converted by tfshard


# ---- data ---------------------------------------------------------------------------------------------------------


def source_path(root: str, i: int) -> str:
    return os.path.join(root, f"c{i % CLASSES}", f"ep_{i:05d}.npz")


def task_set(data_dir: str, count: int) -> str:
    """``data_dir/window-tasks/<parameters>/c<k>/ep_<i>.npz``, made once; ``params.json``, written last, marks it
    complete (as ``windows.episode_set``)."""
    params = {"episodes": count, "steps": [bench.MIN_STEPS, bench.MAX_STEPS], "obs": OBS, "action": ACTION,
              "classes": CLASSES, "seed": 0, "dtype": "float32", "generator": 1}
    root = os.path.join(data_dir, "window-tasks",
                        f"e{count}-t{bench.MIN_STEPS}-{bench.MAX_STEPS}-obs{OBS}-action{ACTION}-c{CLASSES}-seed0")
    marker = os.path.join(root, "params.json")
    try:
        with open(marker) as f:
            if json.load(f) == params and all(os.path.isfile(source_path(root, i)) for i in range(count)):
                return root
    except (OSError, ValueError):
        pass
    print(f"generating {count} episodes in {root} ...", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    shape = bench.Shape(0, 0, 0, OBS + ACTION, seed=0)  # only features and seed shape an episode
    for i in range(count):
        e = bench.episode(i, shape)
        os.makedirs(os.path.dirname(source_path(root, i)), exist_ok=True)
        np.savez(source_path(root, i), obs=e[:, :OBS], action=e[:, OBS:])
    with open(marker, "w") as f:
        json.dump(params, f)
    return root


def load(src: str, count: int) -> tuple[list, list, list]:
    obs, action = [], []
    for i in range(count):
        with np.load(source_path(src, i)) as z:
            obs.append(z["obs"])
            action.append(z["action"])
    return obs, action, [i % CLASSES for i in range(count)]


def tasks() -> list[Task]:
    import keras
    from tfshard import readers

    def forecaster(shape: bench.Shape):
        keras.utils.set_random_seed(shape.seed)
        return keras.Sequential([keras.Input((shape.length, OBS)), keras.layers.Flatten(), keras.layers.Dense(16),
                                 keras.layers.Dense(HORIZON * ACTION), keras.layers.Reshape((HORIZON, ACTION))])

    def classifier(shape: bench.Shape):
        keras.utils.set_random_seed(shape.seed)
        return keras.Sequential([keras.Input((shape.length, OBS)), keras.layers.Flatten(), keras.layers.Dense(16),
                                 keras.layers.Dense(CLASSES)])

    return [
        Task("forecast", readers.Targets("action", width=HORIZON, offset=HORIZON), HORIZON, forecaster, "mse",
             f"obs [B, L, {OBS}] -> the next {HORIZON} steps of action [B, {HORIZON}, {ACTION}], dense, mse"),
        Task("classify", "label", 0, classifier, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
             f"obs [B, L, {OBS}] -> the episode's class (of {CLASSES}), dense, sparse cross-entropy"),
    ]


def pairs_of(episodes: Episodes, task: Task, shape: bench.Shape) -> np.ndarray:
    """Every window's (episode, start): starts every S steps while the span (L + horizon) fits."""
    span = shape.length + task.horizon
    return np.array([(e, s) for e, ep in enumerate(episodes.obs) for s in range(0, len(ep) - span + 1, shape.shift)])


def reference(episodes: Episodes, task: Task, shape: bench.Shape) -> tuple[np.ndarray, np.ndarray]:
    """Every window's (x, y) by plain slicing: the oracle of the check."""
    length, rows = shape.length, pairs_of(episodes, task, shape).tolist()
    x = np.stack([episodes.obs[e][s : s + length] for e, s in rows])
    if task.horizon:
        return x, np.stack([episodes.action[e][s + length : s + length + task.horizon] for e, s in rows])
    return x, np.array([episodes.labels[e] for e, _ in rows], np.int64)


def pair_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One row of raw bytes per window, x's then y's: what the multiset check sorts."""
    n = len(x)
    return np.concatenate([np.ascontiguousarray(a).reshape(n, -1).view(np.uint8) for a in (x, y)], axis=1)


# ---- model.fit inputs: each builds, from (task, episodes, shape, drop_remainder), a windows.FitInput -----------------


def reader_kwargs(task: Task, shape: bench.Shape, drop_remainder: bool) -> dict:
    return dict(length=shape.length, shift=shape.shift, batch_size=shape.batch, features="obs",
                targets=task.targets, seed=shape.seed, drop_remainder=drop_remainder)


def fit_windows(task: Task, episodes: Episodes, shape: bench.Shape, drop_remainder: bool) -> bench.FitInput:
    from tfshard import readers

    ds = readers.windows(episodes.tfr, **reader_kwargs(task, shape, drop_remainder))
    return bench.FitInput(ds, len(ds), None, lambda: iter(ds))


def fit_same_batch(task: Task, episodes: Episodes, shape: bench.Shape, drop_remainder: bool) -> bench.FitInput:
    import tensorflow as tf

    ds = fit_windows(task, episodes, shape, drop_remainder).x
    options = tf.data.Options()  # as windows.fit_same_batch: a constant, repeated, no reader options inherited
    options.autotune.enabled = False
    repeated = tf.data.Dataset.from_tensors(next(iter(ds))).repeat(len(ds)).with_options(options)
    return bench.FitInput(repeated, len(ds), None, lambda: iter(repeated))


def fit_sequence(task: Task, episodes: Episodes, shape: bench.Shape, drop_remainder: bool) -> bench.FitInput:
    """The user's Keras Sequence doing the same work with numpy (keras.utils.PyDataset, workers=1)."""
    import keras

    length, horizon, batch = shape.length, task.horizon, shape.batch

    class TaskSequence(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()  # workers=1, no multiprocessing: the default
            self.pairs = pairs_of(episodes, task, shape)
            self.labels = np.array(episodes.labels, np.int64)
            self.rng = np.random.default_rng(shape.seed)
            self.order = self.rng.permutation(len(self.pairs))

        def __len__(self):
            whole, tail = divmod(len(self.pairs), batch)
            return whole + (0 if drop_remainder or not tail else 1)

        def __getitem__(self, i):
            rows = self.pairs[self.order[i * batch : (i + 1) * batch]]
            x = np.stack([episodes.obs[e][s : s + length] for e, s in rows.tolist()])
            if horizon:
                return x, np.stack([episodes.action[e][s + length : s + length + horizon] for e, s in rows.tolist()])
            return x, self.labels[rows[:, 0]]

        def on_epoch_end(self):
            self.order = self.rng.permutation(len(self.pairs))

    seq = TaskSequence()
    return bench.FitInput(seq, len(seq), None, lambda: (seq[i] for i in range(len(seq))))


def fit_model_windows(task: Task, episodes: Episodes, shape: bench.Shape, drop_remainder: bool) -> bench.FitInput:
    from tfshard import readers

    mw = readers.model_windows(episodes.tfr, **reader_kwargs(task, shape, drop_remainder))
    return bench.FitInput(mw.starts, len(mw.starts), mw.wrap, lambda: (mw.element(starts) for starts in mw.starts))


FIT_CONTENDERS = {FIT_WINDOWS: fit_windows, FIT_SAME: fit_same_batch, FIT_SEQUENCE: fit_sequence,
                  FIT_MODEL: fit_model_windows}


def check_fit(name: str, task: Task, episodes: Episodes, shape: bench.Shape) -> str:
    """One epoch's (x, y), remainder kept, as a multiset against numpy slicing; (b): one batch of them, as many
    steps as (a)."""
    expected = pair_rows(*reference(episodes, task, shape))
    fit_input = FIT_CONTENDERS[name](task, episodes, shape, False)
    pairs = [(np.asarray(x), np.asarray(y)) for x, y in fit_input.pairs()]
    if name == FIT_SAME:
        known = {row.tobytes() for row in expected}
        steps = fit_windows(task, episodes, shape, False).batches
        if len(pairs) != steps or not all(np.array_equal(p, q) for p, q in zip(pairs[0], pairs[-1])):
            return f"FAILED: not one batch repeated {steps} times"
        inside = all(row.tobytes() in known for row in pair_rows(*pairs[0]))
        return "ok: 1 batch of (a), as many steps" if inside else "FAILED: a pair is not a window of the data"
    got = pair_rows(np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs]))
    return bench.same_windows(got, expected, "shuffled")


# ---- the default path, iterated from Python -------------------------------------------------------------------------


def first_of_each(ds):
    """One epoch, each element's inputs (a batch of windows), so every row is counted the same way."""
    return lambda: (e[0] if isinstance(e, tuple) else e for e in ds)


def default_path(tfr: str, shape: bench.Shape, task_list: list[Task], repeats: int) -> float:
    """The default call, the same with the new options spelled out, and the tasks' (x, y): windows/s side by side.
    Returns the spelled-out call's windows/s over the default's."""
    from tfshard import readers

    common = dict(length=shape.length, shift=shape.shift, batch_size=shape.batch, features="obs", seed=shape.seed)
    rows = {
        'default: readers.windows(features="obs")': readers.windows(tfr, **common),
        "same, sampling_rate=1, time_range=None, padding=None": readers.windows(
            tfr, sampling_rate=1, time_range=None, padding=None, **common),
    }
    for task in task_list:
        rows[f"{task.name}: targets={task.targets!r}"] = readers.windows(tfr, targets=task.targets, **common)
    epochs = {name: first_of_each(ds) for name, ds in rows.items()}
    runs = {name: [] for name in rows}
    for epoch in epochs.values():  # warm-up
        bench.timed_pass(epoch)
    for _ in range(repeats):  # interleaved, so drift on the machine hits every row alike
        for name, epoch in epochs.items():
            runs[name].append(bench.timed_pass(epoch))
    best = {name: min(r, key=lambda run: run.seconds) for name, r in runs.items()}
    rate = {name: run.windows / run.seconds for name, run in best.items()}
    default, spelled = list(rows)[:2]
    cpus, width = len(os.sched_getaffinity(0)), max(map(len, rows))
    print(f"\niterated from Python (obs [B, L, {OBS}]; (x, y) counted as x's windows), one warm-up epoch, "
          f"best of {repeats}, interleaved")
    print(f"{'reader':<{width}} {'windows':>8} {'windows/s':>10} {'vs default':>10} {'busy':>4} {'other':>5}")
    for name, run in best.items():
        print(f"{name:<{width}} {run.windows:8d} {rate[name]:10.0f} {rate[name] / rate[default]:9.3f}x "
              f"{run.cpu / run.seconds / cpus:4.0%} {run.other:5.0%}")
    return rate[spelled] / rate[default]


# ---- the whole part -------------------------------------------------------------------------------------------------


def run(settings: bench.Settings, length: int, shift: int, batch: int) -> list[bench.Target]:
    """Part 3, printed as it goes; returns the goals' ratios measured (fit ones None under ``--no-fit``)."""
    from tfshard.ingest import convert_episodes

    shape = bench.Shape(length, shift, batch, OBS, seed=0)
    count = settings.episodes
    task_list = tasks()
    print()
    src = task_set(settings.data_dir, count)
    obs, action, labels = load(src, count)
    lengths = [len(e) for e in obs]
    print(f"==== tasks: {count} episodes, obs [T, {OBS}] + action [T, {ACTION}] float32, T {min(lengths)}-"
          f"{max(lengths)}, {CLASSES} class folders; L={length}, S={shift}, B={batch} ====")

    targets = []
    with tempfile.TemporaryDirectory(prefix="tfshard-bench-window-tasks-") as tmp:
        out, check_src, check_out = (os.path.join(tmp, n) for n in ("tfr", "check-src", "check-tfr"))
        manifest = convert_episodes(src, out, progress=False)
        for i in range(CHECK_EPISODES):
            os.makedirs(os.path.dirname(source_path(check_src, i)))
            shutil.copyfile(source_path(src, i), source_path(check_src, i))
        convert_episodes(check_src, check_out, progress=False)
        print(f"converted: labels {manifest.labels!r}, class_names {manifest.class_names}")
        episodes = Episodes(obs, action, labels, out)
        check_episodes = Episodes(obs[:CHECK_EPISODES], action[:CHECK_EPISODES], labels[:CHECK_EPISODES], check_out)

        spelled_ratio = default_path(out, shape, task_list, max(settings.repeats, 5))
        targets.append(bench.Target("Python loop: default options spelled out / default", spelled_ratio, 0.95, True,
                                    "{:.3f}x", ">= 0.95x"))
        for task in task_list:
            targets += fit_task(task, episodes, check_episodes, shape, settings)
        import keras

        keras.backend.clear_session()
        gc.collect()
    return targets


def fit_task(task: Task, episodes: Episodes, check_episodes: Episodes, shape: bench.Shape,
             settings: bench.Settings) -> list[bench.Target]:
    """One task's model.fit comparison, printed; its goals."""
    rate = {}
    if settings.fit_epochs:
        n_check = len(pairs_of(check_episodes, task, shape))
        checks = {name: check_fit(name, task, check_episodes, shape) for name in FIT_CONTENDERS}
        inputs = {name: build(task, episodes, shape, True) for name, build in FIT_CONTENDERS.items()}
        steps = {name: fit_input.batches for name, fit_input in inputs.items()}
        runs = bench.fit_epochs(inputs, shape, settings.fit_epochs, make_model=task.make_model, loss=task.loss)
        del inputs
        gc.collect()
        rate = bench.fit_table(
            f"model.fit, {task.name}: {task.what}; each epoch = all {steps[FIT_WINDOWS]} batches of {shape.batch}; "
            f"{settings.fit_epochs} epochs each, the first not counted; best of the other "
            f"{settings.fit_epochs - 1} shown, and the worst", runs, steps, checks, n_check, FIT_SAME, FIT_SEQUENCE)

    def ratio(name: str, against: str, overhead: bool) -> float | None:
        if not rate:
            return None
        return rate[against] / rate[name] - 1 if overhead else rate[name] / rate[against]

    t = task.name
    return [
        bench.Target(f"{t}: fit windows/s: readers.windows (a) / Sequence (c)", ratio(FIT_WINDOWS, FIT_SEQUENCE, False),
                     1.5, True, "{:.2f}x", ">= 1.5x"),
        bench.Target(f"{t}: fit windows/s: model_windows (d) / Sequence (c)", ratio(FIT_MODEL, FIT_SEQUENCE, False),
                     1.5, True, "{:.2f}x", ">= 1.5x"),
        bench.Target(f"{t}: fit input overhead: readers.windows (a)/(b) - 1", ratio(FIT_WINDOWS, FIT_SAME, True),
                     0.05, False, "{:+.1%}", "<= +5%"),
        bench.Target(f"{t}: fit input overhead: model_windows (d)/(b) - 1", ratio(FIT_MODEL, FIT_SAME, True),
                     0.05, False, "{:+.1%}", "<= +5%"),
    ]
