"""Attacks on the converter's image validation (ingest/images.py): JPEGs whose entropy-coded data is cut short or
garbled, which PIL decodes with only a swallowed libjpeg warning, and grayscale content at every bit depth, which
must stay 1-channel unless ``rgb``.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
import simplejpeg
import tensorflow as tf
from helpers import image_features, saved_bytes
from PIL import Image
from tfshard.ingest import ConvertOptions, ImageOptions, convert_images
from tfshard.ingest.images import PixelSums, PreparedImage, prepare_image
from tfshard.ingest.scan import SourceFile
from tfshard.tools.demo_data import make_image_folders

FEATURES = image_features()
FIX = "re-download or re-export the file"


def convert(src, out, workers=0, **image):
    options = ConvertOptions(on_error="skip", image=ImageOptions(**image))
    return convert_images(str(src), str(out), options, workers=workers, progress=False)


def read_all(out, manifest) -> dict[str, dict]:
    """{filename: record} over every split."""
    files = [os.path.join(str(out), shard.file) for split in manifest.splits.values() for shard in split.shards]
    dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, FEATURES))
    return {r["image/filename"].decode(): r for r in dataset.as_numpy_iterator()}


def write(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        os.makedirs(os.path.join(str(root), os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(str(root), rel), "wb") as f:
            f.write(data)


def prepare(tmp_path, data: bytes, name="x.png", **image) -> PreparedImage:
    path = tmp_path / name
    path.write_bytes(data)
    result = prepare_image(SourceFile(str(path), name, "train", 0, len(data), 0), ImageOptions(**image))
    assert isinstance(result, PreparedImage), result
    return result


# --- corrupt JPEGs ---------------------------------------------------------------------------------------------------


def photo(seed=0, size=(256, 192)) -> Image.Image:
    """Photo-like content (smooth gradients, a ripple, sensor noise): most of its JPEG is entropy-coded data."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width] / max(size)
    base = np.stack([x * 200 + 30, y * 180 + 40, (x + y) * 100 + 20], -1)
    base += 40 * np.sin(x[..., None] * 9 + np.array([0, 1, 2])) * np.cos(y[..., None] * 7)
    noise = np.random.default_rng(seed).normal(0, 6, base.shape)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def jpeg(image: Image.Image, fmt="JPEG", **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, quality=90, **kwargs)
    return out.getvalue()


def _scan(data: bytes) -> tuple[int, int]:
    """Start and end of the first scan's entropy-coded data (after the SOS header, up to the first EOI)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big"), data.index(b"\xff\xd9", sos)


def cut(data: bytes) -> bytes:
    start, end = _scan(data)
    return data[: start + (end - start) // 4] + b"\xff\xd9"  # cut at 25%, the end-of-image marker put back


def dropped(data: bytes) -> bytes:
    start, end = _scan(data)
    middle = (start + end) // 2
    return data[:middle] + data[middle + 400 :]


def zeroed(data: bytes) -> bytes:
    start, end = _scan(data)
    middle = (start + end) // 2
    return data[:middle] + bytes(400) + data[middle + 400 :]


CORRUPTIONS = {"cut": cut, "dropped": dropped, "zeroed": zeroed}


def _pil_decodes_garbage(bad: bytes, good: bytes) -> None:
    """The premise: PIL decodes the damaged file without raising, into pixels far from the original's."""
    decoded = np.asarray(Image.open(io.BytesIO(bad)).convert("RGB"), np.int16)
    original = np.asarray(Image.open(io.BytesIO(good)).convert("RGB"), np.int16)
    assert (np.abs(decoded - original).max(-1) > 32).mean() > 0.3


def _assert_corrupt(manifest, names) -> None:
    reasons = {r["path"]: r["reason"] for r in manifest.rejected}
    assert sorted(reasons) == sorted(names)
    for name, reason in reasons.items():
        assert reason.startswith("corrupt JPEG data (Corrupt JPEG data: ") and reason.endswith(FIX), (name, reason)


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpegs_are_rejected_and_good_ones_pass_through(tmp_path, workers):
    good = jpeg(photo(0))
    video = b"\x00\x00\x00\x18ftypmp42" + b"\xff\xd8\xff\xda" + bytes(range(256)) * 8  # a motion photo's MP4
    sources = {
        "cat/baseline.jpg": good,
        "cat/progressive.jpg": jpeg(photo(1), progressive=True),
        "cat/gray.jpg": jpeg(photo(2).convert("L")),
        "cat/motion.jpg": jpeg(photo(3)) + video,
        "cat/subsampling444.jpg": jpeg(photo(4), subsampling=0),
    }
    bad = {f"dog/{name}.jpg": corrupt(good) for name, corrupt in CORRUPTIONS.items()}
    for data in bad.values():
        _pil_decodes_garbage(data, good)
    write(tmp_path / "src", {**sources, **bad})

    manifest = convert(tmp_path / "src", tmp_path / "out", workers=workers)

    _assert_corrupt(manifest, bad)
    assert manifest.options["converted_images"] == 0
    records = read_all(tmp_path / "out", manifest)
    assert sorted(records) == sorted(sources)
    for rel, data in sources.items():
        assert records[rel]["image/encoded"] == data, rel
    assert records["cat/gray.jpg"]["image/channels"] == 1


def _cmyk(image):
    return jpeg(image.convert("CMYK")), {}


def _rotated(image):
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(image, exif=exif.tobytes()), {}


def _gray_to_rgb(image):
    return jpeg(image.convert("L")), {"rgb": True}


def _resized(image):
    return jpeg(image), {"max_side": 100}


def _mpo(image):  # zeroed, not shortened: the MPO index holds the second picture's offset
    return jpeg(image, "MPO", save_all=True, append_images=[photo(9)]), {}


CONVERTED = {"cmyk": _cmyk, "exif_rotated": _rotated, "gray_to_rgb": _gray_to_rgb, "resized": _resized, "mpo": _mpo}


@pytest.mark.parametrize("kind", CONVERTED)
def test_corrupt_jpeg_content_that_would_be_converted_is_rejected(tmp_path, kind):
    good, options = CONVERTED[kind](photo(0))
    corruptions = {"zeroed": zeroed} if kind == "mpo" else CORRUPTIONS
    bad = {f"dog/{name}.jpg": corrupt(good) for name, corrupt in corruptions.items()}
    for data in bad.values():
        Image.open(io.BytesIO(data)).load()  # PIL would convert it without a word
    write(tmp_path / "src", {"cat/good.jpg": good, **bad})

    manifest = convert(tmp_path / "src", tmp_path / "out", **options)

    _assert_corrupt(manifest, bad)
    assert manifest.options["converted_images"] == 1
    assert sorted(read_all(tmp_path / "out", manifest)) == ["cat/good.jpg"]


def test_without_validation_nothing_changes(tmp_path):
    good = jpeg(photo(0))
    sources = {"cat/good.jpg": good, **{f"dog/{name}.jpg": corrupt(good) for name, corrupt in CORRUPTIONS.items()}}
    write(tmp_path / "src", sources)

    manifest = convert(tmp_path / "src", tmp_path / "out", validate=False)

    assert manifest.rejected == [] and manifest.options["converted_images"] == 0
    records = read_all(tmp_path / "out", manifest)
    assert {rel: r["image/encoded"] for rel, r in records.items()} == sources


def test_a_truncated_jpeg_without_end_marker_keeps_its_reason(tmp_path):
    good = jpeg(photo(0))
    start, end = _scan(good)
    write(tmp_path / "src", {"cat/good.jpg": good, "dog/half.jpg": good[: (start + end) // 2],
                             "dog/half_cmyk.jpg": jpeg(photo(0).convert("CMYK"))[: (start + end) // 2]})

    manifest = convert(tmp_path / "src", tmp_path / "out")

    reasons = {r["path"]: r["reason"] for r in manifest.rejected}
    assert reasons["dog/half.jpg"].startswith("truncated image data (no end-of-image marker)")
    assert reasons["dog/half_cmyk.jpg"] == f"truncated image data (Premature end of JPEG file); {FIX}"


def _flat_jpeg_with_sampling(factors, size=32) -> bytes:
    """A valid flat mid-gray baseline JPEG whose components have the given (h, v) sampling factors: each block is
    a zero DC difference and an end-of-block, in the standard Huffman codes Pillow writes."""
    data = bytearray(jpeg(Image.new("RGB", (size, size), (128, 128, 128)), subsampling=0))
    sof = data.index(b"\xff\xc0")
    for c, (h, v) in enumerate(factors):
        data[sof + 11 + 3 * c] = h << 4 | v
    start, _ = _scan(bytes(data))
    mcus = -(-size // (8 * max(h for h, _ in factors))) * -(-size // (8 * max(v for _, v in factors)))
    # luma: DC category 0 "00", AC end-of-block "1010"; chroma: "00" and "00"
    bits = "".join(("001010" if c == 0 else "0000") * h * v for c, (h, v) in enumerate(factors)) * mcus
    bits += "1" * (-len(bits) % 8)
    scan = bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8)).replace(b"\xff", b"\xff\x00")
    return bytes(data[:start]) + scan + b"\xff\xd9"


def _jfif_revision_2() -> bytes:
    data = bytearray(jpeg(photo(5, (64, 48))))
    data[data.index(b"JFIF\x00") + 5] = 2  # libjpeg warns "unknown JFIF revision number 2.01"
    return bytes(data)


def test_valid_jpegs_that_turbojpeg_declines_still_pass_through(tmp_path):
    # TurboJPEG's API names no subsampling for these factors, and strict decoding stops at a warning that is not about
    # the data; PIL and TensorFlow decode both, so PIL's decode decides, as before the strict check.
    sources = {"cat/odd_sampling.jpg": _flat_jpeg_with_sampling([(2, 2), (2, 1), (1, 1)]),
               "cat/jfif_2.jpg": _jfif_revision_2()}
    for data in sources.values():
        with pytest.raises(ValueError):
            simplejpeg.decode_jpeg(data, strict=True, min_height=1, min_width=1)
        tf.io.decode_jpeg(data)
    write(tmp_path / "src", sources)

    manifest = convert(tmp_path / "src", tmp_path / "out")

    assert manifest.rejected == [] and manifest.options["converted_images"] == 0
    records = read_all(tmp_path / "out", manifest)
    assert {rel: r["image/encoded"] for rel, r in records.items()} == sources
    assert manifest.splits["train"].pixel_mean is not None  # PIL's 1/8-scale decode stood in


def _draft_sums(data: bytes) -> PixelSums:
    image = Image.open(io.BytesIO(data))
    image.draft(image.mode, (1, 1))
    pixels = np.asarray(image).astype(np.int64).reshape(-1, 3 if image.mode == "RGB" else 1)
    pixels = np.repeat(pixels, 3, axis=1) if pixels.shape[1] == 1 else pixels
    return PixelSums(len(pixels), tuple(map(int, pixels.sum(0))), tuple(map(int, (pixels * pixels).sum(0))))


@pytest.mark.parametrize("kind", ["baseline", "progressive", "444", "gray", "odd_size", "one_pixel"])
def test_passthrough_pixel_sums_equal_pils_draft_decode(tmp_path, kind):
    image = photo(6, (33, 65) if kind == "odd_size" else (1, 1) if kind == "one_pixel" else (256, 192))
    kwargs = {"progressive": {"progressive": True}, "444": {"subsampling": 0}}.get(kind, {})
    data = jpeg(image.convert("L") if kind == "gray" else image, **kwargs)

    prepared = prepare(tmp_path, data, "x.jpg")

    assert prepared.converted is None and prepared.encoded == data
    assert prepared.pixels == _draft_sums(data)


def test_demo_inputs_keep_their_verdicts(tmp_path):
    src = make_image_folders(str(tmp_path / "demo"))

    manifest = convert(src, tmp_path / "out")

    reasons = {r["path"]: r["reason"] for r in manifest.rejected}
    assert sorted(reasons) == ["train/squares/truncated.jpg", "train/stripes/notes.jpg"]
    assert reasons["train/squares/truncated.jpg"].startswith("truncated image data")
    assert manifest.options["converted_images"] == 3  # the PNG, the CMYK and the rotated one; grayscale passes through
    assert manifest.total_records == 72 + 18 + 6 - 2


# --- grayscale at every bit depth ------------------------------------------------------------------------------------

_VALUES16 = [0, 1, 257, 1000, 30000, 32896, 65280, 65535]


def png(samples: np.ndarray, bit_depth: int, colour_type: int) -> bytes:
    """A PNG from ``[h, w, samples]`` (8- or 16-bit), written by hand: Pillow cannot save 16-bit gray+alpha."""
    height = samples.shape[0]
    rows = samples.astype(">u2" if bit_depth == 16 else np.uint8).reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 on every row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", samples.shape[1], height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _scaled16(values) -> np.ndarray:
    return np.round(np.asarray(values, np.float64) * 255 / 65535)


def _grid(values) -> np.ndarray:
    return np.asarray(values).reshape(2, -1)


def gray_png16_alpha():
    gray = _grid(_VALUES16)
    alpha = np.arange(gray.size).reshape(gray.shape) * 9000
    # Pillow reads this as RGBA from each sample's high byte, within one level of the 16-bit rounding.
    return png(np.stack([gray, alpha], -1), 16, 4), "RGBA", gray >> 8


def gray_png16():
    return png(_grid(_VALUES16)[..., None], 16, 0), "I;16", _scaled16(_grid(_VALUES16))


def gray_png8_alpha():
    gray = _grid([0, 1, 100, 255])
    return png(np.stack([gray, 255 - gray], -1), 8, 4), "LA", gray


def gray_png1():
    bits = _grid([0, 1, 1, 0, 1, 0, 0, 1]).astype(bool)
    return saved_bytes(Image.fromarray(bits), "PNG"), "1", bits * 255


def gray_png4():
    levels = _grid([0, 85, 170, 255])
    return saved_bytes(Image.fromarray(levels.astype(np.uint8)), "PNG", bits=4), "L", levels


def gray_tiff16():
    return saved_bytes(Image.fromarray(_grid(_VALUES16).astype(np.uint16)), "TIFF"), "I;16", _scaled16(_grid(_VALUES16))


def gray_tiff32():
    values = _grid(_VALUES16).astype(np.int32)
    return saved_bytes(Image.fromarray(values), "TIFF"), "I", _scaled16(values)


def gray_tiff_la():
    gray = _grid([0, 1, 100, 255])
    return saved_bytes(Image.fromarray(np.stack([gray, gray], -1).astype(np.uint8), "LA"), "TIFF"), "LA", gray


def gray_pgm16_dark():
    # A 16-bit PGM (named .png: the content decides) whose values are all under 256: 16-bit data, not 8-bit.
    values = _grid([0, 1, 100, 255])
    header = f"P5 {values.shape[1]} {values.shape[0]} 65535\n".encode()
    return header + values.astype(">u2").tobytes(), "I", _scaled16(values)


GRAYS = {"png16_alpha": gray_png16_alpha, "png16": gray_png16, "png8_alpha": gray_png8_alpha, "png1": gray_png1,
         "png4": gray_png4, "tiff16": gray_tiff16, "tiff32": gray_tiff32, "tiff_la": gray_tiff_la,
         "pgm16_dark": gray_pgm16_dark}


@pytest.mark.parametrize("rgb", [False, True], ids=["gray", "rgb"])
@pytest.mark.parametrize("kind", GRAYS)
def test_grayscale_stays_one_channel_at_any_depth_and_is_scaled_to_8_bits(tmp_path, kind, rgb):
    data, mode, expected = GRAYS[kind]()
    assert Image.open(io.BytesIO(data)).mode == mode  # the PIL mode this case covers

    prepared = prepare(tmp_path, data, rgb=rgb)

    assert prepared.channels == (3 if rgb else 1)
    assert (prepared.height, prepared.width) == expected.shape
    # The sums are taken over the 8-bit image before it is JPEG-encoded: exact.
    assert prepared.pixels == PixelSums.of(Image.fromarray(expected.astype(np.uint8), "L"))
    assert prepared.pixels.sums[0] == expected.sum() and max(prepared.pixels.sums) == min(prepared.pixels.sums)


def test_a_16_bit_gray_alpha_png_is_a_one_channel_record(tmp_path):
    gray = np.repeat(np.repeat(_grid([0, 32896, 65535, 257 * 200]), 16, 0), 16, 1)  # flat 16-pixel squares
    write(tmp_path / "src", {"cat/x.png": png(np.stack([gray, np.full_like(gray, 65535)], -1), 16, 4)})

    manifest = convert(tmp_path / "src", tmp_path / "out")

    record = read_all(tmp_path / "out", manifest)["cat/x.png"]
    assert record["image/channels"] == 1
    decoded = tf.io.decode_jpeg(record["image/encoded"]).numpy()
    assert decoded.shape == (32, 32, 1)
    squares = decoded[4:32:16, 4:32:16, 0], decoded[12:32:16, 12:32:16, 0]  # two pixels inside each square
    for pixels in squares:
        np.testing.assert_allclose(pixels, [[0, 128], [255, 200]], atol=2)
