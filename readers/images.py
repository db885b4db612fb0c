"""``readers.images()``: a dataset of ``(images float32 [B, H, W, C] in [0, 1], labels int64 [B])``.

One canonical order, written once (the tf.data performance guide's):
list shard files → shuffle files → interleave reads → parse + decode (parallel)
→ cache → shuffle → batch → augment the batch → prefetch. Only deterministic
work is ever cached: with a cache in training, images are decoded and resized to
a fixed cache size, cached as uint8, shuffled, and the random crop happens on
the batch after the cache.

Without a cache the decode itself is the random work: training shuffles the
encoded records (~80 KB JPEGs, not 150 KB decoded images, in the buffer), then
decodes only a random crop of each JPEG (``decode_and_crop_jpeg``) and, with
the default recipe, flips it and casts it to the output dtype in the same map,
so a plain batch() fuses with the decode. Colour jitter and callables run on
uint8 batches after the batch.

With ``service=`` (the tf.data service, see ``readers/service.py``) everything
up to and including batching runs on the service's workers; the client
receives uint8 batches and only augments them, casts to float and prefetches.

The dataset knows its length (``len(ds)``, so Keras needs no ``steps_per_epoch``
and does not warn that the input "ran out of data") whenever the manifest's
record counts fix it: without ``ignore_errors`` and without a service.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from ..format.records import IMAGE_FEATURES, parse_spec
from . import augment as augment_lib
from . import cache as cache_lib
from . import files as files_lib
from . import service as service_lib
from .arguments import (INT32_LIMIT, MAX_BATCH_SIZE, MAX_IMAGE_SIDE, MAX_SHUFFLE_BUFFER, check_count,
                        check_reading)
from .layout import check_start_step


AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 1024
_CROP_PADDING = 32  # the eval centre crop keeps image_size / (image_size + 32) of the shorter side
AUGMENTATIONS = {"default": augment_lib.default_augment, "color": augment_lib.color_augment}
DTYPES = ("float32", "uint8")
_FEATURES = ("image/encoded", "image/class/label")  # what the reader parses of each record


def _parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_single_example(record, parse_spec(IMAGE_FEATURES, _FEATURES))
    return parsed["image/encoded"], parsed["image/class/label"]


def _pixels(image: tf.Tensor) -> tf.Tensor:
    """A resized float image rounded and clipped to the 0..255 pixel values a uint8 image holds."""
    return tf.clip_by_value(tf.round(image), 0.0, 255.0)


def _output(pixels: tf.Tensor, unit_float: bool) -> tf.Tensor:
    """uint8, or with ``unit_float`` float32 in [0, 1]: the same values / 255, without a uint8 round trip."""
    return pixels / 255.0 if unit_float else tf.cast(pixels, tf.uint8)


def decode_random_crop(encoded: tf.Tensor, seed: tf.Tensor, size: tuple[int, int], flip: bool = False,
                       unit_float: bool = False) -> tf.Tensor:
    """Inception-style random-resized crop, decoding only the crop (fused ``decode_and_crop_jpeg``).

    uint8, or with ``unit_float`` float32 in [0, 1] (the uint8 values / 255). ``flip``: also flip a random half
    of the images left-right, here on the one image: done per image inside the decode map, the flip and the cast
    cost ~2% of the pass; as a separate map over the batch, ~8% (benchmarks/images.py, 2 cores).
    """
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    pixels = _pixels(tf.image.resize(image, size))
    if flip:
        heads = tf.random.stateless_uniform([], tf.random.experimental.stateless_fold_in(seed, 1)) < 0.5
        pixels = tf.cond(heads, lambda: tf.reverse(pixels, axis=[1]), lambda: pixels)
    return _output(pixels, unit_float)


def decode_center_crop(encoded: tf.Tensor, size: tuple[int, int], padding: int = _CROP_PADDING,
                       unit_float: bool = False) -> tf.Tensor:
    """Deterministic: decode only a centred square of ``size/(size+padding)`` of the shorter side, resize to ``size``.

    uint8, or with ``unit_float`` float32 in [0, 1] straight from the resize, equal to the uint8 values / 255
    (the uint8 round trip and a separate batch map cost ~10% of an evaluation pass's CPU, by TensorFlow's profiler).
    """
    shape = tf.io.extract_jpeg_shape(encoded)
    height, width = shape[0], shape[1]
    side = tf.cast(
        tf.cast(size[0], tf.float32) / float(size[0] + padding) * tf.cast(tf.minimum(height, width), tf.float32),
        tf.int32,
    )
    side = tf.maximum(side, 1)
    window = tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return _output(_pixels(tf.image.resize(image, size)), unit_float)


def _seed_stream(seed: int | None, salt: int) -> tf.data.Dataset:
    """An endless stream of stateless seeds ``[2]``, new each epoch; reproducible when ``seed`` is set."""
    return tf.data.Dataset.random(
        seed=None if seed is None else seed + salt, rerandomize_each_iteration=True
    ).batch(2)


def _cache_identity(
    dataset: files_lib.DatasetInfo, split: str, shards: list[files_lib.ShardFile], stage: dict, ignore_errors: bool
) -> dict:
    """What the cached bytes depend on. The manifest's fingerprint covers only the *sources* (names, sizes, mtimes):
    the shards' sha256 follows their content, and their size and mtime at build time follow any rewrite, even a
    byte-identical one that repairs a shard a cache was read from with ``ignore_errors``."""
    files = [{"path": s.path, "sha256": s.info.sha256, "bytes": s.size, "mtime_ns": s.mtime_ns} for s in shards]
    return {"fingerprint": dataset.manifest.fingerprint, "split": split, "files": files, "stage": stage,
            "ignore_errors": ignore_errors, "v": 2}


def _image_size(value) -> tuple[int, int]:
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


def _check_kind(dataset: files_lib.DatasetInfo) -> None:
    """An episodes dataset has no ``image/*`` keys: refuse it here, not with a graph error mid-``fit``."""
    kind = dataset.manifest.kind
    if kind != "images":
        raise ValueError(
            f"{dataset.path}: an {kind!r} dataset, not images (got kind={kind!r} in dataset.json); read it with "
            "readers.windows or readers.episodes, or write an images dataset with `tfshard images SRC OUT`"
        )


def _check_resume(path: str, repeat: bool, start_step, *, batch_size, seed, cache, service, ignore_errors,
                  deterministic) -> None:
    """``start_step`` replays the stream up to a step, so that stream must be a pure function of the seed."""
    start_step = check_start_step(start_step, path)
    if repeat and service is not None:
        raise ValueError(f"{path}: repeat: not with service= (each epoch is a new service job, shared among its "
                         "clients); repeat the dataset yourself, knowing a service epoch cannot be resumed exactly")
    if not start_step:
        return
    blockers = [  # (it applies, the problem, the fix)
        (not repeat, "repeat=False: resuming at a step needs one stream of epochs", "pass repeat=True"),
        (seed is None, "seed=None: the stream must be a function of a seed", "pass the seed the job started with"),
        (cache is not None, f"cache={cache!r}: not supported yet", "drop cache to resume"),
        (ignore_errors, "ignore_errors=True: skipped records would shift every later batch", "drop ignore_errors"),
        (deterministic is False, "deterministic=False: the order must be reproducible", "drop deterministic=False"),
        (start_step * batch_size > INT32_LIMIT, f"batch_size={batch_size}: the {start_step * batch_size} records "
         f"before it are more than tf.data's skip() takes ({INT32_LIMIT:,})", "pass the step count the job saved"),
    ]
    for applies, problem, fix in blockers:
        if applies:
            raise ValueError(f"{path}: start_step={start_step}: cannot resume exactly with {problem}; {fix}")


def _check_not_empty(dataset: files_lib.DatasetInfo, split: str, records: int, batch_size: int, fed: int) -> None:
    """With drop_remainder, fewer records than one step takes would make an epoch of nothing: say so up front.

    ``fed``: replicas this pipeline feeds under a strategy; a step takes a batch for each of them, or none at all.
    """
    if records < batch_size * fed:
        what = f"batch_size={batch_size}" if fed == 1 else (
            f"the {batch_size * fed} a step takes from it (batch_size={batch_size} for each of the {fed} replicas it "
            "feeds)")
        raise ValueError(
            f"{dataset.path}: split {split!r} has {records} records for this pipeline, fewer than {what} with "
            "drop_remainder=True, so an epoch would yield no batch; pass a smaller batch_size or drop_remainder=False"
        )


def images(
    path: str,
    split: str = "train",
    *,
    batch_size: int,
    image_size: int | tuple[int, int] = (224, 224),
    training: bool = True,
    seed: int | None = None,
    cache: str | None = None,
    augment: str | Callable | None = "default",
    dtype: str = "float32",
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    input_context: tf.distribute.InputContext | None = None,
    deterministic: bool | None = None,
    drop_remainder: bool | None = None,
    num_parallel_reads: int | None = None,
    read_buffer_bytes: int = files_lib.DEFAULT_READ_BUFFER_BYTES,
    ignore_errors: bool = False,
    service: str | None = None,
    service_job_name: str | None = None,
    processing_mode: str = "distributed_epoch",
    repeat: bool = False,
    start_step: int = 0,
) -> tf.data.Dataset:
    """Streams a ``tfshard images`` dataset for training or evaluation.

    Args:
      path: the dataset folder (local or ``gs://``), holding ``dataset.json``.
      split: which split to read.
      batch_size: batch size of this input pipeline (under a strategy, the
        per-replica size: ``input_context.get_per_replica_batch_size(global)``).
      image_size: output ``(height, width)``, or one int for a square (numpy ints too).
      training: random crop, shuffling and augmentation; False gives a
        deterministic centre crop in file order.
      seed: makes file order, crops, shuffling and augmentation reproducible
        (each epoch still differs from the last); None draws fresh randomness.
      cache: None; ``"memory"``; or a folder for a cache file. Only decoded,
        resized, deterministic images are cached (see the module docstring);
        the file name follows the data (the shards' sha256, size and mtime) and
        every option that changes it. A second pipeline of this process built
        while the first may still be writing that file reads without it.
      augment: ``"default"``: the standard recipe, a random-resized crop (fused
        into the JPEG decode, or on the batch after a cache) and a random flip,
        both on uint8; ``"color"``: that plus brightness/contrast/saturation
        jitter (float work, XLA-fused); None: the crop alone; or a callable
        ``(images [B,H,W,C] of ``dtype``, seed [2]) -> images`` applied per batch
        after the crop. Ignored when ``training`` is False.
      dtype: ``"float32"`` (in [0, 1]) or ``"uint8"`` ([0, 255], a quarter of the
        bytes to the accelerator; normalise there with ``readers.normalization``).
        ``augment="color"`` needs float32.
      shuffle_buffer: elements in the shuffle buffer: encoded records without a
        cache, decoded uint8 images after one. Records are also shuffled at
        write time and files every epoch.
      input_context: from ``distribute_datasets_from_function``; each input
        pipeline reads its own shard files. With ``service`` the service splits
        the epoch instead: the pipelines must share a ``service_job_name``.
      deterministic: element order of the parallel stages; None keeps
        ``tf.data``'s default (deterministic). False is faster when order need
        not be reproducible.
      drop_remainder: drop the last partial batch; defaults to ``training``.
      num_parallel_reads: files read at once (interleave cycle); None: up to 16.
      read_buffer_bytes: read buffer per file (larger helps on gs://).
      ignore_errors: skip records that fail to read or decode, logging each,
        instead of stopping; a shard whose size differs from the manifest's is
        then only logged. A missing shard is still an error up front.
      service: ``"grpc://HOST:PORT"`` of a tf.data service dispatcher (``tfshard
        service dispatcher``): reading, decoding, cropping, shuffling and
        batching run on its workers; augmentation stays here. Each epoch's
        order then depends on which worker asks first, and ``seed`` seeds only
        the augmentation: the workers' file order, crops and shuffle buffer draw
        fresh randomness every epoch (each epoch is a new service job built from
        the same graph, so a fixed seed there would repeat one order every
        epoch). Not with ``cache``. With ``drop_remainder`` each worker drops
        its own last partial batch.
      service_job_name: clients passing the same name share one stream (each
        gets part of every epoch); None: this dataset gets a job of its own.
      processing_mode: ``"distributed_epoch"``: each record once per epoch
        across all workers (at most once, if a worker dies mid-file);
        ``"parallel_epochs"``: every worker reads the whole split.

      repeat: epoch after epoch (files and records reshuffled each one) from one
        endless iterator: ``model.fit(ds, steps_per_epoch=...)``. Batches then run
        on across epoch ends.
      start_step: with ``repeat`` and a ``seed``, start at this step (batch) exactly
        as if the ones before had been read: the records before it are read and
        shuffled again but not decoded. A job that saved its step count with the
        model resumes mid-epoch with no record lost or repeated (README: Resuming).
        Not with ``cache``, ``service`` or ``ignore_errors``.

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels)`` batches that ``model.fit`` takes directly. Unless
      ``ignore_errors`` or ``service``, its length is known from the manifest: this pipeline's records
      ``// batch_size`` with ``drop_remainder``, else rounded up (``len(ds)``).

    Raises:
      FileNotFoundError: a shard of this pipeline is missing.
      TypeError: an ``image_size`` that is neither an int nor a pair of ints.
      ValueError: bad arguments, not an images dataset (an episodes one), a split that does not exist, ``cache``
        with ``service``, a shard that is not a regular file or not the manifest's size (only logged with
        ``ignore_errors``), or too few records for one batch with ``drop_remainder``.

    Example:
      ds = readers.images("photos-tfr", batch_size=64, seed=0, cache="/tmp/cache")
      model.fit(ds, epochs=10)
    """
    batch_size = check_count(batch_size, "batch_size", path, high=MAX_BATCH_SIZE)
    image_size = _image_size(image_size)
    shuffle_buffer = check_count(shuffle_buffer, "shuffle_buffer", path, high=MAX_SHUFFLE_BUFFER)
    read_buffer_bytes, num_parallel_reads = check_reading(path, read_buffer_bytes=read_buffer_bytes,
                                                          num_parallel_reads=num_parallel_reads)
    if not (augment is None or callable(augment) or (isinstance(augment, str) and augment in AUGMENTATIONS)):
        raise ValueError(f"augment: must be one of {sorted(AUGMENTATIONS)}, None or a callable (got {augment!r})")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {DTYPES} (got {dtype!r})")
    if dtype == "uint8" and augment == "color":
        raise ValueError("augment: 'color' jitters in float, so it needs dtype='float32' (got dtype='uint8'); "
                         "pass augment='default', or dtype='float32'")
    _check_resume(path, repeat, start_step, batch_size=batch_size, seed=seed, cache=cache, service=service, ignore_errors=ignore_errors,
                  deterministic=deterministic)
    remote = service_lib.service_options(
        service, processing_mode, service_job_name, where="service", input_context=input_context
    )
    if remote is not None and cache is not None:
        raise ValueError(
            f"cache: not with service= (got cache={cache!r}); each epoch is a new service job, so a memory cache "
            "never outlives one, and every worker would write its own share of the split under one cache name. "
            "Drop cache, or read without service"
        )
    drop_remainder = training if drop_remainder is None else drop_remainder
    # On service workers a fixed seed would replay the same randomness every epoch (see ``service``).
    worker_seed = seed if remote is None else None

    dataset = files_lib.info(path)
    _check_kind(dataset)
    # With a service the workers share out the whole split, so every shard is this pipeline's.
    chosen = files_lib.pipeline_shards(dataset, split, input_context=input_context if remote is None else None)
    infos = files_lib.split_info(dataset, split).shards
    mine = sum(infos[i].records for i in chosen)  # this pipeline's records, as the manifest counts them
    if drop_remainder:
        fed = 1 if input_context is None else max(1, input_context.num_replicas_in_sync
                                                  // input_context.num_input_pipelines)
        _check_not_empty(dataset, split, mine, batch_size, fed)
    shards = files_lib.check_shards(dataset, split, chosen, warn_on_size=ignore_errors)
    records = files_lib.interleave_records(
        shards,
        compression=dataset.manifest.compression,
        shuffle_files=training,
        seed=worker_seed,
        cycle_length=num_parallel_reads,
        read_buffer_bytes=read_buffer_bytes,
        deterministic=deterministic,
        ignore_errors=ignore_errors,
        guard=remote is None,
    )
    crop_after_cache = None
    # Without a cache or a service, evaluation and the default recipe (or none) finish each image in the decode
    # map: crop, flip and the cast to float32. Nothing is left to do on the batch, and a plain batch() lets
    # tf.data fuse it with the decode map, as keras' own loader is (evaluation +7-13% img/s, training ~+6%;
    # benchmarks/images.py). Colour jitter and callables stay batched, on uint8 batches.
    per_image = cache is None and remote is None and (not training or augment is None or augment == "default")
    unit_float = per_image and dtype == "float32"
    if training and cache is None:
        # Random work, never cached: decode only a random crop of each image (parse and decode in one map).
        flip = per_image and augment == "default"

        def decode(record, seed_):
            encoded, label = _parse(record)
            return decode_random_crop(encoded, seed_, image_size, flip=flip, unit_float=unit_float), label

        # Shuffle the encoded records, before the decode (as TF's model garden readers do): the buffer holds
        # ~80 KB JPEGs instead of 150 KB decoded images, and batch() stays fused with the decode map.
        records = records.shuffle(shuffle_buffer, seed=worker_seed, reshuffle_each_iteration=True)
        ds = tf.data.Dataset.zip((records.repeat() if repeat else records, _seed_stream(worker_seed, salt=1)))
        stage = None
    else:
        # Deterministic, so it may be cached. In training keep a larger centred square to crop from later.
        decode_size, padding = image_size, _CROP_PADDING
        if training:
            decode_size, padding = (image_size[0] + _CROP_PADDING, image_size[1] + _CROP_PADDING), 0
            crop_after_cache = image_size

        def decode(record):
            encoded, label = _parse(record)
            return decode_center_crop(encoded, decode_size, padding, unit_float=unit_float), label

        ds = records.repeat() if repeat and cache is None else records  # with a cache: after it, below
        stage = {"decode": "centre", "size": decode_size, "padding": padding}
    if start_step:  # before the decode: a resumed job reads what it skips, decodes none of it (never with a cache)
        ds = ds.skip(start_step * batch_size)
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if ignore_errors:
        ds = ds.ignore_errors(log_warning=True)
    if cache == "memory":
        ds = ds.cache()
    elif cache is not None:
        identity = _cache_identity(dataset, split, shards, stage, ignore_errors)
        ds = cache_lib.cache_to_file(ds, cache_lib.cache_prefix(cache, identity))
    if training and cache is not None:  # decoded images, after the cache (without one, the records were shuffled)
        ds = ds.shuffle(shuffle_buffer, seed=worker_seed, reshuffle_each_iteration=True)
    if repeat and cache is not None:  # each epoch read from the cache (after the first), reshuffled
        ds = ds.repeat()
    if per_image:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)  # fused with the decode map (map_and_batch)
    else:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=AUTOTUNE,
                      deterministic=deterministic)
    options = tf.data.Options()
    # Autotune off: with it on (TF 2.21), deleting an iterator often blocks until the autotuner's next step, so
    # model.fit paid 0.4-1.3 s between epochs; off, 0.03 s, with the same img/s on 2 cores (AUTOTUNE parallelism
    # then means one thread per core). Measured by benchmarks/images.py's model.fit rows.
    options.autotune.enabled = False
    options.experimental_optimization.map_parallelization = True
    if deterministic is not None:
        options.deterministic = deterministic
    if remote is not None:  # everything above runs on the workers, with these options; uint8 batches cross the network
        ds = remote.distribute(ds.with_options(options))

    def finish(images_):  # to the asked dtype: only float32 output is ever cast, once, on the batch
        return augment_lib.to_unit_float(images_) if dtype == "float32" else images_

    def augment_batch(batch, seed_):
        images_, labels = batch  # uint8: crop and flip stay uint8; a cast to float, if any, comes last
        if augment == "default":
            return augment_lib.default_augment(images_, seed_, crop_to=crop_after_cache,
                                               unit_float=dtype == "float32"), labels
        if isinstance(augment, str):
            return finish(AUGMENTATIONS[augment](images_, seed_, crop_to=crop_after_cache)), labels
        if crop_after_cache is not None:
            crop_seed, seed_ = tf.unstack(tf.random.experimental.stateless_split(seed_, 2))
            images_ = augment_lib.random_resized_crop_batch(images_, crop_after_cache, crop_seed)
        images_ = finish(images_)
        return (augment(images_, seed_) if augment is not None else images_), labels

    if per_image:
        pass  # every image left the decode map finished
    elif training and (augment is not None or crop_after_cache is not None):
        # Per-batch seeds continue from the resumed step too (start_step batches in).
        ds = tf.data.Dataset.zip((ds, _seed_stream(seed, salt=2).skip(start_step)))
        ds = ds.map(augment_batch, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    elif dtype == "float32":
        ds = ds.map(lambda images_, labels: (finish(images_), labels), num_parallel_calls=AUTOTUNE,
                    deterministic=deterministic)
    if remote is None and not ignore_errors and not repeat:
        # Exact only here: ignore_errors may skip records, and a service shares the epoch among its clients. A known
        # length lets Keras end each epoch on its count instead of warning that the input "ran out of data".
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            mine // batch_size if drop_remainder else -(-mine // batch_size)))
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(options)
