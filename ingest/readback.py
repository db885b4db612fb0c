"""Reading a written dataset back against its manifest: ``tfshard verify`` and ``tfshard info``.

Everything read here is untrusted: the manifest is validated field by field on
load (so every shard path is a plain file name inside OUT), only regular files
are opened, and no file is read past the size the manifest gives it.
"""

from __future__ import annotations

import re

import numpy as np

from ..format import manifest as manifest_lib
from ..format.dataset import load_manifest
from ..format.names import tf_compression_type
from ..format.records import DATA_PREFIX, data_features, episode_parse_spec
from .errors import VerifyError


def short_tf_error(message: str) -> str:
    """TensorFlow's op error without its graph-function wrapper and op name, e.g. "corrupted record at 120"."""
    lines = message.strip().splitlines() or [""]
    text = re.sub(r"\{\{function_node [^}]*\}\}", "", lines[0])
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text)
    return text.split("' failed with")[0].strip()


def _records(path: str, compression: str | None):
    import tensorflow as tf

    return tf.data.TFRecordDataset(path, compression_type=tf_compression_type(compression))


def _count_records(path: str, compression: str | None) -> tuple[int, str | None]:
    """Reads every record (TensorFlow checks both CRCs of each); returns the count and any read error."""
    import tensorflow as tf

    try:
        return int(_records(path, compression).reduce(0, lambda n, _: n + 1)), None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        return 0, short_tf_error(e.message)


def _step_bytes(features: dict) -> dict[str, int]:
    """Bytes per time step of each episode feature, by feature name."""
    return {name: int(np.dtype(spec["dtype"]).itemsize * int(np.prod(spec["shape"], dtype=np.int64)))
            for name, spec in data_features(features).items()}


def _episode_problems(path: str, shard_index: int, split: manifest_lib.EpisodeSplitInfo, manifest) -> list[str]:
    """Every chunk record of one episode shard against the manifest: ids, order, lengths, coverage, byte counts."""
    import tensorflow as tf

    step_bytes = _step_bytes(manifest.features)
    spec = episode_parse_spec(step_bytes)
    data = {f"{DATA_PREFIX}{name}" for name in step_bytes}
    parsed = _records(path, manifest.compression).map(lambda r: tf.io.parse_single_example(r, spec)).map(
        lambda e: {k: tf.cast(tf.strings.length(v), tf.int64) if k in data else v for k, v in e.items()}
    )
    listed = [e for e in split.episodes if e.shard == shard_index]
    expected = {e.id: e for e in listed}
    fix = "the manifest does not describe this shard's records; rerun the conversion with --overwrite"
    problems, seen_order, covered = [], [], {}
    try:
        for record in parsed.as_numpy_iterator():
            episode_id, length = int(record["episode/id"]), int(record["episode/length"])
            start, steps = int(record["episode/start"]), int(record["episode/steps"])
            entry = expected.get(episode_id)
            if entry is None:
                problems.append(f"{path}: holds episode {episode_id}, which the manifest does not list in this shard; {fix}")
                continue
            name = f"episode {episode_id} ({entry.source})"
            if length != entry.length:
                problems.append(f"{path}: {name} has {length} steps, the manifest says {entry.length}; {fix}")
            if start < 0 or steps < 1 or start + steps > length or covered.get(episode_id, 0) != start:
                problems.append(f"{path}: {name} chunk {int(record['episode/chunk'])} covers steps "
                                f"[{start}, {start + steps}), not the next steps of the episode; {fix}")
            for feature, per_step in step_bytes.items():
                held = int(record[f"{DATA_PREFIX}{feature}"])
                if held != steps * per_step:
                    problems.append(f"{path}: {name} feature {feature!r} holds {held} bytes, "
                                    f"{steps} steps need {steps * per_step}; {fix}")
            covered[episode_id] = start + steps
            if not seen_order or seen_order[-1] != episode_id:
                seen_order.append(episode_id)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
        return problems  # the record count check already names the unreadable record
    for entry in listed:
        if covered.get(entry.id, 0) != entry.length:
            problems.append(f"{path}: episode {entry.id} ({entry.source}) has {covered.get(entry.id, 0)} "
                            f"of its {entry.length} steps in the shard; {fix}")
    if not problems and seen_order != [e.id for e in listed]:
        problems.append(f"{path}: episodes are not in the manifest's order; {fix}")
    return problems[:20]


def verify(out: str) -> manifest_lib.Manifest:
    """Checks every shard of ``out`` against its manifest: presence, size, sha256, record CRCs and counts,
    and for episodes every chunk's episode id, length, steps and bytes.

    Returns:
      The manifest, when everything matches.

    Raises:
      FileNotFoundError: ``out`` does not exist or holds no manifest (the message says what it holds).
      NotADirectoryError: ``out`` is a file.
      ValueError: the manifest is not valid (names the field).
      VerifyError: any mismatch; ``.problems`` lists each as "path: problem; fix".
    """
    import tensorflow as tf

    from ..format.storage import NotRegularFileError, file_sha256, join, stat_regular

    manifest = load_manifest(out)
    problems = []
    listed = set()
    fix = "rerun the conversion with --overwrite to rewrite it"
    for split in manifest.splits.values():
        for shard_index, shard in enumerate(split.shards):
            listed.add(shard.file)
            path = join(out, shard.file)
            try:
                stat_regular(path)
            except FileNotFoundError:
                problems.append(f"{path}: missing shard (listed in the manifest); {fix}")
                continue
            except NotRegularFileError as e:
                problems.append(f"{e}; remove it and {fix}")
                continue
            sha256, size = file_sha256(path, max_bytes=shard.bytes)
            if size < shard.bytes:
                problems.append(f"{path}: truncated shard ({size} bytes, manifest says {shard.bytes}); {fix}")
            elif size > shard.bytes:  # not read further: its length is unknown and could be anything
                problems.append(f"{path}: shard is longer than the manifest says (> {shard.bytes} bytes); {fix}")
                continue
            elif sha256 != shard.sha256:
                problems.append(f"{path}: corrupted shard (sha256 {sha256[:12]}… != manifest {shard.sha256[:12]}…); {fix}")
            records, error = _count_records(path, manifest.compression)
            if error is not None:
                problems.append(f"{path}: unreadable record ({error}); {fix}")
            elif records != shard.records:
                problems.append(f"{path}: {records} records, manifest says {shard.records}; {fix}")
            elif manifest.kind == "episodes":
                problems += _episode_problems(path, shard_index, split, manifest)
            if shard.index_file is not None:
                listed.add(shard.index_file)
                index_path = join(out, shard.index_file)
                try:
                    index_size, _ = stat_regular(index_path)
                except FileNotFoundError:
                    problems.append(f"{index_path}: missing index file; {fix}")
                    continue
                except NotRegularFileError as e:
                    problems.append(f"{e}; remove it and {fix}")
                    continue
                if index_size > 64 * (shard.records + 1) or file_sha256(index_path)[0] != shard.index_sha256:
                    problems.append(f"{index_path}: index file does not match the manifest's sha256; {fix}")
    for name in sorted(tf.io.gfile.listdir(out)):
        if manifest_lib.SHARD_NAME.match(name) and name not in listed:
            problems.append(
                f"{join(out, name)}: unexpected shard (not in the manifest); remove it or rerun with --overwrite"
            )
    problems += _tfds_problems(out, manifest)
    if problems:
        raise VerifyError(f"{out}: {len(problems)} problem(s): " + " | ".join(problems), problems)
    return manifest


def _tfds_problems(out: str, manifest: manifest_lib.Manifest) -> list[str]:
    """TFDS metadata (``tfshard tfds OUT``), when present, must describe these very shards."""
    from ..format.dataset import read_small_file
    from ..format.storage import join
    from .tfds_metadata import tfds_shard_lengths

    path = join(out, "dataset_info.json")
    fix = f"run `tfshard tfds {out}` again (or remove the TFDS files)"
    try:
        info = manifest_lib.parse_json(read_small_file(path, "TFDS metadata"), path)
    except FileNotFoundError:
        return []
    except ValueError as e:  # not a regular file, too large, not UTF-8 JSON, nested absurdly deep
        return [f"{path}: not TFDS metadata tfshard wrote ({str(e)[:120]}); {fix}"]
    try:
        lengths = {s["name"]: [int(n) for n in s["shardLengths"]] for s in info["splits"]}
        ours = manifest.fingerprint in info.get("description", "")
    except (KeyError, TypeError, ValueError):
        return [f"{path}: not TFDS metadata tfshard wrote (no splits with shard lengths); {fix}"]
    if lengths != tfds_shard_lengths(manifest) or not ours:
        return [f"{path}: TFDS metadata of another dataset (its splits or fingerprint differ from dataset.json); {fix}"]
    return []
