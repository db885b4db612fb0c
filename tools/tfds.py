"""``tfshard tfds OUT``: TFDS metadata beside a finished dataset's ``dataset.json``.

The export of a finished dataset to TFDS, for people and other systems. The metadata itself (what it holds, what
TFDS cannot express, how it is written through a temporary folder) is ``ingest/tfds.py``, which a conversion with
``--tfds`` calls under the lock it already holds; this command takes OUT's lock and calls the same functions, so both
write the same bytes. Needs the ``tfds`` extra.

    write_tfds_metadata("photos-tfr")
    builder = tfds.builder_from_directory("photos-tfr")
    ds = builder.as_dataset(split="train", as_supervised=True)  # (image uint8 [H, W, 3], label)
"""

from __future__ import annotations

from ..format.dataset import load_manifest
from ..ingest.lock import output_lock
from ..ingest.tfds import write_tfds_info
from ..ingest.tfds_info import tfds_info


def write_tfds_metadata(out: str) -> list[str]:
    """Writes TFDS's metadata for the dataset in ``out`` next to its ``dataset.json``; returns the files written.

    Holds OUT's lock (no conversion can be writing), writes into a temporary folder inside OUT and moves
    each file into place, so no partial file sits under a final name. Running it again rewrites the
    same files; a new conversion into OUT with ``--overwrite`` removes them. A conversion with ``--tfds``
    (``convert_images(..., tfds=True)``) writes the same files at its end.

    Raises:
      ValueError: gzip shards, a class name TFDS's labels file cannot hold, or an episode feature TFDS cannot
        decode (the message says why); nothing is moved into OUT.
      ImportError: tensorflow-datasets is not installed (the message says how to install it).
    """
    manifest = load_manifest(out)
    info = tfds_info(out, manifest)  # refused before the lock: a read-only or busy OUT still hears why
    with output_lock(out):
        return write_tfds_info(out, manifest, info)
