"""Two real worker processes under MultiWorkerMirroredStrategy on loopback: file shares, resident windows, and the
index-driven streams (images, an image mixture, windows of an episode mixture) resumed 2 -> 1 in this process."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import make_tree, save_episodes
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_episodes, convert_images

CHILD = os.path.join(os.path.dirname(__file__), "multi_worker_child.py")
LENGTHS = [30, 9, 41, 17, 25, 12, 33, 20]
LENGTHS_B = [14, 10]  # the window mixture's second source: 6 + 4 windows of length 4, shift 2


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("multi-worker")
    make_tree(base / "images", classes=("a", "b", "c"), per_class=8)
    convert_images(str(base / "images"), str(base / "images-tfr"), ConvertOptions(num_shards=4), workers=0,
                   progress=False)
    convert_images(str(base / "images"), str(base / "one-shard"), ConvertOptions(num_shards=1), workers=0,
                   progress=False)
    make_tree(base / "images-b", classes=("a", "b"), per_class=4, seed=100)  # a mixture's smaller source
    convert_images(str(base / "images-b"), str(base / "images-b-tfr"), ConvertOptions(num_shards=1), workers=0,
                   progress=False)
    episodes = {f"e{i}.npy": (1000.0 * i + np.arange(t, dtype=np.float32))[:, None] for i, t in enumerate(LENGTHS)}
    save_episodes(base / "episodes", episodes)
    convert_episodes(str(base / "episodes"), str(base / "episodes-tfr"), ConvertOptions(num_shards=4), workers=0,
                     progress=False)
    save_episodes(base / "episodes-b", {f"e{i}.npy": (100_000.0 + 1000.0 * i + np.arange(t, dtype=np.float32))[:, None]
                                        for i, t in enumerate(LENGTHS_B)})
    convert_episodes(str(base / "episodes-b"), str(base / "episodes-b-tfr"), ConvertOptions(num_shards=1), workers=0,
                     progress=False)

    ports = _free_ports(2)
    children = []
    for index in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps({
            "cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}))
        args = [sys.executable, CHILD, str(base / "images-tfr"), str(base / "episodes-tfr"), str(base / "one-shard"),
                str(base / f"result-{index}.json"), str(base / "images-b-tfr"), str(base / "episodes-b-tfr")]
        children.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for child in children:
        try:
            outputs.append(child.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for c in children:
                c.kill()
            pytest.fail("a worker hung (timeout 240 s): unequal steps across workers would do this")
    for child, output in zip(children, outputs):
        assert child.returncode == 0, output[-3000:]
    results = [json.loads((base / f"result-{i}.json").read_text()) for i in range(2)]
    return base, results


def _image_signatures(path):
    ds = readers.images(path, batch_size=4, image_size=(8, 8), training=False, drop_remainder=False)
    return sorted((int(label), round(float(np.sum(image)), 3)) for images, labels in ds
                  for image, label in zip(images.numpy(), labels.numpy()))


@pytest.mark.slow
def test_two_workers_read_disjoint_complete_file_shares(cluster_run):
    base, results = cluster_run
    shares = [sorted(tuple(s) for s in r["images"]) for r in results]
    assert shares[0] and shares[1]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == _image_signatures(str(base / "images-tfr"))


def _two_then_one(by_task: list[list], read) -> None:
    """The global steps two workers ran (``by_task[w][k]``: worker ``w``'s slice of step ``k``, the first half of
    each step on worker 0), followed by one process resuming at that step, equal an uninterrupted one-replica run
    (``read(start, count)``) into the stream's second epoch."""
    import multi_worker_child as child

    steps = child.ELASTIC_STEPS
    before = [by_task[0][k] + by_task[1][k] for k in range(steps)]
    assert all(len(step) == child.ELASTIC_BATCH for step in before)
    after = steps + 6
    assert before + read(steps, after - steps) == read(0, after)


def _results_by_task(results, key):
    return [r[key] for r in sorted(results, key=lambda r: r["task"])]


@pytest.mark.slow
@pytest.mark.parametrize("mixture", [False, True], ids=["images", "image-mixture"])
def test_two_workers_then_one_resuming_read_what_one_uninterrupted_replica_does(cluster_run, mixture):
    """Elastic resume 2 -> 1 real workers (issue 32): two workers run global steps [0, s) of shuffle="global" (one
    dataset of 24 images, or a 70/30 mixture of it and one of 8), one process resumes with start_step=s; the
    elements, crops included, are an uninterrupted 1-replica run's."""
    import multi_worker_child as child

    base, results = cluster_run
    path = [str(base / "images-tfr"), str(base / "images-b-tfr")] if mixture else str(base / "images-tfr")
    stream = child.MIXTURE if mixture else {}

    def read(start: int, count: int) -> list:
        iterator = iter(child.elastic_reader(path, start_step=start, **stream))
        return [child.signatures(*(t.numpy() for t in next(iterator))) for _ in range(count)]

    _two_then_one(_results_by_task(results, "elastic_mixture" if mixture else "elastic"), read)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["strategy", "input_context"])
def test_two_workers_then_one_resuming_windows_on_the_stream(cluster_run, how):
    """Windows of a 70/30 mixture of two episode datasets under two real workers (``strategy=`` holding every window
    on each, or each worker's pipeline under ``input_context``), resumed 2 -> 1 with start_step: an uninterrupted
    one-replica run's windows, each the steps its first one starts, from both sources."""
    import multi_worker_child as child

    base, results = cluster_run
    paths = [str(base / "episodes-tfr"), str(base / "episodes-b-tfr")]

    def read(start: int, count: int) -> list:
        iterator = iter(child.window_reader(paths, start_step=start))
        return [child.window_signatures(*tf.nest.map_structure(lambda t: t.numpy(), next(iterator)))
                for _ in range(count)]

    by_task = [r[how] for r in _results_by_task(results, "elastic_windows")]
    _two_then_one(by_task, read)
    seen = [w for task in by_task for step in task for w in step]
    assert {source for source, _, _ in seen} == {0, 1}
    assert all(last == first + 3 for _, first, last in seen)  # a window never crosses an episode boundary


@pytest.mark.slow
def test_two_workers_run_equal_steps_of_a_window_stream_epoch_with_a_partial_last_step(cluster_run):
    """One epoch of 22 windows in global steps of 4, drop_remainder=False: both workers run 6 steps under a
    per-step collective (worker 1 has nothing in the last) and together read the one-pipeline epoch's windows."""
    import multi_worker_child as child

    base, results = cluster_run
    epochs = _results_by_task(results, "window_epoch")
    assert epochs[0]["steps"] == epochs[1]["steps"] == [4] * 5 + [2]
    ds = readers.windows([str(base / "episodes-tfr"), str(base / "episodes-b-tfr")], length=4, shift=2,
                         batch_size=child.ELASTIC_BATCH, features="data", seed=0, epoch_size=22, drop_remainder=False,
                         with_source=True, **child.MIXTURE)
    whole = [w for keys, batch in ds for w in child.window_signatures(
        {"source": keys["source"].numpy()}, batch.numpy())]
    first, second = epochs[0]["windows"], epochs[1]["windows"]  # each worker's 2 of a step, step after step
    assert len(whole) == 22 and len(second) == 10
    assert [w for k in range(6) for w in first[2 * k:2 * k + 2] + second[2 * k:2 * k + 2]] == whole


@pytest.mark.slow
def test_fewer_shards_than_workers_is_a_clear_error(cluster_run):
    _, results = cluster_run
    for r in results:
        assert r["few_shards_error"] and "1 shards, fewer than the 2 input pipelines" in r["few_shards_error"]
        assert "--min-shards 2" in r["few_shards_error"]


@pytest.mark.slow
def test_model_windows_on_the_stream_under_two_workers_is_refused_in_one_line(cluster_run):
    base, results = cluster_run
    where = f"{base / 'episodes-tfr'} + {base / 'episodes-b-tfr'}"
    for r in results:
        assert r["model_windows_error"].startswith(
            f"{where}: model_windows supports single-worker strategies (got CollectiveAllReduceStrategy); use "
            "readers.windows(..., strategy=strategy)")


@pytest.mark.slow
def test_each_worker_holds_only_its_own_shards_episodes(cluster_run):
    base, results = cluster_run
    manifest = readers.info(str(base / "episodes-tfr")).manifest.splits["train"]
    by_shard = collections.defaultdict(set)
    for e in manifest.episodes:
        by_shard[e.shard].add(e.id)
    held = []
    for r in results:
        (arrays,) = r["resident"]  # one local replica (one CPU) per worker
        episodes = {int(v // 1000) for v in arrays["values"]}
        expected = set().union(*(by_shard[s] for s in range(r["task"], 4, 2)))
        assert episodes == expected  # only its shards (ids are the .npy files' sorted positions: e0..e7)
        held.append(episodes)
    assert not held[0] & held[1] and held[0] | held[1] == set(range(len(LENGTHS)))


@pytest.mark.slow
def test_workers_run_equal_steps_of_their_own_windows_reshuffled_each_epoch(cluster_run):
    _, results = cluster_run
    counts = [[len(epoch["windows"]) for epoch in r["epochs"]] for r in results]
    assert counts[0] == counts[1] and counts[0][0] > 0  # equal steps (else the per-step collective would hang)
    for r in results:
        (arrays,) = r["resident"]
        own = {int(v // 1000) for v in arrays["values"]}
        first, second = ([tuple(w) for w in epoch["windows"]] for epoch in r["epochs"])
        assert {int(w[0] // 1000) for w in first} <= own
        assert len(set(first)) == len(first)  # no window twice in an epoch
        for w in first:  # a window never crosses an episode boundary
            assert w == tuple(w[0] + np.arange(4, dtype=np.float32))
        assert first != second  # a new order every epoch
        assert r["epochs"][0]["global_count"] == len(first) * 2


@pytest.mark.slow
def test_window_options_under_two_workers_give_each_window_once_and_exactly(cluster_run):
    """Targets with a gap, sampling_rate, time_range and padding under MultiWorkerMirroredStrategy: every window
    once over the workers, each exactly the steps its keys name (episode i holds 1000·i + step)."""
    base, results = cluster_run
    seen = [tuple(w[:2]) for r in results for w in r["shaped"]]
    assert len(seen) == len(set(seen)) > 0
    ids = {e.source: e.id for e in readers.info(str(base / "episodes-tfr")).manifest.splits["train"].episodes}
    value_of = {ids[f"e{i}.npy"]: i for i in range(len(LENGTHS))}
    for r in results:
        for episode, step, inputs, mask, target in r["shaped"]:
            steps = LENGTHS[value_of[episode]]
            lo = int(np.floor(0.2 * steps))
            points = [step + 2 * k for k in range(5)]  # 3 inputs and 2 more points, 2 steps apart
            expected = [1000.0 * value_of[episode] + p if p >= lo else -1.0 for p in points]
            assert inputs == expected[:3] and target == expected[4:] and mask == [p >= lo for p in points[:3]]
    total = readers.info(str(base / "episodes-tfr")).num_windows(
        "train", 3, 2, targets=readers.Targets(width=1, offset=2), sampling_rate=2, time_range=(0.2, 1.0),
        padding="start")
    assert len(seen) <= total and len(seen) >= total // 2  # equal steps: each worker's share cut to the smallest
