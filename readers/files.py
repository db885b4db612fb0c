"""Stages 1-3 of every reader: shard list from the manifest → per-epoch file shuffle → per-pipeline sharding →
interleaved reads; and what the manifest alone tells training code (``readers.info``, ``readers.class_weights``).

The shard list comes from ``dataset.json`` (no directory listing, no data pass),
and every read goes through TensorFlow's filesystem layer, so ``gs://`` paths
work unchanged.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow as tf

from ..format.dataset import load_manifest, manifest_identity
from ..format.manifest import Manifest, ShardInfo
from ..format.names import tf_compression_type
from ..format.objects import use_storage_options, uses_fsspec
from ..format.records import data_features
from ..format.storage import NotRegularFileError, file_identity, is_url, join, prefer_small_gcs_blocks
from .arguments import DEFAULT_READ_BUFFER_BYTES
from .guard import ShardGuard, checkpointable
from .options import seeded_shuffle
from .sampling import classes as sampling_classes
from .shard_cache.pipeline import FETCH_AHEAD, ShardCacheArg
from .windowing.targets import TargetsArg, check_label_targets, window_spec

try:  # the source under tf.data.TFRecordDataset (see tfrecord_file); absent in some TensorFlow: the public class then
    from tensorflow.python.data.ops.readers import _TFRecordDataset as _OneFileSource
except ImportError:  # pragma: no cover - every TensorFlow this project supports has it
    _OneFileSource = None

log = logging.getLogger(__name__)

_STAT_THREADS = 16  # on gs:// each stat is a request: 16 in flight hide the round trips


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What training code needs to know about a dataset, from its manifest alone.

    Example:
      info = readers.info("photos-tfr")
      info.class_names, info.num_records("train"), info.steps_per_epoch("train", 64)  # ([...], 3670, 57)
    """

    path: str
    manifest: Manifest
    # ``format.dataset.manifest_identity`` of dataset.json, taken before it was loaded: () when unknown (the epoch
    # check then re-reads the manifest every epoch)
    manifest_identity: tuple = dataclasses.field(default=(), repr=False, compare=False)

    def __repr__(self) -> str:
        """A line, not the whole manifest: ``DatasetInfo('photos-tfr': images, 5 classes, train 3,670 records
        in 2 shards, val 500 records in 1 shard)``."""
        kind, labels = self.manifest.kind, self.manifest.labels
        if kind == "episodes":
            what = f"{len(data_features(self.manifest.features))} features"
        elif labels == "value":
            what = f"value labels ({', '.join(self.manifest.label_columns)})"
        else:
            what = f"{len(self.manifest.class_names)} classes{' (multi-label)' if labels == 'multi' else ''}"
        splits = ", ".join(f"{name} {split.records:,} records in {len(split.shards)} shard"
                           f"{'' if len(split.shards) == 1 else 's'}" for name, split in self.manifest.splits.items())
        return f"DatasetInfo({self.path!r}: {kind}, {what}, {splits})"

    @property
    def class_names(self) -> list[str]:
        return list(self.manifest.class_names)

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    @property
    def labelled(self) -> bool:
        """Whether the episodes carry labels (class folders or ``--labels FILE`` at conversion)."""
        return self.manifest.labels is not None

    @property
    def label_kind(self) -> str | None:
        """What the labels are: ``"class"``, ``"multi"`` or ``"value"``; None for unlabelled episodes. Image class
        folders are ``"class"``."""
        if self.manifest.kind == "images":
            return self.manifest.labels or "class"
        return self.manifest.labels

    def num_records(self, split: str) -> int:
        return split_info(self, split).records

    def steps_per_epoch(self, split: str, batch_size: int, drop_remainder: bool = True, num_pipelines: int = 1) -> int:
        """Batches one input pipeline yields per epoch (assuming records spread evenly over pipelines)."""
        per_pipeline = self.num_records(split) // num_pipelines
        return per_pipeline // batch_size if drop_remainder else -(-per_pipeline // batch_size)

    def episode_lengths(self, split: str) -> list[int]:
        """Time steps of every episode of an episode dataset, in record order."""
        if self.manifest.kind != "episodes":
            raise ValueError(f"{self.path}: an {self.manifest.kind!r} dataset has no episodes (got split {split!r}); "
                             "pass an episodes dataset (`tfshard episodes SRC OUT`)")
        return split_info(self, split).episode_lengths

    def num_windows(self, split: str, length: int, shift: int = 1, horizon: int = 0, *, targets: TargetsArg = None,
                    sampling_rate: int = 1, time_range: tuple | None = None, padding: str | None = None) -> int:
        """Windows per epoch of ``readers.windows(length=, shift=, ...)`` with the same arguments, no data pass
        (``horizon``: an int ``targets``, as before ``targets=`` was here)."""
        if horizon and targets is not None:
            raise ValueError(f"{self.path}: horizon={horizon!r} and targets={targets!r} both say what follows a "
                             "window; pass one (an int horizon H is targets=H)")
        spec = self._spec(length, shift, targets if targets is not None else (horizon or None),
                          sampling_rate=sampling_rate, time_range=time_range, padding=padding)
        return spec.count(self.episode_lengths(split))

    def _spec(self, length, shift, targets, **shape):
        """The windows' ``WindowSpec``, refused as ``readers.windows`` refuses label targets on unlabelled data."""
        check_label_targets(targets, self.labelled, self.path)
        return window_spec(length, shift, targets, where=self.path, **shape)

    def too_short(self, split: str, length: int, shift: int = 1, *, targets: TargetsArg = None,
                  sampling_rate: int = 1, time_range: tuple | None = None, padding: str | None = None) -> int:
        """Episodes of the split that give no window with these arguments (shorter than the span, or their
        ``time_range`` slice is): the reader skips them and logs how many."""
        spec = self._spec(length, shift, targets, sampling_rate=sampling_rate, time_range=time_range,
                          padding=padding)
        return spec.too_short(self.episode_lengths(split))

    def shard_paths(self, split: str) -> list[str]:
        return [join(self.path, shard.file) for shard in split_info(self, split).shards]


def info(path: str, storage_options: Mapping[str, Any] | None = None) -> DatasetInfo:
    """Reads ``path/dataset.json``; raises FileNotFoundError naming the path if there is none.

    For a ``gs://`` path it also prefers 8 MiB GCS read blocks (``format.storage.prefer_small_gcs_blocks``).
    ``storage_options``: fsspec's options for an ``s3://``, ``az://`` or ``https://`` path, as ``readers.images``
    takes them (kept for its URL in this process).
    """
    use_storage_options(path, storage_options)
    if path.startswith("gs://"):
        prefer_small_gcs_blocks()
    seen = manifest_identity(path)  # before the load: a manifest replaced meanwhile is re-read at the first epoch
    return DatasetInfo(path, load_manifest(path), seen)


def split_info(dataset: DatasetInfo, split: str):
    if split not in dataset.manifest.splits:
        raise ValueError(
            f"{dataset.path}: no split {split!r} (got splits {sorted(dataset.manifest.splits)}); pass one of those"
        )
    return dataset.manifest.splits[split]


def class_weights(path: str, split: str = "train", storage_options: Mapping[str, Any] | None = None
                  ) -> dict[int, float]:
    """The ``class_weight`` dict ``model.fit`` takes, from the split's class counts in the manifest ("balanced", as
    keras and scikit-learn mean it): class index → ``records / (classes · count)``; the mean weight per record is 1.

    ``storage_options``: as for ``readers.info``.

    Raises:
      ValueError: an episodes dataset, multi-label or value labels (no one class per record to weigh), or a class
        with no record in the split (its balanced weight would be infinite; see ``sampling.classes``).

    Example:
      readers.class_weights("photos-tfr", "train")   # {0: 0.6666666666666666, 1: 2.0}: 30 and 10 images
    """
    dataset = info(path, storage_options)
    if dataset.label_kind != "class" or dataset.manifest.kind != "images":
        what = f"an {dataset.manifest.kind} dataset" + (f" with {dataset.label_kind} labels" if dataset.label_kind
                                                         else " without labels")
        raise ValueError(f"{path}: class weights need one class per image (got {what}); pass an images dataset of "
                         "class labels, or weigh the samples yourself")
    counts = split_info(dataset, split).class_counts
    return sampling_classes.class_weights([counts.get(name, 0) for name in dataset.class_names],
                                          f"{path}: split {split!r}", dataset.class_names)


def pipeline_shards(
    dataset: DatasetInfo, split: str, *, input_context: tf.distribute.InputContext | None = None
) -> list[int]:
    """Indices (into the split's shards) of this input pipeline's share of the split (FILE sharding).

    Raises:
      ValueError: fewer shards than input pipelines, naming how many to write.
    """
    count = len(split_info(dataset, split).shards)
    if input_context is None or input_context.num_input_pipelines == 1:
        return list(range(count))
    pipelines = input_context.num_input_pipelines
    if count < pipelines:
        raise ValueError(
            f"{dataset.path}: split {split!r} has {count} shards, fewer than the {pipelines} input pipelines "
            f"(got num_input_pipelines={pipelines}); rewrite it with "
            f"`tfshard {dataset.manifest.kind} ... --min-shards {pipelines}`"
        )
    return list(range(input_context.input_pipeline_id, count, pipelines))


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """A shard as found when a pipeline was built: its manifest entry, path, and the stat made then.

    ``identity`` (``format.storage.file_identity``: size, mtime, and locally inode and ctime) is what the
    pipeline checks again each time it opens the file (``readers/guard.py``).
    """

    path: str
    info: ShardInfo
    identity: tuple

    @property
    def size(self) -> int:
        return self.identity[0]

    @property
    def mtime_ns(self) -> int:
        return self.identity[1]


def stat_all(paths: list[str]) -> list[tuple[tuple | None, Exception | None]]:
    """``(file_identity(path), None)`` or ``(None, the error)`` per path, in order; URLs several at a time."""

    def stat(path):
        try:
            return file_identity(path), None
        except (OSError, NotRegularFileError) as e:  # returned, so the caller raises the first one in manifest order
            return None, e

    if not any(is_url(path) for path in paths):  # a local stat takes microseconds; starting threads, milliseconds
        return [stat(path) for path in paths]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(_STAT_THREADS, len(paths)))) as pool:
        return list(pool.map(stat, paths))


def check_shards(
    dataset: DatasetInfo, split: str, shards: list[int], *, warn_on_size: bool = False
) -> list[ShardFile]:
    """Stats the given shards of a split (in parallel) before a pipeline reads them.

    A shard the manifest lists must exist, be a regular file (a FIFO blocks the
    reader, ``/dev/zero`` never ends) and have the manifest's size. The stats
    are returned, in the order given, so a cache key can follow a rewrite.

    Args:
      dataset: the dataset.
      split: its split.
      shards: indices into the split's shards.
      warn_on_size: log a size that differs from the manifest instead of
        raising (``ignore_errors``: reading what can be read is the point).

    Raises:
      FileNotFoundError: a shard is missing.
      ValueError: a shard is not a regular file, or not the manifest's size.

    Example:
      [s.size for s in check_shards(readers.info("photos-tfr"), "train", [0, 1])]  # [31457280, 31457024]
    """
    infos = [split_info(dataset, split).shards[i] for i in shards]
    paths = [join(dataset.path, info.file) for info in infos]
    fix = f"run `tfshard verify {dataset.path}`, then rerun the conversion"
    checked = []
    for path, info, (found, error) in zip(paths, infos, stat_all(paths)):
        if isinstance(error, FileNotFoundError):
            raise FileNotFoundError(
                f"{path}: shard of split {split!r} is missing (listed in the manifest); {fix}"
            ) from error
        if isinstance(error, NotRegularFileError):
            raise NotRegularFileError(f"{error}; a shard of split {split!r} must be a regular file: {fix}") from error
        if error is not None:
            raise error
        size = found[0]
        if size != info.bytes:
            message = (f"{path}: shard of split {split!r} is not the size the manifest says "
                       f"(got {size} bytes, manifest says {info.bytes}); {fix}")
            if not warn_on_size:
                raise ValueError(message)
            log.warning("%s; reading what can be read (ignore_errors=True)", message)
        checked.append(ShardFile(path, info, found))
    return checked


def interleave_records(
    shards: list[ShardFile],
    *,
    compression: str | None,
    shuffle_files: bool,
    seed: int | None,
    cycle_length: int | None,
    read_buffer_bytes: int,
    deterministic: bool | None,
    ignore_errors: bool = False,
    guard: bool = True,
    shard_cache=None,
) -> tf.data.Dataset:
    """Serialized records of ``shards`` (as ``check_shards`` found them), read ``cycle_length`` files at a time.

    Files are reshuffled every epoch (seeded) when ``shuffle_files``; ``cycle_length``
    None reads up to 16 files at once (more hides network latency on gs://).
    ``guard``: every epoch, a shard replaced or changed since the pipeline was built is an error naming it, or
    with ``ignore_errors`` is logged and skipped (``readers/guard.py``); off for a tf.data service, whose workers
    cannot run the check. ``ignore_errors``: the caller skips errors. ``shard_cache``: a
    ``shard_cache.pipeline.CacheSession`` of these shards: each epoch's files are fetched into it a few ahead of
    the reads, in the shuffled order, and read from their verified local copies (``readers/shard_cache``).
    """
    compression_type = tf_compression_type(compression)

    def open_records(path):
        return tfrecord_file(path, compression_type, read_buffer_bytes)

    paths = [s.path for s in shards]
    checks = ShardGuard(shards, strict=not ignore_errors) if guard else None

    def read(index, path):
        if checks is not None:
            return checks.read(index, path, open_records)
        return _read_if_present(path, open_records) if ignore_errors else open_records(path)

    files = tf.data.Dataset.from_tensor_slices((tf.range(len(paths), dtype=tf.int64), paths))
    if shuffle_files and len(paths) > 1:
        files = seeded_shuffle(files, len(paths), seed)
    cycle = 1 if len(paths) == 1 else cycle_length or min(len(paths), 16)  # one file: no interleave stage or thread
    if shard_cache is not None:  # fetched a few files ahead into the cache; each read from its copy, or remotely
        files = shard_cache.localized(files, ahead=min(len(paths), cycle + FETCH_AHEAD))
        read_remote = read

        def read(index, path, local):
            return shard_cache.read(index, path, local, open_records, read_remote)

    if cycle == 1:
        records = files.flat_map(read)
    else:
        # One reader thread per open file, not AUTOTUNE: threads waiting on the network use no CPU, and tf.data's
        # CPU-budgeted autotuner starts each iterator (each epoch) with little parallelism, measured on gs:// as a
        # 1.9 s first batch instead of 0.3 s (benchmarks/network.py).
        records = files.interleave(read, cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                                   deterministic=deterministic)
    # The guard's checks and the cache's fetch are Python, holding no state to save.
    return checkpointable(records) if checks is not None or shard_cache is not None else records


def tfrecord_file(path: tf.Tensor, compression_type: str | None, buffer_size: int) -> tf.data.Dataset:
    """The records of one TFRecord file, ``path`` a scalar string tensor (inside a ``flat_map``/``interleave``
    function). ``tf.data.TFRecordDataset`` wraps even one file in a ``flat_map`` of its own: one more function to trace
    when the pipeline is built and to set up for every file each iterator opens. Its source, which reads the file
    directly, spares that."""
    if _OneFileSource is None:
        return tf.data.TFRecordDataset(path, compression_type=compression_type, buffer_size=buffer_size)
    return _OneFileSource(path, compression_type, buffer_size)


def records_in_order(dataset: DatasetInfo, split: str) -> Iterator[tf.data.Dataset]:
    """The split's serialized records, shard after shard in manifest order, as datasets to read one after another:
    what ``tfshard preview`` and ``bench --compare`` read, stopping when they have enough.

    Local and ``gs://`` shards come as one ``TFRecordDataset`` of them all. Shards TensorFlow cannot open
    (``s3://``, ``az://``, ``https://``) come one dataset per shard, each read from its verified copy in the default
    shard cache (``shard_cache.pipeline.default_folder``), fetched when the read reaches it: a preview of a large
    dataset downloads the few shards it shows, and needs room for one shard, not all.

    Example:
      sum(1 for records in records_in_order(readers.info("s3://bucket/photos-tfr"), "train") for _ in records)  # 3670
    """
    shards = check_shards(dataset, split, pipeline_shards(dataset, split))
    compression = dataset.manifest.compression
    if not any(uses_fsspec(s.path) for s in shards):
        yield tf.data.TFRecordDataset([s.path for s in shards], compression_type=tf_compression_type(compression))
        return
    for shard in shards:  # a session per shard: its copy pinned only while that shard is read
        yield interleave_records([shard], compression=compression, shuffle_files=False, seed=None, cycle_length=1,
                                 read_buffer_bytes=DEFAULT_READ_BUFFER_BYTES, deterministic=True,
                                 shard_cache=ShardCacheArg().session(dataset.path, [shard]))


def _read_if_present(path: tf.Tensor, read) -> tf.data.Dataset:
    """``read(path)``, or, if the file is gone, one error (for ``ignore_errors`` to log) and then nothing.

    Needed because TFRecordDataset retries a failed *open* of the same file on
    every ``GetNext`` (it advances past a file only after a failed *read*), so
    ``ignore_errors`` over a vanished shard spun forever at 100% CPU. The file
    is looked up once per epoch (a stat, or one request on gs://); a file that
    vanishes between that look-up and the open, or turns into a FIFO (the open
    blocks), still cannot be escaped from inside TensorFlow.
    """
    found = tf.io.matching_files(tf.strings.regex_replace(path, r"([*?\[\\])", r"\\\1"))  # a path, not a glob

    def fail_if_gone(path_):
        message = tf.strings.join([path_, ": shard is gone (it was there when the pipeline was built); skipping it"])
        with tf.control_dependencies([tf.debugging.Assert(tf.size(found) > 0, [message])]):
            return tf.identity(path_)

    # A map that fails on its only element, then ends: ignore_errors logs the error and moves on.
    gone = tf.data.Dataset.from_tensors(path).map(fail_if_gone).filter(lambda _: False)
    return gone.concatenate(read(found))
