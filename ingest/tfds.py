"""TFDS metadata beside ``dataset.json``, so ``tfds.builder_from_directory(OUT)`` opens a tfshard dataset.

The records stay as they are: TFDS reads a ``FeaturesDict`` whose keys are the
records' own keys (``image/encoded``, ``image/class/label``, ...; TFDS joins nested
names with ``/``, so a flat key with a ``/`` is the same ``tf.train.Example`` key),
and finds the shards through a file name template (``{SPLIT}-{SHARD_X_OF_Y}.tfrecord``).
tensorflow-datasets' own ``DatasetInfo.write_to_directory`` writes the files:
``dataset_info.json``, ``features.json`` and, for images, the class names
(``image.class.label.labels.txt``). Needs the ``tfds`` extra.

    info = tfds_info("photos-tfr", manifest)       # checked and built; nothing written yet
    write_tfds_info("photos-tfr", manifest, info)  # ['dataset_info.json', 'features.json', ...]; OUT's lock held

Why here, in the converter: the metadata is one more file set tfshard writes in OUT, and a conversion asked for it
(``convert_images(..., tfds=True)``, ``--tfds``) writes it right after ``dataset.json`` under the lock it already
holds, so no other conversion can come between (a wrapper in ``tools`` around the conversion could only write it
once the lock is let go); the converter imports only ``format``, so its writer lives in ``ingest``. Not in
``format``: that is the contract both sides read and loads no TensorFlow, while this needs TensorFlow,
tensorflow-datasets and OUT's lock discipline. ``tools/tfds.py`` is the command on a finished dataset
(``tfshard tfds OUT``): it takes the lock and calls these same two functions, so the flag and the command write
the same bytes.

What TFDS cannot express is refused with the reason: gzip shards (its TFRecord reader
opens files uncompressed), class names its labels file cannot hold (one name per line, each
stripped: TFDS reads back the metadata it wrote before anything moves into OUT) and, for
episodes, dtypes ``tf.io.decode_raw`` does not read (uint32) or features with no elements per step.
A split with no records is left out (TFDS refuses an empty split for the whole builder). An
episode longer than the chunk size is several records, and TFDS yields those chunks as they are
(``episode/chunk`` of ``episode/chunks``); ``readers.episodes`` joins them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from ..format import untrusted
from ..format.dataset import load_manifest, read_small_file
from ..format.manifest import SPLIT_TYPES, ShardInfo
from ..format.names import TEMP_PREFIX, TFDS_FILES, is_tfds_name, shard_generation
from ..format.records import (
    DATA_PREFIX,
    EPISODE_FEATURES,
    IMAGE_LABEL_KEYS,
    LABEL_KEY,
    MULTI_LABEL_KEY,
    VALUE_KEY,
    data_features,
    image_features_of,
)
from ..format.storage import is_url, join
from .errors import InputError, TfdsMetadataError
from .plan import ShardSpec

SHARD_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"  # train-00000-of-00004.tfrecord
_TEMP_FOLDER = TEMP_PREFIX + "tfds"
log = logging.getLogger(__name__)
_INSTALL = "pip install 'tfshard[tfds]' (from a clone: pip install -e '.[tfds]')"
LABELS_FILE = TFDS_FILES[2]  # image.class.label.labels.txt: the class names of image/class/label
_LABEL = "image/class/label"
# What tfds_info writes as the description: how TFDS metadata tfshard wrote, for any dataset, is told apart.
_DESCRIPTION = re.compile(r"tfshard (images|episodes) dataset \(dataset\.json fingerprint [0-9a-f]{64}\)\Z")


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


def _scalar(tfds, spec: dict):
    return tfds.features.Scalar(np.int64) if spec["dtype"] == "int64" else tfds.features.Text()


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


def _shown(name: str) -> str:
    """``repr`` with its spaces as ``\\x20``: the name's surrounding spaces are the point, and a one-line error
    message may have its runs of spaces collapsed (the CLI does)."""
    return repr(name).replace(" ", "\\x20")


def _unlabelled_class(out: str, class_names: list[str], theirs: list[str] | None,
                      labels_file: str = LABELS_FILE) -> ValueError | None:
    """A class name TFDS does not hold as it is, as the error that refuses it (``theirs``: the names TFDS read back,
    None before writing): the first name that differs is the culprit, every one before it came back whole."""
    for i, name in enumerate(class_names):
        if theirs is None:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                why = f"its labels file {labels_file} is UTF-8 text and this folder name is not valid UTF-8"
                break
        elif i >= len(theirs) or theirs[i] != name:
            got = f"as {_shown(theirs[i])}" if i < len(theirs) else "as no name"
            why = (f"its labels file {labels_file} holds one name per line, each stripped of surrounding whitespace, "
                   f"so TFDS reads label {i} back {got}")
            break
    else:
        return None
    return ValueError(f"{out}: TFDS cannot hold class name {_shown(name)}: {why} (got class_names[{i}] = "
                      f"{_shown(name)}); rename the class folder (UTF-8, no line breaks, no leading or trailing "
                      "whitespace) and convert again")


def _raw_bytes_problem(feature, dtype: np.dtype, shape: tuple[int, ...]) -> str | None:
    """Why TFDS's raw-bytes ``Tensor`` feature cannot read one of our episode features, or None: its own decode
    (``tf.io.decode_raw``, a reshape to ``[-1, *shape]``) is run on an empty value."""
    if 0 in shape:
        return f"no elements per step (shape {list(shape)}): the reshape cannot infer the steps"
    try:
        feature.decode_example(tf.constant(b""))
    except (TypeError, ValueError, tf.errors.InvalidArgumentError):
        return f"{dtype.name} values (tf.io.decode_raw does not read {dtype.name})"
    return None


def _tfds():
    """tensorflow-datasets, the optional extra ``[tfds]``: imported on first use; nothing else of tfshard needs it."""
    try:
        import tensorflow_datasets
    except ImportError as e:
        raise ImportError(f"TFDS metadata needs tensorflow-datasets ({e}); {_INSTALL}") from None
    return tensorflow_datasets


def tfds_features(manifest):
    """The ``tfds.features.FeaturesDict`` of a manifest's records, keyed by the records' own keys."""
    tfds = _tfds()
    if manifest.kind == "images":  # the label key by kind: ClassLabel, a Sequence of them, or a float32 Tensor
        table = image_features_of(manifest.labels, manifest.label_columns)
        features = {key: _scalar(tfds, spec) for key, spec in table.items()}
        features["image/encoded"] = tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg")
        names = tfds.features.ClassLabel(names=list(manifest.class_names)) if manifest.class_names else None
        if manifest.labels == "multi":
            features[MULTI_LABEL_KEY] = tfds.features.Sequence(names)
        elif manifest.labels == "value":
            features[VALUE_KEY] = tfds.features.Tensor(shape=(len(manifest.label_columns),), dtype=np.float32)
        else:
            features[_LABEL] = names
        return tfds.features.FeaturesDict(features)
    features = {key: _scalar(tfds, spec) for key, spec in EPISODE_FEATURES.items()}
    if manifest.labels == "class":
        features[LABEL_KEY] = tfds.features.ClassLabel(names=list(manifest.class_names))
    elif manifest.labels == "value":
        features[LABEL_KEY] = tfds.features.Scalar(np.float32)
    for name, spec in data_features(manifest.features).items():
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        feature = tfds.features.Tensor(shape=(None, *shape), dtype=dtype, encoding=tfds.features.Encoding.BYTES)
        problem = _raw_bytes_problem(feature, dtype, shape)
        if problem:
            raise ValueError(f"feature {name!r}: TFDS cannot decode raw bytes of {problem}; read it with "
                             "readers.episodes or readers.windows instead")
        features[f"{DATA_PREFIX}{name}"] = feature
    return tfds.features.FeaturesDict(features)


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
        raise ValueError(f"tfds: TFDS opens TFRecord files uncompressed only (got compression={compression!r}); "
                         "drop --tfds or --compression")
    _tfds()


def tfds_info(out: str, manifest):
    """The ``tfds.core.DatasetInfo`` of the dataset in ``out`` (its ``manifest``), checked and built; writes nothing.

    Raises:
      ValueError: gzip shards, a class name TFDS's labels file cannot hold, or an episode feature TFDS cannot
        decode (the message says why).
      ImportError: tensorflow-datasets is not installed (the message says how to install it).
    """
    if manifest.compression is not None:
        raise ValueError(f"{out}: gzip shards; TFDS opens TFRecord files uncompressed only, so it cannot read them: "
                         "convert again without --compression to open the dataset from TFDS")
    tfds = _tfds()
    try:
        features = tfds_features(manifest)
    except ValueError as e:
        raise ValueError(f"{out}: {e}") from None
    unlabelled = _unlabelled_class(out, manifest.class_names, None, labels_file_of(manifest) or LABELS_FILE)
    if unlabelled is not None:
        raise unlabelled
    dataset_name = f"tfshard_{manifest.kind}"
    entries = tfds_splits(manifest)
    taken = [name for name, (split, generation, _) in entries.items() if generation and name in manifest.splits]
    if taken:
        raise ValueError(f"{out}: TFDS would name an appended generation {taken[0]!r}, as a split of the dataset is "
                         f"already called (got splits {sorted(manifest.splits)!r}); rename that split, convert again")
    empty = [name for name in manifest.splits if name not in tfds_read_splits(manifest)]
    if empty:
        log.warning("%s: split(s) %s hold no records; left out of the TFDS metadata", out, ", ".join(empty))
    splits = []
    for name, (split, generation, shards) in entries.items():
        pattern = SHARD_TEMPLATE if generation == 0 else f"{split}-g{generation:04d}-{{SHARD_X_OF_Y}}.{{FILEFORMAT}}"
        template = tfds.core.ShardedFileTemplate(data_dir=out, template=pattern, dataset_name=dataset_name,
                                                 split=name, filetype_suffix="tfrecord")
        splits.append(tfds.core.SplitInfo(name=name, shard_lengths=[s.records for s in shards],
                                          num_bytes=sum(s.bytes for s in shards), filename_template=template))
    supervised = ("image/encoded", IMAGE_LABEL_KEYS[manifest.labels]) if manifest.kind == "images" else None
    info = tfds.core.DatasetInfo(
        builder=tfds.core.dataset_info.DatasetIdentity(name=dataset_name, version=tfds.core.Version(
            "1.0.0"), data_dir=out, module_name=""),
        features=features, supervised_keys=supervised,
        description=f"tfshard {manifest.kind} dataset (dataset.json fingerprint {manifest.fingerprint})",
    )
    info.set_file_format(tfds.core.FileFormat.TFRECORD)
    info.set_splits(tfds.core.SplitDict(splits))
    return info


@contextlib.contextmanager
def _staged(out: str, manifest, info) -> Iterator[tuple[str, list[str]]]:
    """``info`` written into ``OUT/.tmp-tfds`` and read back by TFDS itself: yields the folder and the files in it;
    the folder goes on leaving the block.

    Raises:
      ValueError: TFDS reads a class name back otherwise than ``manifest`` has it.
      RuntimeError: tensorflow-datasets wrote a file tfshard does not know.
    """
    tfds = _tfds()
    temp = _fresh_temp_folder(out)
    try:
        info.write_to_directory(temp)  # what tfds.folder_dataset.write_metadata does, minus its shard search
        key = label_key(manifest)
        if key is not None:  # what TFDS itself reads back, not a guess at its rules
            feature = tfds.builder_from_directory(temp).info.features[key]
            theirs = (feature.feature if manifest.labels == "multi" else feature).names
            unlabelled = _unlabelled_class(out, manifest.class_names, list(theirs), labels_file_of(manifest))
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
        info = untrusted.parse_json(read_small_file(path, "TFDS metadata"), path)
        ours = isinstance(info, dict) and _DESCRIPTION.match(str(info.get("description"))) is not None
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
        info = untrusted.parse_json(read_small_file(join(out, TFDS_FILES[0]), "TFDS metadata"), TFDS_FILES[0])
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
