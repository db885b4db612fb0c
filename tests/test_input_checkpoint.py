"""Resuming mid-epoch: windows and images resume exactly, from a few KB of state saved with the model.

Then the attacks: iterator checkpoints and ``start_step`` used carelessly or hostilely. Real data, real checkpoints,
real processes killed with SIGKILL. The bugs this found keep a test each (fixed): per-batch augmentation seeds after
start_step, an endless stream of empty epochs, start_step past tf.data's skip() range, and start_step on a shuffled
stream without its seed. Tests whose names end in ``_tf`` pin TensorFlow's own behaviour that tfshard can only
document (an iterator checkpoint holds positions, not the arguments the dataset was built with).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, first_batches, save_episodes, window_keys, within
from tfshard import readers

CHILD = os.path.join(os.path.dirname(__file__), "resume_child.py")
LENGTHS = [40, 25, 33, 19, 50]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    src = tmp_path_factory.mktemp("resume-src")
    out = tmp_path_factory.mktemp("resume") / "out"
    rng = np.random.default_rng(4)
    save_episodes(src, {f"e{i}.npz": {"obs": rng.normal(size=(t, 2)).astype(np.float32)}
                        for i, t in enumerate(LENGTHS)})
    convert_episode_tree(src, out, num_shards=2)
    return str(out)


@pytest.mark.parametrize("epochs_before", [0, 2])
def test_a_restored_iterator_continues_this_epoch_and_the_next_ones_exactly(dataset, tmp_path, epochs_before):
    def make():
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True,
                               repeat=True)

    per_epoch = readers.info(dataset).num_windows("train", 8, 4) // 4
    iterator = iter(make())
    for _ in range(epochs_before * per_epoch + 3):
        next(iterator)
    path = tf.train.Checkpoint(input=iterator).write(str(tmp_path / "ckpt"))
    expected = [window_keys(next(iterator)) for _ in range(2 * per_epoch)]

    restored = iter(make())  # a new dataset object, as in a new process
    tf.train.Checkpoint(input=restored).read(path).assert_consumed()
    assert [window_keys(next(restored)) for _ in range(2 * per_epoch)] == expected
    assert len({tuple(k) for k in expected[per_epoch - 3 : 2 * per_epoch - 3]}) == per_epoch  # a whole new epoch


def test_the_checkpoint_holds_positions_not_arrays_or_prefetched_windows(tmp_path):
    """Arrays of 8 MB and prefetched batches of 256 KB: the iterator's checkpoint stays a few KB."""
    episodes = {"x": [np.random.default_rng(0).normal(size=(100_000, 20)).astype(np.float32)]}
    ds = readers.resident_windows(episodes, length=256, shift=16, batch_size=64, features="x", seed=0, repeat=True)
    iterator = iter(ds)
    for _ in range(7):
        next(iterator)
    tf.train.Checkpoint(input=iterator).write(str(tmp_path / "ckpt"))
    size = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert size < 16_000, size


def test_model_windows_starts_resume_exactly(dataset, tmp_path):
    def make():
        return readers.model_windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=5,
                                     repeat=True).starts

    iterator = iter(make())
    for _ in range(9):
        next(iterator)
    path = tf.train.Checkpoint(input=iterator).write(str(tmp_path / "ckpt"))
    expected = [next(iterator).numpy().tolist() for _ in range(20)]
    restored = iter(make())
    tf.train.Checkpoint(input=restored).read(path).assert_consumed()
    assert [next(restored).numpy().tolist() for _ in range(20)] == expected


def test_repeat_is_refused_for_streamed_windows(dataset):
    with pytest.raises(ValueError, match=r"repeat= is for resident windows \(got resident=False\)"):
        readers.windows(dataset, length=8, batch_size=4, resident=False, repeat=True)


def _consumed(log) -> list[str]:
    """The batches the job consumed, step by step: a step replayed after a restart counts once, from the last run."""
    by_step = {}
    with open(log) as f:
        for line in f:
            if line.endswith("\n"):  # a line cut by the kill was never a completed step
                step, pairs = line.rstrip("\n").split("\t")
                by_step[int(step)] = pairs
    return [by_step[s] for s in sorted(by_step)]


def _run(args, kill_after_steps: int, log: str) -> None:
    """Runs the child and SIGKILLs it once its log shows ``kill_after_steps`` more steps."""
    child = subprocess.Popen([sys.executable, CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    start = _lines(log)
    deadline = time.monotonic() + 120
    while _lines(log) < start + kill_after_steps and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)


def _lines(path) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def _uninterrupted(reader, line, steps: int) -> list[str]:
    """What an uninterrupted job consumes: the first ``steps`` batches of its input, read in-process through the
    child's own reader and log line (the job's training never changes its input)."""
    iterator = iter(reader())
    return [line(*next(iterator)) for _ in range(steps)]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [0, 2])
def test_a_job_killed_at_random_steps_consumes_what_an_uninterrupted_one_does(dataset, tmp_path, replicas,
                                                                               strategies):
    """Two SIGKILLs at random steps (mid-epoch and across epoch ends), then a run to the end: the steps the job
    consumed are those of an uninterrupted job, with the input iterator in the checkpoint (no strategy) or
    restarted with ``start_step`` (under a strategy)."""
    import resume_child

    steps, save_every = 60, 7  # ~3.5 epochs of 17 batches; kills land mid-epoch and across epoch ends
    strategy = strategies[2] if replicas else None
    expected = _uninterrupted(lambda: resume_child.windows_reader(dataset, strategy),
                              lambda keys, _: resume_child.windows_line(keys, strategy), steps)

    log, ckpt = tmp_path / "killed.log", tmp_path / "ckpt"
    rng = random.Random(replicas)
    for _ in range(2):
        _run(["windows", dataset, str(ckpt), str(log), str(steps), str(save_every), str(replicas)],
             kill_after_steps=rng.randint(3, 15), log=str(log))
    # The run to the end: the same job, in this process (the kills are what need processes of their own).
    resume_child.main("windows", dataset, str(ckpt), str(log), steps, save_every, replicas, strategy=strategy)

    assert _consumed(log) == expected
    assert _lines(log) > steps  # the kills really replayed steps after the last checkpoint


@pytest.mark.parametrize("start_step", [0, 5, 17, 40])
def test_start_step_starts_the_stream_where_the_step_count_says(dataset, start_step):
    def make(**kwargs):
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True,
                               repeat=True, **kwargs)

    whole = iter(make())
    expected = [window_keys(next(whole)) for _ in range(start_step + 20)][start_step:]
    resumed = iter(make(start_step=start_step))
    assert [window_keys(next(resumed)) for _ in range(20)] == expected


def test_start_step_needs_repeat_and_a_non_negative_int(dataset):
    with pytest.raises(ValueError, match=r"resuming at a step needs repeat=True"):
        readers.windows(dataset, length=8, batch_size=4, start_step=3)
    with pytest.raises(ValueError, match=r"start_step must be a non-negative integer \(got start_step=-1\)"):
        readers.windows(dataset, length=8, batch_size=4, repeat=True, start_step=-1)


# --- images ---------------------------------------------------------------------------------------------------------

NUM_CLASSES = 24


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 classes of one flat-coloured JPEG each, in 3 shards: a label names its record."""
    from PIL import Image
    from tfshard.ingest import ConvertOptions, convert_images

    root = tmp_path_factory.mktemp("resume-images")
    for label in range(NUM_CLASSES):
        folder = root / "src" / f"c{label:02d}"
        folder.mkdir(parents=True)
        Image.new("RGB", (20, 16), (label * 10, 255 - label * 10, label * 37 % 256)).save(folder / "a.jpg")
    convert_images(str(root / "src"), str(root / "out"), ConvertOptions(num_shards=3), workers=0, progress=False)
    return str(root / "out")


@pytest.mark.parametrize("training", [True, False])
def test_images_start_step_is_the_uninterrupted_stream_from_that_step(photos, training):
    def make(**kwargs):
        return readers.images(photos, batch_size=5, image_size=8, seed=7, training=training, repeat=True, **kwargs)

    whole = first_batches(make(), 17)  # 85 records: over three epochs of 24, batches straddling their ends
    labels = [label for batch, _ in whole for label in batch]
    for epoch in range(3):  # every record once per epoch, in a new order each epoch when training
        assert sorted(labels[epoch * NUM_CLASSES : (epoch + 1) * NUM_CLASSES]) == list(range(NUM_CLASSES))
    assert training == (labels[:NUM_CLASSES] != labels[NUM_CLASSES : 2 * NUM_CLASSES])
    for start in (3, 11):
        resumed = first_batches(make(start_step=start), 17 - start)
        for (got_labels, got), (want_labels, want) in zip(resumed, whole[start:]):
            assert got_labels == want_labels
            np.testing.assert_array_equal(got, want)  # the same crops and flips, not only the same records


@pytest.mark.parametrize("kwargs", [{}, dict(augment="color"), dict(shuffle="global", augment="color")], ids=str)
def test_every_iterator_of_a_resumable_images_dataset_is_the_same_stream(noisy_photos, kwargs):
    """Keras opens one iterator to build a model under a strategy and drops it after a prefetch of a
    timing-dependent length, before the one it trains on: a seeded reshuffle drew each iterator's epochs from a
    generator they all shared, so the fit's stream depended on how far the first one had read (fixed)."""
    ds = readers.images(noisy_photos, batch_size=4, image_size=8, seed=7, repeat=True, start_step=1, **kwargs)
    first = first_batches(ds, 8)  # 10 records an epoch: into the 4th
    iterator = iter(ds)
    for _ in range(11):
        next(iterator)
    del iterator
    for (got_labels, got), (want_labels, want) in zip(first_batches(ds, 8), first):
        assert got_labels == want_labels
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kwargs, why", [
    (dict(start_step=2), "repeat=False"),
    (dict(start_step=2, repeat=True, seed=None), "seed=None"),
    (dict(start_step=2, repeat=True, cache="memory"), "cache='memory'"),
    (dict(start_step=2, repeat=True, ignore_errors=True), "ignore_errors=True"),
    (dict(start_step=2, repeat=True, deterministic=False), "deterministic=False"),
])
def test_images_start_step_refuses_what_cannot_resume_exactly(photos, kwargs, why):
    options = {"batch_size": 4, "seed": 1, **kwargs}
    with pytest.raises(ValueError, match=rf"start_step=2: cannot resume exactly with {why}"):
        readers.images(photos, **options)


@pytest.mark.slow
def test_an_images_job_killed_at_random_steps_consumes_what_an_uninterrupted_one_does(photos, tmp_path):
    import resume_child

    steps, save_every = 40, 6  # ~6.7 epochs of 24 records in batches of 4
    expected = _uninterrupted(lambda: resume_child.images_reader(photos), resume_child.images_line, steps)
    log, ckpt = tmp_path / "killed.log", tmp_path / "ckpt"
    rng = random.Random(3)
    for _ in range(2):
        _run(["images", photos, str(ckpt), str(log), str(steps), str(save_every)],
             kill_after_steps=rng.randint(2, 12), log=str(log))
    resume_child.images_job(photos, str(ckpt), str(log), steps, save_every)  # to the end, in this process
    assert _consumed(log) == expected  # same records, same crops, in the same order
    labels = [int(pair.split(":")[0]) for step in expected for pair in step.split(",")]
    for epoch in range(len(labels) // NUM_CLASSES):
        assert sorted(labels[epoch * NUM_CLASSES : (epoch + 1) * NUM_CLASSES]) == list(range(NUM_CLASSES))
    assert _lines(log) > steps


def _rest_of_the_epoch(make, tmp_path, after: int):
    """The keys of an epoch's batches after the first ``after``: read on, and read from a checkpoint taken there."""
    iterator = iter(make())
    for _ in range(after):
        next(iterator)
    path = tf.train.Checkpoint(input=iterator).write(str(tmp_path / "ckpt"))
    expected = [window_keys(batch) for batch in iterator]
    restored = iter(make())
    tf.train.Checkpoint(input=restored).read(path).assert_consumed()
    return expected, [window_keys(batch) for batch in restored]


def test_a_single_epoch_iterator_checkpoints_too(dataset, tmp_path):
    """Without repeat, as a first try does it: tf.train.Checkpoint(input=iter(readers.windows(...))) saves mid-epoch."""
    def make():
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True)

    expected, resumed = _rest_of_the_epoch(make, tmp_path, after=4)
    assert resumed == expected and len(expected) == len(make()) - 4


def test_streamed_windows_checkpoint_exactly_with_their_shuffle_buffer(dataset, tmp_path):
    """Streamed mode keeps TensorFlow's explicit checkpoint: exact, and as large as its buffered windows."""
    def make():
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True,
                               resident=False, shuffle_buffer=64)

    expected, resumed = _rest_of_the_epoch(make, tmp_path, after=4)
    assert resumed == expected and expected


@pytest.mark.parametrize("pipeline", [0, 1])
def test_images_start_step_per_input_pipeline_under_a_strategy(photos, pipeline):
    """Under distribute_datasets_from_function each pipeline is its own seeded stream: each resumes at the step."""
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=2)

    def make(**kwargs):
        return readers.images(photos, batch_size=3, image_size=8, seed=2, repeat=True, input_context=context,
                              **kwargs)

    whole = first_batches(make(), 9)
    resumed = first_batches(make(start_step=4), 5)
    assert [labels for labels, _ in resumed] == [labels for labels, _ in whole[4:]]
    for (_, got), (_, want) in zip(resumed, whole[4:]):
        np.testing.assert_array_equal(got, want)


def test_images_repeat_is_refused_with_a_service(photos):
    with pytest.raises(ValueError, match=r"repeat: not with service="):
        readers.images(photos, batch_size=4, repeat=True, service="grpc://localhost:5050")


# --- model.fit resumes mid-epoch: readers.BackupAndRestore ----------------------------------------------------------

FIT_CHILD = os.path.join(os.path.dirname(__file__), "fit_resume_child.py")


def _run_fit(args, held: str) -> None:
    """Runs the fit child (its HOLD_AT > -1) and SIGKILLs it once it is held at that step (``held`` exists)."""
    child = subprocess.Popen([sys.executable, FIT_CHILD, *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                             start_new_session=True)
    deadline = time.monotonic() + 180
    while not os.path.exists(held) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # polls for the point the job holds at; the kill is never timed
    assert os.path.exists(held), f"the job ended (exit {child.poll()}) before it was held: {child.communicate()[0]}"
    os.killpg(child.pid, signal.SIGKILL)
    child.communicate(timeout=60)
    os.remove(held)


@pytest.mark.slow
@pytest.mark.parametrize("stream, steps_per_execution", [("default", 1), ("global", 2), ("windows", 1)])
def test_a_fit_killed_at_random_steps_trains_on_the_batches_an_uninterrupted_fit_does(photos, dataset, tmp_path,
                                                                                      stream, steps_per_execution):
    """model.fit with readers.BackupAndRestore, SIGKILLed three times (before the first save, mid-epoch, at an epoch
    end) and rerun with the same command: the batches it trained on, step by step, are the first ones of its input,
    exactly as many as an uninterrupted fit trains on, and the final weights are that fit's."""
    import fit_resume_child

    epochs, steps, save_freq = 6, 5, 3  # fit's epochs of 5 steps straddle the data's of 6 (images) or 17 (windows)
    per_epoch = -(-steps // steps_per_execution) * steps_per_execution  # Keras trains whole executions
    total = epochs * per_epoch
    data = dataset if stream == "windows" else photos  # 17 batches of windows an epoch, 6 of images
    reference = tmp_path / "reference.log"
    fit_resume_child.job(stream, data, str(tmp_path / "bk-reference"), str(reference), epochs, steps, save_freq,
                         -1, steps_per_execution, pass_dataset=True)
    iterator = iter(fit_resume_child.reader(stream, data))
    expected = [fit_resume_child.line(*(t.numpy() for t in next(iterator))) for _ in range(total)]
    assert _consumed(reference) == expected

    log, backup = tmp_path / "killed.log", tmp_path / "bk"
    rng = random.Random(stream)
    args = [stream, data, backup, log, epochs, steps, save_freq]
    for hold_at in (1, rng.randint(save_freq + 1, total - per_epoch), rng.randint(2, epochs - 1) * per_epoch):
        _run_fit([*args, hold_at, steps_per_execution], held=f"{log}.held")
    # Rerun to the end, in this process (the kills are what need processes of their own; the killed reruns found
    # their input themselves, here other readers live, so it is passed).
    fit_resume_child.job(*map(str, args), "-1", str(steps_per_execution), pass_dataset=True)
    assert _consumed(log) == expected
    assert _lines(log) > total  # the kills really replayed steps after the last save
    np.testing.assert_array_equal(np.load(f"{log}.weights.npy"), np.load(f"{reference}.weights.npy"))
    assert not os.path.exists(backup)  # delete_checkpoint, as Keras' own


def _fit(ds, callbacks, steps=2, epochs=1):
    import keras

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(24)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    model.fit(ds, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    return model


@pytest.mark.parametrize("start_step", [0, 3])
def test_a_fit_with_no_backup_starts_where_the_reader_says(photos, tmp_path, start_step):
    ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True, start_step=start_step)
    backup = readers.BackupAndRestore(tmp_path / "bk", save_freq=1, delete_checkpoint=False, dataset=ds)
    _fit(ds, backup)
    with open(tmp_path / "bk" / "tfshard_state.json") as f:
        state = json.load(f)
    assert backup.step == state["current"]["step"] == start_step + 2
    assert sorted(os.listdir(tmp_path / "bk")) == [f"step-{start_step + 2}.weights.h5", "tfshard_state.json"]


def test_keras_own_callback_restarts_the_epoch_ours_trains_its_remaining_batches(photos, tmp_path):
    """Why readers.BackupAndRestore exists: Keras' callback records the batch it saved at but resumes that epoch from
    its first batch (and the input from its start); ours trains only the epoch's remaining batch, from the step the
    input had reached."""
    import keras

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:  # after the save of the epoch's 3rd batch
                raise RuntimeError("interrupted")

    class Count(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

    def callback(ours: bool, ds):
        if ours:
            return readers.BackupAndRestore(tmp_path / "ours", save_freq=3, delete_checkpoint=False, dataset=ds)
        return keras.callbacks.BackupAndRestore(str(tmp_path / "keras"), save_freq=3, delete_checkpoint=False)

    trained = {}
    for ours in (False, True):
        ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
        with pytest.raises(RuntimeError, match="interrupted"):
            _fit(ds, [callback(ours, ds), Interrupt()], steps=4)
        if not ours:
            with open(tmp_path / "keras" / "training_metadata.json") as f:
                assert json.load(f) == {"epoch": 0, "batch": 2}  # recorded, and unused below
        ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
        resumed, count = callback(ours, ds), Count()
        _fit(ds, [resumed, count], steps=4)
        trained[ours] = count.batches
    assert trained == {False: 4, True: 1}
    assert resumed.step == 4


def _interrupt(at: int):
    """A Keras callback that raises once its fit has trained ``at`` batches: a job interrupted in-process."""
    import keras

    class Interrupt(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == at:
                raise RuntimeError("interrupted")

    return Interrupt()


def _interrupted_twice_ends_as_uninterrupted(fit, tmp_path) -> None:
    """``fit(backup_dir, interrupt)`` (3 epochs of 5 steps, a save every 2, the final weights returned), interrupted
    mid-epoch (saved at step 6), then after an epoch's last batch (saved before its end), then run to its end, ends
    with the weights of one run uninterrupted."""
    uninterrupted = fit(tmp_path / "reference", None)
    for at in (7, 4):
        with pytest.raises(RuntimeError, match="interrupted"):
            fit(tmp_path / "bk", _interrupt(at))
    np.testing.assert_array_equal(fit(tmp_path / "bk", None), uninterrupted)


@pytest.mark.parametrize("stream", ["default", "global"])
def test_a_fit_under_a_strategy_interrupted_twice_ends_with_an_uninterrupted_fits_weights(photos, tmp_path, stream,
                                                                                         strategies):
    """A model built in a MirroredStrategy's scope (2 replicas): Keras opens an iterator of the input before
    on_train_begin to build it (and drops it after a prefetch of a timing-dependent length), and splits each global
    batch; the restore still lands on the step reached, and the fit on the stream's batches."""
    import keras

    def fit(backup_dir, interrupt):
        import fit_resume_child

        ds = fit_resume_child.reader(stream, photos)
        with strategies[2].scope():
            model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(
                24, kernel_initializer=keras.initializers.GlorotUniform(seed=0))])
            model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [readers.BackupAndRestore(backup_dir, save_freq=2, dataset=ds)]
        model.fit(ds, epochs=3, steps_per_epoch=5, callbacks=callbacks + ([interrupt] if interrupt else []),
                  verbose=0)
        return np.concatenate([w.ravel() for w in model.get_weights()])

    _interrupted_twice_ends_as_uninterrupted(fit, tmp_path)


@pytest.mark.parametrize("how", ["alone", "mixture", "strategy"])
def test_a_model_windows_fit_interrupted_twice_ends_with_an_uninterrupted_fits_weights(dataset, tmp_path, how,
                                                                                        strategies):
    """readers.model_windows(..., repeat=True, seed=...): its starts resume too, on the default stream, on a
    mixture's (the index-driven one) and under a MirroredStrategy (2 replicas, each gathering from its own copy)."""
    import contextlib

    import keras

    def fit(backup_dir, interrupt):
        strategy = strategies[2] if how == "strategy" else None
        paths, mixed = ([dataset, dataset], dict(weights=[1, 3])) if how == "mixture" else (dataset, {})
        windows = readers.model_windows(paths, length=8, shift=4, batch_size=4, features="obs", targets=1, seed=11,
                                        repeat=True, strategy=strategy, **mixed)
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = windows.wrap(keras.Sequential([keras.Input((8, 2)), keras.layers.Flatten(), keras.layers.Dense(
                2, kernel_initializer=keras.initializers.GlorotUniform(seed=0)), keras.layers.Reshape((1, 2))]))
            model.compile(keras.optimizers.SGD(0.01), "mse")
            model(next(iter(windows.starts)))  # built, as the callback needs, by an iterator opened before fit's
        backup = readers.BackupAndRestore(backup_dir, save_freq=2, dataset=windows.starts)
        model.fit(windows.starts, epochs=3, steps_per_epoch=5, callbacks=[backup] + ([interrupt] if interrupt else []),
                  verbose=0)
        assert interrupt is not None or backup.step == 15
        return np.concatenate([w.ravel() for w in model.get_weights()])

    _interrupted_twice_ends_as_uninterrupted(fit, tmp_path)


@pytest.mark.parametrize("strategy_replicas", [None, 2], ids=["one-pipeline", "strategy"])
def test_a_windows_mixture_fit_interrupted_twice_ends_with_an_uninterrupted_fits_weights(dataset, tmp_path,
                                                                                          strategy_replicas,
                                                                                          strategies):
    """readers.windows on the index-driven stream (a mixture, repeat=True, a seed): BackupAndRestore moves its start
    as it does the default path's, alone and under a MirroredStrategy (each replica its slice of a global step)."""
    import contextlib

    import keras

    def fit(backup_dir, interrupt):
        strategy = strategies[strategy_replicas] if strategy_replicas else None
        ds = readers.windows([dataset, dataset], weights=[1, 3], length=8, shift=4, batch_size=4, features="obs",
                             targets=1, seed=11, repeat=True, strategy=strategy)
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = keras.Sequential([keras.Input((8, 2)), keras.layers.Flatten(), keras.layers.Dense(
                2, kernel_initializer=keras.initializers.GlorotUniform(seed=0)), keras.layers.Reshape((1, 2))])
            model.compile(keras.optimizers.SGD(0.01), "mse")
        backup = readers.BackupAndRestore(backup_dir, save_freq=2, dataset=ds)
        model.fit(ds, epochs=3, steps_per_epoch=5, callbacks=[backup] + ([interrupt] if interrupt else []), verbose=0)
        return np.concatenate([w.ravel() for w in model.get_weights()])

    _interrupted_twice_ends_as_uninterrupted(fit, tmp_path)


def test_double_checkpoint_restores_the_save_before_when_the_last_ones_weights_are_damaged(photos, tmp_path):
    import keras

    class Count(keras.callbacks.Callback):
        batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

    def backup(ds):
        return readers.BackupAndRestore(tmp_path / "bk", save_freq=1, double_checkpoint=True, delete_checkpoint=False,
                                        dataset=ds)

    ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
    _fit(ds, backup(ds), steps=4)
    assert sorted(os.listdir(tmp_path / "bk")) == ["step-3.weights.h5", "step-4.weights.h5", "tfshard_state.json"]
    (tmp_path / "bk" / "step-4.weights.h5").write_bytes(b"cut")
    ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
    resumed, count = backup(ds), Count()
    _fit(ds, [resumed, count], steps=4)
    assert (count.batches, resumed.step) == (1, 4)  # from step 3: the epoch's last batch again


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not a BackupAndRestore state file"),
    ("[" * 60000, "not a BackupAndRestore state file"),  # nested past Python's recursion limit
    ('{"format": "other", "current": {}}', "not a BackupAndRestore state file"),
    ('{"format": "tfshard.BackupAndRestore/1", "current": {"epoch": 0, "batch": 1, "step": -4, '
     '"weights": "step-1.weights.h5"}}', "its current save is not"),
    ('{"format": "tfshard.BackupAndRestore/1", "current": {"epoch": true, "batch": 1, "step": 4, '
     '"weights": "step-1.weights.h5"}}', "its current save is not"),
    ('{"format": "tfshard.BackupAndRestore/1", "current": {"epoch": 0, "batch": 1, "step": 4, '
     '"weights": "../../etc/x.weights.h5"}}', "its current save is not"),
    ('{"format": "tfshard.BackupAndRestore/1", "current": {"epoch": 0, "batch": 1, "step": 4, '
     '"weights": "step-4.weights.h5"}}', "weights do not load"),
])
def test_a_damaged_or_edited_state_file_is_a_one_line_error(photos, tmp_path, content, problem):
    folder = tmp_path / "bk"
    folder.mkdir()
    (folder / "tfshard_state.json").write_text(content)
    ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
    with pytest.raises(ValueError, match=re.escape(problem)) as raised:
        _fit(ds, readers.BackupAndRestore(folder, dataset=ds))
    assert "\n" not in str(raised.value) and "start afresh" in str(raised.value)


def test_a_fifo_in_place_of_the_state_file_is_refused_not_opened(photos, tmp_path):
    folder = tmp_path / "bk"
    folder.mkdir()
    os.mkfifo(folder / "tfshard_state.json")  # opening it to read would block until a writer came
    ds = readers.images(photos, batch_size=4, image_size=8, seed=7, repeat=True)
    with pytest.raises(ValueError, match=r"tfshard_state.json: a FIFO, not a regular file; delete .* start afresh"):
        within(60, _fit, ds, readers.BackupAndRestore(folder, dataset=ds))


def test_the_input_must_be_one_resumable_tfshard_dataset(photos, tmp_path):
    unseeded = readers.images(photos, batch_size=4, image_size=8, repeat=True)
    with pytest.raises(ValueError, match=r"bk: dataset is not a resumable tfshard input .*repeat=True, seed="):
        readers.BackupAndRestore(tmp_path / "bk", dataset=unseeded)
    first = readers.images(photos, batch_size=4, image_size=8, seed=1, repeat=True)
    second = readers.images(photos, batch_size=4, image_size=8, seed=2, repeat=True)
    with pytest.raises(ValueError, match=r"bk: BackupAndRestore restores the position of one resumable tfshard "
                                         r"input \(got \d+: .*pass it as readers.BackupAndRestore\(..., dataset=ds\)"):
        _fit(first, readers.BackupAndRestore(tmp_path / "bk"))
    model = _fit(second.map(lambda x, y: (x, y)), readers.BackupAndRestore(tmp_path / "bk2", dataset=second))
    assert model.built
    with pytest.raises(ValueError, match=r"bk3: model.fit needs steps_per_epoch"):
        model.fit(second.take(2), epochs=1, callbacks=[readers.BackupAndRestore(tmp_path / "bk3", dataset=second)],
                  verbose=0)


def test_model_windows_starts_begin_at_start_step(dataset):
    def make(**kwargs):
        return readers.model_windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=5,
                                     repeat=True, **kwargs).starts

    whole = iter(make())
    expected = [next(whole).numpy().tolist() for _ in range(30)][12:]
    resumed = iter(make(start_step=12))
    assert [next(resumed).numpy().tolist() for _ in range(18)] == expected


# --- attacks: checkpoints and start_step used carelessly or hostilely ------------------------------------------------

TRAIN, VAL = [40, 25, 33, 19, 50], [30, 45, 22]  # L=8, S=4: 35 train windows (8 batches of 4), 20 val windows
WINDOWS = dict(length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True, repeat=True)
PER_EPOCH = 35 // 4


def _convert(root, train, val=(), seed=0, overwrite=False, out=None) -> str:
    """Episodes ``obs`` [T, 2] and ``act`` [T, 1]; ``val`` lengths make a second split."""
    rng = np.random.default_rng(seed)
    src = root / f"src-{seed}"
    files = {f"train/e{i}.npz": {"obs": rng.normal(size=(t, 2)).astype(np.float32),
                                 "act": rng.normal(size=(t, 1)).astype(np.float32)} for i, t in enumerate(train)}
    files.update({f"val/e{i}.npz": {"obs": rng.normal(size=(t, 2)).astype(np.float32),
                                    "act": rng.normal(size=(t, 1)).astype(np.float32)} for i, t in enumerate(val)})
    save_episodes(src, files)
    out = out or root / "out"
    convert_episode_tree(src, out, num_shards=min(2, len(train), *([len(val)] if val else [])), overwrite=overwrite)
    return str(out)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("resume-attacks"), TRAIN, VAL)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Another dataset folder with the same episode lengths and other values."""
    return _convert(tmp_path_factory.mktemp("resume-other"), TRAIN, VAL, seed=9)


def _stream(iterator, count: int) -> list:
    return [window_keys(next(iterator)) for _ in range(count)]


def _windows(path, **kwargs):
    return readers.windows(path, **{**WINDOWS, **kwargs})


def _save(iterator, path) -> str:
    return tf.train.Checkpoint(input=iterator).write(str(path))


def _restore(path, dataset):
    iterator = iter(dataset)
    tf.train.Checkpoint(input=iterator).read(path).assert_consumed()
    return iterator


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """A repeat=True iterator saved after 5 steps, and the 3 epochs it serves next."""
    iterator = iter(_windows(data))
    _stream(iterator, 5)
    path = _save(iterator, tmp_path_factory.mktemp("saved") / "ckpt")
    return path, _stream(iterator, 3 * PER_EPOCH)


# --- restoring into a dataset built with other arguments ------------------------------------------------------------

@pytest.mark.parametrize("change", [
    dict(batch_size=2), dict(batch_size=8), dict(length=12), dict(shift=2), dict(shuffle=False),
    dict(start_step=5), dict(start_step=3),
], ids=str)
def test_restoring_into_other_window_arguments_is_accepted_and_serves_other_data_tf(data, saved, change):
    """TF: a symbolic iterator checkpoint holds positions into the index, never the arguments. Restored into a dataset
    of another batch size, window, order or start_step of the same data it raises nothing and serves that dataset's
    windows from the saved positions: within the epoch some windows come twice or never (below). Other data (another
    split, folder, or the dataset rewritten) is refused (below)."""
    path, expected = saved
    got = _stream(_restore(path, _windows(data, **change)), 6)
    assert got != expected[:6]


def test_both_resume_mechanisms_at_once_serve_a_third_position_tf(data, saved):
    """The likeliest mix-up: a job restores its step, rebuilds the input with ``start_step=step`` (the strategy
    recipe) and then also restores the iterator saved at that step (the single-device recipe). TF restores the
    positions into a pipeline whose first epoch already skips 5 batches: it serves neither step 5 (the checkpoint)
    nor step 10 (both skips), but step 8 here, silently."""
    path, expected = saved
    whole = _stream(iter(_windows(data)), 30)
    got = _stream(_restore(path, _windows(data, start_step=5)), 6)
    assert whole[5:11] == expected[:6] and got != whole[5:11] and got != whole[10:16]


REFUSED = r": this iterator checkpoint was saved by a pipeline of other data .*restore it only into a pipeline of"


@pytest.mark.parametrize("into", ["another split", "another dataset folder"])
def test_restoring_into_a_pipeline_of_other_data_is_refused_naming_it(data, other, saved, into):
    """TF restored the positions into the other data and served its windows silently (the arrays are loaded anew,
    so here it was the other data; but a checkpoint of prefetched or cached data served the old data): every
    reader's pipeline is led by a stamp of the shards it reads, checked first by the restore
    (readers/epoch_guard.py)."""
    path, _ = saved
    target, split = (data, "val") if into == "another split" else (other, "train")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(target) + REFUSED):
        _restore(path, _windows(target, split=split))


def test_restoring_into_another_seed_continues_the_checkpointed_seed_tf(data, saved):
    """TF: ``Dataset.random`` saves its seeds, so the checkpoint's seed wins over the dataset's, for every epoch."""
    path, expected = saved
    assert _stream(_restore(path, _windows(data, seed=4)), 3 * PER_EPOCH) == expected


def test_restoring_into_other_features_keeps_the_order(data, saved):
    path, expected = saved
    assert _stream(_restore(path, _windows(data, features=["obs", "act"])), PER_EPOCH) == expected[:PER_EPOCH]


def test_a_batch_size_change_repeats_or_skips_windows_of_the_restored_epoch_tf(data, saved):
    """What the silent restores above cost: 5 batches of 4 were consumed before the save."""
    path, _ = saved
    whole = iter(_windows(data))
    before = {k for batch in _stream(whole, 5) for k in batch}
    smaller = _restore(path, _windows(data, batch_size=2))  # resumes at batch 5 of 2: windows 10.. of the epoch
    rest = {k for batch in _stream(smaller, 35 // 2 - 5) for k in batch}
    assert before & rest  # served twice in one epoch
    larger = _restore(path, _windows(data, batch_size=8))  # batch 5 of 8 is past the epoch's 4: the epoch ends
    by_eight = _stream(iter(_windows(data, batch_size=8)), 2 * (35 // 8))
    assert _stream(larger, 35 // 8) == by_eight[35 // 8 :]  # the next epoch at once: windows 20..34 never came


@pytest.mark.parametrize("change", [dict(repeat=False), dict(drop_remainder=False)], ids=str)
def test_restoring_into_another_pipeline_structure_fails_with_tfs_message_tf(data, saved, change):
    path, _ = saved
    with pytest.raises(tf.errors.NotFoundError, match="Make sure the dataset definition has not changed"):
        _restore(path, _windows(data, **change))


def test_a_distributed_iterator_cannot_go_in_a_checkpoint_tf(data, strategies):
    """README: under a strategy save the step and pass start_step. Trying anyway is TF's clear ValueError."""
    iterator = iter(_windows(data, strategy=strategies[2]))
    next(iterator)
    with pytest.raises(ValueError, match="trackable"):
        tf.train.Checkpoint(input=iterator)


# --- restoring after the shards were rewritten ----------------------------------------------------------------------

def _by_key(path, split="train") -> dict:
    """Every window of the split by (episode, step), read in one unshuffled epoch."""
    ds = readers.windows(path, split, length=8, shift=4, batch_size=4, features="obs", shuffle=False,
                         drop_remainder=False, with_keys=True)
    return {key: window for (keys, x) in ds for key, window in zip(window_keys((keys, x)), x.numpy())}


@pytest.mark.parametrize("repeat", [True, False], ids=["symbolic", "explicit"])
def test_a_restore_after_a_rewrite_is_refused_naming_the_dataset(tmp_path, repeat):
    """Before the stamp: a symbolic restore (repeat=True) served the new shards' windows at the saved positions,
    and a one-epoch (explicit) restore served its prefetched batches of the old shards' windows, data the shards
    no longer hold. Both are refused now; a pipeline built again on the rewritten dataset reads it from the start."""
    path = _convert(tmp_path, TRAIN)
    iterator = iter(_windows(path, repeat=repeat))
    _stream(iterator, 2)
    time.sleep(0.5)  # let the prefetch fill (the explicit checkpoint holds it)
    ckpt = _save(iterator, tmp_path / "ckpt")

    _convert(tmp_path, TRAIN, seed=1, overwrite=True, out=path)  # same lengths, other values
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(path) + REFUSED):
        _restore(ckpt, _windows(path, repeat=repeat))
    fresh = _by_key(path)
    keys, x = next(iter(_windows(path, repeat=repeat)))
    for key, window in zip(window_keys((keys, x)), x.numpy()):
        np.testing.assert_array_equal(window, fresh[key])


# --- damaged checkpoints --------------------------------------------------------------------------------------------

def _cut(suffix, keep):
    def tamper(folder):
        (path,) = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(suffix)]
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[:keep(len(data))])
    return tamper


def _flip(suffix, at):
    def tamper(folder):
        (path,) = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(suffix)]
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[at % len(data)] ^= 0xFF
        with open(path, "wb") as f:
            f.write(bytes(data))
    return tamper


def _remove(suffix):
    def tamper(folder):
        for f in os.listdir(folder):
            if f.endswith(suffix):
                os.remove(os.path.join(folder, f))
    return tamper


DATA, INDEX = ".data-00000-of-00001", ".index"


@pytest.mark.parametrize("tamper", [
    _cut(DATA, lambda n: n - 20), _cut(DATA, lambda n: 0), _cut(INDEX, lambda n: n // 2), _cut(INDEX, lambda n: 0),
    _flip(DATA, 0), _flip(DATA, 60), _flip(DATA, 200), _flip(DATA, -1), _flip(INDEX, 0), _flip(INDEX, 40),
    _remove(DATA), _remove(INDEX),
], ids=["data-cut", "data-empty", "index-half", "index-empty", "data-0", "data-60", "data-200", "data-last",
        "index-0", "index-40", "no-data", "no-index"])
def test_a_damaged_checkpoint_is_an_error_never_a_silent_restore_tf(data, tmp_path, tamper):
    """TF: the bundle and the iterator state carry checksums; every damage is an error (DataLossError, a checksum
    mismatch, "not an sstable", IndexError "Read less bytes than requested", NotFound), never wrong positions."""
    iterator = iter(_windows(data))
    _stream(iterator, 5)
    path = _save(iterator, tmp_path / "ckpt")
    tamper(str(tmp_path))
    with pytest.raises((tf.errors.OpError, IndexError)):
        _restore(path, _windows(data))


def test_a_checkpoint_folder_behind_a_symlink_restores_exactly(data, saved, tmp_path):
    iterator = iter(_windows(data))
    _stream(iterator, 5)
    real = tmp_path / "real"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(input=iterator), str(real), max_to_keep=1)
    manager.save()
    os.symlink(real, tmp_path / "link")
    latest = tf.train.latest_checkpoint(str(tmp_path / "link"))
    restored = iter(_windows(data))
    tf.train.Checkpoint(input=restored).read(latest).assert_existing_objects_matched()
    assert _stream(restored, PER_EPOCH) == saved[1][:PER_EPOCH]


# --- checkpoints at epoch edges, rewinds ----------------------------------------------------------------------------

def test_checkpoints_at_epoch_edges_and_a_rewind_of_the_same_iterator_are_exact(data, tmp_path):
    whole = _stream(iter(_windows(data)), 3 * PER_EPOCH)
    for at in (0, PER_EPOCH - 1, PER_EPOCH, PER_EPOCH + 1, 2 * PER_EPOCH):
        iterator = iter(_windows(data))
        _stream(iterator, at)
        path = _save(iterator, tmp_path / f"at-{at}")
        assert _stream(_restore(path, _windows(data)), PER_EPOCH) == whole[at : at + PER_EPOCH]
        _stream(iterator, 3)  # read on, then rewind this very iterator to the checkpoint
        tf.train.Checkpoint(input=iterator).read(path).assert_consumed()
        assert _stream(iterator, 2) == whole[at : at + 2]


def test_model_windows_starts_with_start_step_checkpoint_and_restore_exactly(data, tmp_path):
    def starts(**kwargs):
        return readers.model_windows(data, length=8, shift=4, batch_size=4, features="obs", seed=3, repeat=True,
                                     **kwargs).starts

    whole = [b.numpy().tolist() for b in starts().take(3 * PER_EPOCH)]
    iterator = iter(starts(start_step=6))
    assert [next(iterator).numpy().tolist() for _ in range(4)] == whole[6:10]
    path = _save(iterator, tmp_path / "ckpt")
    restored = _restore(path, starts(start_step=6))  # the same arguments the saved iterator was built with
    assert [next(restored).numpy().tolist() for _ in range(12)] == whole[10:22]


# --- start_step -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [np.int64(5), np.int32(5), np.uint16(5), 5])
def test_start_step_takes_numpy_integers(data, step):
    whole = _stream(iter(_windows(data)), 9)
    assert _stream(iter(_windows(data, start_step=step)), 4) == whole[5:9]
    def starts(**kwargs):
        return readers.model_windows(data, length=8, shift=4, batch_size=4, features="obs", seed=3, repeat=True,
                                     **kwargs).starts

    rows = [b.numpy().tolist() for b in starts().take(9)]
    assert [b.numpy().tolist() for b in starts(start_step=step).take(4)] == rows[5:9]


@pytest.mark.parametrize("step", [5.0, np.float32(5), True, False, "5", -1, np.int64(-2), None], ids=repr)
def test_start_step_that_is_no_step_count_is_refused_by_every_reader(data, noisy_photos, step):
    message = r"start_step must be a non-negative integer"
    with pytest.raises(ValueError, match=message):
        _windows(data, start_step=step)
    with pytest.raises(ValueError, match=message):
        readers.model_windows(data, length=8, batch_size=4, repeat=True, seed=1, start_step=step)
    with pytest.raises(ValueError, match=message):
        readers.images(noisy_photos, batch_size=4, image_size=8, seed=1, repeat=True, start_step=step)


@pytest.mark.parametrize("replicas", [0, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_start_step_with_partial_last_batches_is_the_uninterrupted_stream(data, strategies, replicas, shuffle):
    """drop_remainder=False: 35 windows in batches of 6 (5 full and one of 5 an epoch; under a strategy each replica's
    share ends in a short batch): start_step lands right across those short batches and epoch ends."""
    strategy = strategies.get(replicas)

    def flat(batch):
        keys, x = batch
        if strategy is None:
            return window_keys(batch), x.numpy().tolist()
        local = strategy.experimental_local_results
        return ([list(zip(e.numpy().tolist(), s.numpy().tolist()))
                 for e, s in zip(local(keys["episode"]), local(keys["step"]))],
                [v.numpy().tolist() for v in local(x)])

    def make(**kwargs):
        return _windows(data, batch_size=6, drop_remainder=False, shuffle=shuffle, strategy=strategy, **kwargs)

    iterator = iter(make())
    whole = [flat(next(iterator)) for _ in range(15)]
    sizes = [len(keys) if strategy is None else sum(map(len, keys)) for keys, _ in whole[:6]]
    assert sizes[5] < 6  # the short batch of the epoch
    for start in (5, 6, 13):
        iterator = iter(make(start_step=start))
        assert [flat(next(iterator)) for _ in range(15 - start)] == whole[start:]


def test_model_windows_start_step_under_a_strategy_and_with_partial_batches(data, strategies):
    def starts(**kwargs):
        return readers.model_windows(data, length=8, shift=4, batch_size=6, features="obs", seed=3, repeat=True,
                                     **kwargs).starts

    for kwargs in (dict(strategy=strategies[2]), dict(drop_remainder=False)):
        whole = [b.numpy().tolist() for b in starts(**kwargs).take(14)]
        assert [b.numpy().tolist() for b in starts(start_step=5, **kwargs).take(9)] == whole[5:]


def test_start_step_far_beyond_many_epochs_is_exact(data):
    """A million steps: 125 000 epochs skipped by drawing their seeds (~4 µs an epoch, linear in the epochs)."""
    start = 10**6
    assert start % PER_EPOCH == 0  # an epoch's first step
    late = _stream(iter(_windows(data, start_step=start + 3)), 2)
    at_epoch = iter(_windows(data, start_step=start))
    assert _stream(at_epoch, 5)[3:] == late


@pytest.mark.parametrize("reader, start_step", [
    ("windows", PER_EPOCH * 2**32), ("images", 2**32 // 4), ("windows", 2**70), ("images", 2**62)])
def test_a_start_step_too_large_to_honour_is_refused_naming_it(data, noisy_photos, reader, start_step):
    def first(step):
        if reader == "windows":
            return _stream(iter(_windows(data, start_step=step)), 1)
        images, labels = next(iter(readers.images(noisy_photos, batch_size=4, image_size=8, seed=7, repeat=True,
                                                  start_step=step)))
        return labels.numpy().tolist(), images.numpy().tolist()

    with pytest.raises(ValueError, match=r"start_step=\d+.*pass the step count the job saved"):
        first(start_step)


@pytest.mark.parametrize("reader", ["windows", "model_windows"])
def test_start_step_without_a_seed_is_refused_when_shuffling(data, reader):
    with pytest.raises(ValueError, match="seed"):
        if reader == "windows":
            _windows(data, seed=None, start_step=5)
        else:
            readers.model_windows(data, length=8, batch_size=4, repeat=True, start_step=5)


def test_start_step_without_shuffling_needs_no_seed(data):
    whole = _stream(iter(_windows(data, seed=None, shuffle=False)), 12)
    assert _stream(iter(_windows(data, seed=None, shuffle=False, start_step=7)), 5) == whole[7:]


def test_a_checkpoint_of_a_seedless_iterator_restores_its_drawn_seed(data, tmp_path):
    """seed=None is fine for the checkpoint path: the drawn seed is in the saved state (``Dataset.random``'s)."""
    iterator = iter(_windows(data, seed=None))
    _stream(iterator, 5)
    path = _save(iterator, tmp_path / "ckpt")
    expected = _stream(iterator, 2 * PER_EPOCH)
    assert _stream(_restore(path, _windows(data, seed=None)), 2 * PER_EPOCH) == expected


# --- images ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def noisy_photos(tmp_path_factory):
    """10 classes of one random-pixel JPEG each (so crops and flips show), in 2 shards."""
    from PIL import Image
    from tfshard.ingest import ConvertOptions, convert_images

    root = tmp_path_factory.mktemp("resume-attack-images")
    for label in range(10):
        folder = root / "src" / f"c{label}"
        folder.mkdir(parents=True)
        pixels = np.random.default_rng(label).integers(0, 256, (16, 20, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "a.jpg")
    convert_images(str(root / "src"), str(root / "out"), ConvertOptions(num_shards=2), workers=0, progress=False)
    return str(root / "out")


def _same_images(got, want) -> bool:
    return len(got) == len(want) and all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(got, want))


@pytest.mark.parametrize("kwargs", [
    dict(), dict(augment=None), dict(dtype="uint8"), dict(drop_remainder=False), dict(num_parallel_reads=1),
    dict(training=False, drop_remainder=True), dict(shuffle_buffer=3),
], ids=str)
def test_images_start_step_is_exact_across_epoch_ends(noisy_photos, kwargs):
    """10 records in batches of 3: batches straddle every epoch end (batching follows the repeat)."""
    def make(**more):
        return readers.images(noisy_photos, batch_size=3, image_size=8, seed=7, repeat=True, **kwargs, **more)

    whole = first_batches(make(), 9)
    assert _same_images(first_batches(make(start_step=4), 5), whole[4:])


@pytest.mark.parametrize("augment", ["color", lambda images, seed: tf.image.stateless_random_flip_up_down(
    images, seed)], ids=["color", "callable"])
def test_images_start_step_replays_batch_augmentations_too(noisy_photos, augment):
    def make(**more):
        return readers.images(noisy_photos, batch_size=3, image_size=8, seed=7, repeat=True, augment=augment, **more)

    whole = first_batches(make(), 9)
    resumed = first_batches(make(start_step=4), 5)
    assert [labels for labels, _ in resumed] == [labels for labels, _ in whole[4:]]  # holds: the records are right
    assert _same_images(resumed, whole[4:])  # fails: their augmentation is not


def test_images_iterator_checkpoint_replays_batch_augmentations(noisy_photos, tmp_path):
    """The workaround for the bug above: TF's explicit checkpoint of the images iterator holds the seed stream."""
    def make():
        return readers.images(noisy_photos, batch_size=3, image_size=8, seed=7, repeat=True, augment="color")

    iterator = iter(make())
    for _ in range(4):
        next(iterator)
    path = _save(iterator, tmp_path / "ckpt")
    expected = [(labels.numpy().tolist(), images.numpy()) for images, labels in (next(iterator) for _ in range(5))]
    restored = _restore(path, make())
    got = [(labels.numpy().tolist(), images.numpy()) for images, labels in (next(restored) for _ in range(5))]
    assert _same_images(got, expected)


@pytest.mark.parametrize("cache", [None, "memory"])
def test_images_iterator_checkpoint_restored_into_a_fresh_reader_runs_on_exactly_across_epochs(photos, tmp_path,
                                                                                               cache):
    """The records' shuffle (or the decoded images', after a cache) and the repeat after it are one fused stage
    (``options.shuffled``): without a cache, the unfused pair restored into a fresh pipeline of several shards
    yielded another order from the second epoch after the restore on."""
    def make():
        return readers.images(photos, batch_size=4, image_size=8, seed=0, repeat=True, cache=cache)

    def batches(iterator, count):
        return [(labels.numpy().tolist(), images.numpy()) for images, labels in (next(iterator) for _ in range(count))]

    iterator = iter(make())
    want = batches(iter(make()), 20)  # 6 a pass
    assert _same_images(batches(iterator, 5), want[:5])
    restored = _restore(_save(iterator, tmp_path / "ckpt"), make())
    assert _same_images(batches(restored, 15), want[5:])  # crosses two epoch ends


# --- real processes: SIGKILL during a save, two resumes at once, a hang ----------------------------------------------

SAVER_CHILD = textwrap.dedent("""
    import os, sys
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tfshard import readers

    mode, data, ckpt = sys.argv[1:4]
    if mode == "empty-epochs":  # 1 window per epoch for 3 replicas: no replica gets a window
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
        try:
            ds = readers.windows(data, length=8, shift=4, batch_size=3, features="obs", seed=3, repeat=True,
                                 drop_remainder=False, strategy=strategy)
        except ValueError as error:
            print("refused", error, flush=True)
            sys.exit(0)
        import threading
        print("iterating", flush=True)
        threading.Timer(4, lambda: (print("hung", flush=True), os._exit(3))).start()
        try:
            next(iter(ds))
            print("got a batch", flush=True)
        except Exception as error:
            print("raised", type(error).__name__, error, flush=True)
        os._exit(0)
    iterator = iter(readers.windows(data, length=8, shift=4, batch_size=4, features="obs", seed=3,
                                    with_keys=True, repeat=True))
    step = tf.Variable(0, dtype=tf.int64)
    big = tf.Variable(tf.zeros([4_000_000]))  # 16 MB: a save takes long enough to be killed in
    checkpoint = tf.train.Checkpoint(input=iterator, step=step, big=big)
    manager = tf.train.CheckpointManager(checkpoint, ckpt, max_to_keep=2)
    manager.restore_or_initialize()
    assert bool(tf.reduce_all(big == tf.cast(step, tf.float32))), "a torn checkpoint"
    print("restored", int(step.numpy()), flush=True)
    if mode == "peek":
        for _ in range(3):
            keys, _ = next(iterator)
            print("keys", list(zip(keys["episode"].numpy().tolist(), keys["step"].numpy().tolist())), flush=True)
        sys.exit(0)
    while True:
        next(iterator)
        step.assign_add(1)
        big.assign(tf.fill([4_000_000], tf.cast(step, tf.float32)))
        print("saving", int(step.numpy()), flush=True)
        manager.save(checkpoint_number=int(step.numpy()))
""")


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    path = tmp_path_factory.mktemp("child") / "child.py"
    path.write_text(SAVER_CHILD)
    return str(path)


def _spawn(child, *args):
    return subprocess.Popen([sys.executable, child, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.mark.slow
def test_a_job_killed_during_checkpoint_saves_restarts_from_a_complete_one(data, child, tmp_path):
    ckpt = tmp_path / "ckpt"
    rng = random.Random(0)
    whole = _stream(iter(_windows(data)), 40)
    restored_at = []
    for _ in range(2):
        process = _spawn(child, "run", data, ckpt)
        lines, start = [], None
        for line in process.stdout:
            lines.append(line)
            if line.startswith("restored"):
                start = int(line.split()[1])
            if line.startswith("saving") and int(line.split()[1]) >= start + 3:
                time.sleep(rng.uniform(0, 0.01))  # inside the ~30 ms save of 16 MB, most times
                process.send_signal(signal.SIGKILL)
                break
        process.communicate(timeout=60)
        assert start is not None, "".join(lines[-20:])  # restored: no torn checkpoint (the child asserts it)
        restored_at.append(start)
    assert restored_at[0] == 0 and restored_at[1] >= 2

    iterator = iter(_windows(data))
    step, big = tf.Variable(0, dtype=tf.int64), tf.Variable(tf.zeros([4_000_000]))
    tf.train.Checkpoint(input=iterator, step=step, big=big).read(
        tf.train.latest_checkpoint(str(ckpt))).assert_existing_objects_matched()
    at = int(step.numpy())
    assert at >= restored_at[1] + 2 and bool(tf.reduce_all(big == float(at)))
    assert _stream(iterator, 5) == whole[at : at + 5]


@pytest.mark.slow
def test_two_processes_resuming_from_one_checkpoint_at_once_see_the_same_stream(data, child, tmp_path):
    """Reading one checkpoint from two processes at once is safe. (Saving into one folder from both is not: TF's
    MergeV2Checkpoints of ckpt-N_temp/ races and one job dies with NotFoundError; TF behaviour, not tested.)"""
    ckpt = tmp_path / "ckpt"
    iterator = iter(_windows(data))
    step, big = tf.Variable(7, dtype=tf.int64), tf.Variable(tf.fill([4_000_000], 7.0))
    _stream(iterator, 7)
    tf.train.CheckpointManager(tf.train.Checkpoint(input=iterator, step=step, big=big), str(ckpt), 2).save()
    expected = [f"keys {batch}" for batch in _stream(iterator, 3)]
    processes = [_spawn(child, "peek", data, ckpt) for _ in range(2)]
    for process in processes:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output
        lines = output.splitlines()
        assert "restored 7" in lines and [line for line in lines if line.startswith("keys")] == expected


@pytest.fixture(scope="module")
def one_window(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("one-window"), [8])


@pytest.mark.slow
def test_an_epoch_with_no_batch_under_repeat_is_refused_not_a_hang(one_window, child):
    process = _spawn(child, "empty-epochs", one_window, "-")
    try:
        output, _ = process.communicate(timeout=120)  # the child gives up 4 s into a next() that never returns
    finally:
        process.kill()
    assert "hung" not in output and ("refused" in output or "raised" in output), output[-2000:]
