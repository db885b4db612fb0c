"""Pure: how the TFDS metadata in OUT lays a dataset out: a TFDS split per generation, its shard lengths, the file
of class names and how TFDS reads it back, and the description that marks the metadata as tfshard's.

The writer (``ingest/tfds.py``) and ``verify`` both go through these, and neither needs tensorflow-datasets for it.

    tfds_read_splits(manifest)  # {"train": "train+train_g0001"} after one append
"""

from __future__ import annotations

import re

from .names import TFDS_FILES, shard_generation
from .records import IMAGE_LABEL_KEYS, LABEL_KEY

SHARD_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"  # train-00000-of-00004.tfrecord
LABELS_FILE = TFDS_FILES[2]  # image.class.label.labels.txt: the class names of image/class/label
# The description tfshard writes: how TFDS metadata tfshard wrote, for any dataset, is told apart.
_DESCRIPTION = re.compile(r"tfshard (images|episodes) dataset \(dataset\.json fingerprint [0-9a-f]{64}\)\Z")


def tfds_description(manifest) -> str:
    """The description of the TFDS metadata tfshard writes for ``manifest``: its kind and fingerprint."""
    return f"tfshard {manifest.kind} dataset (dataset.json fingerprint {manifest.fingerprint})"


def is_tfshard_description(description) -> bool:
    """Whether a ``dataset_info.json``'s description is one tfshard writes (``tfds_description``), for any dataset."""
    return _DESCRIPTION.match(str(description)) is not None


def label_key(manifest) -> str | None:
    """The record key TFDS holds class names for (a ``ClassLabel``), or None when the labels are no classes."""
    if manifest.kind == "images":
        return None if manifest.labels == "value" else IMAGE_LABEL_KEYS[manifest.labels]
    return LABEL_KEY if manifest.labels == "class" else None


def labels_file_of(manifest) -> str | None:
    """The TFDS file of the class names (``image.class.label.labels.txt``, ...), or None: TFDS names it after the
    key, ``/`` as ``.``."""
    key = label_key(manifest)
    return None if key is None else key.replace("/", ".") + ".labels.txt"


def tfds_split_name(split: str, generation: int) -> str:
    """The TFDS split of one generation of a split: ``train`` for the shards a conversion wrote, ``train_g0001`` for
    those of the first append (TFDS finds a split's shards through one file name template, and a generation's
    shards are numbered among themselves). Read a whole split as ``split="train+train_g0001"``."""
    return split if generation == 0 else f"{split}_g{generation:04d}"


def tfds_splits(manifest) -> dict[str, tuple[str, int, list]]:
    """TFDS split name → (our split, generation, its shards), in the manifest's order; generations with no
    records are left out (TFDS refuses a split of no examples, "corresponds to no data", for every split)."""
    found: dict[str, tuple[str, int, list]] = {}
    for name, split in manifest.splits.items():
        for shard in split.shards:
            generation = shard_generation(shard.file)
            found.setdefault(tfds_split_name(name, generation), (name, generation, []))[2].append(shard)
    return {name: entry for name, entry in found.items() if sum(s.records for s in entry[2])}


def tfds_shard_lengths(manifest) -> dict[str, list[int]]:
    """TFDS split → records per shard, as the TFDS metadata lists them (``tfds_splits``)."""
    return {name: [s.records for s in shards] for name, (_, _, shards) in tfds_splits(manifest).items()}


def tfds_read_splits(manifest) -> dict[str, str]:
    """Our split → the TFDS split expression that reads all of it: ``{"train": "train+train_g0001"}``."""
    found: dict[str, list[str]] = {}
    for name, (split, _, _) in tfds_splits(manifest).items():
        found.setdefault(split, []).append(name)
    return {split: "+".join(names) for split, names in found.items()}


def tfds_label_names(text: str) -> list[str]:
    """The label names tensorflow-datasets reads from the text of a labels file: one per line, each stripped,
    blank lines dropped (``ClassLabel.load_metadata``). Here so that ``verify`` needs no tensorflow-datasets.

        tfds_label_names(" padded \\nbe\\nta\\n")  # ['padded', 'be', 'ta']
    """
    return [name.strip() for name in text.split("\n") if name.strip()]
