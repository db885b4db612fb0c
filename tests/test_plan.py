"""The pure shard plan: golden tables and exhaustive small products against an oracle."""

import itertools
import math
import os
import sys

import pytest
from tfshard.format.names import index_file_name, shard_file_name
from tfshard.ingest.plan import (
    ShardSpec,
    count_shards,
    parse_size,
    plan_split,
    shard_boundaries,
    shuffled_order,
)


@pytest.mark.parametrize(
    "text, expected",
    [("64MiB", 64 * 2**20), ("1GB", 10**9), ("1gib", 2**30), ("500000", 500000), ("1.5 KiB", 1536), (4096, 4096)],
)
def test_parse_size_golden(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MiB", "12 parsecs", "-5MB", "0", 0])
def test_parse_size_rejects_with_the_value_and_an_example(bad):
    with pytest.raises(ValueError, match="shard size") as info:
        parse_size(bad)
    assert repr(bad) in str(info.value) and ("e.g." in str(info.value))


def test_shard_file_names():
    assert shard_file_name("train", 3, 10) == "train-00003-of-00010.tfrecord"
    assert shard_file_name("val", 0, 1, "gzip") == "val-00000-of-00001.tfrecord.gz"
    assert index_file_name("val-00000-of-00001.tfrecord") == "val-00000-of-00001.idx"


@pytest.mark.parametrize(
    "total, records, kwargs, expected",
    [
        (300 * 2**20, 5000, {}, 3),  # ceil(300 / 128)
        (128 * 2**20, 5000, {}, 1),  # exactly one target
        (1, 5000, {}, 1),
        (10**6, 100, {"target_bytes": 10**5}, 10),
        (10**6, 100, {"target_bytes": 10**5, "num_shards": 4}, 4),  # num_shards wins over the target
        (10**6, 100, {"target_bytes": 10**5, "min_shards": 16}, 16),  # min_shards raises the floor
        (10**6, 100, {"num_shards": 2, "min_shards": 8}, 8),  # ... also over num_shards
        (10**9, 3, {"target_bytes": 10}, 3),  # huge records: one per shard, never an empty shard
    ],
)
def test_count_shards_golden(total, records, kwargs, expected):
    assert count_shards(total, records, **kwargs) == expected


def test_count_shards_refuses_more_shards_than_records():
    with pytest.raises(ValueError, match="only 3 records.*at most 3 shards"):
        count_shards(100, 3, min_shards=4)
    with pytest.raises(ValueError, match="num_shards=5"):
        count_shards(100, 3, num_shards=5)


@pytest.mark.parametrize("kwargs", [{"target_bytes": 0}, {"num_shards": 0}, {"min_shards": 0}])
def test_count_shards_validates_arguments(kwargs):
    with pytest.raises(ValueError, match=list(kwargs)[0]):
        count_shards(10, 10, **kwargs)


def _oracle_is_valid(sizes, num_shards, bounds):
    """Contiguous, complete, non-empty, and no shard exceeds the ideal share by more than one record."""
    if bounds[0] != 0 or bounds[-1] != len(sizes) or len(bounds) != num_shards + 1:
        return False
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        return False
    ideal = sum(sizes) / num_shards
    biggest = max(sizes)
    return all(sum(sizes[a:b]) <= ideal + biggest for a, b in zip(bounds, bounds[1:]))


def test_shard_boundaries_exhaustive_small_products():
    for n in range(1, 7):
        for sizes in itertools.product([1, 2, 7, 50], repeat=n):
            for shards in range(1, n + 1):
                bounds = shard_boundaries(list(sizes), shards)
                assert _oracle_is_valid(sizes, shards, bounds), (sizes, shards, bounds)


def test_shard_boundaries_balance_equal_sizes_like_even_split():
    for n in range(1, 40):
        for shards in range(1, n + 1):
            bounds = shard_boundaries([1] * n, shards)
            lengths = [b - a for a, b in zip(bounds, bounds[1:])]
            assert max(lengths) - min(lengths) <= 1, (n, shards, lengths)


def test_plan_split_covers_every_record_once_in_order():
    sizes = [(i * 7919) % 1000 + 1 for i in range(1000)]
    specs = plan_split("train", sizes, target_bytes=50_000)
    assert len(specs) == math.ceil(sum(sizes) / 50_000)
    positions = [p for s in specs for p in range(s.start, s.stop)]
    assert positions == list(range(1000))
    assert [s.index for s in specs] == list(range(len(specs)))
    assert all(s.planned_bytes == sum(sizes[s.start : s.stop]) for s in specs)
    assert specs[-1].file_name == f"train-{len(specs) - 1:05d}-of-{len(specs):05d}.tfrecord"


def test_shard_spec_checks_itself():
    with pytest.raises(ValueError, match="index"):
        ShardSpec("train", 2, 2, 0, 1, 1, "x")
    with pytest.raises(ValueError, match="start=3"):
        ShardSpec("train", 0, 1, 3, 3, 0, "x")


def test_shuffled_order_is_a_seeded_permutation():
    assert shuffled_order(5, None) == [0, 1, 2, 3, 4]
    a, b, c = shuffled_order(100, 1), shuffled_order(100, 1), shuffled_order(100, 2)
    assert a == b and a != c and sorted(a) == list(range(100)) and a != list(range(100))


def test_pure_core_never_imports_tensorflow():
    import subprocess

    code = (
        "import sys; import tfshard.ingest, tfshard.ingest.plan, tfshard.ingest.scan, tfshard.ingest.images, "
        "tfshard.format.manifest, tfshard.ingest.parallel, tfshard.tools.demo_data, tfshard.ingest.episodes, "
        "tfshard.format.storage, tfshard.format.manifest, tfshard.format.records, tfshard.format.names, "
        "tfshard.format.tfrecord, tfshard.ingest.examples, tfshard.ingest.kinds.images, tfshard.ingest.kinds.episodes, "
        "tfshard.ingest.job_plan, tfshard.ingest.options; print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # readers/ is a TensorFlow package, but its window arithmetic module is plain numpy: load it on its own.
    code = (
        "import importlib.util, sys; "
        "spec = importlib.util.spec_from_file_location('starts', 'readers/windowing/starts.py'); "
        "module = importlib.util.module_from_spec(spec); sys.modules['starts'] = module; "
        "spec.loader.exec_module(module); print('tensorflow' in sys.modules)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"
