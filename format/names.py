"""File names in a dataset folder, and compression names. Pure Python.

    shard_file_name("train", 3, 10)        # 'train-00003-of-00010.tfrecord'
    index_file_name("train-00003-of-00010.tfrecord")   # 'train-00003-of-00010.idx'
"""

from __future__ import annotations

import re
from typing import Any

MANIFEST_NAME = "dataset.json"
TEMP_PREFIX = ".tmp-"  # a file being written; renamed to its final name only when complete
STATE_DIR = ".tfshard-state"  # a conversion's resume state; gone once its manifest is written
LOCK_NAME = ".tfshard-lock"  # held by the one conversion writing into OUT
COMPRESSIONS = (None, "gzip")
SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]+$")
SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord(?P<gz>\.gz)?$")
INDEX_NAME = re.compile(r"^[A-Za-z0-9_]+-\d{5}-of-\d{5}\.idx$")
# TFDS metadata beside dataset.json (`tfshard tfds OUT`), then the class names of image/class/label, of multi-label
# image/class/labels, and of labelled episodes' episode/label (TFDS names each after its key).
TFDS_FILES = ("dataset_info.json", "features.json", "image.class.label.labels.txt", "image.class.labels.labels.txt",
              "episode.label.labels.txt")


def shard_file_name(split: str, index: int, num_shards: int, compression: str | None = None) -> str:
    """Returns the file name of one shard: ``train-00003-of-00010.tfrecord[.gz]``."""
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return f"{split}-{index:05d}-of-{num_shards:05d}{suffix}"


def index_file_name(shard_file: str) -> str:
    """The DALI index file beside a shard: ``train-00003-of-00010.tfrecord`` → ``train-00003-of-00010.idx``."""
    return shard_file.rsplit(".tfrecord", 1)[0] + ".idx"


def is_shard_name(name: Any) -> bool:
    """A plain shard file name inside OUT (``train-00000-of-00004.tfrecord[.gz]``): no folder, no ``..``."""
    return isinstance(name, str) and SHARD_NAME.match(name) is not None


def is_tfds_name(name: Any) -> bool:
    """A TFDS metadata file name tfshard writes in OUT (``TFDS_FILES``)."""
    return isinstance(name, str) and name in TFDS_FILES


def is_output_name(name: Any) -> bool:
    """A file name tfshard writes in OUT: a shard, an index file, the manifest or TFDS metadata (never a path)."""
    return (is_shard_name(name) or (isinstance(name, str) and INDEX_NAME.match(name) is not None)
            or name == MANIFEST_NAME or is_tfds_name(name))


def tf_compression_type(compression: str | None) -> str:
    """The ``compression_type`` TensorFlow's TFRecord reader and writer take for a manifest's compression."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression: must be one of {COMPRESSIONS} (got {compression!r})")
    return "GZIP" if compression == "gzip" else ""
