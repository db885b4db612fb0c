"""Reading a written dataset back against its manifest: ``tfshard verify`` and ``tfshard info``."""

from __future__ import annotations

import re

from ingest import manifest as manifest_lib
from ingest.errors import VerifyError

_SHARD_NAME = re.compile(r"^(?P<split>.+)-\d{5}-of-\d{5}\.tfrecord(\.gz)?$")


def load_manifest(out: str) -> manifest_lib.Manifest:
    """Reads ``out/dataset.json``.

    Raises:
      FileNotFoundError: there is no manifest (not a dataset, or a conversion that never finished).
      ValueError: the manifest is not valid.
    """
    import tensorflow as tf

    from ingest.write import join

    path = join(out, manifest_lib.MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(
            f"{path}: no manifest; {out} is not a finished tfshard dataset (rerun the conversion to finish it)"
        )
    with tf.io.gfile.GFile(path, "r") as f:
        return manifest_lib.from_json(f.read(), path)


def _short_tf_error(message: str) -> str:
    """TensorFlow's op error without its graph-function wrapper and op name, e.g. "corrupted record at 120"."""
    text = re.sub(r"\{\{function_node [^}]*\}\}", "", message.strip().splitlines()[0])
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text)
    return text.split("' failed with")[0].strip()


def _count_records(path: str, compression: str | None) -> tuple[int, str | None]:
    """Reads every record (TensorFlow checks both CRCs of each); returns the count and any read error."""
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(path, compression_type="GZIP" if compression == "gzip" else "")
    try:
        return int(dataset.reduce(0, lambda n, _: n + 1)), None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return 0, _short_tf_error(e.message)


def verify(out: str) -> manifest_lib.Manifest:
    """Checks every shard of ``out`` against its manifest: presence, size, sha256, record CRCs and counts.

    Returns:
      The manifest, when everything matches.

    Raises:
      FileNotFoundError: no manifest in ``out``.
      VerifyError: any mismatch; ``.problems`` lists each as "path: problem; fix".
    """
    import tensorflow as tf

    from ingest.write import file_sha256, join

    manifest = load_manifest(out)
    problems = []
    listed = set()
    fix = "rerun the conversion with --overwrite to rewrite it"
    for split in manifest.splits.values():
        for shard in split.shards:
            listed.add(shard.file)
            path = join(out, shard.file)
            if not tf.io.gfile.exists(path):
                problems.append(f"{path}: missing shard (listed in the manifest); {fix}")
                continue
            sha256, size = file_sha256(path)
            if size < shard.bytes:
                problems.append(f"{path}: truncated shard ({size} bytes, manifest says {shard.bytes}); {fix}")
            elif size > shard.bytes:
                problems.append(f"{path}: shard is longer than the manifest says ({size} > {shard.bytes} bytes); {fix}")
            elif sha256 != shard.sha256:
                problems.append(f"{path}: corrupted shard (sha256 {sha256[:12]}… != manifest {shard.sha256[:12]}…); {fix}")
            records, error = _count_records(path, manifest.compression)
            if error is not None:
                problems.append(f"{path}: unreadable record ({error}); {fix}")
            elif records != shard.records:
                problems.append(f"{path}: {records} records, manifest says {shard.records}; {fix}")
            if shard.index_file is not None:
                listed.add(shard.index_file)
                index_path = join(out, shard.index_file)
                if not tf.io.gfile.exists(index_path):
                    problems.append(f"{index_path}: missing index file; {fix}")
                elif file_sha256(index_path)[0] != shard.index_sha256:
                    problems.append(f"{index_path}: index file does not match the manifest's sha256; {fix}")
    for name in sorted(tf.io.gfile.listdir(out)):
        if _SHARD_NAME.match(name) and not name.startswith(".") and name not in listed:
            problems.append(
                f"{join(out, name)}: unexpected shard (not in the manifest); remove it or rerun with --overwrite"
            )
    if problems:
        raise VerifyError(f"{out}: {len(problems)} problem(s): " + " | ".join(problems), problems)
    return manifest
