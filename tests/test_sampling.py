"""The stream arithmetic of ``readers/sampling/``: shares, passes, epoch orders, class balance and elastic slicing,
against oracles written plainly here over exhaustive small products, and golden tables that catch a change of RNG."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from tfshard.readers.sampling import slicing
from tfshard.readers.sampling.classes import balanced, class_weights
from tfshard.readers.sampling.permute import EXACT_UP_TO, mix_key, permute
from tfshard.readers.sampling.plan import (
    MAX_EPOCH_SIZE,
    StreamSpec,
    element,
    elements,
    epoch_order,
    shares,
    source_records,
)

EPOCHS = 5
SIZES = [(1,), (3,), (2, 5), (4, 1, 3)]
WEIGHTS = {1: [None, (1,)], 2: [None, (1, 1), (0.7, 0.3), (1, 9)], 3: [None, (1, 1, 1), (0.5, 0.3, 0.2), (3, 0.5, 1)]}
EPOCH_SIZES = [None, 1, 4, 7, 13]


def _specs():
    for sizes in SIZES:
        for weights, epoch_size, shuffle in itertools.product(WEIGHTS[len(sizes)], EPOCH_SIZES, (False, True)):
            yield StreamSpec(sizes=sizes, weights=weights, epoch_size=epoch_size, shuffle=shuffle, seed=5)


def _oracle_quotas(spec: StreamSpec) -> list[Fraction]:
    """Each source's exact proportion of an epoch, the weights read as the decimals they print as."""
    raw = spec.weights or spec.sizes
    exact = [Fraction(str(w)) for w in raw]
    return [w * spec.epoch_size / sum(exact) for w in exact]


# --- shares ----------------------------------------------------------------------------------------------------


def test_shares_are_the_largest_remainder_apportionment():
    """Oracle (Hamilton's method, as a property): each share is its quota's floor or ceiling, they add up, and any
    source given the extra element has a remainder at least as large as one that was not (ties: the lower index)."""
    for spec in _specs():
        quotas, got = _oracle_quotas(spec), shares(spec).tolist()
        assert sum(got) == spec.epoch_size, spec
        assert all(math.floor(q) <= c <= math.ceil(q) for q, c in zip(quotas, got)), (spec, got)
        extra = [i for i, (q, c) in enumerate(zip(quotas, got)) if c > q]
        rest = [i for i, (q, c) in enumerate(zip(quotas, got)) if c < q]
        for i, j in itertools.product(extra, rest):
            remainder_i, remainder_j = quotas[i] - math.floor(quotas[i]), quotas[j] - math.floor(quotas[j])
            assert remainder_i > remainder_j or (remainder_i == remainder_j and i < j), (spec, got)


@pytest.mark.parametrize("sizes, weights, epoch_size, expected", [
    ((5, 5, 5), (1, 1, 1), 10, [4, 3, 3]),            # a real three-way tie goes to the lower indices
    ((5, 5), (0.7, 0.3), 10, [7, 3]),                 # 0.7 counts as 7/10, not as the float below it
    ((9, 9, 9, 9), (0.1, 0.2, 0.3, 0.4), 5, [1, 1, 1, 2]),  # 0.5, 1, 1.5, 2: the tie of 0.5s to source 0
    ((1, 1, 1), (1, 2, 3), 4, [1, 1, 2]),             # 2/3, 4/3, 2: exact sixths, not rounded floats
    ((70, 30), None, None, [70, 30]),                 # no weights, no epoch_size: every record once
    ((70, 30), None, 10, [7, 3]),                     # no weights: in proportion to the sizes
    ((3, 1000), (1, 1), 2, [1, 1]),
    ((2, 2), (1, 1e-9), 3, [3, 0]),                   # a source below one element's share gives none
])
def test_shares_golden(sizes, weights, epoch_size, expected):
    assert shares(StreamSpec(sizes=sizes, weights=weights, epoch_size=epoch_size)).tolist() == expected


# --- passes and epochs -----------------------------------------------------------------------------------------


def test_each_source_walks_its_passes_share_by_share():
    """Oracle: a source's elements over consecutive epochs, laid end to end, are its passes: each a permutation of
    its records (in order when unshuffled), so no record twice within a pass; each epoch gives exactly its share."""
    for spec in _specs():
        counts = shares(spec)
        for i, size in enumerate(spec.sizes):
            per_epoch = [source_records(spec, i, e) for e in range(EPOCHS)]
            assert [len(r) for r in per_epoch] == [counts[i]] * EPOCHS, spec
            stream = np.concatenate(per_epoch)
            whole = len(stream) // size * size
            for p, one_pass in enumerate(stream[:whole].reshape(-1, size)):
                expected = np.arange(size)
                assert sorted(one_pass) == expected.tolist(), (spec, i, p)
                if not spec.shuffle:
                    assert one_pass.tolist() == expected.tolist(), (spec, i, p)
            assert len(set(stream[whole:].tolist())) == len(stream) - whole, (spec, i)  # the pass begun


def test_an_epoch_is_its_sources_shares_merged():
    """Oracle: the sources' elements of the epoch as a multiset; unshuffled, sorted by the time (2j + 1) / (2 share)
    of element j of its source, ties to the lower source index, in exact fractions."""
    for spec in _specs():
        counts = shares(spec)
        for e in range(3):
            sources, records = epoch_order(spec, e)
            assert sources.dtype == np.int32 and records.dtype == np.int64
            assert sources.shape == records.shape == (spec.epoch_size,)
            parts = [(i, j, int(r)) for i in range(len(counts)) for j, r in enumerate(source_records(spec, i, e))]
            got = list(zip(sources.tolist(), records.tolist()))
            assert sorted(got) == sorted((i, r) for i, _, r in parts), (spec, e)
            if not spec.shuffle:
                timed = sorted(parts, key=lambda p: (Fraction(2 * p[1] + 1, 2 * int(counts[p[0]])), p[0]))
                assert got == [(i, r) for i, _, r in timed], (spec, e)


def test_shuffled_epochs_differ_and_depend_only_on_the_seed():
    spec = StreamSpec(sizes=(40, 25), weights=(2, 1), epoch_size=60, seed=11)
    first, again = epoch_order(spec, 3), epoch_order(StreamSpec(sizes=[40, 25], weights=[2.0, 1.0], epoch_size=60,
                                                                seed=np.int64(11)), 3)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[1], epoch_order(spec, 4)[1])
    assert not np.array_equal(first[1], epoch_order(StreamSpec(sizes=(40, 25), weights=(2, 1), epoch_size=60,
                                                               seed=12), 3)[1])
    assert not first[0].flags.writeable and not first[1].flags.writeable  # the cache's arrays cannot be changed


def test_a_far_epoch_costs_what_the_first_does_and_continues_the_passes():
    """Epoch 10**12 draws only the passes it touches, and its neighbours chain into whole passes."""
    spec = StreamSpec(sizes=(7, 3), weights=(1, 1), epoch_size=10, seed=2)
    far = 10**12
    stream = np.concatenate([source_records(spec, 0, e) for e in range(far, far + 4)])  # share 5 of 7 records
    start = far * 5
    skip = -start % 7  # to the first pass that begins inside these epochs
    for one_pass in stream[skip:skip + 14].reshape(2, 7):
        assert sorted(one_pass.tolist()) == list(range(7))
    assert element(spec, far * 10 + 3) == tuple(int(a[3]) for a in epoch_order(spec, far))


@pytest.mark.parametrize("size", [1, 2, 3, 17, EXACT_UP_TO, EXACT_UP_TO + 1, 4099, 70_001])
def test_permute_is_a_bijection_per_key_on_both_sides_of_the_exact_bound(size):
    keys = mix_key(9, np.arange(3))
    got = permute(np.broadcast_to(np.arange(size), (3, size)), size, keys[:, None])
    assert all(sorted(row.tolist()) == list(range(size)) for row in got)
    if size > 2:
        assert len({tuple(row.tolist()) for row in got}) == 3  # each key its own order
    assert np.array_equal(permute(np.arange(size)[::-1], size, keys[1]), got[1][::-1])  # an index at a time


@pytest.mark.parametrize("size", [3, 4, 5, 300, EXACT_UP_TO + 300])
def test_permute_is_uniform(size):
    """Over 20,000 keys each index lands in each tenth of the range (or, small, in each place) as often as chance
    says: a chi-square per index within 6 standard deviations of its mean (fixed keys: no flake). The exact path
    also gives every one of the n! orders (n <= 5) equally often."""
    keys = mix_key(4, np.arange(20_000))
    cells = min(size, 10)
    for index in range(0, size, max(1, size // 7)):
        places = permute(np.full(keys.shape, index), size, keys) * cells // size
        seen = np.bincount(places, minlength=cells)
        expected = np.bincount(np.arange(size) * cells // size, minlength=cells) * len(keys) / size
        chi2 = float(((seen - expected) ** 2 / expected).sum())
        assert abs(chi2 - (cells - 1)) < 6 * np.sqrt(2 * (cells - 1)), (index, seen)
    if size <= 5:
        orders = permute(np.broadcast_to(np.arange(size), (len(keys), size)), size, keys[:, None])
        counts = np.unique(orders, axis=0, return_counts=True)[1]
        assert len(counts) == math.factorial(size)
        chi2 = float(((counts - len(keys) / len(counts)) ** 2 / (len(keys) / len(counts))).sum())
        assert abs(chi2 - (len(counts) - 1)) < 6 * np.sqrt(2 * (len(counts) - 1))


def test_an_element_of_the_largest_epoch_holds_nothing_of_its_size():
    """With shuffle, elements of an epoch of 2**31 - 1 from sources of a billion and of ten records are found without
    building the epoch, a pass or the ~10**8 passes the small source makes in it."""
    spec = StreamSpec(sizes=(10**9, 10), weights=(1, 1), epoch_size=MAX_EPOCH_SIZE, seed=5)
    tracemalloc.start()
    try:
        sources, records = elements(spec, np.arange(5 * MAX_EPOCH_SIZE, 5 * MAX_EPOCH_SIZE + 4096))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak
    assert set(sources.tolist()) == {0, 1} and records[sources == 1].max() < 10
    assert element(spec, 5 * MAX_EPOCH_SIZE + 7) == (int(sources[7]), int(records[7]))


def test_element_and_elements_index_the_epochs_laid_end_to_end():
    for spec in itertools.islice(_specs(), 0, None, 7):
        sources = np.concatenate([epoch_order(spec, e)[0] for e in range(3)])
        records = np.concatenate([epoch_order(spec, e)[1] for e in range(3)])
        assert [element(spec, n) for n in range(len(sources))] == list(zip(sources.tolist(), records.tolist()))
        indices = np.array([[len(sources) - 1, 0], [spec.epoch_size, 1]])
        got = elements(spec, indices)
        assert got[0].shape == (2, 2) and got[0].tolist() == sources[indices].tolist()
        assert got[1].tolist() == records[indices].tolist()


GOLDEN = [  # computed once: a change of permute.py's keyed permutations, or of how they are keyed, changes these
    (StreamSpec(sizes=(6,), seed=0), [
        ([0, 0, 0, 0, 0, 0], [5, 4, 1, 2, 0, 3]),
        ([0, 0, 0, 0, 0, 0], [5, 4, 0, 2, 3, 1]),
    ]),
    (StreamSpec(sizes=(4, 2), weights=(1, 1), epoch_size=6, seed=1), [
        ([0, 1, 0, 1, 0, 1], [0, 0, 3, 1, 1, 1]),
        ([1, 0, 0, 1, 1, 0], [0, 0, 2, 0, 1, 3]),
    ]),
    (StreamSpec(sizes=(5, 3, 2), weights=(0.5, 0.3, 0.2), epoch_size=7, seed=7), [
        ([0, 0, 0, 0, 1, 2, 1], [1, 2, 4, 0, 0, 0, 1]),
        ([0, 0, 2, 1, 0, 1, 0], [2, 3, 1, 1, 4, 2, 3]),
    ]),
    (StreamSpec(sizes=(5, 3, 2), weights=(0.5, 0.3, 0.2), epoch_size=7, shuffle=False), [
        ([0, 1, 0, 2, 0, 1, 0], [0, 0, 1, 0, 2, 1, 3]),
        ([0, 1, 0, 2, 0, 1, 0], [4, 2, 0, 1, 1, 0, 2]),
    ]),
]


@pytest.mark.parametrize("spec, epochs", GOLDEN, ids=lambda v: repr(v)[:60] if isinstance(v, StreamSpec) else "")
def test_epoch_orders_golden(spec, epochs):
    assert [tuple(a.tolist() for a in epoch_order(spec, e)) for e in range(len(epochs))] == epochs


# --- the spec checks itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"sizes": ()}, r"sizes: must be a non-empty sequence, one entry per source \(got sizes=\(\)\)"),
    ({"sizes": 3}, r"sizes: must be a non-empty sequence"),
    ({"sizes": (3, 0)}, r"sizes: must be integers of at least 1, the records of each source \(got sizes=\[3, 0\]\)"),
    ({"sizes": (3, 2.0)}, r"sizes: must be integers"),
    ({"sizes": (True,)}, r"sizes: must be integers"),
    ({"sizes": (3, 2), "weights": (1,)}, r"weights: must give one weight per source, 2 \(got 1 weights: \[1\]\)"),
    ({"sizes": (3, 2), "weights": (1, 0)}, r"weights: must be positive finite numbers \(got weights=\[1, 0\]\)"),
    ({"sizes": (3, 2), "weights": (1, float("nan"))}, r"weights: must be positive finite"),
    ({"sizes": (3, 2), "weights": (1, float("inf"))}, r"weights: must be positive finite"),
    ({"sizes": (3, 2), "weights": (1, "2")}, r"weights: must be positive finite"),
    ({"sizes": (3, 2), "weights": (1, 10**400)}, r"weights: must be positive finite"),
    ({"sizes": (3,), "epoch_size": 0}, r"epoch_size: must be an integer in \[1, 2,147,483,647\] \(got epoch_size=0\)"),
    ({"sizes": (3,), "epoch_size": 2**31}, r"epoch_size: must be an integer in"),
    ({"sizes": (3,), "epoch_size": 2.0}, r"epoch_size: must be an integer in"),
    ({"sizes": (3,), "shuffle": "yes"}, r"shuffle: must be True or False \(got shuffle='yes'\)"),
    ({"sizes": (3,), "seed": -1}, r"seed: must be an integer in \[0, 2\*\*63 - 1\] \(got seed=-1\); pass the seed"),
    ({"sizes": (3,), "seed": None}, r"seed: must be an integer"),
    ({"sizes": (3,), "seed": 2**63}, r"seed: must be an integer"),
])
def test_stream_spec_refuses_bad_fields_naming_field_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamSpec(**kwargs)


def test_indices_of_the_stream_are_checked():
    spec = StreamSpec(sizes=(3,))
    for call, match in [(lambda: epoch_order(spec, -1), r"epoch: must be a non-negative integer \(got epoch=-1\)"),
                        (lambda: source_records(spec, 1, 0), r"source: must be an integer in \[0, 0\]"),
                        (lambda: element(spec, -2), r"n: must be a non-negative integer"),
                        (lambda: elements(spec, np.array([0.5])), r"indices: must be non-negative integers")]:
        with pytest.raises(ValueError, match=match):
            call()


# --- class balance ---------------------------------------------------------------------------------------------


def test_balanced_gives_every_class_an_equal_share_of_every_epoch():
    """Oracle: over every labelling of up to 6 records with 1-3 classes, none empty: shares differ by at most one,
    every element is a record of its class, and each class's records come as passes (permutations of the class)."""
    for n, classes in itertools.product(range(1, 7), range(1, 4)):
        for labels in itertools.product(range(classes), repeat=n):
            labels = np.array(labels)
            if len(set(labels.tolist())) < classes:
                continue
            for epoch_size, shuffle in itertools.product((None, 5), (False, True)):
                spec, members = balanced(labels, classes, epoch_size=epoch_size, shuffle=shuffle, seed=1)
                counts = shares(spec)
                assert counts.sum() == spec.epoch_size == (epoch_size or n)
                assert counts.max() - counts.min() <= 1
                streams = {c: [] for c in range(classes)}
                for e in range(4):
                    sources, records = epoch_order(spec, e)
                    picked = members.record(sources, records)
                    assert (labels[picked] == sources).all()
                    for c in range(classes):
                        streams[c] += picked[sources == c].tolist() if not shuffle else \
                            members.record(np.full(counts[c], c), source_records(spec, c, e)).tolist()
                for c, stream in streams.items():
                    mine = np.flatnonzero(labels == c).tolist()
                    whole = len(stream) // len(mine) * len(mine)
                    assert all(sorted(stream[k:k + len(mine)]) == mine for k in range(0, whole, len(mine)))


def test_balanced_golden():
    spec, members = balanced(np.array([0, 1, 1, 1, 2, 2, 0, 1]), 3, seed=3)
    assert balanced(np.array([0, 1, 1, 1, 2, 2, 0, 1], np.uint8), ["a", "b", "c"], seed=3)[0] == spec
    assert spec == StreamSpec(sizes=(2, 4, 2), weights=(1, 1, 1), epoch_size=8, seed=3)
    assert shares(spec).tolist() == [3, 3, 2]
    assert [members.record(*epoch_order(spec, e)).tolist() for e in range(2)] == [[6, 4, 6, 7, 1, 3, 5, 0],
                                                                                   [7, 2, 4, 5, 1, 0, 6, 0]]


@pytest.mark.parametrize("labels, classes, match", [
    ([0, 0, 2], ["cat", "dog", "owl"], r"labels: class 1 \('dog'\) has no record, so no share of a balanced epoch "
                                       r"\(got counts \[2, 0, 1\]\); leave the empty classes out"),
    ([0, 0], 3, r"labels: class 1, class 2 have no record"),
    ([0, 3], 3, r"labels: class ids must be in \[0, 2\] \(got 3 at record 1\); pass classes that cover every label"),
    ([0, -1], 3, r"class ids must be in \[0, 2\] \(got -1 at record 1\)"),
    (np.array([0, 9], np.uint64), 2, r"class ids must be in \[0, 1\] \(got 9 at record 1\)"),
    ([0.0, 1.0], 2, r"labels: must be a 1-D array of integer class ids, one per record \(got dtype float64"),
    ([[0, 1]], 2, r"labels: must be a 1-D array .* shape \(1, 2\)"),
    ([0], 0, r"classes: must be at least one class"),
    ([0], "cat", r"classes: must be at least one class"),
])
def test_balanced_refuses_in_one_line_naming_the_class(labels, classes, match):
    with pytest.raises(ValueError, match=match):
        balanced(np.array(labels), classes)


def test_class_weights_arithmetic():
    assert class_weights([30, 10], "here") == {0: 40 / 60, 1: 2.0}
    assert class_weights([5], "here") == {0: 1.0}
    weights = class_weights([3, 1, 7, 2], "here")
    assert math.isclose(sum(w * n for w, n in zip(weights.values(), [3, 1, 7, 2])), 13)  # mean weight 1
    with pytest.raises(ValueError, match=r"here: class 1 \('dog'\) has no record, so no balanced weight \(got "
                                         r"class_counts \[3, 0\]\); train on a split that holds every class"):
        class_weights([3, 0], "here", ["cat", "dog"])


# --- elastic slicing -------------------------------------------------------------------------------------------


def test_replicas_slices_laid_out_step_by_step_are_the_global_stream():
    """Oracle: for R in 1, 2, 3 the replicas' slices, step-major, are ``range(steps·G)``; so what has been consumed
    before any step is the same prefix for every R, and a run resumes on another R at a step with one counter."""
    for global_batch, steps in itertools.product((6, 12), (1, 4)):
        for first in (0, 5):
            expected = np.arange(first * global_batch, (first + steps) * global_batch)
            for replicas in (1, 2, 3):
                batch = global_batch // replicas
                per_replica = [slicing.replica_steps(first, steps, r, replicas, global_batch).reshape(steps, batch)
                               for r in range(replicas)]
                assert np.array_equal(np.concatenate(per_replica, axis=1).reshape(-1), expected)
                for s in range(first, first + steps):
                    one = [slicing.replica_elements(s, r, replicas, global_batch) for r in range(replicas)]
                    assert np.concatenate(one).tolist() == list(range(s * global_batch, (s + 1) * global_batch))


def test_one_epoch_per_replica_covers_it_once_with_or_without_the_remainder():
    for epoch_size, global_batch, replicas in itertools.product((0, 1, 5, 12, 13), (2, 6), (1, 2)):
        for drop_remainder in (True, False):
            steps = slicing.steps_per_epoch(epoch_size, global_batch, drop_remainder=drop_remainder)
            parts = [slicing.replica_epoch(epoch_size, r, replicas, global_batch, drop_remainder=drop_remainder)
                     for r in range(replicas)]
            read = sorted(np.concatenate(parts).tolist())
            expected = epoch_size // global_batch * global_batch if drop_remainder else epoch_size
            assert read == list(range(expected)), (epoch_size, global_batch, replicas, drop_remainder)
            assert steps == (epoch_size // global_batch if drop_remainder else -(-epoch_size // global_batch))
    assert slicing.replica_epoch(10, 1, 2, 4, drop_remainder=False).tolist() == [2, 3, 6, 7]  # the last: none


def test_steps_across_epochs_map_to_elements_of_the_epochs_laid_end_to_end():
    spec = StreamSpec(sizes=(3, 4), weights=(1, 1), epoch_size=5, seed=4)
    for replicas in (1, 2):
        indices = slicing.replica_steps(0, 5, replicas - 1, replicas, 4)  # 20 elements: 4 epochs, straddled
        got = elements(spec, indices)
        assert list(zip(*(a.tolist() for a in got))) == [element(spec, int(n)) for n in indices]


@pytest.mark.parametrize("call, match", [
    (lambda: slicing.replica_elements(0, 0, 4, 6), r"global_batch: must be a multiple of replicas=4, every replica "
                                                   r"taking an equal slice \(got global_batch=6\); pass a multiple"),
    (lambda: slicing.replica_elements(0, 2, 2, 4), r"replica: must be an integer in \[0, 1\] \(got replica=2\)"),
    (lambda: slicing.replica_elements(-1, 0, 2, 4), r"first_step: must be an integer of at least 0"),
    (lambda: slicing.replica_steps(0, 1, 0, 0, 4), r"replicas: must be an integer of at least 1"),
    (lambda: slicing.replica_steps(0, 1, 0, 1, 0), r"global_batch: must be an integer of at least 1"),
    (lambda: slicing.steps_per_epoch(-1, 4), r"epoch_size: must be an integer of at least 0"),
])
def test_slicing_refuses_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_stream_arithmetic_loads_no_tensorflow():
    """The process is the point: ``readers/sampling/`` loaded alone (its parent packages stubbed, as nothing of
    theirs is needed) must not bring TensorFlow in."""
    import tfshard

    root = os.path.dirname(tfshard.__file__)
    code = ("import sys, types\n"
            f"for name, path in (('tfshard', {root!r}), ('tfshard.readers', {os.path.join(root, 'readers')!r})):\n"
            "    module = types.ModuleType(name); module.__path__ = [path]; sys.modules[name] = module\n"
            "import tfshard.readers.sampling.plan, tfshard.readers.sampling.classes, tfshard.readers.sampling.slicing\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'tfshard.format', 'tfshard.readers.')))"
            ")\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == ("['tfshard.readers.sampling', 'tfshard.readers.sampling.classes', "
                                   "'tfshard.readers.sampling.permute', 'tfshard.readers.sampling.plan', "
                                   "'tfshard.readers.sampling.slicing']")
