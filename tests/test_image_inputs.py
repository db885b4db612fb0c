"""Bad and odd inputs: each is rejected with a reason (skip), stops the run naming the file (fail), or is converted.

Every bad-input test builds a tree of good JPEGs plus one bad thing, and checks both policies:
``on_error="skip"`` leaves the bad file in ``manifest.rejected`` and loses no good file;
``on_error="fail"`` raises ``InputError`` naming the file's path and commits no manifest.

The last section attacks the JPEG validation: corrupt entropy-coded data PIL decodes without a word,
and grayscale content at every bit depth.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unicodedata
import zlib

import numpy as np
import pytest
import simplejpeg
import tensorflow as tf
from helpers import image_features, jpeg_bytes, make_tree, saved_bytes, skip_unless_ci, write_jpeg
from PIL import Image
from tfshard.ingest import ConvertOptions, ImageOptions, InputError, convert_images, load_manifest
from tfshard.ingest.images import PixelSums, PreparedImage, prepare_image
from tfshard.ingest.scan import SourceFile
from tfshard.tools.demo_data import make_image_folders

FEATURES = image_features()


def convert(src, out, on_error="skip", image=ImageOptions(), **options):
    options = ConvertOptions(on_error=on_error, image=image, **options)
    return convert_images(str(src), str(out), options, workers=0, progress=False)


def read_all(out, manifest) -> dict[str, dict]:
    """{filename: record} over every split. Filenames are decoded as the OS decodes names (surrogateescape)."""
    records = {}
    for split in manifest.splits.values():
        files = [os.path.join(out, shard.file) for shard in split.shards]
        dataset = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, FEATURES))
        for example in dataset.as_numpy_iterator():
            name = example["image/filename"].decode("utf-8", "surrogateescape")
            assert name not in records, f"{name}: in two records"
            records[name] = dict(example)
    return records


def good_tree(src) -> dict[str, bytes]:
    """Two classes of three good 16x16 JPEGs."""
    return make_tree(str(src), per_class=3)


def assert_skipped(src, out, bad: dict[str, str], good: dict[str, bytes], image=ImageOptions()):
    """Converts with on_error="skip"; every bad relpath is rejected with its reason, every good file kept intact."""
    manifest = convert(src, out, image=image)
    rejected = {r["path"]: r["reason"] for r in manifest.rejected}
    assert sorted(rejected) == sorted(bad)
    for rel, reason in bad.items():
        assert reason in rejected[rel], rel
    records = read_all(str(out), manifest)
    assert sorted(records) == sorted(good)
    for rel, data in good.items():
        assert records[rel]["image/encoded"] == data, rel
    assert manifest.total_records == len(good)
    assert sum(sum(s.class_counts.values()) for s in manifest.splits.values()) == len(good)
    return manifest


def assert_fails(src, out, bad_relpath: str, image=ImageOptions()):
    """Converts with on_error="fail"; the InputError names the bad file's path, and no manifest is committed."""
    with pytest.raises(InputError, match=re.escape(os.path.join(str(src), bad_relpath))) as error:
        convert(src, out, on_error="fail", image=image)
    assert not os.path.exists(os.path.join(str(out), "dataset.json"))
    return error.value


# --- files that must be rejected -------------------------------------------------------------------------------------


def make_truncated_half(src):
    data = jpeg_bytes(50, size=(32, 32))  # 1.5 kB: the cut falls in the entropy-coded data, past the 0.6 kB of headers
    (src / "cat" / "bad.jpg").write_bytes(data[: len(data) // 2])
    return {"cat/bad.jpg": "truncated"}


def make_truncated_no_eoi(src):
    # Only the 2-byte end-of-image marker missing. tf.io.decode_jpeg refuses this file ("Invalid JPEG data"),
    # and for this seed PIL decodes every pixel of it without complaint.
    data = jpeg_bytes(50)
    assert data.endswith(b"\xff\xd9")
    (src / "cat" / "bad.jpg").write_bytes(data[:-2])
    return {"cat/bad.jpg": "truncated"}


def make_zero_bytes(src):
    (src / "dog" / "empty.jpg").write_bytes(b"")
    return {"dog/empty.jpg": "empty file"}


def make_not_an_image(src):
    (src / "dog" / "page.jpg").write_bytes(b"<html><body>403 Forbidden</body></html>\n")
    return {"dog/page.jpg": "not an image"}


def make_bomb(src):
    # 40x40 = 1600 pixels, over the 1000-pixel cap below; the good 16x16 images (256 pixels) are under it.
    Image.new("RGB", (40, 40), (10, 20, 30)).save(src / "cat" / "bomb.png")
    return {"cat/bomb.png": "decompression bomb"}


def make_bomb_jpeg(src):
    (src / "cat" / "bomb.jpg").write_bytes(jpeg_bytes(50, size=(40, 32)))
    return {"cat/bomb.jpg": "decompression bomb"}


def make_symlink_loop(src):
    os.symlink("b.jpg", src / "cat" / "a.jpg")
    os.symlink("a.jpg", src / "cat" / "b.jpg")
    return {"cat/a.jpg": "symlink loop", "cat/b.jpg": "symlink loop"}


def make_dir_link_to_parent(src):
    os.symlink("..", src / "cat" / "up")  # cat/up/cat/up/... would never end
    return {"cat/up": "symlink loop"}


def make_dir_link_to_itself(src):
    os.symlink(".", src / "dog" / "again")
    return {"dog/again": "symlink loop"}


def make_broken_symlink(src):
    os.symlink("moved-away.jpg", src / "dog" / "gone.jpg")
    return {"dog/gone.jpg": "broken symlink"}


def make_truncated_tiff(src):
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
        out, "TIFF", compression="tiff_lzw")  # PIL writes the IFD (the header's tables) last: the cut loses it
    (src / "cat" / "scan.tif").write_bytes(out.getvalue()[: len(out.getvalue()) // 2])
    return {"cat/scan.tif": "truncated or corrupt header"}


BAD_KINDS = {
    "truncated_half": (make_truncated_half, ImageOptions()),
    "truncated_no_eoi": (make_truncated_no_eoi, ImageOptions()),
    "zero_bytes": (make_zero_bytes, ImageOptions()),
    "not_an_image": (make_not_an_image, ImageOptions()),
    "bomb_png": (make_bomb, ImageOptions(max_pixels=1000)),
    "bomb_jpeg": (make_bomb_jpeg, ImageOptions(max_pixels=1000)),
    "symlink_loop": (make_symlink_loop, ImageOptions()),
    "dir_link_to_parent": (make_dir_link_to_parent, ImageOptions()),
    "dir_link_to_itself": (make_dir_link_to_itself, ImageOptions()),
    "broken_symlink": (make_broken_symlink, ImageOptions()),
    "truncated_tiff": (make_truncated_tiff, ImageOptions()),
}


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_is_rejected_with_a_reason_and_no_good_file_is_lost(tmp_path, kind):
    make_bad, image = BAD_KINDS[kind]
    src = tmp_path / "src"
    good = good_tree(src)
    bad = make_bad(src)

    assert_skipped(src, tmp_path / "out", bad, good, image=image)


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_with_on_error_fail_raises_naming_the_file(tmp_path, kind):
    make_bad, image = BAD_KINDS[kind]
    src = tmp_path / "src"
    good_tree(src)
    bad = make_bad(src)

    error = assert_fails(src, tmp_path / "out", sorted(bad)[0], image=image)

    assert bad[sorted(bad)[0]] in str(error)


def test_no_record_is_written_that_tensorflow_cannot_decode(tmp_path):
    # Forty JPEGs, each missing just its end-of-image marker: each must be rejected or decode in TensorFlow.
    src, out = tmp_path / "src", tmp_path / "out"
    for seed in range(40):
        (src / "cat").mkdir(parents=True, exist_ok=True)
        (src / "cat" / f"{seed:02d}.jpg").write_bytes(jpeg_bytes(seed)[:-2])
    (src / "cat" / "whole.jpg").write_bytes(jpeg_bytes(99))  # a dataset of only rejected inputs is refused

    manifest = convert(src, out)

    undecodable = []
    for rel, record in read_all(str(out), manifest).items():
        try:
            tf.io.decode_jpeg(record["image/encoded"])
        except tf.errors.InvalidArgumentError:
            undecodable.append(rel)
    assert undecodable == []


def test_jpeg_cut_inside_its_header_is_reported_as_truncated(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    good = good_tree(src)
    data = jpeg_bytes(50)
    # Cut 2 bytes into the second quantisation-table segment: SOI, JFIF and a table are there, clearly a JPEG.
    (src / "cat" / "bad.jpg").write_bytes(data[:91])
    assert data[89:91] == b"\xff\xdb"

    manifest = convert(src, out)

    assert [r["path"] for r in manifest.rejected] == ["cat/bad.jpg"]
    reason = manifest.rejected[0]["reason"]
    assert "truncat" in reason.lower(), reason
    assert "no known image format" not in reason
    assert sorted(read_all(str(out), manifest)) == sorted(good)


def test_bomb_cap_is_inclusive(tmp_path):
    src = tmp_path / "src"
    good = good_tree(src)
    (src / "cat" / "edge.jpg").write_bytes(data := jpeg_bytes(50, size=(40, 25)))  # exactly 1000 pixels

    manifest = convert(src, tmp_path / "out", image=ImageOptions(max_pixels=1000))

    assert manifest.rejected == []
    assert read_all(str(tmp_path / "out"), manifest)["cat/edge.jpg"]["image/encoded"] == data
    assert manifest.total_records == len(good) + 1


@pytest.mark.parametrize("name", ["big.png", "big.jpg"])
def test_max_pixels_above_pillows_own_limit_is_honoured(tmp_path, monkeypatch, name):
    # Scaled down: Pillow's bomb limit (89 Mpx by default) stands at 1000 pixels here, and the user raised
    # max_pixels to 10000, as `--max-pixels 200000000` would for a 100 Mpx scan.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    src = tmp_path / "src"
    good = good_tree(src)
    Image.fromarray(blocks(_COLOURS[:3], grid=(1, 3)).astype(np.uint8)).resize((40, 40)).save(src / "cat" / name)

    manifest = convert(src, tmp_path / "out", image=ImageOptions(max_pixels=10_000))

    assert manifest.rejected == []
    record = read_all(str(tmp_path / "out"), manifest)[f"cat/{name}"]
    assert (record["image/width"], record["image/height"]) == (40, 40)
    assert manifest.total_records == len(good) + 1


# --- unreadable files: needs a process that is not root --------------------------------------------------------------

_UNPRIVILEGED = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from tfshard.ingest import ConvertOptions, InputError, convert_images

jobs = json.loads(sys.argv[1])
# Run one whole conversion while still root, so every lazy import (ours, TensorFlow's, the stdlib's) is done
# before the interpreter's own files (under /root) may become unreadable.
convert_images(jobs["warm_src"], jobs["warm_out"], ConvertOptions(), workers=0, progress=False)
if os.geteuid() == 0:
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    except OSError as e:
        print(json.dumps({"skip": f"cannot drop root privileges ({e})"}))
        sys.exit(0)
try:
    open(jobs["probe"], "rb").close()
    print(json.dumps({"skip": f"chmod 000 does not stop reads for uid {os.geteuid()}"}))
    sys.exit(0)
except PermissionError:
    pass
results = {}
for name, (src, out, on_error) in jobs["runs"].items():
    try:
        manifest = convert_images(src, out, ConvertOptions(on_error=on_error), workers=0, progress=False)
        results[name] = {"rejected": manifest.rejected, "records": manifest.total_records}
    except InputError as e:
        results[name] = {"error": type(e).__name__, "message": str(e)}
print(json.dumps(results))
"""


@pytest.fixture
def world_readable_dir():
    """A temp folder an unprivileged user can read (pytest's tmp_path sits under a 0700 folder)."""
    folder = tempfile.mkdtemp(prefix="tfshard-perm-")
    os.chmod(folder, 0o755)
    yield folder
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    shutil.rmtree(folder)


def _open_to_all(folder):
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


@pytest.mark.slow
def test_unreadable_file_and_folder(world_readable_dir):
    base = world_readable_dir
    warm = os.path.join(base, "warm")
    good_tree(warm)
    file_src, dir_src = os.path.join(base, "file-src"), os.path.join(base, "dir-src")
    good = good_tree(file_src)
    good_tree(dir_src)
    write_jpeg(os.path.join(file_src, "cat", "locked.jpg"), 77)
    write_jpeg(os.path.join(dir_src, "dog", "locked", "inside.jpg"), 78)
    runs = {}
    for name in ("file", "dir"):
        for on_error in ("skip", "fail"):
            out = os.path.join(base, f"out-{name}-{on_error}")
            os.mkdir(out)
            runs[f"{name}-{on_error}"] = (os.path.join(base, f"{name}-src"), out, on_error)
    _open_to_all(base)
    for _, out, _ in runs.values():
        os.chmod(out, 0o777)
    os.chmod(os.path.join(file_src, "cat", "locked.jpg"), 0o000)
    os.chmod(os.path.join(dir_src, "dog", "locked"), 0o000)
    jobs = {
        "warm_src": warm,
        "warm_out": os.path.join(base, "warm-out"),
        "probe": os.path.join(file_src, "cat", "locked.jpg"),
        "runs": runs,
    }
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    child = subprocess.run(
        [sys.executable, "-c", _UNPRIVILEGED, json.dumps(jobs)], cwd=repo, capture_output=True, text=True, timeout=300
    )

    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout.strip().splitlines()[-1])
    if "skip" in results:
        skip_unless_ci(results["skip"])
    assert results["file-skip"]["rejected"] == [
        {"path": "cat/locked.jpg", "reason": "permission denied; make the file readable (chmod a+r)"}
    ]
    assert results["file-skip"]["records"] == len(good)
    out = runs["file-skip"][1]
    assert sorted(read_all(out, load_manifest(out))) == sorted(good)
    assert results["file-fail"]["error"] == "InputError"
    assert os.path.join(file_src, "cat", "locked.jpg") + ": permission denied" in results["file-fail"]["message"]

    assert [r["path"] for r in results["dir-skip"]["rejected"]] == ["dog/locked"]
    assert "cannot list folder" in results["dir-skip"]["rejected"][0]["reason"]
    assert results["dir-skip"]["records"] == len(good)
    assert results["dir-fail"]["error"] == "InputError"
    assert os.path.join(dir_src, "dog", "locked") + ": cannot list folder" in results["dir-fail"]["message"]


# --- names -----------------------------------------------------------------------------------------------------------


def test_unicode_file_and_class_names_round_trip_exactly(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    decomposed = unicodedata.normalize("NFD", "café")  # must not come back NFC
    names = ["chat_été/фото_1.jpg", "猫/画像.jpg", f"{decomposed}/{decomposed} 2.jpg", "dog/plain.jpg"]
    written = {rel: write_jpeg(str(src / rel), i) for i, rel in enumerate(names)}

    manifest = convert(src, out)

    classes = sorted({rel.split("/")[0] for rel in names})
    assert manifest.class_names == classes
    assert load_manifest(str(out)).class_names == classes
    records = read_all(str(out), manifest)
    assert sorted(records) == sorted(names)
    for rel in names:
        record = records[rel]
        assert record["image/filename"] == rel.encode("utf-8")
        assert record["image/class/text"] == rel.split("/")[0].encode("utf-8")
        assert record["image/class/label"] == classes.index(rel.split("/")[0])
        assert record["image/encoded"] == written[rel]


def test_unicode_bad_file_is_named_exactly(tmp_path):
    src = tmp_path / "src"
    good = make_tree(str(src), classes=("猫",), per_class=2)
    (src / "猫" / "壊れた.jpg").write_bytes(b"")

    assert_skipped(src, tmp_path / "skip", {"猫/壊れた.jpg": "empty file"}, good)
    assert_fails(src, tmp_path / "fail", "猫/壊れた.jpg")


def test_non_utf8_file_name_round_trips_as_its_bytes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    good_tree(src)
    raw = os.fsencode(src / "cat") + b"/caf\xe9.jpg"  # Latin-1 name from an old archive
    data = write_jpeg(os.fsdecode(raw), 5)

    manifest = convert(src, out)

    records = read_all(str(out), manifest)
    assert records[os.fsdecode(b"cat/caf\xe9.jpg")]["image/filename"] == b"cat/caf\xe9.jpg"
    assert records[os.fsdecode(b"cat/caf\xe9.jpg")]["image/encoded"] == data


def test_non_utf8_class_name_converts_and_the_manifest_is_written(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    good_tree(src)
    data = write_jpeg(os.fsdecode(os.fsencode(src) + b"/caf\xe9/x.jpg"), 5)

    manifest = convert(src, out)

    assert load_manifest(str(out)).class_names == manifest.class_names
    records = read_all(str(out), manifest)
    assert records[os.fsdecode(b"caf\xe9/x.jpg")]["image/class/text"] == b"caf\xe9"
    assert records[os.fsdecode(b"caf\xe9/x.jpg")]["image/encoded"] == data


def test_non_utf8_name_of_a_rejected_file_is_listed_in_the_manifest(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    good = good_tree(src)
    with open(os.fsencode(src) + b"/dog/\xff.jpg", "wb"):
        pass

    manifest = convert(src, out)

    assert [r["path"] for r in manifest.rejected] == [os.fsdecode(b"dog/\xff.jpg")]
    assert load_manifest(str(out)).rejected == manifest.rejected
    assert sorted(read_all(str(out), manifest)) == sorted(good)


# --- content decides the conversion ----------------------------------------------------------------------------------

_COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 40)]
_GREYS = [20, 90, 160, 240]


def blocks(values, grid=(2, 2), block=16) -> np.ndarray:
    """An image of flat ``block``-pixel squares (one per value, row-major): JPEG keeps their insides near exact."""
    values = [v if isinstance(v, tuple) else (v,) for v in values]
    rows = [
        np.concatenate([np.full((block, block, len(values[0])), values[r * grid[1] + c]) for c in range(grid[1])], 1)
        for r in range(grid[0])
    ]
    return np.concatenate(rows, 0)


def interior(array: np.ndarray, block=16, margin=4) -> np.ndarray:
    """The pixels at least ``margin`` from a block edge (chroma upsampling smears across edges)."""
    y, x = np.mgrid[0 : array.shape[0], 0 : array.shape[1]]
    keep = (y % block >= margin) & (y % block < block - margin) & (x % block >= margin) & (x % block < block - margin)
    return array[keep]


def _rgb():
    return Image.fromarray(blocks(_COLOURS).astype(np.uint8))


def odd_png_named_jpg():
    return "x.jpg", saved_bytes(_rgb(), "PNG"), blocks(_COLOURS), ImageOptions()


def odd_cmyk_jpeg():
    data = saved_bytes(_rgb().convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    return "x.jpg", data, blocks(_COLOURS), ImageOptions()


def odd_palette_png_with_transparency():
    image = _rgb().quantize(colors=4, method=Image.Quantize.FASTOCTREE)
    data = saved_bytes(image, "PNG", transparency=0)
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "P" and "transparency" in opened.info
    return "x.png", data, np.asarray(opened.convert("RGB")), ImageOptions()


def odd_la_png():
    grey = blocks(_GREYS)[..., 0]
    alpha = np.random.default_rng(0).integers(0, 256, grey.shape)
    data = saved_bytes(Image.fromarray(np.stack([grey, alpha], -1).astype(np.uint8), "LA"), "PNG")
    return "x.png", data, grey[..., None], ImageOptions()


def odd_la_png_rgb():
    name, data, grey, _ = odd_la_png()
    return name, data, np.repeat(grey, 3, -1), ImageOptions(rgb=True)


def _gray16(values):
    data = saved_bytes(Image.fromarray(blocks(values)[..., 0].astype(np.uint16)), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    expected = np.round(blocks(values).astype(np.float64) * 255 / 65535)
    return "x.png", data, expected, ImageOptions()


def odd_gray16_png():
    return _gray16([0, 1000, 30000, 65535])


def odd_gray16_png_dark():
    # A dark 16-bit scan: every value is under 256, i.e. under 0.4% of full scale. Scaled, not read as 8-bit.
    return _gray16([0, 100, 200, 255])


def odd_rgba_png():
    rgb = blocks(_COLOURS)
    alpha = np.random.default_rng(1).integers(0, 256, rgb.shape[:2] + (1,))
    rgba = Image.fromarray(np.concatenate([rgb, alpha], -1).astype(np.uint8), "RGBA")
    return "x.png", saved_bytes(rgba, "PNG"), rgb, ImageOptions()


def odd_gif_first_frame():
    second = Image.fromarray(blocks(list(reversed(_COLOURS))).astype(np.uint8))
    data = saved_bytes(_rgb(), "GIF", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(data)).n_frames == 2
    return "x.gif", data, blocks(_COLOURS), ImageOptions()


def odd_webp():
    return "x.webp", saved_bytes(_rgb(), "WEBP", lossless=True), blocks(_COLOURS), ImageOptions()


def odd_bmp():
    return "x.bmp", saved_bytes(_rgb(), "BMP"), blocks(_COLOURS), ImageOptions()


def odd_exif_rotated_jpeg():
    stored = blocks(_COLOURS[:2], grid=(1, 2))  # 32 wide, 16 high as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90° clockwise
    data = saved_bytes(Image.fromarray(stored.astype(np.uint8)), "JPEG", quality=95, exif=exif.tobytes())
    return "x.jpg", data, np.rot90(stored, k=-1), ImageOptions()


def odd_tiff_rgb():
    return "x.tif", saved_bytes(_rgb(), "TIFF"), blocks(_COLOURS), ImageOptions()


def odd_tiff_rgba_lzw():
    _, data, rgb, options = odd_rgba_png()
    return "x.tiff", saved_bytes(Image.open(io.BytesIO(data)), "TIFF", compression="tiff_lzw"), rgb, options


def odd_tiff_gray16():
    values = [0, 1000, 30000, 65535]
    data = saved_bytes(Image.fromarray(blocks(values)[..., 0].astype(np.uint16)), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    return "x.TIF", data, np.round(blocks(values).astype(np.float64) * 255 / 65535), ImageOptions()


def odd_tiff_gray16_big_endian():
    values = [0, 1000, 30000, 65535]
    pixels = blocks(values)[..., 0].astype(">u2")
    data = saved_bytes(Image.frombytes("I;16B", pixels.shape[::-1], pixels.tobytes()), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I;16B"
    return "x.tiff", data, np.round(blocks(values).astype(np.float64) * 255 / 65535), ImageOptions()


def odd_tiff_float32():
    values = [0.0, 0.25, 0.5, 1.0]  # float images are in [0, 1]
    data = saved_bytes(Image.fromarray(blocks(values)[..., 0].astype(np.float32)), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "F"
    return "x.tif", data, np.round(blocks(values) * 255), ImageOptions()


ODD_KINDS = {
    "png_named_jpg": odd_png_named_jpg,
    "cmyk_jpeg": odd_cmyk_jpeg,
    "palette_png_transparency": odd_palette_png_with_transparency,
    "la_png": odd_la_png,
    "la_png_rgb": odd_la_png_rgb,
    "gray16_png": odd_gray16_png,
    "gray16_png_dark": odd_gray16_png_dark,
    "rgba_png": odd_rgba_png,
    "gif_first_frame": odd_gif_first_frame,
    "webp": odd_webp,
    "bmp": odd_bmp,
    "exif_orientation_6": odd_exif_rotated_jpeg,
    "tiff_rgb": odd_tiff_rgb,
    "tiff_rgba_lzw": odd_tiff_rgba_lzw,
    "tiff_gray16": odd_tiff_gray16,
    "tiff_gray16_big_endian": odd_tiff_gray16_big_endian,
    "tiff_float32": odd_tiff_float32,
}


@pytest.mark.parametrize("kind", ODD_KINDS)
def test_odd_content_becomes_a_jpeg_record_tensorflow_decodes(tmp_path, kind):
    name, data, expected, image = ODD_KINDS[kind]()
    src, out = tmp_path / "src", tmp_path / "out"
    good = good_tree(src)
    (src / "cat" / name).write_bytes(data)

    manifest = convert(src, out, image=image)

    assert manifest.rejected == []
    assert manifest.options["converted_images"] == 1
    records = read_all(str(out), manifest)
    assert sorted(records) == sorted([*good, f"cat/{name}"])
    record = records[f"cat/{name}"]
    height, width, channels = expected.shape
    assert (record["image/height"], record["image/width"], record["image/channels"]) == (height, width, channels)
    assert record["image/format"] == b"jpeg"
    encoded = record["image/encoded"]
    assert encoded != data
    reopened = Image.open(io.BytesIO(encoded))
    assert reopened.format == "JPEG"
    assert reopened.getexif().get(0x0112, 1) == 1  # the rotation is applied, not left for readers to apply again
    decoded = tf.io.decode_jpeg(encoded).numpy()
    assert decoded.shape == (height, width, channels)
    np.testing.assert_allclose(interior(decoded), interior(expected), rtol=0, atol=3, err_msg=f"{kind}: pixels")
    cropped = tf.image.decode_and_crop_jpeg(encoded, [0, 0, height, width]).numpy()
    np.testing.assert_array_equal(cropped, decoded)
    window = tf.image.decode_and_crop_jpeg(encoded, [4, 4, 8, 8]).numpy()
    assert window.shape == (8, 8, channels)
    np.testing.assert_allclose(window, expected[4:12, 4:12], rtol=0, atol=3, err_msg=f"{kind}: crop window")
    for rel, source in good.items():
        assert records[rel]["image/encoded"] == source, rel


# --- the CLI ---------------------------------------------------------------------------------------------------------


def _bad_tree_truncated(src):
    good_tree(src)
    return make_truncated_half(src)


def _bad_tree_broken_link(src):
    good_tree(src)
    return make_broken_symlink(src)


@pytest.mark.parametrize("make", [_bad_tree_truncated, _bad_tree_broken_link], ids=["truncated", "broken_link"])
def test_cli_on_error_fail_prints_one_line_and_exits_1(cli, tmp_path, make):
    src = tmp_path / "src"
    (bad,) = make(src)

    result = cli("images", src, tmp_path / "out", "--on-error", "fail", "--workers", "0", "--quiet")

    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {os.path.join(str(src), bad)}: ")
    assert not isinstance(result.exception, InputError)


def test_cli_debug_lets_the_exception_propagate(cli, tmp_path):
    src = tmp_path / "src"
    (bad,) = _bad_tree_truncated(src)

    result = cli("--debug", "images", src, tmp_path / "out", "--on-error", "fail", "--workers", "0", "--quiet")

    assert result.exit_code != 0
    assert isinstance(result.exception, InputError)
    assert os.path.join(str(src), bad) in str(result.exception)


def test_cli_skip_is_the_default_and_lists_the_rejected_file(cli, tmp_path):
    src = tmp_path / "src"
    good = good_tree(src)
    (src / "dog" / "empty.jpg").write_bytes(b"")

    result = cli("images", src, tmp_path / "out", "--workers", "0")

    assert result.exit_code == 0, result.output
    assert "dog/empty.jpg: empty file" in result.stdout
    manifest = load_manifest(str(tmp_path / "out"))
    assert [r["path"] for r in manifest.rejected] == ["dog/empty.jpg"]
    assert manifest.total_records == len(good)


# =====================================================================================================================
# JPEG validation and grayscale depths
# Attacks on the converter's image validation (ingest/images.py): JPEGs whose entropy-coded data is cut short or
# garbled, which PIL decodes with only a swallowed libjpeg warning, and grayscale content at every bit depth, which
# must stay 1-channel unless ``rgb``.
#
# =====================================================================================================================


FIX = "re-download or re-export the file"


def convert_validating(src, out, workers=0, **image):
    options = ConvertOptions(on_error="skip", image=ImageOptions(**image))
    return convert_images(str(src), str(out), options, workers=workers, progress=False)


def read_by_name(out, manifest) -> dict[str, dict]:
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

    manifest = convert_validating(tmp_path / "src", tmp_path / "out", workers=workers)

    _assert_corrupt(manifest, bad)
    assert manifest.options["converted_images"] == 0
    records = read_by_name(tmp_path / "out", manifest)
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

    manifest = convert_validating(tmp_path / "src", tmp_path / "out", **options)

    _assert_corrupt(manifest, bad)
    assert manifest.options["converted_images"] == 1
    assert sorted(read_by_name(tmp_path / "out", manifest)) == ["cat/good.jpg"]


def test_without_validation_nothing_changes(tmp_path):
    good = jpeg(photo(0))
    sources = {"cat/good.jpg": good, **{f"dog/{name}.jpg": corrupt(good) for name, corrupt in CORRUPTIONS.items()}}
    write(tmp_path / "src", sources)

    manifest = convert_validating(tmp_path / "src", tmp_path / "out", validate=False)

    assert manifest.rejected == [] and manifest.options["converted_images"] == 0
    records = read_by_name(tmp_path / "out", manifest)
    assert {rel: r["image/encoded"] for rel, r in records.items()} == sources


def test_a_truncated_jpeg_without_end_marker_keeps_its_reason(tmp_path):
    good = jpeg(photo(0))
    start, end = _scan(good)
    write(tmp_path / "src", {"cat/good.jpg": good, "dog/half.jpg": good[: (start + end) // 2],
                             "dog/half_cmyk.jpg": jpeg(photo(0).convert("CMYK"))[: (start + end) // 2]})

    manifest = convert_validating(tmp_path / "src", tmp_path / "out")

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

    manifest = convert_validating(tmp_path / "src", tmp_path / "out")

    assert manifest.rejected == [] and manifest.options["converted_images"] == 0
    records = read_by_name(tmp_path / "out", manifest)
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

    manifest = convert_validating(src, tmp_path / "out")

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

    manifest = convert_validating(tmp_path / "src", tmp_path / "out")

    record = read_by_name(tmp_path / "out", manifest)["cat/x.png"]
    assert record["image/channels"] == 1
    decoded = tf.io.decode_jpeg(record["image/encoded"]).numpy()
    assert decoded.shape == (32, 32, 1)
    squares = decoded[4:32:16, 4:32:16, 0], decoded[12:32:16, 12:32:16, 0]  # two pixels inside each square
    for pixels in squares:
        np.testing.assert_allclose(pixels, [[0, 128], [255, 200]], atol=2)
