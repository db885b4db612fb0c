"""Resuming mid-epoch (issue 13): resident windows checkpoint with the model in a few KB and resume exactly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import convert_episode_tree, save_episodes
from tfshard import readers

tf = pytest.importorskip("tensorflow")

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


def _keys(batch) -> list[tuple[int, int]]:
    keys, _ = batch
    return list(zip(keys["episode"].numpy().tolist(), keys["step"].numpy().tolist()))


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
    expected = [_keys(next(iterator)) for _ in range(2 * per_epoch)]

    restored = iter(make())  # a new dataset object, as in a new process
    tf.train.Checkpoint(input=restored).read(path).assert_consumed()
    assert [_keys(next(restored)) for _ in range(2 * per_epoch)] == expected
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


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [0, 2])
def test_a_job_killed_at_random_steps_consumes_what_an_uninterrupted_one_does(dataset, tmp_path, replicas):
    steps, save_every = 60, 7  # ~3.5 epochs of 17 batches; kills land mid-epoch and across epoch ends
    reference = tmp_path / "reference.log"
    _run([dataset, str(tmp_path / "ref-ckpt"), str(reference), str(steps), str(save_every), str(replicas)])

    log, ckpt = tmp_path / "killed.log", tmp_path / "ckpt"
    rng = random.Random(replicas)
    for _ in range(3):
        _run([dataset, str(ckpt), str(log), str(steps), str(save_every), str(replicas)],
             kill_after_steps=rng.randint(3, 15), log=str(log))
    _run([dataset, str(ckpt), str(log), str(steps), str(save_every), str(replicas)])

    got, expected = _consumed(log), _consumed(reference)
    assert len(expected) == steps and got == expected
    assert _lines(log) > steps  # the kills really replayed steps after the last checkpoint


@pytest.mark.parametrize("start_step", [0, 5, 17, 40])
def test_start_step_starts_the_stream_where_the_step_count_says(dataset, start_step):
    def make(**kwargs):
        return readers.windows(dataset, length=8, shift=4, batch_size=4, features="obs", seed=3, with_keys=True,
                               repeat=True, **kwargs)

    whole = iter(make())
    expected = [_keys(next(whole)) for _ in range(start_step + 20)][start_step:]
    resumed = iter(make(start_step=start_step))
    assert [_keys(next(resumed)) for _ in range(20)] == expected


def test_start_step_needs_repeat_and_a_non_negative_int(dataset):
    with pytest.raises(ValueError, match=r"resuming at a step needs repeat=True"):
        readers.windows(dataset, length=8, batch_size=4, start_step=3)
    with pytest.raises(ValueError, match=r"start_step must be a non-negative integer \(got start_step=-1\)"):
        readers.windows(dataset, length=8, batch_size=4, repeat=True, start_step=-1)
