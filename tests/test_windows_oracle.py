"""Every window option against a plain numpy reference, exactly, in every mode.

The reference below is written from the documented meaning of the arguments (``readers.windows``' docstring,
docs/guide/windows.md), not from ``starts.py``: for each episode, the slice ``[lo, hi)`` of ``time_range``; window
starts ``0, ±shift, ...`` of it while the span's ``(points - 1)·rate + 1`` steps fit (and, with padding, while the
last input point is a real step); point k of a window at s is slice step ``s + k·rate`` (``pad_value`` before the
slice). Readers are compared with their keys (episode id, start step), so order does not matter; the count must
equal ``DatasetInfo.num_windows`` too.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from helpers import convert_episode_tree, save_episodes
from tfshard import readers
from tfshard.ingest import EpisodeOptions

LENGTHS = [1, 3, 4, 7, 12, 20]  # shorter than most windows, and long ones
PAD = -7


def make_episodes(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return {"a": [rng.standard_normal((t, 2)).astype(np.float32) for t in lengths],
            "b": [rng.integers(-1000, 1000, size=t).astype(np.int32) for t in lengths]}


def reference(episodes, *, length, shift, targets, sampling_rate, time_range, padding, features):
    """``{(episode, step): (inputs, mask, targets)}`` of every window, from the definitions."""
    if targets is None:
        offset, width, target_names = 0, 0, []
    else:
        offset, width = targets.offset, targets.width
        target_names = features if targets.features is None else [targets.features]
    points = length + offset
    extent = (points - 1) * sampling_rate + 1
    out = {}
    for e in range(len(episodes["a"])):
        steps = len(episodes["a"][e])
        if time_range is None:
            lo, hi = 0, steps
        elif isinstance(time_range[0], float):
            lo, hi = math.floor(time_range[0] * steps), math.floor(time_range[1] * steps)
        else:
            lo, hi = min(time_range[0], steps), min(time_range[1], steps)
        used = hi - lo
        for s in range(-100 * shift, used, shift):  # multiples of shift, before the slice too
            real_end = s + extent <= used
            real_start = s >= 0 or (padding == "start" and s + (length - 1) * sampling_rate >= 0)
            if not (real_end and real_start):
                continue
            idx = s + np.arange(points) * sampling_rate

            spans = {n: take(episodes[n][e][lo:hi], idx) for n in set(features) | set(target_names)}
            inputs = {n: spans[n][:length] for n in features}
            wanted = {n: spans[n][points - width:] for n in target_names}
            out[(e, lo + s)] = (inputs, idx[:length] >= 0, wanted)
    return out


def take(values: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The slice's steps at ``points``; ``PAD`` before the slice."""
    return np.stack([values[i] if i >= 0 else np.full(values.shape[1:], PAD, values.dtype) for i in points])


def flatten(element, masked, with_targets, features, target_names):
    """A reader's batch → per-window ``(inputs, mask, targets)`` in the reference's form."""
    x, y = element if with_targets else (element, None)
    mask = None
    if masked:
        x, mask = x["inputs"], x["mask"].numpy()
    x = {features[0]: x} if not isinstance(x, dict) else x
    y = {} if y is None else ({target_names[0]: y} if not isinstance(y, dict) else y)
    x, y = ({n: v.numpy() for n, v in part.items()} for part in (x, y))  # once a batch: eager slicing is slow
    count = len(next(iter(x.values())))
    return [({n: v[i] for n, v in x.items()}, None if mask is None else mask[i],
             {n: v[i] for n, v in y.items()}) for i in range(count)]


def compare(got: dict, expected: dict, masked: bool, case):
    assert sorted(got) == sorted(expected), case
    for key, (inputs, mask, wanted) in expected.items():
        g_inputs, g_mask, g_wanted = got[key]
        for n in inputs:
            np.testing.assert_array_equal(g_inputs[n], inputs[n], err_msg=f"{case} {key} inputs {n}")
        if masked:
            np.testing.assert_array_equal(g_mask, mask, err_msg=f"{case} {key} mask")
        for n in wanted:
            np.testing.assert_array_equal(g_wanted[n], wanted[n], err_msg=f"{case} {key} targets {n}")


def collect(batches, case, masked, with_targets, features, target_names):
    got = {}
    for keys, element in batches:
        windows = flatten(element, masked, with_targets, features, target_names)
        for e, s, w in zip(keys["episode"].numpy().tolist(), keys["step"].numpy().tolist(), windows):
            assert (e, s) not in got, (case, e, s)
            got[(e, s)] = w
    return got


TARGETS = [None, readers.Targets(width=2, offset=4), readers.Targets("b", width=1, offset=0),
           readers.Targets("b", width=3, offset=3)]
CASES = list(itertools.product([2, 3], [1, 2, 3], [1, 2], TARGETS, [None, (0.25, 1.0), (2, 9)], [None, "start"]))


def case_args(case):
    length, shift, rate, targets, time_range, padding = case
    return dict(length=length, shift=shift, targets=targets, sampling_rate=rate, time_range=time_range,
                padding=padding)


def target_names_of(targets, features):
    if targets is None:
        return []
    return features if targets.features is None else [targets.features]


def _pairwise_shift(combination) -> tuple:
    """``combination`` (length, rate, targets, time_range, padding) with a shift of 1, 2 or 3 picked by the sum of
    its values' positions mod 3: every combination of the five appears once, and each shift meets every value of
    each other factor (pairwise cover of the whole table at a third of the pipelines)."""
    positions = [values.index(value) for values, value in zip(FACTORS, combination)]
    length, rate, targets, time_range, padding = combination
    return length, 1 + sum(positions) % 3, rate, targets, time_range, padding


FACTORS = [[2, 3], [1, 2], TARGETS, [None, (0.25, 1.0), (2, 9)], [None, "start"]]
RESIDENT_CASES = [_pairwise_shift(c) for c in itertools.product(*FACTORS)]


@pytest.mark.parametrize("targets", TARGETS, ids=["no-targets", "horizon-2-offset-4", "b-width-1-offset-0",
                                                  "b-width-3-offset-3"])
def test_resident_windows_match_the_numpy_reference_over_every_combination(targets):
    """Every combination of length, sampling_rate, targets, time_range and padding (shifts cycled pairwise: a shift
    changes only the starts, the same code path), tensors or dicts by a fair coin per case, from memory."""
    episodes = make_episodes(LENGTHS)
    cases = [case for case in RESIDENT_CASES if case[3] is targets]
    checked = 0
    for case in cases:
        number = RESIDENT_CASES.index(case)
        features = random.Random(number).choice([["a"], ["a", "b"]])  # tensors or dicts, a fair coin per case
        args = case_args(case)
        expected = reference(episodes, features=features, **args)
        if not expected:
            continue
        single = features[0] if len(features) == 1 else features
        ds = readers.resident_windows(episodes, batch_size=4, features=single, pad_value=PAD, shuffle=False,
                                      drop_remainder=False, with_keys=True, **args)
        got = collect(ds, case, args["padding"] is not None, args["targets"] is not None, features,
                      target_names_of(args["targets"], features))
        compare(got, expected, args["padding"] is not None, case)
        checked += 1
    assert checked > len(cases) // 2  # most combinations give windows: the comparison is not vacuous


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The episodes converted in source order (``seed=None``), cut into chunk records of a few steps."""
    root = tmp_path_factory.mktemp("oracle")
    episodes = make_episodes(LENGTHS, seed=1)
    save_episodes(root / "src", {f"e{i:02d}.npz": {n: episodes[n][i] for n in episodes}
                                 for i in range(len(LENGTHS))})
    convert_episode_tree(root / "src", root / "out", seed=None, num_shards=2,
                         episode=EpisodeOptions(max_record_bytes=64))
    return str(root / "out"), episodes


def pairwise_cover(cases) -> list:
    """A few of ``cases`` that together hold every pair of values of any two arguments (greedy: each next case is
    the first that adds the most pairs not yet held)."""
    def pairs(case):
        return set(itertools.combinations(enumerate(map(repr, case)), 2))

    left, chosen = set().union(*map(pairs, cases)), []
    while left:
        best = max(cases, key=lambda case: len(pairs(case) & left))
        chosen.append(best)
        left -= pairs(best)
    return chosen


# Every pair of option values (what a random sample of 36 covered), and two spans longer than every slice of
# time_range=(2, 9): the refusal path. Each mode builds one pipeline per case, so 16 cases, not 36.
NO_WINDOW = [(3, 3, 2, TARGETS[3], (2, 9), None), (3, 2, 2, TARGETS[1], (2, 9), None)]
SAMPLE = pairwise_cover(CASES) + NO_WINDOW


@pytest.mark.parametrize("mode", ["resident", "streamed", "model_windows"])
def test_every_mode_matches_the_numpy_reference_on_converted_shards(converted, mode):
    out, episodes = converted
    features = ["a", "b"]
    info = readers.info(out)
    checked = 0
    for case in SAMPLE:
        args = case_args(case)
        expected = reference(episodes, features=features, **args)
        assert info.num_windows("train", **args) == len(expected), case
        if not expected:
            with pytest.raises(ValueError, match="no episode of at least"):
                readers.windows(out, batch_size=2, features=features, pad_value=PAD, **args)
            continue
        masked, with_targets = args["padding"] is not None, args["targets"] is not None
        names = target_names_of(args["targets"], features)
        if mode == "model_windows":
            mw = readers.model_windows(out, batch_size=3, features=features, pad_value=PAD, shuffle=False,
                                       drop_remainder=False, **args)
            batches = [(mw.keys(starts), mw.element(starts)) for starts in mw.starts]
        else:
            batches = readers.windows(out, batch_size=3, features=features, pad_value=PAD, shuffle=False,
                                      drop_remainder=False, with_keys=True, resident=mode == "resident", **args)
        compare(collect(batches, case, masked, with_targets, features, names), expected, masked, case)
        checked += 1
    assert checked == len(SAMPLE) - len(NO_WINDOW)  # every case but the refused ones gives windows


def test_too_short_episodes_are_counted_and_logged(converted, caplog):
    out, _ = converted
    info = readers.info(out)
    assert info.too_short("train", length=5, shift=1) == 3  # episodes of 1, 3 and 4 steps
    assert info.too_short("train", length=5, shift=1, padding="start") == 0
    assert info.too_short("train", length=4, shift=1, time_range=(0.5, 1.0)) == 3  # slices of 1, 2, 2 steps
    with caplog.at_level("WARNING"):
        readers.windows(out, length=5, batch_size=2, features="a")
    assert "3 of 6 episodes give no window" in caplog.text
    assert "padding='start' serves 3 of them" in caplog.text


def test_a_pad_value_the_dtype_cannot_hold_is_refused(converted):
    out, _ = converted
    with pytest.raises(ValueError, match=r"pad_value=0.5 cannot be held by feature 'b' of dtype int32"):
        readers.windows(out, length=3, batch_size=2, features=["a", "b"], padding="start", pad_value=0.5)
    with pytest.raises(ValueError, match=r"pad_value=nan cannot be held by feature 'b'"):
        readers.model_windows(out, length=3, batch_size=2, features="b", padding="start", pad_value=float("nan"))


@pytest.mark.parametrize("bad, message", [
    ({"time_range": (0.8, 0.2)}, "fractions must be 0 <= a < b <= 1"),
    ({"time_range": (0, 0.5)}, "not a mix"),
    ({"time_range": (5, 5)}, "steps must be 0 <= a < b"),
    ({"sampling_rate": 0}, "sampling_rate: must be an integer of at least 1"),
    ({"padding": "end"}, "padding: must be None or 'start'"),
    ({"targets": readers.Targets(width=5, offset=1)}, "width: the targets are the last width points"),
])
def test_bad_window_shapes_are_refused_with_the_fix(converted, bad, message):
    out, _ = converted
    for make in (readers.windows, readers.model_windows):
        with pytest.raises(ValueError, match=message):
            make(out, **{"length": 3, "batch_size": 2, **bad})


def test_targets_shortcuts_mean_exactly_their_targets_form(converted):
    out, _ = converted
    options = dict(length=3, shift=2, batch_size=4, shuffle=False, drop_remainder=False)
    pairs = [("b", readers.Targets("b", width=3, offset=0)), (2, readers.Targets(width=2, offset=2))]
    for shortcut, spelled in pairs:
        a = list(readers.windows(out, features="a", targets=shortcut, **options))
        b = list(readers.windows(out, features="a", targets=spelled, **options))
        assert len(a) == len(b) > 1
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa.numpy(), xb.numpy())
            np.testing.assert_array_equal(ya.numpy(), yb.numpy())
