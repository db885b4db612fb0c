"""File names in a dataset folder, compression names, and names made printable for messages. Pure Python.

    shard_file_name("train", 3, 10)        # 'train-00003-of-00010.tfrecord'
    shard_file_name("train", 0, 2, generation=1)        # 'train-g0001-00000-of-00002.tfrecord' (an append's)
    index_file_name("train-00003-of-00010.tfrecord")   # 'train-00003-of-00010.idx'
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

MANIFEST_NAME = "dataset.json"
INPUTS_NAME = "inputs.json"  # every input an image dataset has read, and its exact pixel sums (format/inputs.py)
TEMP_PREFIX = ".tmp-"  # a file being written; renamed to its final name only when complete
STATE_DIR = ".tfshard-state"  # a conversion's resume state; gone once its manifest is written
LOCK_NAME = ".tfshard-lock"  # held by the one conversion writing into OUT
COMPRESSIONS = (None, "gzip")
# A split names its shard files: ".tmp-<split>-g0001-00000-of-00001.tfrecord.gz" must fit a file name's 255 bytes.
# \Z: "$" would also match before a final newline ("val\n").
MAX_SPLIT_CHARS = 100
SPLIT_NAME = re.compile(rf"^[A-Za-z0-9_]{{1,{MAX_SPLIT_CHARS}}}\Z")
# A conversion writes generation 0 (no g part); each append adds its shards as the next generation, numbered
# i-of-n among themselves, so no name ever changes or collides.
SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?:g(?P<generation>\d{4})-)?(?P<index>\d{5})-of-(?P<count>\d{5})"
                        r"\.tfrecord(?P<gz>\.gz)?\Z")
INDEX_NAME = re.compile(r"^[A-Za-z0-9_]+-(?:g\d{4}-)?\d{5}-of-\d{5}\.idx\Z")
MAX_GENERATION = 9999
# TFDS metadata beside dataset.json (`tfshard tfds OUT`), then the class names of image/class/label, of multi-label
# image/class/labels, and of labelled episodes' episode/label (TFDS names each after its key).
TFDS_FILES = ("dataset_info.json", "features.json", "image.class.label.labels.txt", "image.class.labels.labels.txt",
              "episode.label.labels.txt")


def shard_file_name(split: str, index: int, num_shards: int, compression: str | None = None,
                    generation: int = 0) -> str:
    """Returns the file name of one shard: ``train-00003-of-00010.tfrecord[.gz]``, or with ``generation`` g > 0
    (the g-th append's shards) ``train-g000g-00003-of-00010.tfrecord[.gz]``."""
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"generation: must be in [0, {MAX_GENERATION}] (got {generation!r})")
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    part = f"g{generation:04d}-" if generation else ""
    return f"{split}-{part}{index:05d}-of-{num_shards:05d}{suffix}"


def shard_generation(name: str) -> int:
    """The generation of a shard file name: 0 for a conversion's shards, g for the g-th append's."""
    match = SHARD_NAME.match(name)
    if match is None:
        raise ValueError(f"{name!r}: not a shard file name")
    return int(match["generation"] or 0)


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
    """A file name tfshard writes in OUT: a shard, an index file, the manifest, the inputs file or TFDS metadata
    (never a path)."""
    return (is_shard_name(name) or (isinstance(name, str) and INDEX_NAME.match(name) is not None)
            or name in (MANIFEST_NAME, INPUTS_NAME) or is_tfds_name(name))


def tf_compression_type(compression: str | None) -> str:
    """The ``compression_type`` TensorFlow's TFRecord reader and writer take for a manifest's compression."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression: must be one of {COMPRESSIONS} (got {compression!r})")
    return "GZIP" if compression == "gzip" else ""


def printable(text: str) -> str:
    """``text`` as one line any terminal or log shows as it is: control characters (a newline, ESC), format
    characters (a right-to-left override) and bytes of a name that was no UTF-8 (kept as surrogates, which a strict
    UTF-8 stdout cannot write) as escapes: ``\\n``, ``\\x1b``, ``\\u202e``, ``\\xff``. Other Unicode stays.

    Example:
      printable("a/evil\\n.jpg")  # 'a/evil\\\\n.jpg'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or unicodedata.category(ch) == "Zs" else
                   f"\\x{ord(ch) - 0xDC00:02x}" if 0xDC80 <= ord(ch) <= 0xDCFF else
                   ch.encode("unicode_escape").decode("ascii") for ch in text)
