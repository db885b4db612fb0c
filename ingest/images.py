"""Turning one image file into the bytes of one record: validate, convert only when needed.

Pure PIL/numpy, no TensorFlow: this runs in the worker processes. Decisions come
from the file's content, never its name. A JPEG that TensorFlow's
``decode_jpeg``/``decode_and_crop_jpeg`` can read as it is (RGB or grayscale, no
EXIF rotation to apply, within ``max_side``) passes through byte for byte;
everything else (PNG named .jpg, TIFF, CMYK, palette, alpha, 16-bit or float,
rotated) is converted to a baseline JPEG. Grayscale content stays 1-channel at
any bit depth unless ``rgb``.

With ``validate``, JPEG content is decoded by libjpeg-turbo through simplejpeg,
which stops at libjpeg's first warning: PIL's decoder only warns, and carries on,
on entropy-coded data that is cut short or garbled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import re

import numpy as np
import simplejpeg
from PIL import Image, ImageOps

from ..format.statistics import PIXEL_DECIMALS
from ..format.storage import NotRegularFileError, open_regular
from .options import ImageOptions
from .scan import Rejection, SourceFile

_EXIF_ORIENTATION = 0x0112


@dataclasses.dataclass(frozen=True)
class PixelSums:
    """Exact integer sums over RGB pixels (grayscale counted as R=G=B), to merge across workers."""

    count: int = 0
    sums: tuple[int, int, int] = (0, 0, 0)
    squares: tuple[int, int, int] = (0, 0, 0)

    def __add__(self, other: PixelSums) -> PixelSums:
        return PixelSums(
            self.count + other.count,
            tuple(a + b for a, b in zip(self.sums, other.sums)),
            tuple(a + b for a, b in zip(self.squares, other.squares)),
        )

    @classmethod
    def of(cls, image: Image.Image) -> PixelSums:
        """The sums of an 'L' or 'RGB' image, from its per-band histogram (exact, and ~10x faster than summing
        the pixels: the validation decode is small, so the summing was a fifth of a worker's time)."""
        counts = np.asarray(image.histogram(), np.int64).reshape(-1, 256)  # [bands, 256]
        if counts.shape[0] == 1:
            counts = np.repeat(counts, 3, axis=0)
        levels = np.arange(256, dtype=np.int64)
        return cls(int(counts[0].sum()), tuple(int(v) for v in counts @ levels),
                   tuple(int(v) for v in counts @ (levels * levels)))

    def mean_std(self) -> tuple[list[float] | None, list[float] | None]:
        """Per-channel mean and standard deviation, scaled to [0, 1]; None when no pixel was decoded."""
        if self.count == 0:
            return None, None
        mean = [s / self.count for s in self.sums]
        var = [max(q / self.count - m * m, 0.0) for q, m in zip(self.squares, mean)]
        return [round(m / 255, PIXEL_DECIMALS) for m in mean], [round(v**0.5 / 255, PIXEL_DECIMALS) for v in var]


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """The record-ready form of one source image."""

    source: SourceFile
    encoded: bytes
    height: int
    width: int
    channels: int
    converted: str | None  # why it was re-encoded, or None for passthrough
    pixels: PixelSums
    sha256: str = ""  # of the source file's bytes: how identical images are found (``ingest/duplicates.py``)


_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM", b"RIFF", b"II*\x00", b"MM\x00*")  # TIFF: both byte orders
_JPEG_EOI, _JPEG_SOS = b"\xff\xd9", b"\xff\xda"
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # in entropy-coded data: the next real marker
_NO_LENGTH = {0x01, *range(0xD0, 0xD8)}  # TEM and RSTn: markers without a length field


def _jpeg_complete(data: bytes) -> bool:
    """Whether the JPEG's marker segments run, through every scan, to an end-of-image marker: what TensorFlow's
    decoder needs. Bytes after that EOI do not matter. False when the segments cannot be followed."""
    i, size = 2, len(data)  # after SOI
    while i + 1 < size:
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0xD9:
            return True
        elif marker in _NO_LENGTH:
            i += 2
        else:
            if i + 4 > size:
                return False
            i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
            if marker == 0xDA:  # a scan: its entropy-coded data runs to the next marker that is not stuffing or RST
                found = _SCAN_END.search(data, i)
                if found is None:
                    return False
                i = found.start()
    return False


class _ChangedSinceScan(ValueError):
    pass


class _CorruptJpeg(ValueError):
    """libjpeg's warning about the file's data, which PIL would have decoded past."""


_JPEG_FORMATS = ("JPEG", "MPO")  # Pillow opens a JPEG with a multi-picture index (MPO) as "MPO"
_COLORSPACES = {"L": "GRAY", "CMYK": "CMYK"}  # simplejpeg's output for a PIL mode; "RGB" for the rest
# libjpeg's warnings about the entropy-coded data (jerror.h: JWRN_HIT_MARKER, JWRN_EXTRANEOUS_DATA,
# JWRN_HUFF_BAD_CODE, JWRN_MUST_RESYNC, ...; JWRN_JPEG_EOF is the premature end).
_DATA_WARNINGS = ("Corrupt JPEG data", "Premature end of JPEG file")


def _decode_jpeg_scaled(data: bytes, mode: str) -> np.ndarray | None:
    """The JPEG decoded at 1/8 scale (``[h, w, bands]``, the pixels PIL's ``draft`` decode gives), stopping at
    libjpeg's first warning.

    Returns None when TurboJPEG declines a file that libjpeg itself reads: chroma sampling factors its API has no
    name for (PIL and TensorFlow decode those), or a warning that is not about the data (an unknown JFIF
    revision, non-sequential SOS parameters). PIL's decode then decides, as it did before this check.

    Raises:
      _CorruptJpeg: libjpeg reported cut-short or garbled entropy-coded data.
    """
    try:
        return simplejpeg.decode_jpeg(data, colorspace=_COLORSPACES.get(mode, "RGB"), strict=True,
                                      min_height=1, min_width=1)
    except ValueError as e:
        if str(e).startswith(_DATA_WARNINGS):
            raise _CorruptJpeg(str(e)) from e
        return None


def _read(source: SourceFile) -> bytes:
    """The file's bytes, never more than its size at scan time (a file that grew is refused, not read on)."""
    with open_regular(source.path) as f:
        data = f.read(source.size + 1)
    if len(data) != source.size:
        raise _ChangedSinceScan(f"{len(data)} bytes")
    return data


@contextlib.contextmanager
def _own_pixel_cap():
    """Turns off PIL's process-wide bomb check while opening: ``max_pixels`` is checked instead, so it can
    be raised above PIL's limit. Restored afterwards (this also runs in the caller's process with workers=0)."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def _gray_as_rgba(data: bytes) -> bool:
    """Whether the file is a 16-bit gray+alpha PNG, which Pillow (no 16-bit LA mode) opens as 'RGBA' with R=G=B
    from each sample's high byte. IHDR is the first chunk: bit depth at byte 24, colour type (4: gray+alpha) at 25."""
    return data.startswith(b"\x89PNG\r\n\x1a\n") and data[24:26] == b"\x10\x04"


def _to_8bit(image: Image.Image, rgb: bool, *, gray: bool = False, full_scale: float | None = None) -> Image.Image:
    """Any PIL mode to 'RGB' or 'L'; alpha is dropped, 16/32-bit and float scaled to 8 bits (not clipped).

    Args:
      gray: the content is grayscale though PIL holds it as 'RGBA' (``_gray_as_rgba``): it stays 1-channel.
      full_scale: white in mode 'I' when the format fixes it (Pillow rescales PGM/PPM to 65535); None: guessed
        from the values.
    """
    if gray and image.mode == "RGBA":
        image = image.getchannel("R")  # v >> 8 of the 16-bit gray: within 1 level of the rounding below
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        if image.mode == "F":
            peak = 1.0
        elif image.mode == "I" and full_scale is not None:
            peak = full_scale
        elif image.mode == "I":  # 32-bit TIFF or 16-bit signed TIFF: a container of unknown range
            peak = 65535.0 if array.max(initial=0) > 255 else 255.0
        else:
            peak = 65535.0
        image = Image.fromarray(np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    elif image.mode in ("1", "L", "LA", "La"):
        image = image.convert("L")
    elif image.mode != "RGB":
        image = image.convert("RGB")
    if rgb and image.mode == "L":
        image = image.convert("RGB")
    return image


def _conversion_reason(image: Image.Image, options: ImageOptions) -> str | None:
    if image.format != "JPEG":
        return f"{image.format or 'unknown'} content"
    if image.mode not in ("RGB", "L"):
        return f"{image.mode} JPEG"
    if image.mode == "L" and options.rgb:
        return "grayscale to RGB"
    if image.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None):
        return "EXIF orientation"
    if options.max_side is not None and max(image.size) > options.max_side:
        return "resized"
    return None


def _decode_problem(error: Exception, data: bytes) -> str:
    if isinstance(error, NotRegularFileError):
        return ("not a regular file (replaced since the scan); only regular files are read: replace it with the "
                "real file")
    if isinstance(error, _ChangedSinceScan):
        return "changed size since the scan; run the conversion again"
    if isinstance(error, FileNotFoundError):
        return "file not found (removed since the scan?); restore it or run again"
    if isinstance(error, PermissionError) or getattr(error, "errno", None) == errno.EACCES:
        return "permission denied; make the file readable (chmod a+r)"
    if getattr(error, "errno", None) == errno.ELOOP:
        return "symlink loop (the link resolves to itself); remove or repoint the link"
    if isinstance(error, Image.UnidentifiedImageError):
        if data.startswith(_SIGNATURES):
            return "truncated or corrupt header (the file starts like an image); re-download or re-export the file"
        return "not an image (no known image format in the file content); remove it or replace it with the real image"
    if isinstance(error, _CorruptJpeg):
        problem = "truncated image data" if str(error).startswith("Premature end") else "corrupt JPEG data"
        return f"{problem} ({error}); re-download or re-export the file"
    if isinstance(error, OSError) and "truncated" in str(error):
        return f"truncated image data ({error}); re-download or re-export the file"
    return f"corrupt image data ({type(error).__name__}: {error}); re-download or re-export the file"


def _channels(image: Image.Image) -> int:
    return 1 if image.mode == "L" else 3


def _passthrough(source: SourceFile, data: bytes, image: Image.Image,
                 options: ImageOptions) -> PreparedImage | Rejection:
    # libjpeg (and so PIL) fills in a missing end-of-image marker, but TensorFlow's decoder rejects the file.
    # Quick rule: an EOI after the last scan marker (SOS). Bytes after the EOI (a motion photo's video) can hold
    # an FF DA too: then the segments are followed, scan by scan, to see whether an EOI ends the image.
    last_eoi = data.rfind(_JPEG_EOI)
    scan_after = (_JPEG_SOS in data) if last_eoi < 0 else (data.find(_JPEG_SOS, last_eoi) >= 0)
    if scan_after and not _jpeg_complete(data):
        return Rejection(source.relpath,
                         "truncated image data (no end-of-image marker); re-download or re-export the file")
    width, height = image.size  # before draft(), which shrinks size
    pixels = passthrough_pixel_sums(data, image) if options.validate else PixelSums()
    return PreparedImage(source, data, height, width, _channels(image), None, pixels)


def passthrough_pixel_sums(data: bytes, image: Image.Image | None = None) -> PixelSums:
    """The pixel sums a JPEG kept byte for byte adds to its split: those of its 1/8-scale decode (TurboJPEG's, or
    PIL's ``draft`` where TurboJPEG declines the file). ``tfshard verify`` recomputes them from the records' bytes.

    Args:
      data: the JPEG's bytes.
      image: ``data`` opened by PIL, not yet loaded (opened here when None).

    Raises:
      OSError, ValueError: ``data`` is not an RGB or grey JPEG (what is kept as it is), or does not decode
        (libjpeg warned about cut-short or garbled data).
    """
    if image is None:
        with _own_pixel_cap():
            image = Image.open(io.BytesIO(data))
    if image.format not in _JPEG_FORMATS or image.mode not in ("RGB", "L"):  # else no 1/8 decode bounds its memory
        raise ValueError(f"not an RGB or grey JPEG (got {image.format} {image.mode})")
    scaled = _decode_jpeg_scaled(data, image.mode)
    if scaled is None:
        image.draft(image.mode, (1, 1))  # 1/8-scale IDCT; every entropy-coded byte is still decoded
        image.load()
        return PixelSums.of(image)
    return PixelSums.of(Image.fromarray(scaled[..., 0] if scaled.shape[-1] == 1 else scaled))


def _convert(source: SourceFile, data: bytes, image: Image.Image, reason: str, options: ImageOptions) -> PreparedImage:
    if options.validate and image.format in _JPEG_FORMATS:
        _decode_jpeg_scaled(data, image.mode)  # PIL would convert garbled data without a word
    gray, full_scale = _gray_as_rgba(data), (65535.0 if image.format == "PPM" else None)
    image.seek(0)  # first frame of a GIF/WebP animation
    image.load()
    image = _to_8bit(ImageOps.exif_transpose(image), options.rgb, gray=gray, full_scale=full_scale)
    if options.max_side is not None and max(image.size) > options.max_side:
        image.thumbnail((options.max_side, options.max_side), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=options.quality)
    return PreparedImage(
        source, out.getvalue(), image.height, image.width, _channels(image), reason, PixelSums.of(image)
    )


def prepare_image(source: SourceFile, options: ImageOptions) -> PreparedImage | Rejection:
    """Validates and, where needed, converts one image; never raises for bad input.

    Returns:
      A ``PreparedImage``, or a ``Rejection`` naming the problem and the fix.

    Example: a PNG saved as ``cat/x.jpg`` comes back as
    ``PreparedImage(encoded=<JPEG bytes>, converted="PNG content", ...)``; a
    zero-byte file as ``Rejection("cat/x.jpg", "empty file (0 bytes); ...")``.
    """
    data = b""
    try:
        data = _read(source)
        if not data:
            return Rejection(source.relpath, "empty file (0 bytes); remove it or replace it with the real image")
        with _own_pixel_cap():
            image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > options.max_pixels:
            return Rejection(
                source.relpath,
                f"decompression bomb ({width}x{height} = {width * height} pixels, over the "
                f"{options.max_pixels} cap); raise --max-pixels if the image is genuine",
            )
        reason = _conversion_reason(image, options)
        if reason is None:
            prepared = _passthrough(source, data, image, options)
        else:
            prepared = _convert(source, data, image, reason, options)
        if isinstance(prepared, Rejection):
            return prepared
        # Hashed here, where the bytes already are: ~50 us for 65 KB, ~4% of the ~1.3 ms validation takes.
        return dataclasses.replace(prepared, sha256=hashlib.sha256(data).hexdigest())
    except (OSError, ValueError, SyntaxError) as e:  # PIL's decode errors; UnidentifiedImageError is an OSError
        return Rejection(source.relpath, _decode_problem(e, data))
