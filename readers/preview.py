"""Pictures of a dataset: a contact sheet of images by class, or episodes over time with their windows.

``preview(path)`` returns a ``PIL.Image`` (it shows inline in a notebook; ``.save("x.png")``
writes it). Images are decoded by the reader's own functions: the evaluation
centre crop, or with ``augmented=True`` the training crop and flip, seeded. Episode
plots need matplotlib, an optional extra (``pip install 'tfshard[preview]'``).

    readers.preview("photos-tfr").save("sheet.png")
    readers.preview("runs-tfr", length=64, shift=16).save("episodes.png")
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw, ImageFont

from ..format.names import tf_compression_type
from ..format.records import IMAGE_FEATURES, parse_spec
from . import files as files_lib
from .images import decode_center_crop, decode_random_crop
from .starts import window_starts

LABEL_WIDTH = 150  # the class-name column of a contact sheet
CAPTION_HEIGHT = 16  # the file name under each tile
GAP = 4
MAX_ROWS = 16  # classes shown; a sheet says how many more there are
BACKGROUND, INK = (255, 255, 255), (20, 20, 20)
_PREVIEW_KEYS = ("image/encoded", "image/class/label", "image/filename")
_INSTALL = "pip install 'tfshard[preview]' (from a clone: pip install -e '.[preview]')"


def sheet_size(rows: int, per_class: int, tile: int) -> tuple[int, int]:
    """Width and height in pixels of a contact sheet of ``rows`` classes, ``per_class`` tiles of ``tile`` pixels."""
    return LABEL_WIDTH + per_class * (tile + GAP) + GAP, rows * (tile + CAPTION_HEIGHT + GAP) + GAP + CAPTION_HEIGHT


def tile_box(row: int, column: int, tile: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of one image tile on a contact sheet."""
    left = LABEL_WIDTH + GAP + column * (tile + GAP)
    top = GAP + row * (tile + CAPTION_HEIGHT + GAP)
    return left, top, left + tile, top + tile


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    """``text`` on one line (a control character, such as a newline in a file name, becomes "?"), cut (with …)
    to ``width`` pixels."""
    text = re.sub(r"[\x00-\x1f\x7f]", "?", text)
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def _first_per_class(dataset: files_lib.DatasetInfo, split: str, classes: list[int], per_class: int) -> dict:
    """``{label: [(encoded, filename), ...]}``: the first ``per_class`` records of each class, in shard order."""
    paths = [s.path for s in files_lib.check_shards(dataset, split, files_lib.pipeline_shards(dataset, split))]
    records = tf.data.TFRecordDataset(paths, compression_type=tf_compression_type(dataset.manifest.compression))
    spec = parse_spec(IMAGE_FEATURES, _PREVIEW_KEYS)
    counts = files_lib.split_info(dataset, split).class_counts
    wanted = {label: min(per_class, counts.get(dataset.manifest.class_names[label], 0)) for label in classes}
    found: dict[int, list] = {label: [] for label in classes}
    missing = sum(wanted.values())  # stop as soon as every class has what the split holds of it: no full pass
    for parsed in records.map(lambda r: tf.io.parse_single_example(r, spec)) if missing else ():
        label = int(parsed["image/class/label"])
        if label in found and len(found[label]) < wanted[label]:
            found[label].append((parsed["image/encoded"], parsed["image/filename"].numpy().decode("utf-8", "replace")))
            missing -= 1
            if not missing:
                break
    return found


def image_sheet(path: str, split: str = "train", per_class: int = 8, *, tile: int = 128, augmented: bool = False,
                seed: int = 0) -> Image.Image:
    """A contact sheet: a row per class (the first ``MAX_ROWS``), the first ``per_class`` images of each, captioned
    with their source file. Tiles are what ``readers.images`` yields at ``image_size=tile``: the evaluation
    centre crop, or with ``augmented`` the training random-resized crop and flip, seeded by ``seed`` and the tile."""
    dataset = files_lib.info(path)
    if dataset.manifest.kind != "images":
        raise ValueError(f"{path}: not an images dataset (kind {dataset.manifest.kind!r}); use episode previews for it")
    if per_class < 1 or tile < 16:
        raise ValueError(f"{path}: per_class must be at least 1 and tile at least 16 pixels (got {per_class}, {tile})")
    names = dataset.manifest.class_names
    classes = list(range(min(len(names), MAX_ROWS)))
    found = _first_per_class(dataset, split, classes, per_class)
    sheet = Image.new("RGB", sheet_size(len(classes), per_class, tile), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for row, label in enumerate(classes):
        left, top, _, _ = tile_box(row, 0, tile)
        draw.text((GAP, top + tile // 2 - 6), _fit(draw, names[label], font, LABEL_WIDTH - 2 * GAP), fill=INK, font=font)
        for column, (encoded, filename) in enumerate(found[label]):
            if augmented:
                pixels = decode_random_crop(encoded, tf.constant([seed, row * per_class + column], tf.int64),
                                            (tile, tile), flip=True)
            else:
                pixels = decode_center_crop(encoded, (tile, tile))
            box = tile_box(row, column, tile)
            sheet.paste(Image.fromarray(pixels.numpy()), box[:2])
            caption = _fit(draw, os.path.basename(filename), font, tile)
            draw.text((box[0], box[3] + 2), caption, fill=INK, font=font)
    footer = f"{path} · split {split} · {'augmented, seed ' + str(seed) if augmented else 'evaluation crop'}"
    if len(names) > len(classes):
        footer += f" · {len(names) - len(classes)} more classes not shown"
    draw.text((GAP, sheet.height - CAPTION_HEIGHT), _fit(draw, footer, font, sheet.width - 2 * GAP), fill=INK, font=font)
    return sheet


def _stats_text(mean, std) -> str:
    def show(values):
        if values is None:
            return "n/a"
        shown = ", ".join("n/a" if v is None else f"{v:.3g}" for v in values[:3])
        return f"[{shown}{', …' if len(values) > 3 else ''}]"

    return f"mean {show(mean)}, std {show(std)}"


def episode_plot(path: str, split: str = "train", episodes: int = 3, *, length: int | None = None,
                 shift: int | None = None, max_windows: int = 12) -> Image.Image:
    """One panel per feature with the first ``episodes`` episodes over time (the first element of each step),
    titled with the manifest's mean and std, then one panel with the windows of the first episode as spans:
    where ``readers.windows(length=, shift=)`` cuts it (never across its end; the first windows and the last
    four when there are more than ``max_windows``). Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(f"episode previews need matplotlib ({e}); {_INSTALL}") from None
    from .episodes import episodes as read_episodes

    dataset = files_lib.info(path)
    if dataset.manifest.kind != "episodes":
        raise ValueError(f"{path}: not an episodes dataset (kind {dataset.manifest.kind!r}); use the image sheet for it")
    for what, value in (("episodes", episodes), ("length", length), ("shift", shift)):
        if value is not None and value < 1:
            raise ValueError(f"{path}: {what} must be at least 1 (got {value})")
    info = files_lib.split_info(dataset, split)
    shown = [{k: v.numpy() for k, v in e.items()} for e in read_episodes(path, split).take(episodes)]
    if not shown:
        raise ValueError(f"{path}: split {split!r} holds no episodes to draw; pass another --split")
    names = sorted(shown[0])
    steps = len(next(iter(shown[0].values())))
    length = length or max(1, min(64, steps // 4))
    shift = shift or max(1, length // 2)
    figure = Figure(figsize=(10, 2.2 * (len(names) + 1)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(names) + 1, 1)
    for ax, name in zip(axes, names):
        for index, episode in enumerate(shown):
            values = np.asarray(episode[name]).reshape(len(episode[name]), -1)
            if values.shape[1]:
                ax.plot(values[:, 0].real.astype(np.float64), linewidth=0.8, label=f"episode {index}")
        width = "" if shown[0][name].ndim == 1 else f"[0] of {list(shown[0][name].shape[1:])}"
        ax.set_title(f"{name}{width}: {_stats_text(info.feature_mean.get(name), info.feature_std.get(name))}",
                     fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
    ax = axes[-1]
    starts = window_starts([steps], length, shift) if steps >= length else np.zeros(0, np.int64)
    ax.broken_barh([(0, steps)], (-1.2, 0.8), color="0.7")
    shown_windows = list(range(len(starts)))
    if len(starts) > max_windows:  # the first ones and the last few, so the end of the episode shows too
        shown_windows = shown_windows[: max_windows - 4] + shown_windows[-4:]
    for level, k in enumerate(shown_windows):
        ax.broken_barh([(int(starts[k]), length)], (level, 0.8), color=f"C{k % 10}")
        ax.text(int(starts[k]) + length + 2, level + 0.4, f"#{k}", fontsize=7, va="center")
    ax.set_xlim(0, steps)
    ax.set_xlabel("time step")
    ax.set_yticks([])
    more = f", {len(shown_windows)} shown" if len(starts) > max_windows else ""
    ax.set_title(f"windows of episode 0 ({steps} steps): length {length}, shift {shift}, {len(starts)} windows{more}",
                 fontsize=9, loc="left")
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return Image.open(io.BytesIO(out.getvalue())).convert("RGB")


def preview(path: str, split: str = "train", n: int | None = None, *, augmented: bool = False, seed: int = 0,
            tile: int = 128, length: int | None = None, shift: int | None = None) -> Image.Image:
    """A picture of a tfshard dataset, as a ``PIL.Image``: ``image_sheet`` for images (``n`` per class, default 8),
    ``episode_plot`` for episodes (``n`` episodes, default 3; ``length``/``shift`` of the windows drawn)."""
    if n is not None and n < 1:
        raise ValueError(f"{path}: n must be at least 1 (got {n})")
    kind = files_lib.info(path).manifest.kind
    if kind == "images":
        return image_sheet(path, split, n or 8, tile=tile, augmented=augmented, seed=seed)
    return episode_plot(path, split, n or 3, length=length, shift=shift)
