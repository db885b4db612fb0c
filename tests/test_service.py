"""Readers through the tf.data service: real in-process dispatcher and workers; every record once per epoch."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
from helpers import convert_episode_tree, convert_obs_episodes, make_tree
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_images
from tfshard.readers import service as service_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PER_CLASS = 12  # two classes: 24 records in 6 shards
EPISODE_LENGTHS = [3, 17, 50] + [80] * 12  # 3 is shorter than a window: it contributes none
WINDOW = {"length": 5, "shift": 1, "features": "obs", "targets": 2}  # x: 5 steps, y: the 2 after them
EPOCH_TIMEOUT_S = 120  # a guard against a hung client, far above the few seconds an epoch takes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _start_cluster(worker_ports=(0, 0)):
    dispatcher = service_lib.start_dispatcher(0)
    workers = [service_lib.start_worker(dispatcher.target, port, "localhost:%port%") for port in worker_ports]
    return dispatcher, workers


@pytest.fixture(scope="module")
def cluster():
    """One dispatcher and two workers, in this process: the dispatcher's ``grpc://localhost:PORT``."""
    dispatcher, workers = _start_cluster()
    yield dispatcher.target
    for server in (*workers, dispatcher):
        server.stop()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 seeded random 16x16 JPEGs in two classes, in 6 shards."""
    root = tmp_path_factory.mktemp("service-images")
    make_tree(str(root / "src"), per_class=PER_CLASS)
    convert_images(str(root / "src"), str(root / "out"), ConvertOptions(num_shards=6), workers=0, progress=False)
    return str(root / "out")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Episodes ``obs`` float32 [T, 2] (every value distinct, so every window is), in 8 shards."""
    return convert_obs_episodes(tmp_path_factory.mktemp("service-episodes"), EPISODE_LENGTHS, seed=5, num_shards=8)


def _eval_images(path, **kwargs):
    return readers.images(path, batch_size=5, image_size=(16, 16), training=False, drop_remainder=False, **kwargs)


def _keys(batches) -> list[tuple[int, bytes]]:
    """One key per record: its label and its exact decoded pixels (the eval decode is deterministic)."""
    return sorted((int(label), image.tobytes()) for images, labels in batches
                  for image, label in zip(images.numpy(), labels.numpy()))


def _window_keys(batches) -> list[bytes]:
    return sorted(x.tobytes() + y.tobytes() for xs, ys in batches for x, y in zip(xs.numpy(), ys.numpy()))


@pytest.fixture(scope="module")
def reference(photos):
    """The records of one local epoch (no service), each distinct."""
    keys = _keys(_eval_images(photos))
    assert len(keys) == 2 * PER_CLASS and len(set(keys)) == len(keys)
    return keys


def _drain(iterator, into: list, timeout_s: float = EPOCH_TIMEOUT_S) -> None:
    """Reads ``iterator`` to its end in a thread; fails the test, instead of hanging it, if that takes too long."""
    thread = threading.Thread(target=lambda: into.extend(iterator), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the epoch did not end within {timeout_s} s"


def test_eval_reads_every_record_exactly_once_per_epoch(cluster, photos, reference):
    ds = _eval_images(photos, service=cluster)
    for _ in range(2):  # each epoch is a new service job
        assert _keys(ds) == reference


def test_training_crops_on_workers_and_augments_here(cluster, photos):
    ds = readers.images(photos, batch_size=5, image_size=(12, 12), seed=0, drop_remainder=False, service=cluster)
    for _ in range(2):
        batches = list(ds)
        labels = collections.Counter(int(v) for _, labels in batches for v in labels.numpy())
        assert labels == {0: PER_CLASS, 1: PER_CLASS}
        for images, _ in batches:
            assert images.dtype == tf.float32 and images.shape[1:] == (12, 12, 3)
            assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0


def test_parallel_epochs_has_every_worker_read_the_whole_split(cluster, photos, reference):
    ds = _eval_images(photos, service=cluster, processing_mode="parallel_epochs")
    assert _keys(ds) == sorted(reference * 2)


def test_a_shared_job_name_splits_one_epoch_between_clients(cluster, photos, reference):
    a, b = (iter(_eval_images(photos, service=cluster, service_job_name="shared-epoch")) for _ in range(2))
    got, live = [], [a, b]
    while live:  # alternate, as two trainers would
        for it in list(live):
            try:
                got.append(next(it))
            except StopIteration:
                live.remove(it)
    assert _keys(got) == reference  # one epoch between them, not one each


def test_streamed_windows_through_the_service_are_the_local_windows(cluster, runs):
    local = _window_keys(readers.windows(runs, batch_size=8, resident=False, shuffle=False, drop_remainder=False,
                                         **WINDOW))
    assert len(local) == readers.info(runs).num_windows("train", 5, 1, horizon=2) == len(set(local))
    remote = readers.windows(runs, batch_size=8, resident=False, shuffle=True, drop_remainder=False, seed=0,
                             service=cluster, **WINDOW)
    assert _window_keys(remote) == local


def test_the_client_fails_the_epoch_after_an_overwrite_naming_the_dataset(cluster, tmp_path):
    """The workers cannot run the epoch check's Python (nor the shard guard's): they read what OUT holds when each
    epoch's job starts, so the client checks OUT before each epoch (the new dataset was read silently before)."""
    out = str(tmp_path / "out")
    for name, seed in (("a", 0), ("b", 1000)):
        make_tree(str(tmp_path / name), per_class=3, seed=seed)
    convert_images(str(tmp_path / "a"), out, ConvertOptions(num_shards=2), workers=0, progress=False)
    runs = convert_obs_episodes(tmp_path / "runs", [20, 30], seed=1, num_shards=2)
    pipelines = {out: _eval_images(out, service=cluster),
                 runs: readers.windows(runs, batch_size=4, resident=False, service=cluster, **WINDOW)}
    for ds in pipelines.values():
        assert len(list(ds)) > 0
    convert_images(str(tmp_path / "b"), out, ConvertOptions(num_shards=2), workers=0, progress=False, overwrite=True)
    convert_episode_tree(os.path.join(os.path.dirname(runs), "src"), runs, num_shards=1, overwrite=True)
    for path, ds in pipelines.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path}: the dataset changed since the pipeline"):
            list(ds)


def test_a_stopped_worker_loses_at_most_its_share_once_it_is_back(runs):
    """TF 2.21: the client waits for a stopped worker until one is back at its address (no timeout gives up on it);
    then the epoch ends. distributed_epoch is at-most-once: the stopped worker's files in flight are lost, none
    repeats."""
    ports = (_free_port(), _free_port())
    dispatcher, workers = _start_cluster(ports)
    try:
        options = {"batch_size": 4, "resident": False, "shuffle": False, "drop_remainder": False, **WINDOW}
        local = set(_window_keys(readers.windows(runs, **options)))
        ds = readers.windows(runs, service=dispatcher.target, **options)
        iterator = iter(ds)
        got = [next(iterator) for _ in range(3)]
        workers[0].stop()  # mid-epoch: each worker still has most of its share to read
        workers[0] = service_lib.start_worker(dispatcher.target, ports[0], "localhost:%port%")
        _drain(iterator, got)
        keys = _window_keys(got)
        assert len(set(keys)) == len(keys)  # nothing twice
        assert set(keys) <= local  # and nothing made up
    finally:
        for server in (*workers, dispatcher):
            server.stop()


@pytest.mark.parametrize("address", ["head", "head:", ":5050", "http://head:5050", "grpc://head:0", "head:65536",
                                     "head:50a", "grpc://head:5050/x", " head:5050", ""])
def test_a_malformed_address_is_named(tmp_path, address):
    with pytest.raises(ValueError, match=f"got service={address!r}"):
        readers.images(str(tmp_path / "nowhere"), batch_size=4, service=address)  # checked before any read


@pytest.mark.parametrize("address, expected", [
    ("grpc://head:5050", ("head", 5050)), ("head:5050", ("head", 5050)), ("localhost:1", ("localhost", 1)),
    ("10.0.0.7:65535", ("10.0.0.7", 65535)), ("[::1]:5050", ("[::1]", 5050)),
    ("node-7.cluster:80", ("node-7.cluster", 80)),
])
def test_addresses_parse(address, expected):
    assert service_lib.parse_address(address) == expected
    assert service_lib.ServiceOptions(address).target == f"grpc://{expected[0]}:{expected[1]}"


def test_cache_and_service_do_not_mix(tmp_path):
    with pytest.raises(ValueError, match="cache: not with service="):
        readers.images(str(tmp_path / "nowhere"), batch_size=4, cache="memory", service="localhost:5050")


def test_resident_windows_stay_local(tmp_path):
    with pytest.raises(ValueError, match="resident windows stay local by design"):
        readers.windows(str(tmp_path / "nowhere"), length=4, batch_size=2, service="localhost:5050")


@pytest.mark.parametrize("kwargs, message", [
    ({"service": "localhost:5050", "processing_mode": "distributed"}, "got processing_mode='distributed'"),
    ({"processing_mode": "off"}, "got processing_mode='off'"),
    ({"service": "localhost:5050", "service_job_name": ""}, "service_job_name must be a non-empty string"),
    ({"service_job_name": "job"}, "service_job_name is for service="),
])
def test_service_options_are_checked_up_front(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        readers.images(str(tmp_path / "nowhere"), batch_size=4, **kwargs)


def test_several_input_pipelines_must_share_a_job(tmp_path):
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=2)
    with pytest.raises(ValueError, match="pass one service_job_name"):
        readers.images(str(tmp_path / "nowhere"), batch_size=4, input_context=context, service="localhost:5050")
    with pytest.raises(ValueError, match="pass one service_job_name"):
        readers.windows(str(tmp_path / "nowhere"), length=4, batch_size=2, resident=False, input_context=context,
                        service="localhost:5050")


def test_server_arguments_are_checked():
    with pytest.raises(ValueError, match="fault_tolerant needs a work_dir"):
        service_lib.start_dispatcher(0, fault_tolerant=True)
    with pytest.raises(ValueError, match="port must be an integer"):
        service_lib.start_dispatcher(70000)
    with pytest.raises(ValueError, match="got dispatcher='head'"):
        service_lib.start_worker("head")
    with pytest.raises(ValueError, match="worker_address: must be HOST:PORT"):
        service_lib.start_worker("head:5050", worker_address="head")


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_cli_service_help(cli, command):
    result = cli("service", command, "--help")
    assert result.exit_code == 0, result.output
    assert "--port" in result.output


def test_cli_worker_names_a_bad_dispatcher_in_one_line(cli):
    result = cli("service", "worker", "--dispatcher", "nonsense")
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "'nonsense'" in result.output


@pytest.mark.slow
def test_cli_dispatcher_serves_workers_and_readers_until_ctrl_c(photos, reference, tmp_path):
    port = _free_port()
    with open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", "from tfshard import cli; cli.main()", "service", "dispatcher", "--port", str(port)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    worker = None
    try:
        first = []
        _drain((process.stdout.readline() for _ in range(1)), first, timeout_s=EPOCH_TIMEOUT_S)
        assert f":{port}; add workers with `tfshard service worker --dispatcher" in first[0], first[0]
        worker = service_lib.start_worker(f"localhost:{port}", 0, "localhost:%port%")
        assert _keys(_eval_images(photos, service=f"grpc://localhost:{port}")) == reference
        process.send_signal(signal.SIGINT)  # Ctrl-C: stopped as every command is, 130 and its one line
        assert process.wait(timeout=EPOCH_TIMEOUT_S) == 130
        assert process.stdout.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
        if worker is not None:
            worker.stop()
    with open(tmp_path / "stderr") as stderr:
        assert stderr.read() == "dispatcher: interrupted\n"


@pytest.mark.slow
def test_a_worker_process_caches_shards_on_its_own_host(photos, reference, tmp_path):
    """A `tfshard service worker` in its own process runs the shard cache's fetch from the graph it is shipped: the
    copies land in shard_cache there (verified, named by sha256), the records are the local ones, and the worker
    holds a copy only while it reads it."""
    dispatcher = service_lib.start_dispatcher(0)
    with open(tmp_path / "stderr", "w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-c", "from tfshard import cli; cli.main()", "service", "worker", "--dispatcher",
             dispatcher.target.split("://", 1)[1], "--port", "0", "--worker-address", "localhost:%port%"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    try:
        first = []
        _drain((worker.stdout.readline() for _ in range(1)), first, timeout_s=EPOCH_TIMEOUT_S)
        assert "worker: serving at" in first[0], first[0]
        cache = tmp_path / "cache"
        got = []
        _drain(iter(_eval_images(photos, service=dispatcher.target, shard_cache=str(cache))), got)
        assert _keys(got) == reference
        copies = sorted(os.listdir(cache / "shards"))
        manifest = readers.info(photos).manifest
        assert copies == sorted(f"{s.sha256}.tfrecord" for s in manifest.splits["train"].shards)
        assert os.listdir(cache / "parts") == []
        assert os.listdir(cache / "pins") == []  # released after each read: nothing held once the epoch is over
        got = []
        _drain(iter(_eval_images(photos, service=dispatcher.target, shard_cache=str(cache))), got)
        assert _keys(got) == reference
    finally:
        worker.send_signal(signal.SIGTERM)  # what Kubernetes or Slurm sends: 143 and its one line
        try:
            worker.wait(timeout=EPOCH_TIMEOUT_S)
        finally:
            if worker.poll() is None:
                worker.kill()
        dispatcher.stop()
    assert worker.returncode == 143
    with open(tmp_path / "stderr") as stderr:
        assert stderr.read() == "worker: terminated (SIGTERM)\n"
