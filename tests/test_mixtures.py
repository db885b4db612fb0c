"""readers.images and readers.episodes on the index-driven stream (issue 32): mixtures of datasets, class balance, a
global shuffle and elastic resume, read back from real converted datasets and checked against what
``readers/sampling`` predicts."""

from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    convert_image_tree,
    flat_jpegs,
    make_tree,
    random_episodes,
    save_episodes,
    write_text,
)
from shard_cache_helpers import LIMIT, copies, manifest_shards
from tfshard import readers
from tfshard.ingest import EpisodeOptions, ImageOptions
from tfshard.readers import python_steps
from tfshard.readers.indexed import stream as stream_lib
from tfshard.readers.sampling import classes as sampling_classes
from tfshard.readers.sampling.plan import StreamSpec, epoch_order, shares
from tfshard.readers.shard_cache import pipeline as shard_cache_pipeline

SIZE = 16


@pytest.fixture(params=[None, 4], ids=["epoch-chunks", "small-chunks"])
def chunk_elements(request, monkeypatch):
    """The stream's chunks as they are (an epoch here), or of at most 4 elements (one step each), as an epoch of more
    than ``CHUNK_ELEMENTS`` is read: the same elements either way."""
    if request.param is not None:
        monkeypatch.setattr(stream_lib, "CHUNK_ELEMENTS", request.param)
    return request.param


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Three converted datasets: ``a`` (cat 7, dog 7; 3 shards, located by scanning the framing), ``b`` (dog 3,
    emu 3; one shard with a DALI index file), ``tilted`` (big 20, small 2: 10:1)."""
    root = tmp_path_factory.mktemp("mixtures")
    make_tree(root / "a", classes=("cat", "dog"), per_class=7)
    make_tree(root / "b", classes=("dog", "emu"), per_class=3, seed=100)
    make_tree(root / "t", classes=("big",), per_class=20, seed=200)
    make_tree(root / "t", classes=("small",), per_class=2, seed=300)
    convert_image_tree(root / "a", root / "A", num_shards=3)
    convert_image_tree(root / "b", root / "B", index=True)
    convert_image_tree(root / "t", root / "T", num_shards=2)
    return {"a": str(root / "A"), "b": str(root / "B"), "tilted": str(root / "T")}


def _digest(image) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:16]


def _records(path) -> list[str]:
    """Each record's identity (its centre crop's hash), in record order, by today's reader."""
    return [digest for digest, _ in _labelled(path)]


def _labelled(path) -> list[tuple[str, int]]:
    """``(identity, label)`` of each record, in record order, by today's reader."""
    ds = readers.images(path, batch_size=64, image_size=SIZE, training=False, num_parallel_reads=1)  # shard order
    return [(_digest(image), int(label)) for images, labels in ds for image, label in zip(images.numpy(),
                                                                                        labels.numpy())]


def _read(ds, steps=None) -> list[tuple[str, int, int]]:
    """``(image hash, label, source)`` of every element of a ``with_source=True`` dataset, in order."""
    out = []
    for images, labels in ds.take(steps) if steps is not None else ds:
        for image, label, source in zip(images.numpy(), labels["label"].numpy(), labels["source"].numpy()):
            out.append((_digest(image), int(label), int(source)))
    return out


@contextlib.contextmanager
def _in_memory_bucket(bucket: str, path: str):
    """``path``'s files (not its folders) copied to ``bucket`` on ``ram://``, TensorFlow's in-memory filesystem,
    which stands in for ``gs://``; removed afterwards."""
    tf.io.gfile.makedirs(bucket)
    try:
        for name in tf.io.gfile.listdir(path):
            if not tf.io.gfile.isdir(f"{path}/{name}"):
                tf.io.gfile.copy(f"{path}/{name}", f"{bucket}/{name}", overwrite=True)
        yield bucket
    finally:
        tf.io.gfile.rmtree(bucket)


# --- mixtures ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch_size", [20, 40])
def test_mixture_gives_each_source_its_share_and_every_record_once_a_pass(sets, epoch_size, chunk_elements):
    a, b = _records(sets["a"]), _records(sets["b"])
    ds = readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, training=False, shuffle="global",
                        seed=5, weights=[0.7, 0.3], epoch_size=epoch_size, with_source=True)
    assert len(ds) == epoch_size // 4
    got = _read(ds)
    counts = collections.Counter(source for _, _, source in got)
    assert [counts[0], counts[1]] == list(shares(StreamSpec(sizes=(14, 6), weights=(0.7, 0.3),
                                                            epoch_size=epoch_size)))
    passes = epoch_size // 20  # both shares are whole passes here: 14·k and 6·k
    assert collections.Counter(h for h, _, s in got if s == 0) == collections.Counter(a * passes)
    assert collections.Counter(h for h, _, s in got if s == 1) == collections.Counter(b * passes)


def test_mixture_merges_class_names_by_name(sets):
    got = _read(readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, training=False, seed=0,
                               weights=[1, 1], epoch_size=12, with_source=True))
    # merged names: cat 0, dog 1, emu 2; b's dog (its 0) is 1, its emu (its 1) is 2
    b_labels = {digest: [1, 2][label] for digest, label in _labelled(sets["b"])}
    a_labels = dict(_labelled(sets["a"]))
    for digest, label, source in got:
        assert label == (a_labels if source == 0 else b_labels)[digest]


def test_mixture_is_seeded(sets):
    def run(seed):
        ds = readers.images([sets["a"], sets["b"]], batch_size=4, image_size=SIZE, seed=seed, weights=[0.7, 0.3],
                            with_source=True)
        return _read(ds)

    first = run(3)
    assert run(3) == first
    assert run(4) != first


# --- class balance -------------------------------------------------------------------------------------------------


def test_balance_gives_every_class_an_equal_share_each_epoch(sets):
    ds = readers.images(sets["tilted"], batch_size=2, image_size=SIZE, seed=1, balance="class", repeat=True)
    labels = [int(x) for _, batch in ds.take(3 * 22 // 2) for x in batch.numpy()]
    for epoch in range(3):
        counts = collections.Counter(labels[epoch * 22:(epoch + 1) * 22])
        assert abs(counts[0] - counts[1]) <= 1 and sum(counts.values()) == 22


# --- global shuffle ------------------------------------------------------------------------------------------------


def test_global_shuffle_is_the_permutation_sampling_predicts(sets, chunk_elements):
    records = _records(sets["a"])
    ds = readers.images(sets["a"], batch_size=2, image_size=SIZE, training=False, shuffle="global", seed=9,
                        repeat=True, with_source=True)
    got = [h for h, _, _ in _read(ds, steps=14)]
    spec = StreamSpec(sizes=(14,), shuffle=True, seed=9)
    for epoch in range(2):
        epoch_got = got[epoch * 14:(epoch + 1) * 14]
        assert sorted(epoch_got) == sorted(records)
        assert epoch_got == [records[r] for r in epoch_order(spec, epoch)[1]]
    assert got[:14] != got[14:]


def test_balance_is_the_order_sampling_predicts(sets):
    records, ids = zip(*_labelled(sets["tilted"]))
    ids = np.array(ids)
    spec, members = sampling_classes.balanced(ids, 2, shuffle=False, seed=4)  # training=False: in stream order
    ds = readers.images(sets["tilted"], batch_size=2, image_size=SIZE, training=False, balance="class", seed=4,
                        with_source=True)
    assert [h for h, _, _ in _read(ds)] == [records[r] for r in members.record(*epoch_order(spec, 0))]


# --- elastic resume -------------------------------------------------------------------------------------------------


def _stream(path, replicas, start, steps, global_batch=6, **kwargs):
    """The global batches of steps ``[start, start + steps)`` read by ``replicas`` plain input pipelines (each its
    slice, concatenated in replica order)."""
    batches = []
    for r in range(replicas):
        context = tf.distribute.InputContext(replicas, r, replicas)
        ds = readers.images(path, batch_size=global_batch // replicas, image_size=SIZE, seed=2, repeat=True,
                            start_step=start, input_context=context, shuffle="global", **kwargs)
        batches.append([images.numpy() for images, _ in ds.take(steps)])
    return [np.concatenate([b[s] for b in batches]) for s in range(steps)]


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1), (2, 3)])
@pytest.mark.parametrize("mixture", [False, True], ids=["one", "mixture"])
def test_elastic_resume_on_another_replica_count_reads_the_same_batches(sets, before, after, mixture):
    path = [sets["a"], sets["b"]] if mixture else sets["a"]
    kwargs = {"weights": [0.7, 0.3]} if mixture else {}
    whole = _stream(path, 1, 0, 8, **kwargs)
    resumed = _stream(path, before, 0, 3, **kwargs) + _stream(path, after, 3, 5, **kwargs)
    for step, (one, other) in enumerate(zip(whole, resumed)):
        np.testing.assert_array_equal(one, other, err_msg=f"step {step}")


@pytest.mark.parametrize("augment", ["default", "color"])
def test_augmentation_is_per_element_on_any_replica_count_and_after_a_resume(sets, augment):
    # "default" flips in the decode; "color" flips and jitters each batch, each image by its own seed
    path, kwargs = [sets["a"], sets["b"]], {"weights": [0.7, 0.3], "augment": augment}
    whole = _stream(path, 1, 0, 6, **kwargs)
    for replicas in (2, 3):
        for step, (one, other) in enumerate(zip(whole, _stream(path, replicas, 0, 6, **kwargs))):
            np.testing.assert_array_equal(one, other, err_msg=f"step {step} on {replicas} replicas")
    resumed = _stream(path, 2, 0, 2, **kwargs) + _stream(path, 3, 2, 4, **kwargs)
    for step, (one, other) in enumerate(zip(whole, resumed)):
        np.testing.assert_array_equal(one, other, err_msg=f"step {step}, resumed at step 2")
    if augment == "color":  # the jitter ran: not the default recipe's images
        assert not np.array_equal(whole[0], _stream(path, 1, 0, 1, weights=[0.7, 0.3])[0])


def test_a_callable_augment_on_the_stream_resumes_exactly_on_the_same_replica_count(sets):
    def dim(images, seed):  # one number per pipeline batch, from its seed
        return images * tf.random.stateless_uniform([], seed, 0.5, 1.0)

    whole = _stream(sets["a"], 2, 0, 5, augment=dim)
    resumed = _stream(sets["a"], 2, 0, 2, augment=dim) + _stream(sets["a"], 2, 2, 3, augment=dim)
    for step, (one, other) in enumerate(zip(whole, resumed)):
        np.testing.assert_array_equal(one, other, err_msg=f"step {step}, resumed at step 2")


def test_elastic_resume_under_mirrored_strategies(sets, strategies):
    whole = _stream(sets["a"], 1, 0, 6)

    def run(strategy, start, steps, from_function):
        def make(context=None):
            batch = 6 if context is None else context.get_per_replica_batch_size(6)
            return readers.images(sets["a"], batch_size=batch, image_size=SIZE, seed=2, repeat=True,
                                  start_step=start, input_context=context, shuffle="global")

        ds = strategy.distribute_datasets_from_function(make) if from_function else \
            strategy.experimental_distribute_dataset(make())
        out, it = [], iter(ds)
        for _ in range(steps):
            images, _ = next(it)
            out.append(np.concatenate([t.numpy() for t in strategy.experimental_local_results(images)]))
        return out

    for from_function in (True, False):
        resumed = run(strategies[2], 0, 2, from_function) + run(strategies[3], 2, 4, from_function)
        for step, (one, other) in enumerate(zip(whole, resumed)):
            np.testing.assert_array_equal(one, other, err_msg=f"step {step}, from_function={from_function}")


@pytest.mark.parametrize("pipelines, replicas", [(1, 1), (1, 2), (1, 3), (2, 2), (2, 4), (3, 6)])
@pytest.mark.parametrize("drop_remainder", [True, False])
def test_a_pipeline_counts_a_batch_for_each_replica_it_feeds(pipelines, replicas, drop_remainder):
    """One pipeline may feed several replicas (a ``MirroredStrategy``'s one pipeline for every GPU): its length is
    the batches of the elements it reads, a per-replica batch for each replica in each step."""
    batch = 2
    for epoch_size in (1, 5, 12, 13, 23, 24, 37):
        for pipeline in range(pipelines):
            position = stream_lib.Position(pipelines, pipeline, batch * replicas, batch)
            elements = len(position.epoch(0, epoch_size, drop_remainder))
            read = elements // batch if drop_remainder else -(-elements // batch)
            assert position.batches(epoch_size, drop_remainder) == read, (epoch_size, pipeline)


def test_one_epoch_under_a_strategy_of_one_pipeline_for_two_replicas_reads_every_step(sets, episode_sets,
                                                                                      strategies):
    """``distribute_datasets_from_function`` under a 2-replica strategy: one input pipeline yields a batch for each
    replica; its known length counted one a step, and the epoch failed half way ("expected to contain ... but
    contained at least ...")."""
    strategy, global_batch = strategies[2], 4
    images = strategy.distribute_datasets_from_function(lambda context: readers.images(
        sets["a"], batch_size=context.get_per_replica_batch_size(global_batch), image_size=SIZE, seed=2,
        input_context=context, shuffle="global"))
    for _ in range(2):  # two epochs, each to its end
        assert sum(1 for _ in images) == 14 // global_batch  # 14 images, drop_remainder in training
    episodes = strategy.distribute_datasets_from_function(lambda context: readers.episodes(
        episode_sets["a"], seed=2, input_context=context, shuffle="global"))
    read = [data.numpy() for step in episodes for data in strategy.experimental_local_results(step["data"])]
    lengths = sorted(len(data) for data in read if len(data))  # the strategy pads the last step's empty replica
    assert lengths == sorted([5, 9, 3, 12, 7, 1, 8])  # every episode of the epoch, once


@pytest.mark.parametrize("rewrite, problem", [
    (lambda text: text.replace(b"\n", b" 7\n", 1), "index file is not lines of 'offset size'"),
    (lambda text: text.replace(b" ", b" x", 1), "index file is not lines of 'offset size'"),
    (lambda text: text.replace(b"0 ", b"99999999999999999999 ", 1), "index file is not lines of 'offset size'"),
    (lambda text: b"\n".join(text.splitlines()[:-1]) + b"\n", "index file does not fit its shard (got 5 records, the "
     "manifest counts 6)"),
    (lambda text: text.replace(b"0 ", b"99999999 ", 1), "index file does not fit its shard (got offsets that do not "
     "rise"),
    (None, "index file is not the one the manifest records"),
], ids=["a line of three", "not a number", "past int64", "a record short", "offsets out of order",
        "not the manifest's"])
def test_an_index_file_that_is_not_its_shards_is_refused_naming_it(sets, tmp_path, rewrite, problem):
    out = tmp_path / "B"
    shutil.copytree(sets["b"], out)
    manifest = json.loads((out / "dataset.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]
    index = out / shard["index_file"]
    text = index.read_bytes()
    if rewrite is None:
        index.write_bytes(text + b"0 16\n")  # the manifest keeps the old sha256
    else:
        index.write_bytes(rewrite(text))
        shard["index_sha256"] = hashlib.sha256(index.read_bytes()).hexdigest()
        (out / "dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=re.escape(f"{index}: {problem}")):
        readers.images(str(out), batch_size=2, image_size=SIZE, shuffle="global")


def test_a_corrupt_record_read_by_position_fails_its_crc_naming_the_shard(sets, tmp_path):
    """Read by position, a record's data is checked against the CRC32C its framing stores, as TensorFlow's reader
    checks it (here one byte of a JPEG's quantisation table, which would decode, to other pixels)."""
    out = tmp_path / "A"
    shutil.copytree(sets["a"], out)
    shard = out / json.loads((out / "dataset.json").read_text())["splits"]["train"]["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[data.index(b"\xff\xd8") + 60] ^= 1
    shard.write_bytes(data)
    ds = readers.images(str(out), batch_size=2, image_size=SIZE, seed=0, shuffle="global")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{shard}: record at byte ") + r"\d+ is corrupt "
                       r"\(its data fails the CRC32C its framing stores\); run `tfshard verify`"):
        for _ in ds:
            pass


# A script that ends with iterators of streams still open while a Python step of each pipeline is in flight (each
# pipeline's reads after its first are made slow, and the script ends once all three are in one): held in its
# globals, captured by a tf.function, and a distributed iterator over two devices (a multi-device one), all frozen
# by gc.freeze() as the CLI ends. With the real reads and timing, 5 of 6 runs of such a script on 1,000 images hung
# on the first alone.
_SCRIPT_ENDING_MID_STREAM = """
import sys, threading, time
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tfshard import readers
from tfshard.readers.indexed import records
real, lock, in_flight = records.pread_batch, threading.Lock(), []
def slow_pread_batch(files, identities):
    read, calls = real(files, identities), []
    def slowly(*args):
        calls.append(1)
        if len(calls) == 2:
            with lock:
                in_flight.append(1)
        if len(calls) > 1:
            time.sleep(2)
        return read(*args)
    return slowly
records.pread_batch = slow_pread_batch
def stream():
    return readers.images(sys.argv[1], batch_size=8, image_size=16, seed=0, shuffle="global", repeat=True)
it = iter(stream())
next(it)
captured = iter(stream())
@tf.function
def step():
    return tf.reduce_sum(next(captured)[0])
step()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
distributed = iter(strategy.experimental_distribute_dataset(stream()))
next(distributed)
deadline = time.monotonic() + 60
while len(in_flight) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
import gc
gc.freeze()  # as the CLI ends (console.exiting): the garbage collector's list then leaves out every object
print("reads in flight:", len(in_flight))
"""


def test_a_script_that_ends_mid_stream_exits(sets):
    """Python lets no other thread take the GIL once it is finalizing; a pipeline's Python step that asks for it then
    never returns, and the iterator's destructor, run as the script's globals are cleared, waited for it for ever.
    The readers leave the iterators still open at exit to the process's end (``readers/python_steps.py``)."""
    # As users run it: jax importable (tests/child_site refuses it to TensorFlow's import; without jax, this script
    # went through 4 of 4 without the fix, and the real one hung 1 of 4 times instead of 3 of 4)
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.basename(p) != "child_site"]
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT_ENDING_MID_STREAM, sets["a"]], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    except subprocess.TimeoutExpired:
        pytest.fail("a script ending with iterators of streams open hung at exit")
    assert done.returncode == 0 and "reads in flight: 3" in done.stdout, done.stdout + done.stderr[-2000:]


def test_keep_open_iterators_keeps_each_open_iterator_once_and_usable():
    first, second = iter(tf.data.Dataset.range(3)), iter(tf.data.Dataset.range(3))
    assert next(first) == 0
    assert python_steps.keep_open_iterators() >= 2
    assert python_steps.keep_open_iterators() == 0
    assert [int(x) for x in first] == [1, 2] and [int(x) for x in second] == [0, 1, 2]


# --- errors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights, problem", [
    ([1.0], "weights: must give one weight per source, 2 (got 1 weights"),
    ([0.7, -0.3], "weights: must be positive finite numbers (got weights=[0.7, -0.3])"),
    ([0.7, float("nan")], "weights: must be positive finite numbers (got weights=[0.7, nan])"),
    ([5e-324, 5e-324], "weights: must be positive finite numbers (got weights=[5e-324, 5e-324])"),
], ids=["length", "negative", "nan", "subnormal"])
def test_bad_weights_are_one_line(sets, weights, problem):
    with pytest.raises(ValueError, match=re.escape(f"{sets['a']} + {sets['b']}: {problem}")) as caught:
        readers.images([sets["a"], sets["b"]], batch_size=2, weights=weights)
    assert "\n" not in str(caught.value)


def test_balance_on_value_labels_is_refused(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, ["a", "b", "c"])
    rows = "path,age\na.jpg,1.5\nb.jpg,2\nc.jpg,3\n"
    convert_image_tree(src, out, image=ImageOptions(labels_file=write_text(tmp_path / "l.csv", rows)), seed=None)
    with pytest.raises(ValueError, match=re.escape(f"{out}: balance='class' needs one class per image (got 'value' "
                                                   "labels)")):
        readers.images(str(out), batch_size=1, balance="class")


def test_mixture_of_label_kinds_is_refused_naming_both(sets, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    flat_jpegs(src, ["a", "b"])
    rows = write_text(tmp_path / "l.csv", "path,age\na.jpg,1.5\nb.jpg,2.5\n")
    convert_image_tree(src, out, image=ImageOptions(labels_file=rows), seed=None)
    with pytest.raises(ValueError, match=re.escape(f"{out}: its labels are not {sets['a']}'s")):
        readers.images([sets["a"], str(out)], batch_size=1)


def test_remote_with_index_files_reads_the_same_stream(sets):
    # records read one FixedLengthRecordDataset each
    with _in_memory_bucket("ram://mixtures-indexed", sets["b"]) as bucket:
        arguments = {"batch_size": 2, "image_size": SIZE, "seed": 1, "with_source": True, "shuffle": "global"}
        assert _read(readers.images(bucket, **arguments)) == _read(readers.images(sets["b"], **arguments))


def test_remote_global_shuffle_through_the_shard_cache_reads_each_record_once_an_epoch(sets, tmp_path):
    # no index files: without the cache the bucket is refused (below); its verified local copies are read instead
    records, directory = _records(sets["a"]), str(tmp_path / "cache")
    arguments = {"batch_size": 2, "image_size": SIZE, "training": False, "seed": 1, "with_source": True,
                 "shuffle": "global", "repeat": True}  # centre crops: each element is its record's identity
    with _in_memory_bucket("ram://mixtures-cached", sets["a"]) as bucket:
        ds = readers.images(bucket, shard_cache=directory, shard_cache_limit=LIMIT, **arguments)
        store = shard_cache_pipeline.store_for(directory, LIMIT)
        fetched = store.downloaded_bytes
        got = _read(ds, steps=2 * 7)
    assert copies(directory) == {s.sha256 for s in manifest_shards(sets["a"])}
    assert fetched == sum(s.size for s in manifest_shards(sets["a"])) == store.downloaded_bytes  # once, up front
    for epoch in range(2):
        assert sorted(h for h, _, _ in got[epoch * 14:(epoch + 1) * 14]) == sorted(records)
    assert got == _read(readers.images(sets["a"], **arguments), steps=2 * 7)


def test_a_stream_keeps_its_shard_cache_copies_pinned_and_reads_on_while_another_reader_fetches_them(sets, tmp_path):
    """The copies stay pinned while the pipeline lives (its sessions were dropped after the build, so another
    process could evict them under it) and are released with it, and a second reader's fetch of them (which touches
    each copy, moving its ctime) does not fail the first one's reads."""
    records, directory = _records(sets["a"]), str(tmp_path / "cache")
    arguments = {"batch_size": 2, "image_size": SIZE, "training": False, "seed": 1, "with_source": True,
                 "shuffle": "global", "shard_cache": directory, "shard_cache_limit": LIMIT}
    with _in_memory_bucket("ram://mixtures-pinned", sets["a"]) as bucket:
        ds = readers.images(bucket, **arguments)
        gc.collect()
        pinned = {name.split(".")[0] for name in os.listdir(os.path.join(directory, "pins"))}
        assert pinned == {s.sha256 for s in manifest_shards(sets["a"])}
        iterator = iter(ds)
        first = next(iterator)
        other = readers.images(bucket, **arguments)  # fetches the same copies again
        got = _read([first]) + _read(iterator)
        assert sorted(h for h, _, _ in got) == sorted(records)
        assert _read(other) == got
        del ds, iterator, other
        gc.collect()
        assert os.listdir(os.path.join(directory, "pins")) == []  # released with the pipelines


def test_remote_without_index_or_shard_cache_is_refused(sets):
    with _in_memory_bucket("ram://mixtures-remote", sets["a"]) as bucket:
        with pytest.raises(ValueError, match="a remote shard without an index file cannot be read by record position "
                                             r".*convert with --index .*or pass shard_cache=DIR"):
            readers.images(bucket, batch_size=1, shuffle="global")


@pytest.mark.parametrize("arguments, problem", [
    ({"cache": "memory"}, "cache='memory': each epoch reads its records by position"),
    ({"ignore_errors": True}, "ignore_errors=True: a skipped record would shift"),
    ({"deterministic": False}, "deterministic=False: the order is the point"),
    ({"weights": [1, 1], "balance": "class"}, "balance='class' gives every class an equal share"),
    ({"shuffle": "files"}, "shuffle must be one of (None, 'global')"),
])
def test_stream_refuses_what_it_cannot_honour(sets, arguments, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        readers.images([sets["a"], sets["b"]], batch_size=2, **arguments)


# --- episodes ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def episode_sets(tmp_path_factory):
    """Episode datasets of ``data`` float32 [T, 2], split into chunk records of 4 steps: ``a`` (7 episodes, 3 shards,
    located by scanning the framing), ``b`` (3 episodes, one shard with a DALI index file); ``wide`` (2 episodes of
    [T, 3]) and ``gzip`` (compressed) for the refusals."""
    root = tmp_path_factory.mktemp("episode-mixtures")
    chunked = EpisodeOptions(max_record_bytes=32)
    made = {}
    for name, lengths, width, options in [("a", [5, 9, 3, 12, 7, 1, 8], 2, {"num_shards": 3}),
                                          ("b", [6, 2, 10], 2, {"index": True}), ("wide", [3, 4], 3, {}),
                                          ("gzip", [3, 4], 2, {"compression": "gzip"})]:
        save_episodes(root / name, {f"e{i}.npy": e for i, e in enumerate(random_episodes(lengths, len(name), width))})
        convert_episode_tree(root / name, root / name.upper(), episode=chunked, **options)
        made[name] = str(root / name.upper())
    return made


def _default_episodes(path) -> dict[int, np.ndarray]:
    """Each episode's ``data`` by its id, read by today's reader."""
    return {int(keys["episode"]): episode["data"] for keys, episode in readers.episodes(path, with_keys=True)}


def _manifest_order(path) -> list[int]:
    """The episode ids in manifest (record) order: today's reader's order without shuffle_files."""
    return [int(keys["episode"]) for keys, _ in readers.episodes(path, with_keys=True)]


def _episodes_read(ds, count=None) -> list[tuple[int, int, np.ndarray]]:
    """``(source, id, data)`` of the episodes of a ``with_keys=True, with_source=True`` dataset, in order."""
    ds = ds.take(count) if count is not None else ds
    return [(int(episode["source"]), int(keys["episode"]), episode["data"]) for keys, episode in ds]


def test_episodes_global_shuffle_is_the_permutation_sampling_predicts(episode_sets, chunk_elements):
    path = episode_sets["a"]
    default, order = _default_episodes(path), _manifest_order(path)
    ds = readers.episodes(path, shuffle="global", seed=9, repeat=True, with_keys=True, with_source=True)
    got = _episodes_read(ds, 3 * 7)
    spec = StreamSpec(sizes=(7,), shuffle=True, seed=9)
    for epoch in range(3):
        epoch_got = got[epoch * 7:(epoch + 1) * 7]
        assert [i for _, i, _ in epoch_got] == [order[r] for r in epoch_order(spec, epoch)[1]]
        for _, i, data in epoch_got:  # the default reader's episode, all its chunks joined
            np.testing.assert_array_equal(data, default[i])
    assert [i for _, i, _ in got[:7]] != [i for _, i, _ in got[7:14]]


def test_episodes_stream_without_shuffle_is_the_default_readers_order(episode_sets):
    path = episode_sets["a"]
    ds = readers.episodes(path, with_keys=True, with_source=True)
    assert len(ds) == 7
    assert [i for _, i, _ in _episodes_read(ds)] == _manifest_order(path)


@pytest.mark.parametrize("epoch_size", [10, 20])
def test_episode_mixture_gives_exact_shares_and_each_episode_once_a_pass(episode_sets, epoch_size):
    a, b = episode_sets["a"], episode_sets["b"]
    defaults = [_default_episodes(a), _default_episodes(b)]
    ds = readers.episodes([a, b], weights=[0.7, 0.3], epoch_size=epoch_size, shuffle="global", seed=5,
                          with_keys=True, with_source=True)
    assert len(ds) == epoch_size
    got = _episodes_read(ds)
    counts = collections.Counter(source for source, _, _ in got)
    assert [counts[0], counts[1]] == [epoch_size * 7 // 10, epoch_size * 3 // 10]  # 70/30 of 7 + 3 episodes
    passes = epoch_size // 10  # the shares are whole passes here: 7·k and 3·k
    for source, default in enumerate(defaults):
        assert collections.Counter(i for s, i, _ in got if s == source) == collections.Counter(list(default) * passes)
    for source, i, data in got:
        np.testing.assert_array_equal(data, defaults[source][i])


def _episode_stream(path, replicas, start, count, **kwargs) -> list[tuple[int, int]]:
    """``(source, id)`` of ``count`` groups of ``replicas`` episodes from episode ``start`` of the stream, read by
    ``replicas`` plain input pipelines (each its part of every group, in replica order)."""
    parts = []
    for r in range(replicas):
        context = tf.distribute.InputContext(replicas, r, replicas)
        ds = readers.episodes(path, seed=2, repeat=True, start_step=start, input_context=context, shuffle="global",
                              with_keys=True, with_source=True, **kwargs)
        parts.append([(s, i) for s, i, _ in _episodes_read(ds, count)])
    return [parts[r][k] for k in range(count) for r in range(replicas)]


@pytest.mark.parametrize("before, after", [(1, 2), (2, 1), (2, 3)])
@pytest.mark.parametrize("mixture", [False, True], ids=["one", "mixture"])
def test_episodes_elastic_resume_on_another_replica_count(episode_sets, before, after, mixture):
    path = [episode_sets["a"], episode_sets["b"]] if mixture else episode_sets["a"]
    kwargs = {"weights": [0.7, 0.3]} if mixture else {}
    whole = _episode_stream(path, 1, 0, 24, **kwargs)
    consumed = 4 * before  # 4 steps of one episode per replica, then the job stops
    resumed = _episode_stream(path, before, 0, 4, **kwargs) + _episode_stream(path, after, consumed, 5, **kwargs)
    assert resumed == whole[:len(resumed)]


def test_episodes_elastic_resume_under_a_mirrored_strategy(episode_sets, strategies):
    path = episode_sets["a"]
    whole = [data for _, _, data in _episodes_read(readers.episodes(
        path, seed=2, repeat=True, shuffle="global", with_keys=True, with_source=True), 12)]

    def run(strategy, start, steps):
        ds = strategy.distribute_datasets_from_function(lambda context: readers.episodes(
            path, seed=2, repeat=True, start_step=start, input_context=context, shuffle="global"))
        it = iter(ds)
        return [data.numpy() for _ in range(steps) for data in
                strategy.experimental_local_results(next(it)["data"])]

    resumed = run(strategies[2], 0, 2) + run(strategies[3], 4, 2)  # 2 steps on 2 replicas, then 2 on 3
    assert len(resumed) == 10
    for k, (one, other) in enumerate(zip(whole, resumed)):
        np.testing.assert_array_equal(one, other, err_msg=f"episode {k}")


@pytest.fixture(scope="module")
def labelled_episode_sets(tmp_path_factory):
    """Episodes of ``data`` float32 [T, 2] in class folders, chunk records of 4 steps: ``a`` (run, walk; 6 episodes,
    2 shards), ``b`` (run, walk; 4 episodes, one shard with a DALI index file), ``c`` (sit, walk) for the refusal.
    Returns each dataset's path and its episodes' class names by id."""
    root = tmp_path_factory.mktemp("labelled-episode-mixtures")
    made = {}
    for name, classes, lengths, options in [("a", ("run", "walk"), [5, 9, 3, 12, 7, 6], {"num_shards": 2}),
                                            ("b", ("walk", "run"), [6, 2, 10, 4], {"index": True}),
                                            ("c", ("sit", "walk"), [3, 4], {})]:
        episodes = random_episodes(lengths, 10 + len(made), 2)
        save_episodes(root / name, {f"{classes[i % 2]}/e{i}.npy": e for i, e in enumerate(episodes)})
        out = root / name.upper()
        convert_episode_tree(root / name, out, episode=EpisodeOptions(max_record_bytes=32), **options)
        folders = {e.id: e.source.split("/")[0] for e in readers.info(str(out)).manifest.splits["train"].episodes}
        made[name] = (str(out), folders)
    return made


def test_labelled_episode_mixture_gives_each_episode_its_class_and_source(labelled_episode_sets):
    (a, a_folders), (b, b_folders) = labelled_episode_sets["a"], labelled_episode_sets["b"]
    names = ["run", "walk"]  # both sources' class names; a class id is the same name in each
    ds = readers.episodes([a, b], weights=[0.5, 0.5], epoch_size=20, shuffle="global", seed=3, with_keys=True,
                          with_source=True)
    got = [(int(e["source"]), int(keys["episode"]), e["label"]) for keys, e in ds]
    assert collections.Counter(source for source, _, _ in got) == {0: 10, 1: 10}
    for source, episode, label in got:
        assert label.dtype == np.int64
        assert names[int(label)] == (a_folders if source == 0 else b_folders)[episode], (source, episode)


def test_labelled_episode_mixture_of_other_classes_is_refused_naming_both(labelled_episode_sets):
    (a, _), (c, _) = labelled_episode_sets["a"], labelled_episode_sets["c"]
    with pytest.raises(ValueError, match=re.escape(
            f"{c}: its labels are not {a}'s, so one stream cannot hold both (got 'class' labels, classes ")) as caught:
        readers.episodes([a, c], shuffle="global")
    assert "\n" not in str(caught.value)
    assert "'sit'" in str(caught.value) and "'run'" in str(caught.value)


def test_episode_mixture_of_other_features_is_refused_naming_both(episode_sets):
    a, wide = episode_sets["a"], episode_sets["wide"]
    with pytest.raises(ValueError, match=re.escape(
            f"{wide}: its features are not {a}'s, so one stream cannot hold both (got 'data' float32 [3], {a} has "
            "float32 [2]); mix datasets of one feature schema")) as caught:
        readers.episodes([a, wide])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("arguments, problem", [
    ({"weights": [1.0]}, "weights: must give one weight per source, 2 (got 1 weights"),
    ({"weights": [0.7, -0.3]}, "weights: must be positive finite numbers (got weights=[0.7, -0.3])"),
    ({"shuffle_files": True}, "cannot read the index-driven stream (mixtures, a global shuffle, repeat, start_step) "
                              "with shuffle_files=True"),
    ({"start_step": 3}, "start_step=3: cannot resume exactly with repeat=False"),
    ({"repeat": True, "start_step": 3, "shuffle": "global"}, "start_step=3: cannot resume exactly with seed=None"),
], ids=["weights-length", "weights-negative", "shuffle-files", "no-repeat", "no-seed"])
def test_episode_stream_refuses_bad_arguments_in_one_line(episode_sets, arguments, problem):
    a, b = episode_sets["a"], episode_sets["b"]
    with pytest.raises(ValueError, match=re.escape(f"{a} + {b}: {problem}")) as caught:
        readers.episodes([a, b], **arguments)
    assert "\n" not in str(caught.value)


def test_episode_stream_refuses_compressed_and_remote_unindexed_shards(episode_sets):
    gzip = episode_sets["gzip"]
    with pytest.raises(ValueError, match=re.escape(f"{gzip}: records of compressed shards cannot be read by position "
                                                   "(got compression='gzip')")):
        readers.episodes(gzip, shuffle="global")
    with _in_memory_bucket("ram://episode-mixtures-remote", episode_sets["a"]) as bucket:
        with pytest.raises(ValueError, match="a remote shard without an index file cannot be read by record position "
                                             r".*convert with --index .*or pass shard_cache=DIR"):
            readers.episodes(bucket, shuffle="global")


def test_episodes_remote_with_index_files_read_the_same_stream(episode_sets):
    # records read one FixedLengthRecordDataset each
    with _in_memory_bucket("ram://episode-mixtures-indexed", episode_sets["b"]) as bucket:
        arguments = {"seed": 1, "with_source": True, "with_keys": True, "shuffle": "global", "epoch_size": 7}
        remote, local = (_episodes_read(readers.episodes(p, **arguments)) for p in (bucket, episode_sets["b"]))
        assert [(s, i) for s, i, _ in remote] == [(s, i) for s, i, _ in local]
        for (_, _, one), (_, _, other) in zip(remote, local):
            np.testing.assert_array_equal(one, other)
