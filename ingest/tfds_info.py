"""TFDS's ``DatasetInfo`` of a manifest, built with tensorflow-datasets, and what TFDS cannot express refused.

The records stay as they are: TFDS reads a ``FeaturesDict`` whose keys are the
records' own keys (``image/encoded``, ``image/class/label``, ...; TFDS joins nested
names with ``/``, so a flat key with a ``/`` is the same ``tf.train.Example`` key),
and finds the shards through a file name template (``{SPLIT}-{SHARD_X_OF_Y}.tfrecord``,
``format/tfds.py``). Writing it into OUT is ``ingest/tfds.py``. Needs the ``tfds`` extra.

    info = tfds_info("photos-tfr", manifest)  # checked and built; nothing written yet

What TFDS cannot express is refused with the reason: gzip shards (its TFRecord reader
opens files uncompressed), class names its labels file cannot hold (one name per line, each
stripped: the writer also has TFDS read back the metadata it wrote before anything moves into OUT)
and, for episodes, dtypes ``tf.io.decode_raw`` does not read (uint32) or features with no elements
per step. A split with no records is left out (TFDS refuses an empty split for the whole builder).
An episode longer than the chunk size is several records, and TFDS yields those chunks as they are
(``episode/chunk`` of ``episode/chunks``); ``readers.episodes`` joins them.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf

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
from ..format.tfds import (
    LABELS_FILE,
    SHARD_TEMPLATE,
    labels_file_of,
    tfds_description,
    tfds_read_splits,
    tfds_splits,
)

log = logging.getLogger(__name__)
_INSTALL = "pip install 'tfshard[tfds]' (from a clone: pip install -e '.[tfds]')"
_LABEL = "image/class/label"


def _scalar(tfds, spec: dict):
    return tfds.features.Scalar(np.int64) if spec["dtype"] == "int64" else tfds.features.Text()


def _shown(name: str) -> str:
    """``repr`` with its spaces as ``\\x20``: the name's surrounding spaces are the point, and a one-line error
    message may have its runs of spaces collapsed (the CLI does)."""
    return repr(name).replace(" ", "\\x20")


def unlabelled_class(out: str, class_names: list[str], theirs: list[str] | None,
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
    """Why TFDS's raw-bytes ``Tensor`` feature cannot read one of our episode features, or None: the ops of its
    decode (``Tensor.decode_example``: ``tf.io.decode_raw`` in its ``tf_dtype``, int64 for uint64, then a reshape
    to ``[-1, *shape]``) are run on an empty value. Not through ``decode_example`` itself: it reads the deprecated
    ``FeatureConnector.dtype``, which logged a deprecation warning during every ``--tfds`` of episodes."""
    if 0 in shape:
        return f"no elements per step (shape {list(shape)}): the reshape cannot infer the steps"
    raw = tf.int64 if feature.tf_dtype == tf.uint64 else feature.tf_dtype
    try:
        tf.reshape(tf.io.decode_raw(tf.constant(b""), raw), [-1, *shape])
    except (TypeError, ValueError, tf.errors.InvalidArgumentError):
        return f"{dtype.name} values (tf.io.decode_raw does not read {dtype.name})"
    return None


def tfds_module():
    """tensorflow-datasets, the optional extra ``[tfds]``: imported on first use; nothing else of tfshard needs it."""
    try:
        import tensorflow_datasets
    except ImportError as e:
        raise ImportError(f"TFDS metadata needs tensorflow-datasets ({e}); {_INSTALL}") from None
    return tensorflow_datasets


def tfds_features(manifest):
    """The ``tfds.features.FeaturesDict`` of a manifest's records, keyed by the records' own keys."""
    tfds = tfds_module()
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
    tfds = tfds_module()
    try:
        features = tfds_features(manifest)
    except ValueError as e:
        raise ValueError(f"{out}: {e}") from None
    unlabelled = unlabelled_class(out, manifest.class_names, None, labels_file_of(manifest) or LABELS_FILE)
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
        description=tfds_description(manifest),
    )
    info.set_file_format(tfds.core.FileFormat.TFRECORD)
    info.set_splits(tfds.core.SplitDict(splits))
    return info
