"""Pictures of a dataset: a contact sheet of images by class, or episodes over time with their windows.

``preview(path)`` returns a ``PIL.Image`` (it shows inline in a notebook; ``.save("x.png")``
writes it). Images are decoded by the reader's own functions: the evaluation
centre crop, or with ``augmented=True`` the training crop and flip, seeded. Episode
plots need matplotlib, an optional extra (``pip install 'tfshard[preview]'``).

Sizes are bounded before anything is read: tiles of 16 to ``MAX_TILE`` pixels, at most
``MAX_PER_CLASS`` per class, a sheet of at most ``MAX_SHEET_PIXELS``, at most ``MAX_EPISODES``
episodes; labels are drawn by ``readers/fonts.py`` in any script a font on the machine has.

    readers.preview("photos-tfr").save("sheet.png")
    readers.preview("runs-tfr", length=64, shift=16).save("episodes.png")
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw

from ..format.records import MULTI_LABEL_KEY, VALUE_KEY, image_features_of, parse_spec
from ..format.storage import write_atomic
from ..readers import files as files_lib
from ..readers.arguments import check_count
from ..readers.episodes import episodes as read_episodes
from ..readers.episodes import feature_schema
from ..readers.image_ops import decode_center_crop, decode_random_crop
from ..readers.windowing.starts import WindowSpec
from ..readers.windows.dataset import resident_layout
from ..readers.windows.layout import check_window_args
from . import fonts as fonts_lib

LABEL_WIDTH = 150  # the class-name column of a contact sheet
CAPTION_HEIGHT = 16  # the file name under each tile
GAP = 4
MAX_ROWS = 16  # classes shown; a sheet says how many more there are
MIN_TILE, MAX_TILE = 16, 1024
MAX_PER_CLASS = 64
# 64 megapixels (192 MB of RGB) stays under Pillow's decompression-bomb limit (~89.5 megapixels), so the PNG
# reopens without a warning, and no sheet it allows is wider than JPEG's 65,535 pixels.
MAX_SHEET_PIXELS = 64_000_000
MAX_EPISODES = 10  # one line each in matplotlib's ten distinct colours; also bounds what is read into memory
MAX_PANELS = 16  # features drawn (a panel of 220 pixels each); the plot says how many more there are
BACKGROUND, INK = (255, 255, 255), (20, 20, 20)
VALUE_ROWS = 4  # rows of a value-labelled sheet (the first images in shard order, captioned with their values)
_INSTALL = "pip install 'tfshard[preview]' (from a clone: pip install -e '.[preview]')"


def sheet_size(rows: int, per_class: int, tile: int) -> tuple[int, int]:
    """Width and height in pixels of a contact sheet of ``rows`` classes, ``per_class`` tiles of ``tile`` pixels."""
    return LABEL_WIDTH + per_class * (tile + GAP) + GAP, rows * (tile + CAPTION_HEIGHT + GAP) + GAP + CAPTION_HEIGHT


def tile_box(row: int, column: int, tile: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of one image tile on a contact sheet."""
    left = LABEL_WIDTH + GAP + column * (tile + GAP)
    top = GAP + row * (tile + CAPTION_HEIGHT + GAP)
    return left, top, left + tile, top + tile


def check_sheet(path: str, rows: int, per_class: int, tile: int) -> None:
    """Refuses, before anything is read, a tile size, per-class count or sheet over the limits above."""
    check_count(tile, "tile", path, low=MIN_TILE, high=MAX_TILE, fix="pass a --tile (pixels a side) in that range")
    check_count(per_class, "n", path, high=MAX_PER_CLASS, fix="pass an -n (images per class) in that range")
    width, height = sheet_size(max(rows, 1), per_class, tile)  # no classes: budgeted as one row (JPEG's width)
    if width * height > MAX_SHEET_PIXELS:
        raise ValueError(
            f"{path}: {rows} rows of {per_class} tiles of {tile} pixels make a {width}x{height} sheet, "
            f"{width * height / 1e6:.1f} megapixels, over the limit of {MAX_SHEET_PIXELS / 1e6:.0f} "
            f"(got n={per_class}, tile={tile}); pass a smaller -n or --tile"
        )


def _records_of(dataset: files_lib.DatasetInfo, split: str, keys: tuple[str, ...]):
    """The split's records parsed for ``keys``, in shard order (read lazily: the caller stops when it has enough)."""
    manifest = dataset.manifest
    spec = parse_spec(image_features_of(manifest.labels, manifest.label_columns), keys)
    return itertools.chain.from_iterable(records.map(lambda r: tf.io.parse_single_example(r, spec))
                                         for records in files_lib.records_in_order(dataset, split))


def _name(parsed) -> str:
    return parsed["image/filename"].numpy().decode("utf-8", "replace")


def _first_per_class(dataset: files_lib.DatasetInfo, split: str, classes: list[int], per_class: int) -> dict:
    """``{label: [(encoded, caption), ...]}``: the first ``per_class`` records of each class, in shard order,
    captioned with their file name (multi-label: an image is in the row of each of its classes, captioned with
    all of them)."""
    multi = dataset.manifest.labels == "multi"
    key = MULTI_LABEL_KEY if multi else "image/class/label"
    counts = files_lib.split_info(dataset, split).class_counts
    wanted = {label: min(per_class, counts.get(dataset.manifest.class_names[label], 0)) for label in classes}
    found: dict[int, list] = {label: [] for label in classes}
    missing = sum(wanted.values())  # stop as soon as every class has what the split holds of it: no full pass
    keys = ("image/encoded", key, "image/filename", *(("image/class/text",) if multi else ()))
    for parsed in _records_of(dataset, split, keys) if missing else ():
        held = parsed[key].values.numpy().tolist() if multi else [int(parsed[key])]
        caption = parsed["image/class/text"].numpy().decode("utf-8", "replace") if multi else None
        for label in held:
            if label in found and len(found[label]) < wanted[label]:
                found[label].append((parsed["image/encoded"], caption or os.path.basename(_name(parsed))))
                missing -= 1
        if not missing:
            break
    return found


def _first_values(dataset: files_lib.DatasetInfo, split: str, rows: int, per_class: int) -> dict:
    """``{row: [(encoded, caption), ...]}`` for value labels: the first records in shard order, ``per_class`` a
    row, each captioned with its values."""
    found: dict[int, list] = {row: [] for row in range(rows)}
    wanted = min(rows * per_class, files_lib.split_info(dataset, split).records)
    taken = 0
    for parsed in _records_of(dataset, split, ("image/encoded", VALUE_KEY)) if wanted else ():
        caption = ", ".join(f"{v:.4g}" for v in parsed[VALUE_KEY].numpy().tolist())
        found[taken // per_class].append((parsed["image/encoded"], caption))
        taken += 1
        if taken == wanted:
            break
    return found


def image_sheet(path: str, split: str = "train", per_class: int = 8, *, tile: int = 128, augmented: bool = False,
                seed: int = 0, fonts: Sequence[str] | None = None) -> Image.Image:
    """A contact sheet: a row per class (the first ``MAX_ROWS``), the first ``per_class`` images of each, captioned
    with their source file. Tiles are what ``readers.images`` yields at ``image_size=tile``: the evaluation
    centre crop, or with ``augmented`` the training random-resized crop and flip, seeded by ``seed`` and the tile.

    Args:
      per_class: 1 to ``MAX_PER_CLASS`` (64) images per class.
      tile: 16 to ``MAX_TILE`` (1024) pixels a side; the whole sheet at most ``MAX_SHEET_PIXELS`` (64 megapixels),
        so 16 classes of tiles of 1024 pixels take at most 3 a row.
      fonts: font files (or names in the system's font folders) tried in turn for each character of the labels;
        default ``fonts.default_fonts()``: DejaVu Sans and Last Resort from matplotlib when it is installed, and
        common system fonts. See ``fonts.Labeller``.

    Raises:
      ValueError: another kind of dataset, a split that does not exist, or sizes out of range (before any read).

    Example:
      image_sheet("photos-tfr", per_class=4, tile=64).size  # (426, 1364) for 16 classes or more
    """
    dataset = files_lib.info(path)
    if dataset.manifest.kind != "images":
        raise ValueError(f"{path}: not an images dataset (kind {dataset.manifest.kind!r}); use episode previews for it")
    manifest = dataset.manifest
    values = manifest.labels == "value"
    names = [", ".join(manifest.label_columns)] * VALUE_ROWS if values else manifest.class_names
    classes = list(range(min(len(names), MAX_ROWS)))
    check_sheet(path, len(classes), per_class, tile)
    if not isinstance(augmented, bool):
        raise ValueError(f"{path}: augmented must be True or False (got augmented={augmented!r})")
    check_count(seed, "seed", path, low=-(2**63), high=2**63 - 1, fix="pass a seed that fits in 64 bits")
    labeller = fonts_lib.Labeller(fonts_lib.default_fonts() if fonts is None else fonts)
    if values:
        found = _first_values(dataset, split, len(classes), per_class)
        classes = [row for row in classes if found[row]] or classes[:1]
    else:
        found = _first_per_class(dataset, split, classes, per_class)
    sheet = Image.new("RGB", sheet_size(len(classes), per_class, tile), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for row, label in enumerate(classes):
        left, top, _, _ = tile_box(row, 0, tile)
        labeller.draw(draw, (GAP, top + tile // 2 - 6), names[label], LABEL_WIDTH - 2 * GAP, INK)
        for column, (encoded, caption) in enumerate(found[label]):
            if augmented:
                pixels = decode_random_crop(encoded, tf.constant([seed, row * per_class + column], tf.int64),
                                            (tile, tile), flip=True)
            else:
                pixels = decode_center_crop(encoded, (tile, tile))
            box = tile_box(row, column, tile)
            sheet.paste(Image.fromarray(pixels.numpy()), box[:2])
            labeller.draw(draw, (box[0], box[3] + 2), caption, tile, INK)
    footer = f"{path} · split {split} · {'augmented, seed ' + str(seed) if augmented else 'evaluation crop'}"
    if len(names) > len(classes) and not values:
        footer += f" · {len(names) - len(classes)} more classes not shown"
    labeller.draw(draw, (GAP, sheet.height - CAPTION_HEIGHT), footer, sheet.width - 2 * GAP, INK)
    return sheet


def _stats_text(mean, std) -> str:
    def show(values):
        if values is None:
            return "n/a"
        shown = ", ".join("n/a" if v is None else f"{v:.3g}" for v in values[:3])
        return f"[{shown}{', …' if len(values) > 3 else ''}]"

    return f"mean {show(mean)}, std {show(std)}"


def check_episode_args(path: str, split: str, episodes: int, length: int | None, shift: int | None,
                       max_windows: int) -> tuple[int, int]:
    """The window ``(length, shift)`` to draw, each defaulted from the first episode when None, after the checks
    ``readers.windows(length=, shift=)`` makes, with its messages (a split with no episode that long too)."""
    check_count(episodes, "n", path, high=MAX_EPISODES, fix="pass an -n (episodes drawn, a line each) in that range")
    check_count(max_windows, "max_windows", path, low=4, high=64, fix="pass a count of spans in that range")
    dataset = files_lib.info(path)
    if dataset.manifest.kind != "episodes":
        raise ValueError(f"{path}: not an episodes dataset (kind {dataset.manifest.kind!r}); use the image sheet "
                         "for it")
    lengths = files_lib.split_info(dataset, split).episode_lengths
    if not lengths:
        raise ValueError(f"{path}: split {split!r} holds no episodes to draw; pass another --split")
    # The given values are checked before a default is derived from them (shift from length).
    check_window_args(1 if length is None else length, 1 if shift is None else shift, 1, path)
    length = max(1, min(64, lengths[0] // 4)) if length is None else int(length)
    shift = max(1, length // 2) if shift is None else int(shift)
    resident_layout(path, split, length=length, shift=shift)  # the reader's refusals (no window at all), its words
    return length, shift


def _label_text(manifest, label) -> str:
    """An episode's label as people read it: its class name, or its value."""
    if manifest.labels == "class" and 0 <= int(label) < len(manifest.class_names):
        return manifest.class_names[int(label)]
    return f"{float(label):.4g}"


def episode_plot(path: str, split: str = "train", episodes: int = 3, *, length: int | None = None,
                 shift: int | None = None, max_windows: int = 12) -> Image.Image:
    """One panel per feature (the first ``MAX_PANELS``, by name) with the first ``episodes`` episodes over time
    (the first element of each step), titled with the manifest's mean and std, then one panel with the windows of
    the first episode as spans: where ``readers.windows(length=, shift=)`` cuts it (never across its end; the
    first windows and the last four when there are more than ``max_windows``). Needs matplotlib.

    Args:
      episodes: 1 to ``MAX_EPISODES`` (10); only those are read.
      length, shift: the window; default a quarter of the first episode (at most 64) and half the length.
        Refused exactly as ``readers.windows`` refuses them; a first episode shorter than the window (while
        others are long enough) is drawn with a line saying so.

    Example:
      episode_plot("runs-tfr", length=64, shift=16).size  # (1000, 660) for two features
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"episode previews need matplotlib ({e}); {_INSTALL}") from None
    length, shift = check_episode_args(path, split, episodes, length, shift, max_windows)
    dataset = files_lib.info(path)
    info = files_lib.split_info(dataset, split)
    every = sorted(feature_schema(dataset))
    names = every[:MAX_PANELS]
    read = read_episodes(path, split, features=names, with_keys=True).take(episodes)
    shown, names_of = [], []  # each episode's values, and its name in the legend: its real id (and label)
    for keys, episode in read:
        values = {k: v.numpy() for k, v in episode.items()}
        label = values.pop("label", None)
        names_of.append(f"episode {int(keys['episode'])}" + ("" if label is None else
                                                            f" ({_label_text(dataset.manifest, label)})"))
        shown.append(values)
    steps = len(shown[0][names[0]])  # the first episode read: the one whose windows are drawn
    figure = Figure(figsize=(10, 2.2 * (len(names) + 1)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(names) + 1, 1)
    for ax, name in zip(axes, names):
        for index, episode in enumerate(shown):
            values = np.asarray(episode[name]).reshape(len(episode[name]), -1)
            if values.shape[1]:
                ax.plot(values[:, 0].real.astype(np.float64), linewidth=0.8, label=names_of[index])
        width = "" if shown[0][name].ndim == 1 else f"[0] of {list(shown[0][name].shape[1:])}"
        ax.set_title(f"{name}{width}: {_stats_text(info.feature_mean.get(name), info.feature_std.get(name))}",
                     fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
    ax = axes[-1]
    count = WindowSpec(length, shift).count([steps])
    shown_windows = list(range(count))
    if count > max_windows:  # the first ones and the last few, so the end of the episode shows too
        shown_windows = shown_windows[: max_windows - 4] + shown_windows[-4:]
    if count:
        ax.broken_barh([(0, steps)], (-1.2, 0.8), color="0.7")  # the episode, under its windows
    else:  # not an error: the reader takes its windows from the longer episodes
        ax.text(0.5, 0.5, f"{names_of[0]} has {steps} steps, fewer than the window's {length}: it yields no window",
                transform=ax.transAxes, ha="center", va="center", fontsize=9)
    for level, k in enumerate(shown_windows):  # window k of an episode starts at k * shift (windowing/starts.py)
        ax.broken_barh([(k * shift, length)], (level, 0.8), color=f"C{k % 10}")
        ax.text(k * shift + length + 2, level + 0.4, f"#{k}", fontsize=7, va="center")
    ax.set_xlim(0, max(steps, 1))
    ax.set_xlabel("time step")
    ax.set_yticks([])
    more = f", {len(shown_windows)} shown" if count > max_windows else ""
    hidden = f"; {len(every) - len(names)} more features not shown" if len(every) > len(names) else ""
    ax.set_title(f"windows of {names_of[0]} ({steps} steps): length {length}, shift {shift}, {count} windows{more}"
                 f"{hidden}", fontsize=9, loc="left")
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return Image.open(io.BytesIO(out.getvalue())).convert("RGB")


def preview(path: str, split: str = "train", n: int | None = None, *, augmented: bool | None = None,
            seed: int | None = None, tile: int | None = None, length: int | None = None,
            shift: int | None = None) -> Image.Image:
    """A picture of a tfshard dataset, as a ``PIL.Image``: ``image_sheet`` for images (``n`` per class, default 8;
    ``tile`` default 128, ``augmented`` default False, ``seed`` default 0), ``episode_plot`` for episodes (``n``
    episodes, default 3; ``length``/``shift`` of the windows drawn). An option of the other kind of dataset is
    refused, not ignored: None means not given.

    Raises:
      ValueError: as ``image_sheet``/``episode_plot``, or an option that does not apply to this kind of dataset.

    Example:
      preview("photos-tfr", n=4, tile=64).save("sheet.png")
      preview("photos-tfr", length=16)  # ValueError: "...: length (--length) applies to episode datasets, ..."
    """
    kind = files_lib.info(path).manifest.kind
    given = {"augmented": augmented, "seed": seed, "tile": tile, "length": length, "shift": shift}
    other, applies = (("length", "shift"), "episode") if kind == "images" else (("augmented", "seed", "tile"), "image")
    for name in other:
        if given[name] is not None:
            raise ValueError(f"{path}: {name} (--{name}) applies to {applies} datasets, and this one holds {kind} "
                             f"(got {name}={given[name]!r}); drop it")
    if kind == "images":
        return image_sheet(path, split, 8 if n is None else n, tile=128 if tile is None else tile,
                           augmented=False if augmented is None else augmented, seed=0 if seed is None else seed)
    return episode_plot(path, split, 3 if n is None else n, length=length, shift=shift)


PICTURE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG"}


def save_picture(image: Image.Image, path: str) -> None:
    """Writes a preview to ``path`` (PNG, or JPEG by the extension) under a fresh temporary name, then renames it:
    the folder is the user's, so nothing planted at a predictable name is ever written through."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in PICTURE_FORMATS:
        raise ValueError(f"{path}: --output must end in .png, .jpg or .jpeg (got {extension or 'no extension'})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: folder {folder} does not exist; create it or choose another --output")
    data = io.BytesIO()
    image.save(data, PICTURE_FORMATS[extension])
    write_atomic(path, data.getvalue())
