"""Attacks on `tfshard preview` (readers.preview): sizes that would not fit in memory, window arguments the reader
refuses, options of the other kind of dataset, and names in scripts Pillow's own font does not have. Real
conversions, real reads, pixels read back."""

from __future__ import annotations

import functools
import itertools
import os
import re
import sys

import numpy as np
import pytest
from helpers import convert_episode_tree, convert_image_tree, make_tree, save_episodes, write_jpeg
from PIL import Image, ImageDraw
from tfshard import readers
from tfshard.tools import fonts
from tfshard.tools.preview import (
    GAP,
    LABEL_WIDTH,
    MAX_EPISODES,
    MAX_PANELS,
    MAX_PER_CLASS,
    MAX_SHEET_PIXELS,
    MAX_TILE,
    MIN_TILE,
    check_sheet,
    image_sheet,
    sheet_size,
    tile_box,
)

WHITE = 255


@pytest.fixture
def photos(tmp_path):
    make_tree(str(tmp_path / "src"), per_class=2, size=(20, 20))
    convert_image_tree(tmp_path / "src", tmp_path / "out")
    return str(tmp_path / "out")


@pytest.fixture
def runs(tmp_path):
    """Episodes of 5 and 100 steps, in that order (no write-time shuffle): the first is shorter than most windows."""
    save_episodes(tmp_path / "eps", {"a.npy": np.arange(5, dtype=np.float32)[:, None],
                                     "b.npy": np.arange(100, dtype=np.float32)[:, None] * 0.5})
    out = tmp_path / "eps-out"
    convert_episode_tree(tmp_path / "eps", out, seed=None)
    assert readers.info(str(out)).episode_lengths("train") == [5, 100]
    return str(out)


def _remove_shards(out: str) -> None:
    """Refusals up front read no record: with the shards gone, a read would fail with another error."""
    for split in readers.info(out).splits:
        for path in readers.info(out).shard_paths(split):
            os.remove(path)


# ------------------------------------------------------------------------------------------------------ bounded sizes


def test_sheet_limits_match_the_sheet_size_over_a_product_of_arguments():
    for rows, per_class, tile in itertools.product([0, 1, 2, 16], [-1, 0, 1, 3, 4, 58, 60, 64, 65, 100_000],
                                                   [0, 15, 16, 128, 1000, 1024, 1025, 100_000]):
        width, height = sheet_size(max(rows, 1), per_class, tile)  # a sheet of no classes is budgeted as one row
        fits = MIN_TILE <= tile <= MAX_TILE and 1 <= per_class <= MAX_PER_CLASS and width * height <= MAX_SHEET_PIXELS
        try:
            check_sheet("ds", rows, per_class, tile)
        except ValueError as e:
            assert not fits, (rows, per_class, tile, e)
            assert str(e).startswith("ds: ") and "(got " in str(e) and "; pass " in str(e)
        else:
            assert fits and width <= 65535, (rows, per_class, tile)  # JPEG's largest width
    check_sheet("ds", 16, 3, MAX_TILE)  # the largest tiles still fit three a row of sixteen classes
    with pytest.raises(ValueError, match=r"ds: 16 rows of 4 tiles of 1024 pixels make a 4266x16724 sheet, 71\.3 "
                                         r"megapixels, over the limit of 64 \(got n=4, tile=1024\); pass a smaller"):
        check_sheet("ds", 16, 4, MAX_TILE)


@pytest.mark.parametrize("bad, named", [
    ({"tile": 100_000}, "tile must be an integer of at least 16 (got tile=100000), in [16, 1,024]"),
    ({"n": 100_000}, "n must be a positive integer (got n=100000), in [1, 64]"),
    ({"n": 60, "tile": 1024}, "megapixels, over the limit of 64"),
])
def test_huge_sheets_are_refused_up_front_in_one_line(photos, tmp_path, cli, bad, named):
    _remove_shards(photos)
    with pytest.raises(ValueError, match=re.escape(named)) as caught:
        readers.preview(photos, **bad)
    assert str(caught.value).startswith(f"{photos}: ") and "(got " in str(caught.value)
    flags = [arg for option, value in bad.items() for arg in ({"n": "-n"}.get(option, f"--{option}"), str(value))]
    result = cli("preview", photos, "-o", tmp_path / "x.png", *flags)
    assert result.exit_code == 1 and named in result.output and str(bad.get("n", bad.get("tile"))) in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "x.png")


def test_the_largest_tile_draws_the_readers_decode(tmp_path):
    write_jpeg(str(tmp_path / "src" / "a" / "big.jpg"), 1, size=(1100, 1030))
    out = str(tmp_path / "out")
    convert_image_tree(tmp_path / "src", out)
    sheet = readers.preview(out, n=1, tile=MAX_TILE)
    assert sheet.size == sheet_size(1, 1, MAX_TILE)
    assert np.asarray(sheet.crop(tile_box(0, 0, MAX_TILE))).std() > 20  # the random image, not white


def test_huge_episode_counts_are_refused_before_reading_the_split(runs, tmp_path, cli):
    _remove_shards(runs)  # a read of the split would now fail: the refusal comes first
    message = f"{runs}: n must be a positive integer (got n=100000), in [1, {MAX_EPISODES}]; pass an -n (episodes drawn"
    with pytest.raises(ValueError, match=re.escape(message)):
        readers.preview(runs, n=100_000)
    result = cli("preview", runs, "-o", tmp_path / "x.png", "-n", "100000")
    assert result.exit_code == 1 and "n must be a positive integer (got n=100000), in [1, 10]" in result.output


def test_n_up_to_the_limit_draws_the_episodes_there_are(runs):
    assert readers.preview(runs, n=MAX_EPISODES).size == (1000, 440)  # two episodes, one feature, the windows


def test_features_past_the_panel_limit_are_left_out_not_stacked_on(tmp_path):
    save_episodes(tmp_path / "eps", {"e.npz": {f"f{i:02d}": np.arange(10.0) * i for i in range(MAX_PANELS + 2)}})
    convert_episode_tree(tmp_path / "eps", tmp_path / "out")
    assert readers.preview(str(tmp_path / "out")).size == (1000, 220 * (MAX_PANELS + 1))  # and the windows panel


# --------------------------------------------------------------------------------------------- the reader's refusals


def _refusal(call) -> str | None:
    try:
        call()
    except ValueError as e:
        return str(e)
    return None


def test_window_arguments_are_refused_exactly_as_readers_windows_refuses_them(runs):
    for length, shift in itertools.product([0, -1, True, 2.5, "4", 16, 100, 101, 10**12],
                                           [0, -2, False, 1.0, 7, 10**12]):
        theirs = _refusal(functools.partial(readers.windows, runs, length=length, shift=shift, batch_size=1,
                                            shuffle=False, drop_remainder=False))
        ours = _refusal(functools.partial(readers.preview, runs, length=length, shift=shift))
        assert ours == theirs, (length, shift)
    assert _refusal(lambda: readers.preview(runs, length=101)) == (
        f"{runs}: split 'train' has no episode of at least 101 steps (longest 100); pass a shorter length, or "
        "padding='start' (padded windows)")


def _windows_panel(picture: Image.Image) -> np.ndarray:
    """The lower of the two panels (one feature, then the windows), inside its axes."""
    pixels = np.asarray(picture.convert("RGB")).astype(int)
    return pixels[pixels.shape[0] // 2 + 40 : -50, 60:-20]


def _grey(pixels: np.ndarray) -> int:
    """Pixels of the episode's grey span (matplotlib's "0.7"), which antialiased text hardly ever hits."""
    return int(np.all(np.abs(pixels - 179) <= 1, axis=-1).sum())


def test_a_first_episode_shorter_than_the_window_is_a_line_of_text_not_a_grey_block(runs, tmp_path, cli):
    short = readers.preview(runs, length=20, shift=5)  # episode 0 has 5 steps; episode 1 has 17 windows of 20
    panel = _windows_panel(short)
    assert _grey(panel) < 50  # no span drawn for windows that do not exist
    assert (panel.min(-1) < 100).sum() > 200  # but the line of text saying so
    with_windows = readers.preview(runs, length=4, shift=1)  # episode 0 holds two windows: the span is drawn
    assert _grey(_windows_panel(with_windows)) > 2000
    result = cli("preview", runs, "-o", tmp_path / "x.png", "--length", "20", "--shift", "5")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------------ options of the other kind


@pytest.mark.parametrize("option, value", [("length", 4), ("shift", 2)])
def test_window_options_on_an_images_dataset_are_refused(photos, tmp_path, cli, option, value):
    with pytest.raises(ValueError, match=re.escape(f"{photos}: {option} (--{option}) applies to episode datasets, "
                                                   f"and this one holds images (got {option}={value}); drop it")):
        readers.preview(photos, **{option: value})
    result = cli("preview", photos, "-o", tmp_path / "x.png", f"--{option}", str(value))
    assert result.exit_code == 1 and f"--{option}) applies to episode datasets" in result.output
    assert not os.path.exists(tmp_path / "x.png")


@pytest.mark.parametrize("option, value, flags", [("augmented", True, ["--augmented"]), ("augmented", False, None),
                                                  ("seed", 0, ["--seed", "0"]), ("tile", 128, ["--tile", "128"])])
def test_image_options_on_an_episodes_dataset_are_refused(runs, tmp_path, cli, option, value, flags):
    with pytest.raises(ValueError, match=re.escape(f"{runs}: {option} (--{option}) applies to image datasets, and "
                                                   f"this one holds episodes (got {option}={value!r}); drop it")):
        readers.preview(runs, **{option: value})  # a default value passed is still passed: None is "not given"
    if flags:
        result = cli("preview", runs, "-o", tmp_path / "x.png", *flags)
        assert result.exit_code == 1 and f"--{option}) applies to image datasets" in result.output


def test_options_left_out_take_their_defaults(photos, runs, tmp_path, cli):
    assert readers.preview(photos).size == sheet_size(2, 8, 128)
    assert readers.preview(photos, augmented=True, seed=3).size == sheet_size(2, 8, 128)
    assert readers.preview(runs).size == (1000, 440)
    for out in (photos, runs):
        assert cli("preview", out, "-o", tmp_path / "x.png").exit_code == 0


# --------------------------------------------------------------------------------------------------------- fonts


def _labels(sheet: Image.Image, rows: int, tile: int) -> list[np.ndarray]:
    boxes = [(GAP, tile_box(row, 0, tile)[1], LABEL_WIDTH - GAP, tile_box(row, 0, tile)[3]) for row in range(rows)]
    return [np.asarray(sheet.crop(box).convert("L")) for box in boxes]


NAMES = ["Кошка", "Жираф", "γάτα", "σκύλ", "\ufffd" * 5, "?????"]  # pairs of one script and length, and the marks


@pytest.fixture
def scripts(tmp_path):
    for i, name in enumerate(sorted(NAMES)):
        write_jpeg(str(tmp_path / "src" / name / f"{i}.jpg"), i)
    convert_image_tree(tmp_path / "src", tmp_path / "out")
    return str(tmp_path / "out")


def test_cyrillic_and_greek_names_are_drawn_in_their_own_letters(scripts):
    names = readers.info(scripts).class_names
    labels = dict(zip(names, _labels(readers.preview(scripts, n=1, tile=32), len(names), 32)))
    for name in NAMES:
        assert labels[name].min() < 100, name  # every name is drawn
    for one, other in itertools.combinations(NAMES, 2):  # Pillow's Latin font drew both Cyrillic words as "�����"
        assert not np.array_equal(labels[one], labels[other]), (one, other)


def test_with_pillow_alone_every_name_is_still_drawn_and_unknown_letters_are_boxes(scripts):
    names = readers.info(scripts).class_names
    labels = dict(zip(names, _labels(image_sheet(scripts, per_class=1, tile=32, fonts=()), len(names), 32)))
    assert all(label.min() < 100 for label in labels.values())
    assert np.array_equal(labels["Кошка"], labels["Жираф"])  # five placeholders each: no wrong glyphs
    assert not np.array_equal(labels["Кошка"], labels["?????"])
    pillow = fonts.Labeller(())
    assert pillow.face_of("Ж") is None and pillow.face_of("a") is pillow.faces[0]


def test_default_fonts_without_matplotlib_are_the_system_fonts(monkeypatch, scripts):
    assert fonts.default_fonts()[0].endswith(os.path.join("mpl-data", "fonts", "ttf", "DejaVuSans.ttf"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if only Pillow were installed
    assert fonts.default_fonts() == list(fonts.SYSTEM_FONTS)
    assert readers.preview(scripts, n=1, tile=16).size == sheet_size(len(NAMES), 1, 16)


def test_a_character_no_font_has_is_a_visible_placeholder_not_a_wrong_glyph():
    labeller = fonts.Labeller(fonts.default_fonts())
    assert labeller.face_of("Ж") is labeller.faces[0]  # DejaVu Sans
    unassigned = "\u0378"  # no character at all: Last Resort's box, or the drawn one
    face = labeller.face_of(unassigned)
    assert face is None or face.path.endswith("LastResortHE-Regular.ttf")

    def drawn(text):
        picture = Image.new("L", (80, 16), WHITE)
        labeller.draw(ImageDraw.Draw(picture), (0, 0), text, 80, 0)
        return np.asarray(picture)

    assert drawn(unassigned).min() < 100
    assert labeller.face_of("\udcff") is None  # a lone surrogate (an undecodable byte escaped) is no character
    assert not np.array_equal(drawn(unassigned), drawn("?")) and not np.array_equal(drawn(unassigned), drawn("\ufffd"))


def test_fit_cuts_to_the_longest_prefix_that_fits():
    labeller = fonts.Labeller(fonts.default_fonts())
    text = "Кошка γάτα cat 猫\u0378 Жираф"
    for width in range(0, int(labeller.length(text)) + 2):
        fitted = labeller.fit(text, width)
        if fitted == text:
            assert labeller.length(text) <= width
            continue
        prefix = fitted[:-1]
        assert fitted.endswith("…") and text.startswith(prefix)
        fits = [k for k in range(len(text) + 1) if labeller.length(text[:k] + "…") <= width]
        assert len(prefix) == max(fits, default=0), width
    assert labeller.fit("two\nlines", 1000) == "two?lines"
