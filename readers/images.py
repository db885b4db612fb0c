"""``readers.images()``: a dataset of ``(images float32 [B, H, W, C] in [0, 1], labels int64 [B])``.

The labels follow the dataset's (``image_ops.ImageLabels``): class indices int64 ``[B]``; multi-label, a
multi-hot float32 ``[B, C]``; value labels, float32 ``[B]`` (``[B, k]`` for k columns).

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
which is fused with the batch. Colour jitter and callables run on
uint8 batches after the batch.

With ``service=`` (the tf.data service, see ``readers/service.py``) everything
up to and including batching runs on the service's workers; the client
receives uint8 batches and only augments them, casts to float and prefetches.

The dataset knows its length (``len(ds)``, so Keras needs no ``steps_per_epoch``
and does not warn that the input "ran out of data") whenever the manifest's
record counts fix it: without ``ignore_errors`` and without a service.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from ..format.objects import use_storage_options
from . import cache as cache_lib
from . import files as files_lib
from . import service as service_lib
from .arguments import (
    DEFAULT_READ_BUFFER_BYTES,
    MAX_BATCH_SIZE,
    MAX_SHUFFLE_BUFFER,
    check_count,
    check_not_empty,
    check_reading,
    check_seed,
)
from .epoch_guard import EpochGuard, python_step
from .graph_ready import without_autograph
from .image_batches import augmented, batched, decoded, decoded_batches
from .image_ops import ImageLabels, decode_center_crop, decode_random_crop, parse_image, seed_stream
from .image_recipe import (
    Recipe,
    cache_identity,
    check_kind,
    check_recipe,
    check_resume,
    checked_image_size,
)
from .indexed.images import indexed_images
from .indexed.request import stream_request
from .input_position import InputPosition, attach, skipped
from .options import external_state_ignored, quiet_options, shuffled
from .shard_cache.pipeline import ShardCacheArg

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 1024


@without_autograph
def images(
    path: str | Sequence[str],
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
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES,
    ignore_errors: bool = False,
    service: str | None = None,
    service_job_name: str | None = None,
    processing_mode: str = "distributed_epoch",
    repeat: bool = False,
    start_step: int = 0,
    shard_cache: str | None = None,
    shard_cache_limit: str | int | None = None,
    weights: Sequence[float] | None = None,
    epoch_size: int | None = None,
    balance: str | None = None,
    shuffle: str | None = None,
    with_source: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> tf.data.Dataset:
    """Streams a ``tfshard images`` dataset for training or evaluation.

    Args:
      path: the dataset folder (local or ``gs://``), holding ``dataset.json``; or a list of them, a mixture read
        as one stream (docs/guide/mixtures.md).
      split: which split to read.
      batch_size: batch size of this input pipeline (under a strategy, the
        per-replica size: ``input_context.get_per_replica_batch_size(global)``).
      image_size: output ``(height, width)``, or one int for a square (numpy ints too).
      training: random crop, shuffling and augmentation; False gives a
        deterministic centre crop in file order.
      seed: an int in [0, 2**63 - 1] that makes file order, crops, shuffling and augmentation
        reproducible (each epoch still differs from the last); None draws fresh randomness.
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
        after the crop, with one seed per batch. Ignored when ``training`` is False.
        On the index-driven stream the named recipes draw each image's numbers from
        its own seed, from ``(seed, element)``, so they are the same on any replica
        count; a callable still gets one seed per pipeline batch.
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
        then only logged. A missing shard is still an error up front. With ``repeat``, an epoch in which every
        record was skipped fails, naming the dataset, instead of repeating for ever.
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
        model resumes mid-epoch with no record lost or repeated (docs/guide/resuming.md). Inside ``model.fit``,
        ``readers.BackupAndRestore`` saves and restores it with the model.
        Not with ``cache``, ``service`` or ``ignore_errors``.
      shard_cache: a local folder that keeps verified copies of the shards (for ``gs://`` data): each epoch's
        files are fetched into it a few ahead of the reads, in the epoch's shuffled order, checked against the
        manifest's sha256 and size, and read from disk from then on (docs/guide/shard-cache.md). Several
        processes of a host share one folder; with ``service`` each worker caches on its own host. ``s3://``,
        ``az://`` and ``https://`` shards are always read from such copies: None then means the default folder
        (docs/guide/object-stores.md).
      shard_cache_limit: the most the folder may hold, temporary files included, e.g. ``"200GB"``; least
        recently used copies no live reader holds are evicted. None: 90% of the disk's free space (the default
        folder: at most 50 GB).
      weights: each path's part of an epoch (only the ratios count); None: in proportion to their records.
      epoch_size: elements per epoch of the stream; None: the paths' records.
      balance: ``"class"``: every class an equal share of every epoch (class labels only, not with ``weights``).
      shuffle: ``"global"``: each epoch a seeded permutation of every record, also with ``training=False``.
      with_source: the labels become ``{"label": labels, "source": int32 [B]}``, each element's index in ``path``.
        A list of paths, ``weights``, ``epoch_size``, ``balance``, ``shuffle`` or ``with_source`` reads the
        index-driven stream (``readers/indexed/``, docs/guide/mixtures.md): records read by position in an order
        computed from ``seed``; ``start_step`` then counts global steps and resumes on any replica count. Not with
        ``cache``, ``service``, ``ignore_errors`` or ``deterministic=False``.
      storage_options: fsspec's options for the ``s3://``, ``az://`` and ``https://`` URLs in ``path`` (s3fs's
        ``endpoint_url``, ``key``, ``secret``; adlfs's ``account_name``, ``connection_string``), kept for them in this
        process: the shard cache's fetches use them too (docs/guide/object-stores.md). Never shown in a message.

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels)`` batches that ``model.fit`` takes directly. The labels are
      int64 class indices ``[B]``; for a multi-label dataset a multi-hot float32 ``[B, C]`` (C =
      ``len(class_names)``), for value labels float32 ``[B]`` (``[B, k]`` with k label columns). Unless
      ``ignore_errors`` or ``service``, its length is known from the manifest: this pipeline's records
      ``// batch_size`` with ``drop_remainder``, else rounded up (``len(ds)``).

    Raises:
      FileNotFoundError: a shard of this pipeline is missing.
      TypeError: an ``image_size`` that is neither an int nor a pair of ints.
      ValueError: bad arguments, not an images dataset (an episodes one), a split that does not exist, ``cache``
        with ``service``, a ``shard_cache`` that is not a local folder or a limit below one shard, a shard that is
        not a regular file or not the manifest's size (only logged with ``ignore_errors``), or too few records for
        one batch with ``drop_remainder``. While iterating, ``tf.errors.InvalidArgumentError`` naming ``path`` at
        the start of an epoch when the dataset there is no longer the one the pipeline was built on (an
        ``--overwrite`` since; a cache would serve the old images): build the pipeline again
        (docs/guide/read-images.md#every-epoch-checks-its-dataset).

    Example:
      ds = readers.images("photos-tfr", batch_size=64, seed=0, cache="/tmp/cache")
      model.fit(ds, epochs=10)
    """
    service_lib.check_storage_options(path, service, storage_options)
    use_storage_options(path, storage_options)
    seed = check_seed(seed, path)
    stream = stream_request(path, weights=weights, epoch_size=epoch_size, balance=balance, shuffle=shuffle,
                            with_source=with_source, cache=cache, service=service, ignore_errors=ignore_errors,
                            deterministic=deterministic)
    path = path if stream is None else stream.where  # the paths, in messages
    batch_size = check_count(batch_size, "batch_size", path, high=MAX_BATCH_SIZE)
    image_size = checked_image_size(image_size)
    shuffle_buffer = check_count(shuffle_buffer, "shuffle_buffer", path, high=MAX_SHUFFLE_BUFFER)
    read_buffer_bytes, num_parallel_reads = check_reading(path, read_buffer_bytes=read_buffer_bytes,
                                                          num_parallel_reads=num_parallel_reads)
    check_recipe(augment, dtype)
    start_step = check_resume(path, repeat, start_step, batch_size=batch_size, seed=seed, cache=cache,
                               service=service, ignore_errors=ignore_errors, deterministic=deterministic)
    remote = service_lib.service_options(service, processing_mode, service_job_name, where="service",
                                         input_context=input_context)
    if remote is not None and cache is not None:
        raise ValueError(
            f"cache: not with service= (got cache={cache!r}); each epoch is a new service job, so a memory cache "
            "never outlives one, and every worker would write its own share of the split under one cache name. "
            "Drop cache, or read without service"
        )
    drop_remainder = training if drop_remainder is None else drop_remainder
    recipe = Recipe.of(training=training, cache=cache, remote=remote is not None, augment=augment, dtype=dtype,
                        image_size=image_size)
    # A seeded endless stream is a pure function of its start: readers.BackupAndRestore moves it (input_position.py).
    # Not through a shard cache on this path: its fetch-ahead tickets live in the pipeline built when the iterator
    # opens, and an iterator checkpoint restored into such a rebuilt pipeline read other elements (test_shard_cache).
    resumable = (repeat and seed is not None and cache is None and not ignore_errors and deterministic is not False
                 and (stream is not None or shard_cache is None))
    start = InputPosition(start_step, path if isinstance(path, str) else " + ".join(path)) if resumable else start_step
    if stream is not None:  # mixtures, balance, a global shuffle: records read by position (readers/indexed/)
        return indexed_images(stream, split, batch_size=batch_size, recipe=recipe, seed=seed,
                              input_context=input_context, drop_remainder=drop_remainder,
                              num_parallel_reads=num_parallel_reads, repeat=repeat, start_step=start,
                              shard_cache=ShardCacheArg(shard_cache, shard_cache_limit))
    # On service workers a fixed seed would replay the same randomness every epoch (see ``service``).
    worker_seed = seed if remote is None else None
    dataset, shards, mine = _shards(path, split, input_context, remote, drop_remainder, batch_size, ignore_errors)
    session = ShardCacheArg(shard_cache, shard_cache_limit).session(path, shards)

    # Each epoch first checks that OUT still holds the dataset this pipeline was built on (readers/epoch_guard.py),
    # in the first stage that runs every epoch: the reads, or after a cache, or on a service's client.
    epoch = EpochGuard(dataset, split, shards)

    def records() -> tf.data.Dataset:
        read = files_lib.interleave_records(
            shards, compression=dataset.manifest.compression, shuffle_files=training, seed=worker_seed,
            cycle_length=num_parallel_reads, read_buffer_bytes=read_buffer_bytes, deterministic=deterministic,
            ignore_errors=ignore_errors, guard=remote is None, shard_cache=session,
        )
        if remote is not None or cache is not None or epoch.covered_by_reads(session):
            return read
        return epoch.ahead(read, skippable=ignore_errors)

    # With ignore_errors, repeat comes after the decode (below): an epoch of records that all fail is then empty. Not
    # on a service's workers, which cannot run the check's Python (readers/service.py).
    skipping_repeat = ignore_errors and repeat and remote is None
    ds, decode = _to_decode(records, recipe, ImageLabels.of(dataset.manifest), shuffle_buffer=shuffle_buffer,
                            seed=worker_seed, repeat=repeat and not skipping_repeat, start=start, batch_size=batch_size)
    if cache is None and not skipping_repeat:
        ds = decoded_batches(ds, decode, batch_size=batch_size, drop_remainder=drop_remainder,
                             deterministic=deterministic, ignore_errors=ignore_errors, fused=recipe.per_image)
    else:
        ds = decoded(ds, decode, deterministic=deterministic, ignore_errors=ignore_errors)
        if cache is not None:
            ds = _cached_and_shuffled(ds, recipe, cache, cache_identity(dataset, split, shards, recipe.stage,
                                                                       ignore_errors),
                                      shuffle_buffer=shuffle_buffer, seed=worker_seed, repeat=repeat, epoch=epoch,
                                      records=None if ignore_errors else mine)
        if skipping_repeat:
            ds = _no_empty_epoch(ds if cache is not None else ds.repeat(), path, split)
        ds = batched(ds, batch_size=batch_size, drop_remainder=drop_remainder, deterministic=deterministic)
    options = quiet_options()  # autotune off (readers/options.py)
    if deterministic is not None:
        options.deterministic = deterministic
    if resumable:  # its start, read in Python when the iterator opens, is not state an iterator checkpoint needs
        options = external_state_ignored(options)
    if remote is not None:  # everything above runs on the workers, with these options; uint8 batches cross the network
        ds = epoch.ahead(remote.distribute(ds.with_options(options)))
    ds = augmented(ds, recipe, batch_size=batch_size, seed=seed, start_step=start, deterministic=deterministic)
    if remote is None and not ignore_errors and not repeat:
        # Exact only here: ignore_errors may skip records, and a service shares the epoch among its clients. A known
        # length lets Keras end each epoch on its count instead of warning that the input "ran out of data".
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            mine // batch_size if drop_remainder else -(-mine // batch_size)))
    if remote is None:  # a checkpoint of it restores only into a pipeline of the same shards (epoch_guard.py)
        ds = epoch.stamp.lead(ds)
    return attach(ds.prefetch(AUTOTUNE).with_options(options), start if resumable else None)


# --- the stages, in their canonical order ----------------------------------------------------------------------------


def _shards(path: str, split: str, input_context, remote, drop_remainder: bool, batch_size: int,
            ignore_errors: bool) -> tuple[files_lib.DatasetInfo, list[files_lib.ShardFile], int]:
    """The dataset, this pipeline's shards as found now (checked), and the records the manifest counts in them."""
    dataset = files_lib.info(path)
    check_kind(dataset)
    # With a service the workers share out the whole split, so every shard is this pipeline's.
    chosen = files_lib.pipeline_shards(dataset, split, input_context=input_context if remote is None else None)
    infos = files_lib.split_info(dataset, split).shards
    mine = sum(infos[i].records for i in chosen)
    if drop_remainder:
        fed = 1 if input_context is None else max(1, input_context.num_replicas_in_sync
                                                  // input_context.num_input_pipelines)
        what = f"batch_size={batch_size}" if fed == 1 else (
            f"the {batch_size * fed} a step takes from it (batch_size={batch_size} for each of the {fed} replicas it "
            "feeds)")
        check_not_empty(f"{path}: split {split!r}", mine, "records", "for this pipeline", batch_size * fed, what)
    return dataset, files_lib.check_shards(dataset, split, chosen, warn_on_size=ignore_errors), mine


def _to_decode(records: Callable[[], tf.data.Dataset], recipe: Recipe, labels: ImageLabels, *, shuffle_buffer: int,
               seed, repeat: bool, start: int | InputPosition,
               batch_size: int) -> tuple[tf.data.Dataset, Callable]:
    """The records as the decode takes them, and the decode (parse and decode one record). In training without a
    cache the decode is the random crop: the *encoded* records are shuffled first (as TF's model garden readers do:
    the buffer holds ~80 KB JPEGs instead of 150 KB decoded images, and the batch stays fused with the decode map),
    each zipped with its crop's seed. ``records()`` builds the reads. ``start``: the
    step a resumed job starts at (the records before it are read but not decoded), or the ``InputPosition`` that
    says it when the iterator opens (the reads, shuffles and seeds are then built for each iterator: see
    ``input_position.skipped``)."""
    if recipe.random_decode:
        flip = recipe.per_image and recipe.augment == "default"

        def decode(record, seed_):
            encoded, label = parse_image(record, labels)
            return decode_random_crop(encoded, seed_, recipe.image_size, flip=flip, unit_float=recipe.unit_float), label

        def decode_input() -> tf.data.Dataset:
            return tf.data.Dataset.zip((shuffled(records(), shuffle_buffer, seed, repeat), seed_stream(seed, salt=1)))
    else:
        def decode(record):
            encoded, label = parse_image(record, labels)
            size, padding = recipe.stage["size"], recipe.stage["padding"]
            return decode_center_crop(encoded, size, padding, unit_float=recipe.unit_float), label

        def decode_input() -> tf.data.Dataset:
            read = records()
            return read.repeat() if repeat and not recipe.cached else read  # with a cache: after it, below
    return skipped(decode_input, start, per_step=batch_size), decode


def _no_empty_epoch(repeated: tf.data.Dataset, path: str, split: str) -> tf.data.Dataset:
    """``ignore_errors`` with ``repeat``: the decoded images, repeated, failing when an epoch gave none. tf.data's
    repeat ends at an epoch that yields nothing (here: every record skipped), where a repeat of the records before
    the decode looped for ever, skipping each one again; the step after it (``python_step``) makes that end an
    error naming the dataset, on that pull and every later one (no quotes in it: TensorFlow's assertion escapes
    them). The cost: in training the records' shuffle is no longer fused with a repeat, so each epoch refills its
    buffer and an iterator checkpoint restores exactly only the epoch it was saved in (``options.shuffled``)."""
    problem = (f"{path}: split {split}: an epoch gave no image, every record was skipped (ignore_errors=True: "
               "each is in the warnings), so repeat=True would loop for ever; run `tfshard verify` on the dataset, "
               "then convert it again")
    return python_step(repeated, lambda: problem, after=True)


def _cached_and_shuffled(ds: tf.data.Dataset, recipe: Recipe, cache: str | None, identity: dict, *,
                         shuffle_buffer: int, seed, repeat: bool, epoch: EpochGuard,
                         records: int | None) -> tf.data.Dataset:
    """Cache the deterministic decode (in memory, or to a file named by ``identity``), then shuffle the decoded
    images in training and repeat from the cache; each epoch from the cache first runs the ``epoch`` check.

    TensorFlow completes a cache at the end of the epoch that fills it, errors or not: an error fails one pull, and
    the stages after it pull again and read on to the end. So, unless ``records`` is None (``ignore_errors``, whose
    cache is of what could be read, on purpose), that epoch must reach its end with every one of the ``records``
    images (a corrupt record, a JPEG that does not decode or a shard that failed its check leaves one out) and with
    the dataset still the one it was built on (a shard swapped at its open: ``EpochGuard.behind``); else it ends in
    an error, and so does every later pull of it, and the cache stays incomplete."""
    if records is not None:
        ds = epoch.behind(ds).apply(tf.data.experimental.assert_cardinality(records))
    ds = ds.cache() if cache == "memory" else cache_lib.cache_to_file(ds, cache, identity)
    ds = epoch.ahead(ds)
    if recipe.training:
        return shuffled(ds, shuffle_buffer, seed, repeat)
    return ds.repeat() if repeat else ds
