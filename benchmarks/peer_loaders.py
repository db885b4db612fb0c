"""The loaders that ``benchmarks/peers.py`` compares, each built the way its own documentation recommends.

Every loader does the same work on the same 1,000 JPEGs: a random-resized crop (area 8–100%, aspect 3/4–4/3,
as Inception and torchvision draw it) resized to ``SIZE``, a random horizontal flip, uint8, batches of
``batch_size``, endlessly (the benchmark stops it). Each reads the images from the form its users keep them in:

  tfshard        ``readers.images`` on the converted shards (training, and ``training=False``: centre crop, no flip);
  keras          ``image_dataset_from_directory`` on the class folders; keras' loader has no random crop, so it
                 decodes and resizes the whole image, then flips (``keras.layers.RandomFlip``), as its guide does;
  tfds           ``tfds.builder_from_directory`` on the same shards (tfshard's ``--tfds`` metadata), with
                 ``try_autocache=False`` and TFDS' own ImageNet recipe: ``SkipDecoding`` + ``decode_and_crop_jpeg``;
  grain          ``grain.DataLoader`` over a random-access source of the JPEG files, one worker process per core;
  webdataset     tar shards of the same JPEGs, ``WebLoader`` with one worker per core;
  streaming      MosaicML Streaming's MDS shards of the same JPEGs, a ``StreamingDataset`` in a torch
                 ``DataLoader``, one worker per core;
  dali           DALI on the CPU (``device_id=None``): ``fn.readers.tfrecord`` on tfshard's shards with the
                 ``.idx`` files the converter writes, ``fn.decoders.image_random_crop``, resize, flip.

The Python loaders (grain, webdataset, streaming) decode with PIL, as their examples and torchvision do.
``build(name, data, batch_size)`` imports nothing heavy itself: ``imports(name)`` does that first, so that the
benchmark's clock starts with every import done.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np

SIZE = (224, 224)
SHUFFLE_BUFFER = 256  # as benchmarks/images.py: smaller than the epoch, so augmentation overlaps the reading
AREA, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
SEED = 0

LOADERS = ("tfshard", "tfshard-eval", "keras", "tfds", "grain", "webdataset", "streaming", "dali")
# The module each loader needs, for "not installed" (importlib.util.find_spec of the top-level name).
NEEDS = {"tfshard": ["tensorflow"], "tfshard-eval": ["tensorflow"], "keras": ["keras"],
         "tfds": ["tensorflow_datasets"], "grain": ["grain"], "webdataset": ["webdataset", "torch"],
         "streaming": ["streaming", "torch"], "dali": ["nvidia.dali"]}
PACKAGES = {"tensorflow": "tensorflow", "keras": "keras", "tensorflow_datasets": "tensorflow-datasets",
            "grain": "grain", "webdataset": "webdataset", "torch": "torch", "streaming": "mosaicml-streaming",
            "nvidia.dali": "nvidia-dali-cuda120"}


def missing(name: str) -> list[str]:
    """The PyPI packages ``name`` needs that are not installed (empty when it can run)."""
    import importlib.util

    def found(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package of a dotted name is absent
            return False

    return [PACKAGES[m] for m in NEEDS[name] if not found(m)]


# --- the crop, in numpy + PIL, for the Python loaders ---------------------------------------------------------------


def crop_box(width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a random-resized crop, as torchvision's ``RandomResizedCrop`` draws it."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*AREA)
        ratio = math.exp(rng.uniform(math.log(RATIO[0]), math.log(RATIO[1])))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    side = min(width, height)  # the fallback: the centre square
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def crop_flip(jpeg: bytes, rng: np.random.Generator) -> np.ndarray:
    """JPEG bytes → a random-resized crop, flipped half the time: uint8 [224, 224, 3]."""
    from PIL import Image

    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    image = image.resize(SIZE[::-1], Image.Resampling.BILINEAR, box=crop_box(*image.size, rng))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)


_RNG: dict[int, np.random.Generator] = {}


def worker_rng() -> np.random.Generator:
    """One generator per process, seeded from the OS: forked workers must not share a stream."""
    pid = os.getpid()
    if pid not in _RNG:
        _RNG[pid] = np.random.default_rng()
    return _RNG[pid]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --- the data each loader reads, written once by the parent (not timed) ---------------------------------------------


def files_and_labels(src: str) -> list[tuple[str, int]]:
    """(path, label) of every JPEG of the class folders, sorted."""
    classes = sorted(os.listdir(src))
    return [(os.path.join(src, c, n), label) for label, c in enumerate(classes)
            for n in sorted(os.listdir(os.path.join(src, c)))]


def write_tars(src: str, out: str, shards: int) -> None:
    """The JPEGs as webdataset tar shards (``<key>.jpg``, ``<key>.cls``), written with ``tarfile`` alone."""
    import tarfile

    os.makedirs(out, exist_ok=True)
    items = files_and_labels(src)
    for s in range(shards):
        with tarfile.open(os.path.join(out, f"shard-{s:05d}.tar"), "w") as sink:
            for i, (path, label) in enumerate(items[s::shards]):
                for suffix, payload in (("jpg", _read(path)), ("cls", str(label).encode())):
                    member = tarfile.TarInfo(f"{s:05d}-{i:06d}.{suffix}")
                    member.size = len(payload)
                    sink.addfile(member, io.BytesIO(payload))


def write_mds(src: str, out: str) -> None:
    """The JPEGs as MosaicML Streaming MDS shards (the raw bytes and the label). Imports torch: run it in a process
    that has not imported TensorFlow (the two in one process can crash it)."""
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit="16mb") as sink:
        for path, label in files_and_labels(src):
            sink.write({"image": _read(path), "label": label})


# --- the loaders -----------------------------------------------------------------------------------------------------


def imports(name: str) -> None:
    """Imports everything ``build(name, ...)`` uses, so that building it is timed without them."""
    # The Python loaders never import TensorFlow: their workers fork, and a process whose TensorFlow threads
    # hold locks must not fork.
    modules = {"tfshard": ["tfshard.readers.images"], "tfshard-eval": ["tfshard.readers.images"],
               "keras": ["keras", "tensorflow"], "tfds": ["tensorflow_datasets", "tensorflow"],
               "grain": ["grain", "PIL.Image"],
               "webdataset": ["webdataset", "torch", "PIL.Image"],
               "streaming": ["streaming", "torch", "PIL.Image"], "dali": ["nvidia.dali.fn", "nvidia.dali.tfrecord"]}
    import importlib

    for module in modules[name]:
        importlib.import_module(module)


def build(name: str, data: dict, batch_size: int):
    """An endless iterator of ``(images uint8 [B, 224, 224, 3], labels)`` batches from loader ``name``."""
    return BUILDERS[name](data, batch_size)


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _tfshard(data: dict, batch_size: int, training: bool = True):
    from tfshard.readers.images import images

    ds = images(data["tfr"], batch_size=batch_size, image_size=SIZE, training=training, seed=SEED, dtype="uint8",
                shuffle_buffer=SHUFFLE_BUFFER, repeat=True)
    return iter(ds)


def _keras(data: dict, batch_size: int):
    import keras
    import tensorflow as tf

    flip = keras.layers.RandomFlip("horizontal", seed=SEED)
    ds = keras.utils.image_dataset_from_directory(data["src"], batch_size=batch_size, image_size=SIZE, seed=SEED,
                                                  verbose=False)
    ds = ds.repeat().map(lambda x, y: (tf.cast(flip(x, training=True), tf.uint8), y),
                         num_parallel_calls=tf.data.AUTOTUNE)
    return iter(ds.prefetch(tf.data.AUTOTUNE))


def _tf_crop_flip(encoded, label):
    """TFDS' and TF's ImageNet recipe: a distorted box, a fused crop-and-decode, resize and flip."""
    import tensorflow as tf

    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.io.extract_jpeg_shape(encoded), bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        area_range=AREA, aspect_ratio_range=RATIO, max_attempts=10, use_image_if_no_bounding_boxes=True)
    top, left, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    image = tf.io.decode_and_crop_jpeg(encoded, tf.stack([top, left, height, width]), channels=3)
    image = tf.image.random_flip_left_right(tf.image.resize(image, SIZE))
    return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8), label


def _tfds(data: dict, batch_size: int):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(data["tfr"])
    ds = builder.as_dataset(split="train", as_supervised=True, shuffle_files=True,
                            decoders={"image/encoded": tfds.decode.SkipDecoding()},
                            read_config=tfds.ReadConfig(try_autocache=False, shuffle_seed=SEED))
    ds = ds.repeat().shuffle(SHUFFLE_BUFFER, seed=SEED).map(_tf_crop_flip, num_parallel_calls=tf.data.AUTOTUNE)
    return iter(ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


class JpegFiles:
    """grain's random-access source: the JPEG bytes and label of item ``i`` of the class folders."""

    def __init__(self, src: str):
        self.items = files_and_labels(src)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        path, label = self.items[index]
        return _read(path), label


def _grain(data: dict, batch_size: int):
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain reads its absl flags in its threads; a program without absl.app parses none
        flags.FLAGS.mark_as_parsed()

    class CropFlip(grain.transforms.RandomMap):
        def random_map(self, element, rng: np.random.Generator):
            return crop_flip(element[0], rng), np.int64(element[1])

    source = JpegFiles(data["src"])
    sampler = grain.samplers.IndexSampler(len(source), shard_options=grain.sharding.NoSharding(), shuffle=True,
                                          num_epochs=None, seed=SEED)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=_cpus(),
                              operations=[CropFlip(), grain.transforms.Batch(batch_size, drop_remainder=True)])
    return iter(loader)


def _wds_sample(sample: dict):
    return crop_flip(sample["jpg"], worker_rng()), int(sample["cls"])


def _webdataset(data: dict, batch_size: int):
    import webdataset as wds

    shards = sorted(os.path.join(data["tars"], n) for n in os.listdir(data["tars"]))
    ds = (wds.WebDataset(shards, resampled=True, shardshuffle=False, seed=SEED).shuffle(SHUFFLE_BUFFER)
          .map(_wds_sample).batched(batch_size, partial=False))
    return iter(wds.WebLoader(ds, batch_size=None, num_workers=_cpus()))


def _streaming_dataset_class():
    from streaming import StreamingDataset

    class CropFlipDataset(StreamingDataset):
        def __getitem__(self, index: int):
            sample = super().__getitem__(index)
            return crop_flip(sample["image"], worker_rng()), sample["label"]

    return CropFlipDataset


def _streaming(data: dict, batch_size: int):
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    dataset = _streaming_dataset_class()(local=data["mds"], shuffle=True, shuffle_seed=SEED, batch_size=batch_size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=_cpus(), drop_last=True, persistent_workers=True)

    def endless():
        while True:
            yield from loader

    return endless()


def _dali(data: dict, batch_size: int):
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def, types

    shards = sorted(n for n in os.listdir(data["tfr"]) if n.endswith(".tfrecord") and n.startswith("train-"))
    paths = [os.path.join(data["tfr"], n) for n in shards]
    indexes = [p.rsplit(".tfrecord", 1)[0] + ".idx" for p in paths]

    @pipeline_def(batch_size=batch_size, num_threads=_cpus(), device_id=None, seed=SEED)
    def pipeline():
        records = fn.readers.tfrecord(
            path=paths, index_path=indexes, random_shuffle=True, initial_fill=SHUFFLE_BUFFER,
            features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                      "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        images = fn.decoders.image_random_crop(records["image/encoded"], device="cpu", output_type=types.RGB,
                                               random_area=list(AREA), random_aspect_ratio=list(RATIO))
        images = fn.resize(images, resize_x=SIZE[1], resize_y=SIZE[0])
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, records["image/class/label"]

    pipe = pipeline()
    pipe.build()

    def endless():  # pipe.run() goes on into the next epoch by itself
        while True:
            images, labels = pipe.run()
            yield images.as_array(), labels.as_array()

    return endless()


BUILDERS = {"tfshard": _tfshard, "tfshard-eval": lambda d, b: _tfshard(d, b, training=False), "keras": _keras,
            "tfds": _tfds, "grain": _grain, "webdataset": _webdataset, "streaming": _streaming, "dali": _dali}
