"""What ``readers.images()``'s arguments make of its pipeline: their checks, and where each piece of work runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from . import arguments
from . import augment as augment_lib
from . import files as files_lib
from .arguments import INT32_LIMIT, MAX_IMAGE_SIDE
from .image_ops import CROP_PADDING

AUGMENTATIONS = {"default": augment_lib.default_augment, "color": augment_lib.color_augment}
DTYPES = ("float32", "uint8")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Where each piece of work happens, decided once from the arguments.

    Attributes:
      per_image: every image leaves the decode map finished (crop, flip, cast), the map fused with its batch
        (``image_batches.decoded_batches``), as keras' own loader is (evaluation +7-13% img/s, training ~+6%;
        ``benchmarks/images.py``). Without a cache or a service, for evaluation and the default recipe (or none);
        colour jitter and callables stay batched, on uint8 batches.
      unit_float: the decode map yields float32 in [0, 1] itself.
      cached: a cache is asked for: it holds the deterministic decode, and the epochs repeat from it.
      random_decode: training without a cache: the random crop is the decode (never cached).
      crop_after_cache: the random crop's size, taken on the batch after the cache (training with a cache).
      stage: what the cache holds (its identity), for a deterministic decode.
    """

    training: bool
    augment: str | Callable | None
    dtype: str
    image_size: tuple[int, int]
    per_image: bool
    unit_float: bool
    cached: bool
    random_decode: bool
    crop_after_cache: tuple[int, int] | None
    stage: dict | None

    @classmethod
    def of(cls, *, training: bool, cache, remote: bool, augment, dtype: str, image_size) -> Recipe:
        per_image = cache is None and not remote and (not training or augment is None or augment == "default")
        random_decode = training and cache is None
        crop_after_cache = image_size if training and not random_decode else None
        stage = None
        if not random_decode:  # deterministic, so it may be cached; in training a larger square to crop from later
            size, padding = (image_size, CROP_PADDING) if not training else (
                (image_size[0] + CROP_PADDING, image_size[1] + CROP_PADDING), 0)
            stage = {"decode": "centre", "size": size, "padding": padding}
        return cls(training, augment, dtype, image_size, per_image, per_image and dtype == "float32", cache is not None,
                   random_decode, crop_after_cache, stage)


def check_recipe(augment, dtype: str) -> None:
    if not (augment is None or callable(augment) or (isinstance(augment, str) and augment in AUGMENTATIONS)):
        raise ValueError(f"augment: must be one of {sorted(AUGMENTATIONS)}, None or a callable (got {augment!r})")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {DTYPES} (got {dtype!r})")
    if dtype == "uint8" and augment == "color":
        raise ValueError("augment: 'color' jitters in float, so it needs dtype='float32' (got dtype='uint8'); "
                         "pass augment='default', or dtype='float32'")


def check_resume(path: str, repeat: bool, start_step, *, batch_size, seed, cache, service, ignore_errors,
                  deterministic) -> int:
    """``start_step`` replays the stream up to a step, so that stream must be a pure function of the seed."""
    if repeat and service is not None:
        raise ValueError(f"{path}: repeat: not with service= (each epoch is a new service job, shared among its "
                         "clients); repeat the dataset yourself, knowing a service epoch cannot be resumed exactly")
    step = start_step if isinstance(start_step, (int, np.integer)) and not isinstance(start_step, bool) else 0
    return arguments.check_resume(repeat, start_step, path, shuffle=True, seed=seed, blockers=[
        (cache is not None, f"cache={cache!r}: not supported yet", "drop cache to resume"),
        (ignore_errors, "ignore_errors=True: skipped records would shift every later batch", "drop ignore_errors"),
        (deterministic is False, "deterministic=False: the order must be reproducible", "drop deterministic=False"),
        (step * batch_size > INT32_LIMIT, f"batch_size={batch_size}: the {step * batch_size} records before it are "
         f"more than tf.data's skip() takes ({INT32_LIMIT:,})", "pass the step count the job saved"),
    ])


def checked_image_size(value) -> tuple[int, int]:
    """``image_size`` as ``(height, width)``: an int is a square (as the CLI's ``--image-size``).

    numpy integers count as ints (sizes often come from arithmetic); bools, floats and other lengths do not.
    """
    def whole(v) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if whole(value):
        pair = (value, value)
    elif isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, str) and len(value) == 2 and all(
            whole(v) for v in value):
        pair = tuple(value)
    else:
        raise TypeError(f"image_size: must be an int (a square) or a (height, width) pair of ints (got {value!r}); "
                        "pass e.g. image_size=224 or image_size=(224, 160)")
    if not all(1 <= side <= MAX_IMAGE_SIDE for side in pair):
        raise ValueError(f"image_size: sides must be in [1, {MAX_IMAGE_SIDE:,}] pixels (got {value!r}); "
                         "pass e.g. image_size=224")
    return int(pair[0]), int(pair[1])


def check_kind(dataset: files_lib.DatasetInfo) -> None:
    """An episodes dataset has no ``image/*`` keys: refuse it here, not with a graph error mid-``fit``."""
    kind = dataset.manifest.kind
    if kind != "images":
        raise ValueError(
            f"{dataset.path}: an {kind!r} dataset, not images (got kind={kind!r} in dataset.json); read it with "
            "readers.windows or readers.episodes, or write an images dataset with `tfshard images SRC OUT`"
        )


def cache_identity(
    dataset: files_lib.DatasetInfo, split: str, shards: list[files_lib.ShardFile], stage: dict, ignore_errors: bool
) -> dict:
    """What the cached bytes depend on. The manifest's fingerprint covers only the *sources* (names, sizes, mtimes):
    the shards' sha256 follows their content, and their size and mtime at build time follow any rewrite, even a
    byte-identical one that repairs a shard a cache was read from with ``ignore_errors``."""
    files = [{"path": s.path, "sha256": s.info.sha256, "bytes": s.size, "mtime_ns": s.mtime_ns} for s in shards]
    return {"fingerprint": dataset.manifest.fingerprint, "split": split, "files": files, "stage": stage,
            "ignore_errors": ignore_errors, "v": 2}
