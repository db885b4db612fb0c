"""Stage 1-3 of every reader: shard list from the manifest → per-epoch file shuffle → per-pipeline sharding → interleaved reads.

The shard list comes from ``dataset.json`` (no directory listing, no data pass),
and every read goes through TensorFlow's filesystem layer, so ``gs://`` paths
work unchanged.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from ingest.manifest import Manifest
from ingest.readback import load_manifest
from ingest.write import join
from readers.starts import window_count

DEFAULT_READ_BUFFER_BYTES = 8 * 2**20


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What training code needs to know about a dataset, from its manifest alone.

    Example:
      info = readers.info("photos-tfr")
      info.class_names, info.num_records("train"), info.steps_per_epoch("train", 64)  # ([...], 3670, 57)
    """

    path: str
    manifest: Manifest

    @property
    def class_names(self) -> list[str]:
        return list(self.manifest.class_names)

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    def num_records(self, split: str) -> int:
        return split_info(self, split).records

    def steps_per_epoch(self, split: str, batch_size: int, drop_remainder: bool = True, num_pipelines: int = 1) -> int:
        """Batches one input pipeline yields per epoch (assuming records spread evenly over pipelines)."""
        per_pipeline = self.num_records(split) // num_pipelines
        return per_pipeline // batch_size if drop_remainder else -(-per_pipeline // batch_size)

    def episode_lengths(self, split: str) -> list[int]:
        """Time steps of every episode of an episode dataset, in record order."""
        return split_info(self, split).episode_lengths

    def num_windows(self, split: str, length: int, shift: int = 1, horizon: int = 0) -> int:
        """Windows per epoch of ``readers.windows(length=, shift=)`` (``horizon``: an int ``targets``), no data pass."""
        return window_count(self.episode_lengths(split), length, shift, horizon)

    def shard_paths(self, split: str) -> list[str]:
        return [join(self.path, shard.file) for shard in split_info(self, split).shards]


def info(path: str) -> DatasetInfo:
    """Reads ``path/dataset.json``; raises FileNotFoundError naming the path if there is none.

    For a ``gs://`` path it also sets ``GCS_READ_CACHE_BLOCK_SIZE_MB=8`` unless the
    environment already has a value: TensorFlow's default 64 MiB read-ahead per open
    file made 16 parallel shard reads 2.6x slower (benchmarks/network.py). TensorFlow
    reads it when its GCS filesystem starts, so it only helps if nothing touched gs:// before.
    """
    if path.startswith("gs://"):
        os.environ.setdefault("GCS_READ_CACHE_BLOCK_SIZE_MB", "8")
    return DatasetInfo(path, load_manifest(path))


def split_info(dataset: DatasetInfo, split: str):
    if split not in dataset.manifest.splits:
        raise ValueError(
            f"{dataset.path}: no split {split!r} (got splits {sorted(dataset.manifest.splits)}); pass one of those"
        )
    return dataset.manifest.splits[split]


def shard_files(
    dataset: DatasetInfo, split: str, *, input_context: tf.distribute.InputContext | None = None
) -> list[str]:
    """This input pipeline's share of the split's shard files (FILE sharding).

    Raises:
      ValueError: fewer shards than input pipelines, naming how many to write.
    """
    paths = dataset.shard_paths(split)
    if input_context is None or input_context.num_input_pipelines == 1:
        return paths
    pipelines = input_context.num_input_pipelines
    if len(paths) < pipelines:
        raise ValueError(
            f"{dataset.path}: split {split!r} has {len(paths)} shards, fewer than the {pipelines} input pipelines "
            f"(got num_input_pipelines={pipelines}); rewrite it with `tfshard {dataset.manifest.kind} ... --min-shards {pipelines}`"
        )
    return paths[input_context.input_pipeline_id :: pipelines]


def interleave_records(
    paths: list[str],
    *,
    compression: str | None,
    shuffle_files: bool,
    seed: int | None,
    cycle_length: int | None,
    read_buffer_bytes: int,
    deterministic: bool | None,
) -> tf.data.Dataset:
    """Serialized records from ``paths``, read ``cycle_length`` files at a time in parallel.

    Files are reshuffled every epoch (seeded) when ``shuffle_files``; ``cycle_length``
    None reads up to 16 files at once (more hides network latency on gs://).
    """
    files = tf.data.Dataset.from_tensor_slices(paths)
    if shuffle_files:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    compression_type = "GZIP" if compression == "gzip" else ""
    cycle = cycle_length or min(len(paths), 16)
    # One reader thread per open file, not AUTOTUNE: threads waiting on the network use no CPU, and tf.data's
    # CPU-budgeted autotuner starts each iterator (each epoch) with little parallelism, measured on gs:// as a
    # 1.9 s first batch instead of 0.3 s (benchmarks/network.py).
    return files.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression_type, buffer_size=read_buffer_bytes),
        cycle_length=cycle,
        block_length=1,
        num_parallel_calls=cycle,
        deterministic=deterministic,
    )
