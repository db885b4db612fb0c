"""Held-out splits at conversion (``--val-fraction``, ``--test-fraction``): stable per-file hashing, exact
stratified counts, the manifest's rule, and the refusals."""

from __future__ import annotations

import random

import pytest
from helpers import convert_episode_tree, convert_image_tree, make_tree, random_episodes, save_episodes
from tfshard.format.errors import InputError
from tfshard.ingest.holdout import Holdout, hold_out, position


def split_of(paths: list[str], holdout: Holdout) -> dict[str, str]:
    moved = hold_out({"train": sorted(paths)}, holdout, path_of=lambda p: p)
    return {p: name for name, members in moved.items() for p in members}


def test_a_files_split_never_moves_when_other_files_are_added_or_removed():
    rng = random.Random(0)
    holdout = Holdout(val_fraction=0.2, test_fraction=0.1, seed=7)
    for trial in range(200):  # random trees, random additions and removals: the property, over many cases
        universe = [f"c{rng.randrange(5)}/{rng.getrandbits(40):x}.jpg" for _ in range(60)]
        before = rng.sample(universe, rng.randrange(1, 50))
        after = [p for p in before if rng.random() < 0.7] + rng.sample(universe, rng.randrange(0, 20))
        first, second = split_of(list(set(before)), holdout), split_of(list(set(after)), holdout)
        assert all(first[p] == second[p] for p in set(first) & set(second)), trial


def test_hash_shares_are_near_the_fractions_and_the_seed_matters():
    paths = [f"{i}.jpg" for i in range(20_000)]
    found = split_of(paths, Holdout(val_fraction=0.2, test_fraction=0.1))
    shares = {name: sum(1 for s in found.values() if s == name) / len(paths) for name in ("train", "val", "test")}
    assert abs(shares["val"] - 0.2) < 0.015 and abs(shares["test"] - 0.1) < 0.015
    assert split_of(paths, Holdout(val_fraction=0.2, seed=1)) != split_of(paths, Holdout(val_fraction=0.2, seed=2))
    assert position("a.jpg", 0) == position("a.jpg", 0) != position("a.jpg", 1)


def test_stratified_counts_are_exact_per_class():
    items = [(f"c{c}/{i}.jpg", c) for c in range(3) for i in range((c + 1) * 7)]  # 7, 14, 21 per class
    moved = hold_out({"train": items}, Holdout(val_fraction=0.25, test_fraction=0.1, stratify=True),
                     path_of=lambda item: item[0], class_of=lambda item: item[1])
    for c, n in ((0, 7), (1, 14), (2, 21)):
        counts = {name: sum(1 for _, k in members if k == c) for name, members in moved.items()}
        assert counts["val"] == int(n * 0.25 + 0.5) and counts["test"] == int(n * 0.1 + 0.5)  # rounded to nearest
        assert sum(counts.values()) == n


@pytest.mark.parametrize("holdout, match", [
    (dict(val_fraction=1.0), r"val_fraction: must be a fraction in \[0, 1\)"),
    (dict(val_fraction=-0.1), "val_fraction"),
    (dict(val_fraction=0.6, test_fraction=0.4), "must leave some of train"),
    (dict(val_fraction=0.1, seed=-1), "split_seed"),
])
def test_bad_fractions_are_refused_naming_them(holdout, match):
    with pytest.raises(ValueError, match=match):
        Holdout(**holdout)


def test_conversion_records_the_rule_and_refuses_an_existing_split(tmp_path):
    src = tmp_path / "src"
    make_tree(src, classes=("cat", "dog"), per_class=10)
    manifest = convert_image_tree(src, tmp_path / "out", holdout=Holdout(val_fraction=0.3, seed=3))
    assert manifest.split_rule == {"method": "hash", "seed": 3, "from": "train", "fractions": {"val": 0.3}}
    assert manifest.splits["train"].records + manifest.splits["val"].records == 20
    stratified = convert_image_tree(src, tmp_path / "strat", holdout=Holdout(val_fraction=0.3, stratify=True))
    assert stratified.splits["val"].class_counts == {"cat": 3, "dog": 3}
    assert stratified.split_rule["method"] == "stratified" and stratified.fingerprint != manifest.fingerprint
    split_src = tmp_path / "splits"
    make_tree(split_src, splits=("train", "val"), per_class=3)
    with pytest.raises(InputError, match=r"already has a 'val' split \(got --val-fraction 0.2\)"):
        convert_image_tree(split_src, tmp_path / "x", holdout=Holdout(val_fraction=0.2))
    held = convert_image_tree(split_src, tmp_path / "t", holdout=Holdout(test_fraction=0.5))  # val stays, test added
    assert set(held.splits) == {"train", "val", "test"} and held.splits["val"].records == 6


def test_stratify_needs_class_labels(tmp_path):
    from tfshard.ingest import ImageOptions

    src = tmp_path / "src"
    make_tree(src, classes=("a",), per_class=4)
    csv = tmp_path / "v.csv"
    csv.write_text("path,label\n" + "".join(f"a/{i:03d}.jpg,{i / 2}\n" for i in range(4)))
    with pytest.raises(InputError, match="--stratify keeps each class's share exact, so it needs class labels"):
        convert_image_tree(src, tmp_path / "out", image=ImageOptions(labels_file=str(csv)),
                           holdout=Holdout(val_fraction=0.25, stratify=True))


def test_episodes_hold_out_too_and_the_cli_says_the_rule(tmp_path, cli):
    src = tmp_path / "eps"
    save_episodes(src, {f"run{i}.npy": e for i, e in enumerate(random_episodes([5] * 10))})
    manifest = convert_episode_tree(src, tmp_path / "out", holdout=Holdout(test_fraction=0.3))
    assert set(manifest.splits) == {"train", "test"} and manifest.split_rule["fractions"] == {"test": 0.3}
    assert sum(len(s.episodes) for s in manifest.splits.values()) == 10
    images = tmp_path / "img"
    make_tree(images, per_class=5)
    result = cli("images", images, tmp_path / "cli", "--val-fraction", "0.2", "--split-seed", "4", "--workers", "0")
    assert result.exit_code == 0, result.output
    assert "held out: val 0.2 of train (a seeded hash of each path, seed 4)" in result.output
    bad = cli("images", images, tmp_path / "bad", "--val-fraction", "1.5")
    assert bad.exit_code != 0 and "--val-fraction: must be a fraction in [0, 1)" in bad.output
