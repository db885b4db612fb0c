"""TFDS metadata written beside ``dataset.json``, so ``tfds.builder_from_directory(OUT)`` opens a tfshard dataset.

tensorflow-datasets' own ``DatasetInfo.write_to_directory`` writes the files (``dataset_info.json``,
``features.json`` and, for class labels, the class names: ``image.class.label.labels.txt``) from the
``DatasetInfo`` that ``ingest/tfds_info.py`` builds and checks; how they lay the dataset out is
``format/tfds.py``. Needs the ``tfds`` extra.

    write_tfds_metadata("photos-tfr")              # tfshard tfds OUT (tools/tfds.py): takes OUT's lock
    builder = tfds.builder_from_directory("photos-tfr")
    ds = builder.as_dataset(split="train", as_supervised=True)  # (image uint8 [H, W, 3], label)

Why here, in the converter: the metadata is one more file set tfshard writes in OUT, and a conversion asked for it
(``convert_images(..., tfds=True)``, ``--tfds``) writes it right after ``dataset.json`` under the lock it already
holds, so no other conversion can come between (a wrapper in ``tools`` around the conversion could only write it
once the lock is let go). The export of a finished dataset, ``tfshard tfds OUT``, is ``tools/tfds.py``: it takes
OUT's lock and calls the same ``write_tfds_info``, so the flag and the command write the same bytes. Not in
``format``: that is the contract both sides read and loads no TensorFlow, while this needs TensorFlow,
tensorflow-datasets and OUT's lock discipline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Iterator

import tensorflow as tf

from ..format import json_checks
from ..format.dataset import load_manifest, read_small_file
from ..format.errors import InputError, OptionError, TfdsMetadataError
from ..format.manifest import SPLIT_TYPES, ShardInfo
from ..format.names import TEMP_PREFIX, TFDS_FILES, is_tfds_name
from ..format.storage import is_url, join
from ..format.tfds import is_tfshard_description, label_key, labels_file_of
from .plan import ShardSpec
from .tfds_info import tfds_info, tfds_module, unlabelled_class

_TEMP_FOLDER = TEMP_PREFIX + "tfds"
log = logging.getLogger(__name__)


def _remove_temp_folder(path: str) -> None:
    """Removes what sits at our temporary name: a link or a file itself (never what a link points to), or a folder."""
    if is_url(path):
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)
    elif os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)  # refuses to follow a symlink swapped in meanwhile


def _fresh_temp_folder(out: str) -> str:
    """``OUT/.tmp-tfds``, new and empty: whatever a killed run (or anyone) left there goes first."""
    temp = join(out, _TEMP_FOLDER)
    _remove_temp_folder(temp)
    if is_url(temp):
        tf.io.gfile.makedirs(temp)
    else:
        os.mkdir(temp, 0o755)  # fails rather than reuse anything created in between
    return temp


def check_tfds_request(compression: str | None) -> None:
    """Refuses a conversion's ``tfds=True`` before any work when the metadata could not be written at its end.

    Raises:
      ValueError: gzip shards asked for (TFDS opens TFRecord files uncompressed only).
      ImportError: tensorflow-datasets is not installed (the message says how to install it).
    """
    if compression is not None:
        raise OptionError("{tfds}: TFDS opens TFRecord files uncompressed only (got {compression}={got!r}); "
                          "drop {tfds} or {compression}", got=compression)
    tfds_module()


@contextlib.contextmanager
def _staged(out: str, manifest, info) -> Iterator[tuple[str, list[str]]]:
    """``info`` written into ``OUT/.tmp-tfds`` and read back by TFDS itself: yields the folder and the files in it;
    the folder goes on leaving the block.

    Raises:
      ValueError: TFDS reads a class name back otherwise than ``manifest`` has it.
      RuntimeError: tensorflow-datasets wrote a file tfshard does not know.
    """
    tfds = tfds_module()
    temp = _fresh_temp_folder(out)
    try:
        info.write_to_directory(temp)  # what tfds.folder_dataset.write_metadata does, minus its shard search
        key = label_key(manifest)
        if key is not None:  # what TFDS itself reads back, not a guess at its rules
            feature = tfds.builder_from_directory(temp).info.features[key]
            theirs = (feature.feature if manifest.labels == "multi" else feature).names
            unlabelled = unlabelled_class(out, manifest.class_names, list(theirs), labels_file_of(manifest))
            if unlabelled is not None:
                raise unlabelled
        written = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(temp))
        unexpected = [n for n in written if not is_tfds_name(n)]
        if unexpected:
            raise RuntimeError(f"{out}: tensorflow-datasets wrote {unexpected[0]!r}, a file tfshard does not know; "
                               "nothing was moved into OUT")
        yield temp, written
    finally:
        _remove_temp_folder(temp)


def _refuse_theirs(out: str) -> None:
    """TFDS metadata in OUT is replaced only when tfshard wrote it (its ``dataset_info.json`` describes a tfshard
    dataset, whichever): another tool's is never replaced.

    Raises:
      ValueError: naming the file and the fix.
    """
    present = [name for name in TFDS_FILES if tf.io.gfile.exists(join(out, name))
               or (not is_url(out) and os.path.islink(join(out, name)))]
    if not present:
        return
    path = join(out, TFDS_FILES[0])
    try:
        info = json_checks.parse_json(read_small_file(path, "TFDS metadata"), path)
        ours = isinstance(info, dict) and is_tfshard_description(info.get("description"))
    except (OSError, ValueError):
        ours = False
    links = [name for name in present if not is_url(out) and os.path.islink(join(out, name))]
    if not ours or links:
        name, got = (links[0], "a symlink") if links else (present[0], "no dataset_info.json of a tfshard dataset")
        raise ValueError(f"{join(out, name)}: TFDS metadata tfshard did not write (got {got}); it is not replaced: "
                         "move it out of OUT (or remove it), then write the metadata again")


def write_tfds_info(out: str, manifest, info) -> list[str]:
    """Writes ``info`` (``tfds_info(out, manifest)``) next to ``dataset.json``; returns the files written.

    The caller holds OUT's lock. The files are written into a temporary folder inside OUT and each is moved
    into place, so no partial file sits under a final name; the rest of OUT is never touched, and TFDS metadata
    tfshard did not write is never replaced.

    Raises:
      ValueError: TFDS reads a class name back otherwise than ``manifest`` has it, or OUT holds TFDS metadata
        tfshard did not write; nothing is moved into OUT.
    """
    _refuse_theirs(out)
    with _staged(out, manifest, info) as (temp, written):
        for name in written:
            tf.io.gfile.rename(join(temp, name), join(out, name), overwrite=True)
    return written


def check_tfds_up_front(out: str, manifest, specs: list[ShardSpec]) -> None:
    """A conversion's or an append's ``tfds=True``, before any shard is written: the metadata of ``manifest`` with
    the planned shards ``specs`` added (their records as planned) is built and read back by TFDS as
    ``write_tfds_info`` would, in the temporary folder; nothing is moved into OUT. What the shards' own bytes
    cannot change (gzip, class names, episode dtypes, split names) is all TFDS can refuse.

    Raises:
      InputError: what TFDS could not hold, with the fix; nothing was converted.
      ImportError: tensorflow-datasets is not installed.
    """
    splits = dict(manifest.splits)
    for spec in specs:
        shard = ShardInfo(spec.file_name, spec.num_records, 0, "0" * 64)
        split = splits.get(spec.split) or SPLIT_TYPES[manifest.kind](shards=[], records=0, bytes=0)
        splits[spec.split] = dataclasses.replace(split, shards=[*split.shards, shard],
                                                 records=split.records + spec.num_records)
    planned = dataclasses.replace(manifest, splits=splits)
    try:
        _refuse_theirs(out)
        with _staged(out, planned, tfds_info(out, planned)):
            pass
    except (ValueError, RuntimeError) as e:
        raise InputError(f"{out}: --tfds refused before anything was written: {str(e).removeprefix(out + ': ')}; or "
                         "drop --tfds") from e


def written_for(out: str, manifest) -> list[str]:
    """The TFDS metadata files in OUT that ``tfshard tfds`` (or ``--tfds``) wrote for this dataset (its description
    names the dataset's fingerprint); metadata of anything else is not tfshard's to remove."""
    try:
        info = json_checks.parse_json(read_small_file(join(out, TFDS_FILES[0]), "TFDS metadata"), TFDS_FILES[0])
        ours = isinstance(info, dict) and manifest.fingerprint in str(info.get("description", ""))
    except (OSError, ValueError):
        return []
    if not ours:
        return []
    present = {n.rstrip("/") for n in tf.io.gfile.listdir(out)}
    return [name for name in TFDS_FILES if name in present]


def write_tfds_after_conversion(out: str, done: str = "the dataset is converted and complete",
                                 old: str = "the dataset is untouched") -> list[str]:
    """A conversion's ``tfds=True``: the metadata of the ``dataset.json`` just written (or found complete) in
    ``out``, exactly as ``tfshard tfds OUT`` writes it; the conversion holds OUT's lock. ``done`` and ``old`` say
    in the error what was done and what became of the dataset (an append's: the old metadata is gone).

    Raises:
      TfdsMetadataError: the metadata could not be written (the cause is chained); the converted dataset is
        complete and untouched, and the message says how to add the metadata later (``tfshard tfds OUT``).
    """
    try:
        manifest = load_manifest(out)
        written = write_tfds_info(out, manifest, tfds_info(out, manifest))
    except (ValueError, RuntimeError, ImportError, OSError, tf.errors.OpError) as e:
        reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
        raise TfdsMetadataError(
            f"{out}: {done}, but its TFDS metadata was not written ({reason.removeprefix(out + ': ')}); {old}: once "
            f"that is fixed, `tfshard tfds {out}` writes the metadata"
        ) from e
    log.info("%s: wrote TFDS metadata (%s)", out, ", ".join(written))
    return written

