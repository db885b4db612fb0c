"""Pictures of a dataset (`tfshard preview`, readers.preview): real conversions, real decodes, pixels read back."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from helpers import convert_episode_tree, random_episodes, save_episodes
from PIL import Image
from tfshard import readers
from tfshard.ingest import ConvertOptions, convert_images
from tfshard.tools.preview import GAP, LABEL_WIDTH, sheet_size, tile_box

COLORS = {"blue": (20, 40, 230), "red": (230, 30, 20)}


def _solid_tree(root, per_class: int = 3) -> None:
    """Class folders whose every image is one flat colour (a JPEG of a flat colour decodes to nearly that colour)."""
    for name, color in COLORS.items():
        os.makedirs(root / name)
        for i in range(per_class):
            Image.new("RGB", (48 + 8 * i, 36), color).save(root / name / f"{name}_{i}.jpg", quality=95)


@pytest.fixture
def solid_dataset(tmp_path):
    _solid_tree(tmp_path / "src")
    out = tmp_path / "out"
    convert_images(str(tmp_path / "src"), str(out), ConvertOptions(num_shards=2), workers=0, progress=False)
    return str(out)


def _mean(sheet: Image.Image, box) -> np.ndarray:
    return np.asarray(sheet.crop(box), np.float64).reshape(-1, 3).mean(0)


@pytest.mark.parametrize("augmented", [False, True])
def test_a_row_per_class_in_class_order_with_the_class_colours(solid_dataset, augmented):
    sheet = readers.preview(solid_dataset, n=4, tile=32, augmented=augmented)
    assert sheet.size == sheet_size(2, 4, 32)
    for row, name in enumerate(sorted(COLORS)):  # classes are sorted: blue, then red
        for column in range(3):
            assert np.abs(_mean(sheet, tile_box(row, column, 32)) - COLORS[name]).max() < 12, (name, column)
        # The fourth tile is empty (three images per class) and the label column holds the class name's ink.
        assert _mean(sheet, tile_box(row, 3, 32)).min() == 255
        top = tile_box(row, 0, 32)[1]
        label = np.asarray(sheet.crop((GAP, top, LABEL_WIDTH - GAP, top + 32)).convert("L"))
        assert label.min() < 100, name
        caption = np.asarray(sheet.crop((tile_box(row, 0, 32)[0], top + 32, tile_box(row, 0, 32)[2], top + 32 + 14)))
        assert caption.min() < 100, name  # the source file's name under the tile


def test_augmented_tiles_follow_the_seed(tmp_path):
    rng = np.random.default_rng(0)
    os.makedirs(tmp_path / "src" / "noise")
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(tmp_path / "src" / "noise" / f"{i}.jpg")
    out = str(tmp_path / "out")
    convert_images(str(tmp_path / "src"), out, ConvertOptions(), workers=0, progress=False)
    first, again = (readers.preview(out, n=3, tile=32, augmented=True, seed=1) for _ in range(2))
    other = readers.preview(out, n=3, tile=32, augmented=True, seed=2)
    plain = readers.preview(out, n=3, tile=32)
    assert np.array_equal(np.asarray(first), np.asarray(again))
    assert not np.array_equal(np.asarray(first), np.asarray(other))
    assert not np.array_equal(np.asarray(first), np.asarray(plain))


def test_cli_writes_a_png_of_the_sheet_and_refuses_bad_outputs(solid_dataset, tmp_path, cli):
    path = tmp_path / "sheet.png"
    result = cli("preview", solid_dataset, "-o", path, "-n", "2", "--tile", "40")
    assert result.exit_code == 0, result.output
    with Image.open(path) as picture:
        assert picture.format == "PNG" and picture.size == sheet_size(2, 2, 40)
    assert f"{path}: {picture.width}x{picture.height} preview of {solid_dataset} [train]" in result.output
    bad = cli("preview", solid_dataset, "-o", tmp_path / "sheet.gif")
    assert bad.exit_code == 1 and f"{tmp_path / 'sheet.gif'}: --output must end in .png, .jpg or .jpeg" in bad.output
    missing = cli("preview", solid_dataset, "-o", tmp_path / "nowhere" / "x.png")
    assert missing.exit_code == 1 and "does not exist; create it or choose another --output" in missing.output
    assert sorted(os.listdir(tmp_path)) == sorted(["out", "sheet.png", "src"])  # no temporary left behind
    split = cli("preview", solid_dataset, "-o", path, "--split", "test")
    assert split.exit_code == 1 and "no split 'test'" in split.output


@pytest.fixture
def episode_dataset(tmp_path):
    episodes = random_episodes([120, 90, 200], width=3)
    save_episodes(tmp_path / "episodes", {f"e{i}.npz": {"obs": e, "act": np.arange(len(e), dtype=np.int32)}
                                          for i, e in enumerate(episodes)})
    out = tmp_path / "episodes-out"
    convert_episode_tree(tmp_path / "episodes", out)
    return str(out)


def test_episode_plot_has_a_panel_per_feature_and_the_windows(episode_dataset, tmp_path, cli):
    picture = readers.preview(episode_dataset, n=2, length=16, shift=4)
    assert picture.size == (1000, 660)  # 10 x 2.2 inches per panel at 100 dpi: act, obs, windows
    assert len(picture.getcolors(2**24)) > 100  # lines, spans, text: not a blank canvas
    path = tmp_path / "episodes.png"
    result = cli("preview", episode_dataset, "-o", path, "--length", "16", "--shift", "4")
    assert result.exit_code == 0, result.output
    with Image.open(path) as written:
        assert written.format == "PNG" and written.size == (1000, 660)


def test_episode_plot_without_matplotlib_says_how_to_install_it(episode_dataset, monkeypatch, cli, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match=r"episode previews need matplotlib .*pip install 'tfshard\[preview\]'"):
        readers.preview(episode_dataset)
    result = cli("preview", episode_dataset, "-o", tmp_path / "x.png")
    assert result.exit_code == 1 and "pip install 'tfshard[preview]'" in result.output


def test_kind_specific_drawings_refuse_the_other_kind(solid_dataset, episode_dataset):
    from tfshard.tools.preview import episode_plot, image_sheet

    with pytest.raises(ValueError, match=f"{episode_dataset}: not an images dataset"):
        image_sheet(episode_dataset)
    with pytest.raises(ValueError, match=f"{solid_dataset}: not an episodes dataset"):
        episode_plot(solid_dataset)


@pytest.mark.parametrize("bad", [{"n": 0}, {"length": 0}, {"shift": -2}])
def test_counts_below_one_are_refused_naming_the_dataset(episode_dataset, bad):
    (what, value), = bad.items()  # length and shift in readers.windows' own words (test_preview_attacks.py)
    with pytest.raises(ValueError, match=f"{episode_dataset}: {what} must be .*\\(got ({what}=)?{value}\\)"):
        readers.preview(episode_dataset, **bad)


def test_episode_plot_names_episodes_by_their_ids_and_labels(tmp_path):
    from tfshard.tools.preview import _label_text

    episodes = random_episodes([40, 50, 60, 70], seed=3)
    save_episodes(tmp_path / "src", {f"{name}/e{i}.npy": e for i, (name, e) in
                                     enumerate(zip(["walk", "run", "walk", "run"], episodes))})
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    manifest = readers.info(str(tmp_path / "out")).manifest
    assert [_label_text(manifest, i) for i in (0, 1)] == ["run", "walk"]
    picture = readers.preview(str(tmp_path / "out"), n=2, length=8)
    assert picture.size[0] > 0
