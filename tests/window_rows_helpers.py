"""The rich episode datasets and the numpy slicing oracle shared by test_window_rows.py and test_model_windows.py.

Every step of every episode carries a unique nonzero id (``t``: 100000·(episode + 1) + step + 1), so a window
that crossed an episode boundary or reached into the zero padding of the row layout shows as a gap or a zero.
``rich_dataset`` converts the rich episodes once per test run (per xdist worker): tests only read it.
"""

from __future__ import annotations

import types

import numpy as np
import tensorflow as tf
from helpers import convert_episode_tree, save_episodes
from tfshard.ingest import EpisodeOptions


def step_ids(i: int, t: int) -> np.ndarray:
    return 100_000 * (i + 1) + np.arange(1, t + 1, dtype=np.int64)


def rich_episode(i: int, t: int) -> dict:
    """Several features of several dtypes and shapes, each a function of the step id (nonzero everywhere)."""
    ids = step_ids(i, t)
    return {
        "t": ids,                                                                   # int64 [T]
        "m": (ids[:, None, None] * 8 + np.arange(6).reshape(3, 2)).astype(np.float32),  # float32 [T, 3, 2], exact
        "u": (ids % 251 + 1).astype(np.uint8),                                      # uint8 [T]
        "b": np.stack([np.ones(t, bool), ids % 2 == 0], axis=1),                     # bool [T, 2]
    }


def convert(tmp_path_factory, name: str, lengths, make=rich_episode, **options) -> types.SimpleNamespace:
    src = tmp_path_factory.mktemp(f"{name}-src")
    out = tmp_path_factory.mktemp(name) / "out"
    written = {f"e{i:03d}.npz": make(i, t) for i, t in enumerate(lengths)}
    save_episodes(src, written)
    manifest = convert_episode_tree(src, out, **options)
    listed = manifest.splits["train"].episodes
    return types.SimpleNamespace(
        out=str(out), manifest=manifest, lengths=list(lengths),
        by_id={e.id: written[e.source] for e in listed},
        source_order=sorted(e.id for e in listed),      # resident, unshuffled
        manifest_order=[e.id for e in listed],          # streamed, unshuffled
    )


RICH = [300, 40, 256, 17, 513, 1, 64, 129, 96]  # sum 1416: 1/64 of it is 22 steps of padding


def oracle(data, order, length: int, shift: int, horizon: int = 0) -> list[tuple[int, int]]:
    """(episode id, start step) of every window, episode after episode in ``order``, by start step."""
    return [(e, s) for e in order for s in range(0, len(data.by_id[e]["t"]) - length - horizon + 1, shift)]


def as_dict(value, name):
    return value if isinstance(value, dict) else {name: value}


def collect(ds, features, single_name=None, horizon=0, with_targets=False):
    """One epoch of a (keys, element) dataset → list of (episode, step, {name: window}, {name: future or target})."""
    rows, sizes = [], []
    for keys, element in ds:
        inputs, targets = element if (horizon or with_targets) else (element, None)
        inputs = as_dict(inputs, single_name)
        if targets is not None and not isinstance(targets, dict):
            targets = {single_name if horizon else "__target__": targets}
        episodes, steps = keys["episode"].numpy(), keys["step"].numpy()
        assert keys["episode"].dtype == tf.int64 and keys["step"].dtype == tf.int64
        sizes.append(len(episodes))
        values = {n: v.numpy() for n, v in inputs.items()}
        futures = {n: v.numpy() for n, v in targets.items()} if targets is not None else {}
        for j in range(len(episodes)):
            rows.append((int(episodes[j]), int(steps[j]), {n: v[j] for n, v in values.items()},
                         {n: v[j] for n, v in futures.items()}))
    return rows, sizes


def check_against_oracle(data, rows, length, horizon, names):
    for episode, step, window, future in rows:
        source = data.by_id[episode]
        for name in names:
            np.testing.assert_array_equal(window[name], source[name][step : step + length])
            assert window[name].dtype == source[name].dtype
            if horizon:
                np.testing.assert_array_equal(future[name], source[name][step + length : step + length + horizon])
        ids = window.get("t")
        if ids is not None:  # inside one episode, no padding: consecutive nonzero ids
            assert (ids > 0).all() and (np.diff(ids) == 1).all()
            if horizon:
                assert (np.diff(np.concatenate([ids, future["t"]])) == 1).all()


def ids_only(i, t):
    return {"t": step_ids(i, t)}


MW = {"length": 24, "shift": 8, "targets": 8}  # span 32, shift 8: rows of 4 on RICH; 153 windows


_BUILT: dict = {}


def rich_dataset(tmp_path_factory) -> types.SimpleNamespace:
    """RICH as chunk records of 20 steps (35 bytes a step) over 3 gzip shards, written in shuffled order; converted
    on first use and shared (read-only) by every module that asks."""
    if "rich" not in _BUILT:
        _BUILT["rich"] = convert(tmp_path_factory, "rich", RICH, num_shards=3, compression="gzip",
                                 episode=EpisodeOptions(max_record_bytes=35 * 20))
    return _BUILT["rich"]
