"""``tfshard demo``: the embedded default (``tools/demo_data.py``) converted, verified, read back and drawn."""

from __future__ import annotations

import os
from collections.abc import Iterator

from .. import readers
from ..ingest import convert_episodes, convert_images
from ..readers.windows.resident import default_device
from .demo_data import make_episodes, make_image_folders
from .preview import preview, save_picture
from .verify import verify


def _converted(convert, src: str, out: str, workers: int | None, **options) -> Iterator[str]:
    """Converts (replacing an earlier demo's dataset) and yields the conversion's summary lines."""
    yield from convert(src, out, workers=workers, overwrite=True, **options).lines()


def run_demo(folder: str = "tfshard-demo", workers: int | None = None) -> Iterator[str]:
    """Makes both trees in ``folder``, converts, verifies and reads them back, draws their previews; yields the
    lines ``tfshard demo`` prints as each step finishes.

    Example:
      for line in run_demo("/tmp/demo"):
          print(line)   # demo: made /tmp/demo/images/{train,val}/<class>/*.jpg, ...
    """
    src = make_image_folders(os.path.join(folder, "images"))
    out = os.path.join(folder, "images-tfrecord")
    yield f"demo: made {src}/{{train,val}}/<class>/*.jpg, including 6 odd or broken files"
    yield from _converted(convert_images, src, out, workers, min_shards=2)
    verify(out)
    yield f"{out}: verified, every record's CRC and every shard's sha256 match dataset.json"
    images, labels = next(iter(readers.images(out, batch_size=16, image_size=(64, 64), seed=0)))
    yield (f"readers.images({out!r}, batch_size=16, image_size=(64, 64)): images {tuple(images.shape)} "
           f"{images.dtype.name} in [0, 1], labels {labels.numpy().tolist()}")

    src = make_episodes(os.path.join(folder, "episodes"))
    out_ep = os.path.join(folder, "episodes-tfrecord")
    yield (f"demo: made {src}/{{train,val}}/run-*.npz (obs float32 [T, 3], action int32 [T]), plus an empty "
           "episode and one with a NaN")
    yield from _converted(convert_episodes, src, out_ep, workers, min_shards=2, on_nan="skip")
    verify(out_ep)
    yield f"{out_ep}: verified"
    x, y = next(iter(readers.windows(out_ep, length=128, shift=16, batch_size=32, features="obs", targets=8, seed=0)))
    count = readers.info(out_ep).num_windows("train", 128, 16, horizon=8)
    yield (f"readers.windows({out_ep!r}, length=128, shift=16, batch_size=32, features='obs', targets=8): "
           f"x {tuple(x.shape)}, y {tuple(y.shape)} (the next 8 steps); {count:,} windows per epoch, "
           f"gathered from one resident array on {default_device()}")

    drawings = ((out, "images-preview.png", {}), (out_ep, "episodes-preview.png", {"length": 128, "shift": 16}))
    for dataset, name, drawing in drawings:  # length/shift only for episodes: preview refuses them for images
        path = os.path.join(folder, name)
        try:
            save_picture(preview(dataset, **drawing), path)
        except ImportError as e:  # episode plots need the preview extra (make demo installs it)
            yield f"preview: {path} not drawn: {e}"
            continue
        yield f"preview: {path} (tfshard preview {dataset} -o {path})"
    yield f"next: tfshard info {out}; tfshard bench {out}; tfshard bench {out_ep} --window 128 --shift 16"
