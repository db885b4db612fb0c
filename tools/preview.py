"""Pictures of a dataset: a contact sheet of images by class, or episodes over time with their windows.

``preview(path)`` returns a ``PIL.Image`` (it shows inline in a notebook; ``.save("x.png")``
writes it). Images are decoded by the reader's own functions: the evaluation
centre crop, or with ``augmented=True`` the training crop and flip, seeded; with ``changed=True`` only the inputs
the converter re-encoded. Episode plots (``episode_plot.py``) need matplotlib, an optional extra
(``pip install 'tfshard[preview]'``).

Sizes are bounded before anything is read: tiles of 16 to ``MAX_TILE`` pixels, at most
``MAX_PER_CLASS`` per class, a sheet of at most ``MAX_SHEET_PIXELS``, at most ``MAX_EPISODES``
episodes; labels are drawn by ``tools/fonts.py`` in any script a font on the machine has.

    readers.preview("photos-tfr").save("sheet.png")
    readers.preview("runs-tfr", length=64, shift=16, channel=[0, 1]).save("episodes.png")
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
from collections.abc import Sequence

import tensorflow as tf
from PIL import Image, ImageDraw

from ..format.inputs import load_inputs
from ..format.records import MULTI_LABEL_KEY, VALUE_KEY, image_features_of, parse_spec
from ..format.storage import write_atomic
from ..readers import files as files_lib
from ..readers.arguments import check_count
from ..readers.image_ops import decode_center_crop, decode_random_crop
from . import fonts as fonts_lib
from .episode_plot import MAX_EPISODES, _label_text, check_episode_args, episode_plot  # noqa: F401
from .series import MAX_PANELS, time_range_of  # noqa: F401

LABEL_WIDTH = 150  # the class-name column of a contact sheet
CAPTION_HEIGHT = 16  # the file name under each tile
GAP = 4
MAX_ROWS = 16  # classes shown; a sheet says how many more there are
MIN_TILE, MAX_TILE = 16, 1024
MAX_PER_CLASS = 64
# 64 megapixels (192 MB of RGB) stays under Pillow's decompression-bomb limit (~89.5 megapixels), so the PNG
# reopens without a warning, and no sheet it allows is wider than JPEG's 65,535 pixels.
MAX_SHEET_PIXELS = 64_000_000
BACKGROUND, INK, COUNT_INK = (255, 255, 255), (20, 20, 20), (90, 90, 90)
VALUE_ROWS = 4  # rows of a value-labelled sheet (the first images in shard order, captioned with their values)


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


def _first_per_class(dataset: files_lib.DatasetInfo, split: str, classes: list[int], per_class: int,
                     changed: dict | None = None) -> dict:
    """``{label: [(encoded, caption), ...]}``: the first ``per_class`` records of each class, in shard order,
    captioned with their file name (multi-label: an image is in the row of each of its classes, captioned with
    all of them). ``changed``: only records whose bytes are not their source's (``_recorded_sources``)."""
    multi = dataset.manifest.labels == "multi"
    key = MULTI_LABEL_KEY if multi else "image/class/label"
    counts = files_lib.split_info(dataset, split).class_counts
    wanted = {label: min(per_class, counts.get(dataset.manifest.class_names[label], 0)) for label in classes}
    found: dict[int, list] = {label: [] for label in classes}
    missing = sum(wanted.values())  # stop as soon as every class has what the split holds of it: no full pass
    # How many re-encoded records the whole dataset holds: past them, no other can be found.
    left = None if changed is None else dataset.manifest.options.get("converted_images", 0)
    keys = ("image/encoded", key, "image/filename", "image/channels", *(("image/class/text",) if multi else ()))
    for parsed in _records_of(dataset, split, keys) if missing and left != 0 else ():
        held = parsed[key].values.numpy().tolist() if multi else [int(parsed[key])]
        caption = parsed["image/class/text"].numpy().decode("utf-8", "replace") if multi else None
        if changed is not None:
            name = _name(parsed)
            source = changed.get(name)
            if source is None or source == hashlib.sha256(parsed["image/encoded"].numpy()).hexdigest():
                continue  # passed through byte for byte (or not an input the file records)
            gray = " (gray)" if int(parsed["image/channels"]) == 1 else ""
            caption, left = f"{os.path.basename(name)} → JPEG{gray}", left - 1
        for label in held:
            if label in found and len(found[label]) < wanted[label]:
                found[label].append((parsed["image/encoded"], caption or os.path.basename(_name(parsed))))
                missing -= 1
        if not missing or left == 0:
            break
    return found


def _recorded_sources(path: str, dataset: files_lib.DatasetInfo) -> dict[str, str]:
    """``{source path: sha256 of its bytes}`` of every input written, from ``inputs.json``: a record whose bytes hash
    otherwise is one the converter re-encoded (PNG, CMYK, rotated...), since every other passes byte for byte."""
    inputs = load_inputs(path, dataset.manifest)
    if inputs is None:
        raise ValueError(f"{path}: changed=True needs the dataset's inputs.json, the record of what each input was "
                         "(got none: written before it existed, or episodes); convert the images again to see them")
    return {entry.path: entry.sha256 for entry in inputs.inputs if entry.state == "written" and entry.sha256}


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
                seed: int = 0, fonts: Sequence[str] | None = None, changed: bool = False) -> Image.Image:
    """A contact sheet: a row per class (the first ``MAX_ROWS``) named with its count in the split, the first
    ``per_class`` images of each, captioned with their source file. Tiles are what ``readers.images`` yields at
    ``image_size=tile``: the evaluation centre crop, or with ``augmented`` the training random-resized crop and
    flip, seeded by ``seed`` and the tile.

    Args:
      per_class: 1 to ``MAX_PER_CLASS`` (64) images per class.
      tile: 16 to ``MAX_TILE`` (1024) pixels a side; the whole sheet at most ``MAX_SHEET_PIXELS`` (64 megapixels),
        so 16 classes of tiles of 1024 pixels take at most 3 a row.
      fonts: font files (or names in the system's font folders) tried in turn for each character of the labels;
        default ``fonts.default_fonts()``: DejaVu Sans and Last Resort from matplotlib when it is installed, and
        common system fonts. See ``fonts.Labeller``.
      changed: only the inputs the converter re-encoded to JPEG (not JPEG content, CMYK, EXIF rotation, 16-bit,
        alpha, ``--max-side``...), captioned ``name → JPEG``: a record whose bytes are not its source's, as
        ``inputs.json`` recorded them. Reads the split until every row is full (or every such record is found).

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
    for name, flag in (("augmented", augmented), ("changed", changed)):
        if not isinstance(flag, bool):
            raise ValueError(f"{path}: {name} must be True or False (got {name}={flag!r})")
    check_count(seed, "seed", path, low=-(2**63), high=2**63 - 1, fix="pass a seed that fits in 64 bits")
    labeller = fonts_lib.Labeller(fonts_lib.default_fonts() if fonts is None else fonts)
    counts = files_lib.split_info(dataset, split).class_counts
    if values:
        if changed:
            raise ValueError(f"{path}: changed=True draws a row per class, and this dataset has value labels (got "
                             "changed=True); drop it")
        found = _first_values(dataset, split, len(classes), per_class)
        classes = [row for row in classes if found[row]] or classes[:1]
    else:
        found = _first_per_class(dataset, split, classes, per_class,
                                 _recorded_sources(path, dataset) if changed else None)
    sheet = Image.new("RGB", sheet_size(len(classes), per_class, tile), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for row, label in enumerate(classes):
        left, top, _, _ = tile_box(row, 0, tile)
        _row_name(labeller, draw, top + tile // 2 - 6, names[label], None if values else counts.get(names[label], 0))
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
    if changed:
        footer += (f" · inputs re-encoded to JPEG ({manifest.options.get('converted_images', 0):,} in the dataset),"
                   " row counts all images")
    if len(names) > len(classes) and not values:
        footer += f" · {len(names) - len(classes)} more classes not shown"
    labeller.draw(draw, (GAP, sheet.height - CAPTION_HEIGHT), footer, sheet.width - 2 * GAP, INK)
    return sheet


def _row_name(labeller: fonts_lib.Labeller, draw: ImageDraw.ImageDraw, y: int, name: str, count: int | None) -> None:
    """A row's name, cut to fit, and its count in the split right-aligned beside it: the count always shows."""
    room = LABEL_WIDTH - 2 * GAP
    if count is not None:
        text = f"{count:,}"
        width = labeller.length(text)
        labeller.draw(draw, (int(LABEL_WIDTH - GAP - width), y), text, width + 1, COUNT_INK)
        room -= int(width) + GAP
    labeller.draw(draw, (GAP, y), name, room, INK)


IMAGE_OPTIONS, EPISODE_OPTIONS = ("augmented", "seed", "tile", "changed"), ("length", "shift", "feature", "channel",
                                                                          "time_range")


def preview(path: str, split: str = "train", n: int | None = None, *, augmented: bool | None = None,
            seed: int | None = None, tile: int | None = None, changed: bool | None = None, length: int | None = None,
            shift: int | None = None, feature: str | Sequence[str] | None = None,
            channel: int | Sequence[int] | None = None, time_range: tuple | None = None) -> Image.Image:
    """A picture of a tfshard dataset, as a ``PIL.Image``: ``image_sheet`` for images (``n`` per class, default 8;
    ``tile`` default 128, ``augmented`` default False, ``seed`` default 0, ``changed`` default False),
    ``episode_plot`` for episodes (``n`` episodes, default 3; ``length``/``shift`` of the windows drawn; the
    ``feature``, ``channel`` and ``time_range`` drawn). An option of the other kind of dataset is refused, not
    ignored: None means not given.

    Raises:
      ValueError: as ``image_sheet``/``episode_plot``, or an option that does not apply to this kind of dataset.

    Example:
      preview("photos-tfr", n=4, tile=64).save("sheet.png")
      preview("weather-tfr", feature="obs", channel=[0, 2], time_range=(0, 720))  # a month of two channels
      preview("photos-tfr", length=16)  # ValueError: "...: length (--length) applies to episode datasets, ..."
    """
    kind = files_lib.info(path).manifest.kind
    given = {"augmented": augmented, "seed": seed, "tile": tile, "changed": changed, "length": length,
             "shift": shift, "feature": feature, "channel": channel, "time_range": time_range}
    other, applies = (EPISODE_OPTIONS, "episode") if kind == "images" else (IMAGE_OPTIONS, "image")
    for name in other:
        if given[name] is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{path}: {name} ({flag}) applies to {applies} datasets, and this one holds {kind} "
                             f"(got {name}={given[name]!r}); drop it")
    if kind == "images":
        return image_sheet(path, split, 8 if n is None else n, tile=128 if tile is None else tile,
                           augmented=False if augmented is None else augmented, seed=0 if seed is None else seed,
                           changed=False if changed is None else changed)
    return episode_plot(path, split, 3 if n is None else n, length=length, shift=shift, feature=feature,
                        channel=channel, time_range=time_range)


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
