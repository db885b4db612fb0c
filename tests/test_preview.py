"""Pictures of a dataset (`tfshard preview`, readers.preview): real conversions, real decodes, pixels read back.

Then the attacks: sizes that would not fit in memory, window arguments the reader refuses, options of the other kind
of dataset, names in scripts Pillow's own font does not have, odd classes, episodes and shards, and the CLI's output
paths. Found bugs, since fixed: a planted temporary of `tfshard preview -o`, newlines in names. Datasets that tests
only read are converted once for the module; a test that changes one gets a copy.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    convert_episode_tree,
    convert_image_tree,
    image_features,
    make_tree,
    random_episodes,
    save_episodes,
    write_jpeg,
)
from PIL import Image, ImageDraw
from tfshard import readers
from tfshard.ingest import ConvertOptions, EpisodeOptions, convert_images
from tfshard.readers.image_ops import decode_center_crop
from tfshard.tools import fonts, series
from tfshard.tools.episode_plot import episode_figure, picture_size
from tfshard.tools.preview import (
    GAP,
    LABEL_WIDTH,
    MAX_EPISODES,
    MAX_PANELS,
    MAX_PER_CLASS,
    MAX_ROWS,
    MAX_SHEET_PIXELS,
    MAX_TILE,
    MIN_TILE,
    check_sheet,
    image_sheet,
    sheet_size,
    tile_box,
)
from tfshard.tools.strips import stats_text

WHITE = 255


COLORS = {"blue": (20, 40, 230), "red": (230, 30, 20)}


def _solid_tree(root, per_class: int = 3) -> None:
    """Class folders whose every image is one flat colour (a JPEG of a flat colour decodes to nearly that colour)."""
    for name, color in COLORS.items():
        os.makedirs(root / name)
        for i in range(per_class):
            Image.new("RGB", (48 + 8 * i, 36), color).save(root / name / f"{name}_{i}.jpg", quality=95)


@pytest.fixture(scope="module")
def solid_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("solid")
    _solid_tree(root / "src")
    out = root / "out"
    convert_images(str(root / "src"), str(out), ConvertOptions(num_shards=2), workers=0, progress=False)
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
    assert os.listdir(tmp_path) == ["sheet.png"]  # no temporary left behind
    split = cli("preview", solid_dataset, "-o", path, "--split", "test")
    assert split.exit_code == 1 and "no split 'test'" in split.output


@pytest.fixture(scope="module")
def episode_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("episodes")
    episodes = random_episodes([120, 90, 200], width=3)
    save_episodes(root / "episodes", {f"e{i}.npz": {"obs": e, "act": np.arange(len(e), dtype=np.int32)}
                                      for i, e in enumerate(episodes)})
    out = root / "episodes-out"
    convert_episode_tree(root / "episodes", out)
    return str(out)


def test_episode_plot_has_a_panel_per_feature_and_the_windows(episode_dataset, tmp_path, cli):
    picture = readers.preview(episode_dataset, n=2, length=16, shift=4)
    assert picture.size == picture_size([1, 3]) == (1000, 680)  # act, obs's 3 channels a strip each, the windows
    assert len(picture.getcolors(2**24)) > 100  # lines, spans, text: not a blank canvas
    path = tmp_path / "episodes.png"
    result = cli("preview", episode_dataset, "-o", path, "--length", "16", "--shift", "4")
    assert result.exit_code == 0, result.output
    with Image.open(path) as written:
        assert written.format == "PNG" and written.size == (1000, 680)


def test_episode_plot_renders_once_what_savefig_draws(episode_dataset):
    """The picture is one render of the laid-out figure (no PNG round trip, no second layout): the same pixels as
    matplotlib's own savefig of the same figure, whose extra draw lays it out again."""
    from tfshard.tools.episode_plot import episode_plot

    options = {"length": 16, "shift": 4, "episodes": 2}
    drawn = io.BytesIO()
    episode_figure(episode_dataset, **options).savefig(drawn, format="png")
    saved = np.asarray(Image.open(drawn).convert("RGB"))
    assert np.array_equal(np.asarray(episode_plot(episode_dataset, **options)), saved)


def test_the_fewest_windows_shown_still_show_both_ends(episode_dataset):
    """max_windows=4, the least it takes: the first window and the last three (its first group was empty: an
    IndexError drawing it)."""
    figure = episode_figure(episode_dataset, length=4, shift=1, max_windows=4)
    first, last = figure.axes[-2:]
    count = int(re.search(r"(\d+) windows, 4 shown", first.get_title(loc="left")).group(1))
    assert [t.get_text() for t in first.texts] == ["#0"]
    assert [t.get_text() for t in last.texts] == [f"#{k}" for k in range(count - 3, count)]


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
    (what, value), = bad.items()  # length and shift in readers.windows' own words (below)
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


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_tree(str(root / "src"), per_class=2, size=(20, 20))
    convert_image_tree(root / "src", root / "out")
    return str(root / "out")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Episodes of 5 and 100 steps, in that order (no write-time shuffle): the first is shorter than most windows."""
    root = tmp_path_factory.mktemp("runs")
    save_episodes(root / "eps", {"a.npy": np.arange(5, dtype=np.float32)[:, None],
                                 "b.npy": np.arange(100, dtype=np.float32)[:, None] * 0.5})
    out = root / "eps-out"
    convert_episode_tree(root / "eps", out, seed=None)
    assert readers.info(str(out)).episode_lengths("train") == [5, 100]
    return str(out)


def _without_shards(golden: str, copy) -> str:
    """A copy of ``golden`` with its shards removed. Refusals up front read no record: with the shards gone, a read
    would fail with another error."""
    out = str(shutil.copytree(golden, copy))
    for split in readers.info(out).splits:
        for path in readers.info(out).shard_paths(split):
            os.remove(path)
    return out


@pytest.fixture
def bare_photos(photos, tmp_path):
    return _without_shards(photos, tmp_path / "bare-photos")


@pytest.fixture
def bare_runs(runs, tmp_path):
    return _without_shards(runs, tmp_path / "bare-runs")


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
def test_huge_sheets_are_refused_up_front_in_one_line(bare_photos, tmp_path, cli, bad, named):
    photos = bare_photos
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


def test_huge_episode_counts_are_refused_before_reading_the_split(bare_runs, tmp_path, cli):
    runs = bare_runs  # a read of the split would now fail: the refusal comes first
    message = f"{runs}: n must be a positive integer (got n=100000), in [1, {MAX_EPISODES}]; pass an -n (episodes drawn"
    with pytest.raises(ValueError, match=re.escape(message)):
        readers.preview(runs, n=100_000)
    result = cli("preview", runs, "-o", tmp_path / "x.png", "-n", "100000")
    assert result.exit_code == 1 and "n must be a positive integer (got n=100000), in [1, 10]" in result.output


def test_n_up_to_the_limit_draws_the_episodes_there_are(runs):
    assert readers.preview(runs, n=MAX_EPISODES).size == (1000, 440)  # two episodes, one feature, the windows


def test_a_handful_of_features_by_default_and_at_most_the_panel_limit_chosen(tmp_path):
    save_episodes(tmp_path / "eps", {"e.npz": {f"f{i:02d}": np.arange(10.0) * i for i in range(MAX_PANELS + 2)}})
    convert_episode_tree(tmp_path / "eps", tmp_path / "out")
    out = str(tmp_path / "out")
    assert readers.preview(out).size == (1000, 220 * (series.DEFAULT_FEATURES + 1))  # and the windows panel
    every = [f"f{i:02d}" for i in range(MAX_PANELS + 2)]
    assert readers.preview(out, feature=every[:MAX_PANELS]).size == (1000, 220 * (MAX_PANELS + 1))
    with pytest.raises(ValueError, match=re.escape(f"{out}: choose 1 to {MAX_PANELS} features to draw (got feature=")):
        readers.preview(out, feature=every)


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


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    root = tmp_path_factory.mktemp("scripts")
    for i, name in enumerate(sorted(NAMES)):
        write_jpeg(str(root / "src" / name / f"{i}.jpg"), i)
    convert_image_tree(root / "src", root / "out")
    return str(root / "out")


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


# --- odd classes, episodes, shards and output paths ------------------------------------------------------------------


def _records(out: str, split: str = "train") -> list[dict]:
    """Every record of a split in manifest order, parsed with the manifest's own feature table."""
    paths = readers.info(out).shard_paths(split)
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, image_features()).items()}
            for r in tf.data.TFRecordDataset(paths)]


def _tile(sheet, row, column, tile) -> np.ndarray:
    return np.asarray(sheet.crop(tile_box(row, column, tile)))


def _first_of_each_class(out: str, split: str = "train") -> dict:
    first = {}
    for record in _records(out, split):
        first.setdefault(int(record["image/class/label"]), record["image/encoded"])
    return first


# ----------------------------------------------------------------------------------------------------- preview: images


@pytest.fixture(scope="module")
def tree_out(tmp_path_factory):
    """The two-class tree of 12 seeded 16x16 JPEGs (conftest's ``image_tree``), converted once for the module."""
    root = tmp_path_factory.mktemp("tree")
    make_tree(str(root / "src"))
    convert_image_tree(root / "src", root / "out")
    return str(root / "out")


def test_over_max_rows_classes_first_sixteen_rows_hold_the_readers_decode(tmp_path):
    make_tree(str(tmp_path / "src"), classes=[f"c{i:02d}" for i in range(MAX_ROWS + 4)], per_class=1, size=(40, 30))
    out = str(tmp_path / "out")
    convert_image_tree(tmp_path / "src", out, num_shards=2)
    sheet = readers.preview(out, n=3, tile=16)  # n larger than the one image per class
    assert sheet.size == sheet_size(MAX_ROWS, 3, 16)  # 16 rows, the footer says how many more
    first = _first_of_each_class(out)
    for row in range(MAX_ROWS):
        assert np.array_equal(_tile(sheet, row, 0, 16), decode_center_crop(first[row], (16, 16)).numpy()), row
        assert _tile(sheet, row, 1, 16).min() == WHITE and _tile(sheet, row, 2, 16).min() == WHITE
    footer = np.asarray(sheet.convert("L"))[-14:]
    assert footer.min() < 100  # the footer line is drawn


def test_grayscale_cmyk_unicode_and_overlong_names_draw_at_the_minimum_tile(tmp_path):
    src = tmp_path / "src"
    long_class, long_file = "ü" * 120, "é" * 100 + ".jpg"
    write_jpeg(str(src / "猫🐱" / "gray.jpg"), 1, size=(30, 20), mode="L")
    os.makedirs(src / long_class)
    Image.new("CMYK", (24, 36), (10, 200, 30, 0)).save(src / long_class / "cmyk.jpg")
    write_jpeg(str(src / long_class / long_file), 2, size=(17, 17))
    out = str(tmp_path / "out")
    convert_image_tree(src, out)
    names = readers.info(out).class_names
    first = {label: [r["image/encoded"] for r in _records(out) if r["image/class/label"] == label] for label in (0, 1)}
    for augmented in (False, True):
        sheet = readers.preview(out, n=2, tile=16, augmented=augmented, seed=7)
        assert sheet.size == sheet_size(len(names), 2, 16) and sheet.mode == "RGB"
    sheet = readers.preview(out, n=2, tile=16)
    for label in (0, 1):
        for column, encoded in enumerate(first[label]):
            assert np.array_equal(_tile(sheet, label, column, 16), decode_center_crop(encoded, (16, 16)).numpy())


@pytest.mark.parametrize("bad", [{"tile": 15}, {"tile": 0}, {"n": -1}, {"n": 0}, {"split": "nope"}])
def test_bad_sheet_arguments_are_value_errors_naming_the_dataset(tree_out, tmp_path, cli, bad):
    out = tree_out
    with pytest.raises(ValueError, match=str(out)):
        readers.preview(out, **bad)
    (option, value), = bad.items()
    flag = {"n": "-n"}.get(option, f"--{option}")
    result = cli("preview", out, "-o", tmp_path / "x.png", flag, value)
    assert result.exit_code == 1 and f"error: {out}" in result.output and not os.path.exists(tmp_path / "x.png")


def test_a_class_with_no_images_in_the_split_is_an_empty_labelled_row(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), classes=("a", "b"), per_class=2, splits=["train"])
    write_jpeg(str(src / "val" / "a" / "only.jpg"), 50, size=(20, 20))
    out = str(tmp_path / "out")
    convert_image_tree(src, out)
    assert readers.info(out).manifest.splits["val"].class_counts == {"a": 1, "b": 0}
    sheet = readers.preview(out, "val", n=2, tile=16)
    assert sheet.size == sheet_size(2, 2, 16)
    assert _tile(sheet, 0, 0, 16).min() < WHITE and _tile(sheet, 1, 0, 16).min() == WHITE
    top = tile_box(1, 0, 16)[1]
    assert np.asarray(sheet.crop((4, top, 140, top + 16)).convert("L")).min() < 100  # the name "b" is still written


def test_deleted_truncated_or_corrupt_shards_fail_clearly(tree_out, tmp_path, cli):
    out = str(shutil.copytree(tree_out, tmp_path / "out"))
    shard = readers.info(out).shard_paths("train")[0]
    data = open(shard, "rb").read()
    cases = [(data[: len(data) // 2], ValueError, "not the size the manifest says"),
             (data[:100] + bytes(len(data) - 100), tf.errors.DataLossError, "corrupted record"),
             (None, FileNotFoundError, "is missing")]
    for content, error, message in cases:
        if content is None:
            os.remove(shard)
        else:
            with open(shard, "wb") as f:
                f.write(content)
        with pytest.raises(error, match=message):
            readers.preview(out, tile=16)
        result = cli("preview", out, "-o", tmp_path / "x.png", "--tile", "16")
        assert result.exit_code == 1 and message in result.output, result.output
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


def test_newline_in_class_and_file_names_does_not_break_the_sheet(tmp_path):
    write_jpeg(str(tmp_path / "src" / "two\nlines" / "a\nb.jpg"), 3)
    out = str(tmp_path / "out")
    convert_image_tree(tmp_path / "src", out)
    assert readers.info(out).class_names == ["two\nlines"]  # the converter accepts it, so the sheet must draw it
    assert readers.preview(out, n=1, tile=16).size == sheet_size(1, 1, 16)


# -------------------------------------------------------------------------------------------------- preview: episodes


@pytest.fixture(scope="module")
def odd_episodes(tmp_path_factory):
    """1-, 3- and 2-step episodes: 4-d float64, complex64, bool, int64, uint8, and inf/NaN kept (--on-nan keep)."""
    files = {}
    for i, steps in enumerate([1, 3, 2]):
        files[f"e{i}.npz"] = {"m": np.arange(steps * 24, dtype=np.float64).reshape(steps, 2, 3, 4),
                              "z": (np.arange(steps) + 1j).astype(np.complex64), "b": np.arange(steps) % 2 == 0,
                              "i": np.arange(steps, dtype=np.int64) * -5, "u": np.arange(steps, dtype=np.uint8),
                              "n": np.array([np.inf, np.nan, -np.inf][:steps], np.float32)}
    root = tmp_path_factory.mktemp("odd-episodes")
    save_episodes(root / "eps", files)
    convert_episode_tree(root / "eps", root / "eps-out", episode=EpisodeOptions(on_nan="keep"))
    return str(root / "eps-out")


def test_episode_plot_of_odd_features_and_short_episodes(odd_episodes):
    info = readers.info(odd_episodes).manifest.splits["train"]
    assert info.feature_mean["n"] == [None]  # NaN kept: null in the manifest, n/a in the title
    assert stats_text(info.feature_mean["n"], info.feature_std["n"]) == "mean [n/a], std [n/a]"
    assert "mean n/a" in stats_text(info.feature_mean.get("z"), None)
    for options in ({}, {"length": 1, "shift": 1}, {"length": 3}, {"n": 10}):  # episode 0 has 1 step: no windows
        picture = readers.preview(odd_episodes, **options)
        # b, i, n, u, z one strip each; m's 24 channels ([2, 3, 4] a step) the first 16 of them
        assert picture.size == picture_size([1, 1, series.MAX_CHANNELS, 1, 1, 1]), options
        assert len(picture.getcolors(2**24)) > 50, options
    assert readers.preview(odd_episodes, feature="m", channel=[23, 0]).size == picture_size([2])


@pytest.mark.parametrize("bad", [{"length": 0}, {"length": -3}, {"shift": 0}, {"shift": -1}, {"n": -2}, {"length": 50},
                                 {"length": 50, "shift": -1}, {"split": "nope"}])
def test_bad_episode_plot_arguments_are_value_errors_naming_the_dataset(odd_episodes, bad):
    with pytest.raises(ValueError, match=str(odd_episodes)):
        readers.preview(odd_episodes, **bad)


def test_episode_split_with_no_episodes_is_a_clear_error(tmp_path, cli):
    save_episodes(tmp_path / "e", {"train/a.npy": np.ones((4, 2), np.float32),
                                   "val/b.npy": np.full((4, 2), np.nan, np.float32)})
    out = tmp_path / "out"
    convert_episode_tree(tmp_path / "e", out, episode=EpisodeOptions(on_nan="skip"))
    assert list(readers.info(str(out)).manifest.splits) == ["train"]  # a split of only rejected inputs is left out
    with pytest.raises(ValueError, match=f"{out}.*no split 'val'"):
        readers.preview(str(out), "val")


# ------------------------------------------------------------------------------------------------------- preview: CLI


def test_cli_output_paths_directory_symlink_overwrite_and_failed_draws(tree_out, tmp_path, cli):
    out = tree_out
    pics = tmp_path / "pics"
    os.makedirs(pics / "taken.png")
    result = cli("preview", out, "-o", pics / "taken.png", "--tile", "16")
    assert result.exit_code == 1 and str(pics / "taken.png") in result.output
    assert os.path.isdir(pics / "taken.png") and os.listdir(pics) == ["taken.png"]  # no temporary left
    result = cli("preview", out, "-o", pics / "none" / "x.png")
    assert result.exit_code == 1 and "does not exist" in result.output
    (pics / "old.png").write_bytes(b"old")
    assert cli("preview", out, "-o", pics / "old.png", "--split", "nope").exit_code == 1
    assert (pics / "old.png").read_bytes() == b"old"  # a failed draw leaves the previous picture
    assert cli("preview", out, "-o", pics / "old.png", "--tile", "16", "-n", "1").exit_code == 0
    with Image.open(pics / "old.png") as picture:
        assert picture.format == "PNG" and picture.size == sheet_size(2, 1, 16)
    os.symlink(pics / "old.png", pics / "link.jpg")
    assert cli("preview", out, "-o", pics / "link.jpg", "--tile", "16").exit_code == 0
    with Image.open(pics / "link.jpg") as picture:
        assert picture.format == "JPEG" and picture.size == sheet_size(2, 8, 16)
    assert sorted(os.listdir(pics)) == ["link.jpg", "old.png", "taken.png"]


def test_cli_preview_does_not_write_through_a_planted_temporary_symlink(tree_out, tmp_path, cli):
    out = tree_out
    os.makedirs(tmp_path / "shared")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "shared" / f".tmp-{os.getpid()}-sheet.png")  # the CLI runs in this process
    result = cli("preview", out, "-o", tmp_path / "shared" / "sheet.png", "--tile", "16")
    assert victim.read_bytes() == b"precious", result.output
    assert not os.path.islink(tmp_path / "shared" / "sheet.png")


# ------------------------------------------------------------------- preview: which series, long ones, discrete ones


def test_envelope_and_column_means_against_an_oracle():
    rng = np.random.default_rng(0)
    for steps, columns in itertools.product([1, 2, 5, 17, 100, 1801], [1, 2, 3, 7, 900, 5000]):
        values = rng.standard_normal(steps)
        values[rng.random(steps) < 0.1] = np.nan
        low, high, first = series.envelope(values, columns)
        runs = np.split(values, first[1:])  # the oracle: every step in exactly one run, in order
        assert len(runs) == min(columns, steps) and sum(map(len, runs)) == steps
        assert max(map(len, runs)) - min(map(len, runs)) <= 1  # as even as whole steps allow
        for run, lo, hi in zip(runs, low, high):
            finite = run[~np.isnan(run)]
            assert (np.isnan(lo) and not len(finite)) or (lo == finite.min() and hi == finite.max())
        flags = rng.random(steps) < 0.3
        means, first = series.column_means(flags, columns)
        assert np.allclose(means, [run.mean() for run in np.split(flags, first[1:])])
        codes = rng.integers(0, 4, steps) * (rng.random(steps) < 0.7)  # 0 most often, ties in short runs
        modes, first = series.column_modes(codes, columns)
        for run, mode in zip(np.split(codes, first[1:]), modes, strict=True):
            counts = np.bincount(run)
            assert mode == next(c for c in run if counts[c] == counts.max())  # the most frequent, met first


def test_which_features_and_channels_are_chosen_and_refused():
    schema = {"obs": (6,), "act": (), "img": (2, 3), **{f"x{i}": () for i in range(6)}}
    assert series.choose_features("ds", schema, None) == (["act", "img", "obs", "x0", "x1", "x2"], 3)
    assert series.choose_features("ds", schema, "obs") == (["obs"], 8)
    assert series.choose_channels("ds", schema, ["img", "act"], None) == {"img": ([0, 1, 2, 3, 4, 5], 0),
                                                                        "act": ([0], 0)}
    assert series.choose_channels("ds", schema, ["obs"], [4, 1]) == {"obs": ([4, 1], 4)}
    assert series.channel_name((2, 3), 4) == "ch 4 [1, 1]" and series.channel_name((6,), 4) == "ch 4"
    refusals = [
        (lambda: series.choose_features("ds", schema, ["obs", "nope"]),
         "ds: no feature 'nope' to draw (got feature=['obs', 'nope']); the dataset has act, img, obs, x0"),
        (lambda: series.choose_features("ds", schema, ["obs", "obs"]), "ds: a feature named twice"),
        (lambda: series.choose_channels("ds", schema, ["obs", "act"], [2]),
         "ds: feature 'act' has 1 channels, 0 to 0 (got channel=[2]); pass channels it has, or --feature"),
        (lambda: series.choose_channels("ds", schema, ["obs"], [-1]), "ds: channels are distinct integers from 0"),
        (lambda: series.choose_channels("ds", schema, ["obs"], [True]), "(got channel=[True])"),
        (lambda: series.choose_channels("ds", schema, ["obs"], [1, 1]), "pass each --channel once"),
        (lambda: series.time_range_of("100-500"), "--time-range: must be START:STOP, steps (100:500) or fractions"),
    ]
    for call, message in refusals:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert series.time_range_of("100:500") == (100, 500) and series.time_range_of("0.5:1") == (0.5, 1.0)
    assert [series.kind_of(np.dtype(d)) for d in ("bool", "uint8", "int64", "float16", "complex64")] == [
        "heat", "steps", "steps", "line", "line"]
    few, many = [np.arange(300) % 4, np.arange(50) % 3], [np.arange(8760) % 24]  # actions; hours of the day
    assert [series.kind_of(d, few) for d in ("int32", "uint8", "bool", "float32")] == [
        "categories", "categories", "heat", "line"]
    assert series.kind_of("int64", many) == "steps" and series.kind_of("int32", [np.array([], np.int32)]) == "steps"
    top = series.MAX_CATEGORIES
    assert [series.kind_of("int16", [np.arange(n) * 1000 - 7]) for n in (1, top, top + 1)] == [
        "categories", "categories", "steps"]  # distinct values, whatever their range


@pytest.fixture(scope="module")
def year(tmp_path_factory):
    """A year of hourly steps (8,760): 6 float channels, the hour of day (int) and whether it rained (bool)."""
    root = tmp_path_factory.mktemp("year")
    steps = np.arange(8760)
    obs = np.stack([np.sin(2 * np.pi * steps / 24 + k) * (k + 1) + k * 100 for k in range(6)], 1).astype(np.float32)
    save_episodes(root / "src", {"year.npz": {"obs": obs, "hour": (steps % 24).astype(np.int32),
                                              "rain": steps % 97 < 5}})
    convert_episode_tree(root / "src", root / "out")
    return str(root / "out")


def _bar_widths(picture: Image.Image, color=(31, 119, 180)) -> list[int]:
    """Widths in pixels of the runs of a window's colour (matplotlib's C0) in the windows panel, the picture's last
    WINDOWS_PANEL inches."""
    pixels = np.asarray(picture)[-200:]
    widths = []
    for row in np.all(pixels == color, axis=-1):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(int), [0]])))
        widths += list(edges[1::2] - edges[::2])
    return widths


def test_a_long_multichannel_series_draws_every_channel_and_readable_windows(year, tmp_path, cli):
    picture = readers.preview(year, length=64, shift=24)
    assert picture.size == picture_size([1, 6, 1])  # hour, obs's 6 channels, rain
    assert max(_bar_widths(picture)) > 40  # window #0 of 64 steps: not a sliver of 8,760 (it was 6 pixels)
    chosen = readers.preview(year, feature=["obs"], channel=[0, 5], time_range=(0, 24 * 14))
    assert chosen.size == picture_size([2])
    result = cli("preview", year, "-o", tmp_path / "y.png", "--feature", "obs", "--channel", "0", "--channel", "5",
                 "--time-range", "0:336")
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "y.png") as written:
        assert np.array_equal(np.asarray(written), np.asarray(chosen))
    fraction = cli("preview", year, "-o", tmp_path / "f.png", "--feature", "rain", "--time-range", "0.5:1.0")
    assert fraction.exit_code == 0, fraction.output


def test_the_envelope_keeps_the_range_of_every_day(year):
    """Each channel swings by ±(k + 1) around 100·k every day: on columns of a day or more, the envelope of 8,760
    steps holds the whole daily swing in every column (a line drawn point by point holds it too, but as a solid
    block); on columns of a few hours, the part of the swing those hours hold."""
    values = readers.info(year).manifest  # the stats the title shows come from here
    assert values.splits["train"].feature_mean["obs"][5] == pytest.approx(500, abs=0.1)
    daily = np.sin(2 * np.pi * np.arange(8760) / 24)
    low, high, first = series.envelope(daily, 365)
    assert np.allclose(low, -1) and np.allclose(high, 1) and np.array_equal(first, np.arange(0, 8760, 24))
    low, high, first = series.envelope(daily, 2190)  # 4 hours a column: 0, 1, 2, 3 o'clock, then 4 to 7...
    assert np.array_equal(high, np.maximum.reduceat(daily, first)) and np.all(high - low > 0.13)  # 1 - cos 30°: a peak


@pytest.mark.parametrize("bad, message", [
    ({"feature": "nope"}, "no feature 'nope' to draw (got feature=['nope']); the dataset has hour, obs, rain"),
    ({"channel": 6, "feature": "obs"}, "feature 'obs' has 6 channels, 0 to 5 (got channel=[6])"),
    ({"channel": 1}, "feature 'hour' has 1 channels, 0 to 0 (got channel=[1]); pass channels it has, or --feature"),
    ({"time_range": (100, 50)}, "time_range: steps must be 0 <= a < b (got time_range=(100, 50))"),
    ({"time_range": (0, 40), "length": 64}, "has no episode of at least 64 steps"),
])
def test_bad_series_choices_are_refused_naming_the_dataset(year, bad, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        readers.preview(year, **bad)
    assert str(caught.value).startswith(f"{year}: ")


def test_bad_series_choices_on_the_command_line(year, tmp_path, cli):
    result = cli("preview", year, "-o", tmp_path / "x.png", "--time-range", "1:2:3")
    assert result.exit_code == 1 and "--time-range: must be START:STOP" in result.output
    result = cli("preview", year, "-o", tmp_path / "x.png", "--feature", "nope")
    assert result.exit_code == 1 and "no feature 'nope' to draw" in result.output
    assert not os.path.exists(tmp_path / "x.png")


@pytest.mark.parametrize("option, value, flags", [("feature", "obs", ["--feature", "obs"]),
                                                  ("channel", [0], ["--channel", "0"]),
                                                  ("time_range", (0, 5), ["--time-range", "0:5"])])
def test_series_options_on_an_images_dataset_are_refused(photos, tmp_path, cli, option, value, flags):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ValueError, match=re.escape(f"{photos}: {option} ({flag}) applies to episode datasets, and "
                                                   f"this one holds images (got {option}={value!r}); drop it")):
        readers.preview(photos, **{option: value})
    result = cli("preview", photos, "-o", tmp_path / "x.png", *flags)
    assert result.exit_code == 1 and f"({flag}) applies to episode datasets" in result.output


def _meshes(ax) -> list:
    """The cells of a heat strip or a strip of categories on ``ax``, a row of them per episode drawn."""
    from matplotlib.collections import QuadMesh

    return [c for c in ax.collections if isinstance(c, QuadMesh)]


def test_discrete_features_draw_as_steps_heat_strips_and_categories(tmp_path, year, episode_dataset):
    """An integer of a few values (state, 0 to 4) is a strip of a colour per value, a row per episode, its cells
    the most frequent value under each pixel column; a wide-range integer (hour, 24 values; act, hundreds) stays
    steps, a boolean (flag) a grey heat strip. Ten episodes' names fit beside the rows of a channel's strip."""
    from matplotlib.colors import to_rgb

    rng = np.random.default_rng(1)
    steps = [(30 + i) * 100 for i in range(MAX_EPISODES)]
    files = {f"d{i}.npz": {"state": np.repeat(rng.integers(0, 5, n // 100), 100), "flag": rng.random(n) < .1,
                           "grid": rng.integers(0, 3, (n, 2)).astype(np.int16)} for i, n in enumerate(steps)}
    save_episodes(tmp_path / "src", files)
    convert_episode_tree(tmp_path / "src", tmp_path / "out")
    out = str(tmp_path / "out")
    figure = episode_figure(out, episodes=MAX_EPISODES, feature=["flag", "state", "grid"])
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png")  # the same pixels as episode_plot's one render (test_episode_plot_...)
    assert Image.open(drawn).size == picture_size([1, 1, 2])
    pixels = np.asarray(Image.open(drawn).convert("RGB"))
    flag = pixels[:220]  # a heat strip of grey cells, a row per episode
    assert np.all((flag[..., :1] == flag) & (flag > 20) & (flag < 235), axis=-1).sum() > 5000
    state = pixels[220:440].reshape(-1, 3)
    for rank in range(5):  # every value's colour (C0 to C4) fills cells, not only the legend's swatch
        colour = np.round(np.array(to_rgb(f"C{rank}")) * 255)
        assert np.sum(np.all(np.abs(state - colour) <= 1, axis=-1)) > 2000, rank

    strip = figure.axes[1]
    assert "a colour per value, the most frequent of each pixel column" in strip.get_title(loc="left")
    assert [t.get_text() for t in strip.get_legend().get_texts()] == ["0", "1", "2", "3", "4"]
    names = [t.get_text() for t in strip.get_yticklabels()]
    assert len(names) == len(_meshes(strip)) == MAX_EPISODES and all(n.startswith("episode ") for n in names)
    read = {f"episode {int(k['episode'])}": e["state"].numpy() for k, e in readers.episodes(out, with_keys=True)}
    for name, mesh in zip(names, _meshes(strip)):  # each row: the modes of its episode's steps, from step 0
        modes, first = series.column_modes(read[name], 900)
        assert np.array_equal(np.asarray(mesh.get_array()).ravel(), modes)
        assert np.array_equal(mesh.get_coordinates()[0, :, 0], np.append(first, len(read[name])))
    for strip in figure.axes[2:4]:  # grid's two channels, 0.8 inches each: every second (or third) row named
        shown = [t.get_text() for t in strip.get_yticklabels()]
        step = names.index(shown[1])
        assert step > 1 and shown == names[::step] and len(_meshes(strip)) == MAX_EPISODES
        size = strip.get_yticklabels()[0].get_fontsize()
        spacing = strip.get_position().height * figure.get_figheight() * 72 * step / MAX_EPISODES  # points
        assert 5 <= size < spacing  # legible, and clear of the next name

    for dataset, name in ((year, "hour"), (episode_dataset, "act")):
        strip = episode_figure(dataset, feature=name, length=8).axes[0]
        assert not _meshes(strip) and (strip.lines or strip.collections), name  # steps or their envelope
        assert "a colour per value" not in strip.get_title(loc="left")
        assert all(t.get_text().startswith("episode ") for t in strip.get_legend().get_texts())  # of episodes


# ------------------------------------------------------------------------------- preview: counts, changed inputs


def test_each_row_shows_its_class_count_beside_its_name(tmp_path):
    long_name = "a-very-long-class-name-" * 6
    make_tree(str(tmp_path / "src"), classes=(long_name, "b"), per_class=3, size=(20, 20))
    make_tree(str(tmp_path / "src"), classes=("c",), per_class=11, size=(20, 20), seed=50)
    convert_image_tree(tmp_path / "src", tmp_path / "out")
    out = str(tmp_path / "out")
    assert readers.info(out).manifest.splits["train"].class_counts == {long_name: 3, "b": 3, "c": 11}
    labels = _labels(readers.preview(out, n=1, tile=32), 3, 32)
    for label in labels:
        assert label[:, -12:].min() < 150  # the count's digits, right-aligned, even after a name cut to fit
    assert not np.array_equal(labels[1][:, -30:], labels[2][:, -30:])  # "3" and "11"


@pytest.fixture(scope="module")
def changed_photos(tmp_path_factory):
    """Class a: a JPEG, and PNG content named .jpg; class b: a CMYK JPEG, a JPEG, a gray PNG. Three are re-encoded."""
    root = tmp_path_factory.mktemp("changed")
    src = root / "src"
    write_jpeg(str(src / "a" / "ok1.jpg"), 1, size=(24, 24))
    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)).save(src / "a" / "png.jpg", format="PNG")
    os.makedirs(src / "b")
    Image.new("CMYK", (24, 36), (10, 200, 30, 0)).save(src / "b" / "cmyk.jpg")
    write_jpeg(str(src / "b" / "ok2.jpg"), 2, size=(24, 24))
    Image.fromarray(rng.integers(0, 256, (30, 24), dtype=np.uint8)).save(src / "b" / "gray.png")
    convert_image_tree(src, root / "out")
    return str(root / "out")


def test_changed_shows_only_the_inputs_the_converter_re_encoded(changed_photos, tmp_path, cli):
    out = changed_photos
    assert readers.info(out).manifest.options["converted_images"] == 3
    sheet = readers.preview(out, n=3, tile=16, changed=True)
    assert sheet.size == sheet_size(2, 3, 16)
    re_encoded = {"a/png.jpg", "b/cmyk.jpg", "b/gray.png"}
    for label in (0, 1):
        expected = [r["image/encoded"] for r in _records(out) if r["image/class/label"] == label
                    and r["image/filename"].decode() in re_encoded]
        assert len(expected) == (1, 2)[label]
        for column, encoded in enumerate(expected):
            assert np.array_equal(_tile(sheet, label, column, 16), decode_center_crop(encoded, (16, 16)).numpy())
        assert _tile(sheet, label, len(expected), 16).min() == WHITE  # passthrough JPEGs are not shown
    result = cli("preview", out, "-o", tmp_path / "c.png", "--changed", "-n", "3", "--tile", "16")
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "c.png") as written:
        assert np.array_equal(np.asarray(written), np.asarray(sheet))


def test_changed_is_refused_where_it_cannot_be_told(changed_photos, runs, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"{runs}: changed (--changed) applies to image datasets")):
        readers.preview(runs, changed=True)
    out = str(shutil.copytree(changed_photos, tmp_path / "old"))
    os.remove(os.path.join(out, "inputs.json"))
    with pytest.raises(ValueError, match=re.escape(f"{out}: changed=True needs the dataset's inputs.json")):
        readers.preview(out, changed=True)
    assert readers.preview(out, n=1, tile=16).size == sheet_size(2, 1, 16)  # the plain sheet needs none
