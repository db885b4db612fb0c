"""The embedded default of ``tfshard demo``: small, deterministic image and episode trees. Pure PIL/numpy.

Besides clean JPEGs the image tree holds the inputs real datasets hide: a PNG named
``.jpg``, a CMYK JPEG, a grayscale JPEG, an EXIF-rotated JPEG, a truncated JPEG and
a text file named ``.jpg``, so the demo shows conversion and rejection at work; the
episodes include an empty one and one with a NaN.
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

CLASSES = ("circles", "squares", "stripes")
_FIXED_MTIME_NS = 1_700_000_000 * 10**9  # fixed mtimes keep the inputs' fingerprint stable across regenerations


def _picture(kind: str, rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    background = rng.integers(0, 256, 3)
    colour = rng.integers(0, 256, 3)
    cx, cy, r = rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height, rng.uniform(0.15, 0.35) * height
    if kind == "circles":
        mask = (x - cx) ** 2 + (y - cy) ** 2 < r**2
    elif kind == "squares":
        mask = (abs(x - cx) < r) & (abs(y - cy) < r)
    else:
        mask = ((x + y * rng.uniform(-1, 1)) // max(r / 2, 2)) % 2 == 0
    pixels = np.where(mask[..., None], colour, background).astype(np.float64)
    pixels += rng.normal(0, 8, pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _save(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(_FIXED_MTIME_NS, _FIXED_MTIME_NS))


def _jpeg(image: Image.Image, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **kwargs)
    return out.getvalue()


def make_image_folders(root: str, *, per_class: int = 24, val_per_class: int = 6, size=(96, 72), seed: int = 0) -> str:
    """Writes ``root/{train,val}/<class>/*.jpg`` and returns ``root``; the same arguments give the same bytes.

    Example:
      make_image_folders("/tmp/demo")  # 3 classes, 72 train + 18 val images, 6 of them odd or broken
    """
    rng = np.random.default_rng(seed)
    width, height = size
    for split, count in (("train", per_class), ("val", val_per_class)):
        for kind in CLASSES:
            for i in range(count):
                image = Image.fromarray(_picture(kind, rng, width, height))
                _save(os.path.join(root, split, kind, f"{kind}_{i:03d}.jpg"), _jpeg(image))
    odd = Image.fromarray(_picture("circles", rng, width, height))
    png = io.BytesIO()
    odd.save(png, "PNG")
    _save(os.path.join(root, "train", "circles", "really_a_png.jpg"), png.getvalue())
    _save(os.path.join(root, "train", "squares", "cmyk.jpg"), _jpeg(odd.convert("CMYK")))
    _save(os.path.join(root, "train", "stripes", "grayscale.jpg"), _jpeg(odd.convert("L")))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° on display
    _save(os.path.join(root, "train", "circles", "rotated.jpg"), _jpeg(odd, exif=exif.tobytes()))
    whole = _jpeg(odd)
    _save(os.path.join(root, "train", "squares", "truncated.jpg"), whole[: len(whole) // 2])
    _save(os.path.join(root, "train", "stripes", "notes.jpg"), b"not an image, just text\n")
    return root


def make_episodes(root: str, *, count: int = 24, val_count: int = 6, seed: int = 0) -> str:
    """Writes ``root/{train,val}/run-NNN.npz`` sensor episodes of 300–1,200 steps, plus an empty and a NaN episode.

    Each episode has ``obs`` (float32 ``[T, 3]``: a noisy damped oscillation) and
    ``action`` (int32 ``[T]``); the empty one and the one with a NaN show the
    skip rules at work. Returns ``root``.
    """
    rng = np.random.default_rng(seed)

    def episode(steps: int) -> dict[str, np.ndarray]:
        t = np.arange(steps, dtype=np.float64)[:, None]
        freq, decay = rng.uniform(0.01, 0.05, 3), rng.uniform(1e-4, 1e-3, 3)
        obs = np.sin(t * freq) * np.exp(-t * decay) + rng.normal(0, 0.05, (steps, 3))
        return {"obs": obs.astype(np.float32), "action": rng.integers(0, 4, steps).astype(np.int32)}

    for split, n in (("train", count), ("val", val_count)):
        for i in range(n):
            path = os.path.join(root, split, f"run-{i:03d}.npz")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            np.savez(path, **episode(int(rng.integers(300, 1201))))
            os.utime(path, ns=(_FIXED_MTIME_NS, _FIXED_MTIME_NS))
    odd = {"run-empty.npz": episode(0), "run-nan.npz": episode(400)}
    odd["run-nan.npz"]["obs"][123, 1] = np.nan
    for name, arrays in odd.items():
        path = os.path.join(root, "train", name)
        np.savez(path, **arrays)
        os.utime(path, ns=(_FIXED_MTIME_NS, _FIXED_MTIME_NS))
    return root
