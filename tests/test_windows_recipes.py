"""Every recipe of docs/guide/windows-recipes.md, run as written on a small dataset of the shape it names."""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import pytest
from helpers import convert_episode_tree, save_episodes

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide" / "windows-recipes.md"


def recipes() -> dict[str, str]:
    """``{section title: its python code}``, in page order (a section's blocks joined)."""
    found: dict[str, str] = {}
    title = None
    for part in re.split(r"^(## .*)$", PAGE.read_text(), flags=re.M):
        if part.startswith("## "):
            title = part[3:].strip()
            continue
        for block in re.findall(r"```python\n(.*?)```", part, flags=re.S):
            found[title] = found.get(title, "") + block
    return found


@pytest.fixture(scope="module")
def recipe_data(tmp_path_factory):
    """``runs-tfr`` (obs [T, 8], action [T, 2]) and ``gestures-tfr`` (the same, in three class folders)."""
    root = tmp_path_factory.mktemp("recipes")
    rng = np.random.default_rng(0)
    lengths = [600, 840, 360, 1040, 40, 520]  # one shorter than every span
    episodes = [{"obs": rng.standard_normal((t, 8)).astype(np.float32),
                 "action": rng.standard_normal((t, 2)).astype(np.float32)} for t in lengths]
    save_episodes(root / "runs", {f"run{i}.npz": e for i, e in enumerate(episodes)})
    save_episodes(root / "gestures", {f"{['wave', 'swipe', 'tap'][i % 3]}/g{i}.npz": e for i, e in enumerate(episodes)})
    convert_episode_tree(root / "runs", root / "runs-tfr")
    convert_episode_tree(root / "gestures", root / "gestures-tfr")
    return root


EXPECTED = {  # what each recipe's names hold afterwards
    "Autoencoder": lambda ns: ns["x"].shape == (32, 64, 8) and np.array_equal(ns["x"], ns["y"]),
    "Forecasting another feature, with a gap": lambda ns: ns["x"].shape == (32, 64, 8) and ns["y"].shape == (
        32, 16, 2),
    "Classification of episodes": lambda ns: ns["classes"] == ["swipe", "tap", "wave"] and ns["y"].shape == (32,)
    and ns["y"].dtype.name == "int64" and set(ns["y"].numpy()) <= {0, 1, 2},
    "A split in time": lambda ns: ns["counts"][0] > ns["counts"][1] > 0,
    "Padded history": lambda ns: ns["x"]["mask"].shape == (32, 64) and ns["y"].shape == (32, 1, 8)
    and ns["x"]["inputs"].shape == (32, 64, 8),
    "Normalizing episode features": lambda ns: ns["model"].layers[0] is ns["norm"],
}


def test_every_section_with_code_is_checked():
    assert list(recipes()) == list(EXPECTED)


def test_the_recipes_run_as_written(recipe_data, monkeypatch):
    monkeypatch.chdir(recipe_data)
    namespace: dict = {}
    for title, code in recipes().items():
        exec(compile(code, f"{PAGE.name}: {title}", "exec"), namespace)  # noqa: S102 (our own docs page)
        assert EXPECTED[title](namespace), title
    assert os.getcwd() == str(recipe_data)


def test_the_split_in_time_gives_the_windows_of_each_slice_alone(recipe_data):
    """The recipe's claim: time_range gives exactly the windows of converting each episode's slice alone."""
    from tfshard import readers

    runs = str(recipe_data / "runs-tfr")
    options = dict(length=64, shift=8, batch_size=1, features="obs", shuffle=False, drop_remainder=False,
                   with_keys=True)
    got = {(int(k["episode"][0]), int(k["step"][0])): x[0].numpy()
           for k, x in readers.windows(runs, time_range=(0.85, 1.0), **options)}
    episodes = {int(keys["episode"]): ep for keys, ep in readers.episodes(runs, with_keys=True)}
    expected = {}
    for episode_id, episode in episodes.items():
        steps = len(episode["obs"])
        lo, hi = int(np.floor(0.85 * steps)), int(np.floor(1.0 * steps))
        for s in range(0, hi - lo - 64 + 1, 8):
            expected[(episode_id, lo + s)] = episode["obs"].numpy()[lo + s : lo + s + 64]
    assert sorted(got) == sorted(expected) and expected
    for key, window in expected.items():
        np.testing.assert_array_equal(got[key], window)
