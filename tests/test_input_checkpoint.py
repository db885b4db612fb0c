"""Resuming mid-epoch: windows and images resume exactly, from a few KB of state saved with the model."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_episode_tree, first_batches, save_episodes, window_keys
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


def _run(args, kill_after_steps=None, log=None):
    """Runs the child; with ``kill_after_steps``, SIGKILLs it once its log shows that many more steps."""
    child = subprocess.Popen([sys.executable, CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if kill_after_steps is None:
        output, _ = child.communicate(timeout=180)
        assert child.returncode == 0, output
        return
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
    _run(["windows", dataset, str(ckpt), str(log), str(steps), str(save_every), str(replicas)])

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
    _run(["images", photos, str(ckpt), str(log), str(steps), str(save_every)])
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


def test_model_windows_starts_begin_at_start_step(dataset):
    def make(**kwargs):
        return readers.model_windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=5,
                                     repeat=True, **kwargs).starts

    whole = iter(make())
    expected = [next(whole).numpy().tolist() for _ in range(30)][12:]
    resumed = iter(make(start_step=12))
    assert [next(resumed).numpy().tolist() for _ in range(18)] == expected
