"""Bad and odd inputs: each is rejected with a reason (skip), stops the run naming the file (fail), or is converted.

Every bad-input test builds a tree of good JPEGs plus one bad thing, and checks both policies:
``on_error="skip"`` leaves the bad file in ``manifest.rejected`` and loses no good file;
``on_error="fail"`` raises ``InputError`` naming the file's path and commits no manifest.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
from helpers import image_features, jpeg_bytes, make_tree, saved_bytes, skip_unless_ci, write_jpeg
from PIL import Image
from tfshard.ingest import ConvertOptions, ImageOptions, InputError, convert_images, load_manifest

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
