"""``tfshard verify``: a written dataset read back against its manifest.

Everything read here is untrusted: the manifest is validated field by field on
load (so every shard path is a plain file name inside OUT), only regular files
are opened, and no file is read past the size the manifest gives it. Each shard
is read once (``tools/record_checks.py``): that one pass checks the CRCs, counts
the records and weighs what the readers take from the manifest (class names,
totals, dtypes, every statistic) against what the records hold, and for images
``inputs.json`` too (``tools/image_checks.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import tempfile

from ..format import json_checks
from ..format import manifest as manifest_lib
from ..format.dataset import load_manifest, read_small_file
from ..format.errors import NotRegularFileError, VerifyError
from ..format.objects import uses_fsspec
from ..format.storage import can_list, file_sha256, join, listdir, open_for_reading, stat_regular
from ..format.tfds import label_key, labels_file_of, tfds_label_names, tfds_shard_lengths
from ..format.tfrecord import record_frames
from .image_checks import ImageChecks
from .record_checks import read_shard
from .shard_read import REWRITE, Tally
from .split_checks import labels_problems, split_problems


def verify(out: str) -> manifest_lib.Manifest:
    """Checks every shard of ``out`` against its manifest: presence, size, sha256, record CRCs and counts; each
    image record's label and class text against ``class_names``; each episode chunk's id, source, length, steps
    and bytes, and its label against the episode's; and each split's totals, class counts, pixel or feature
    statistics against what its records hold. An image dataset's ``inputs.json`` is checked against the records
    too: every written input one record of its split with its label (and, kept as it is, its size and sha256),
    and its exact pixel sums those the records give.

    Returns:
      The manifest, when everything matches.

    Raises:
      FileNotFoundError: ``out`` does not exist or holds no manifest (the message says what it holds).
      NotADirectoryError: ``out`` is a file.
      ValueError: the manifest is not valid (names the field).
      VerifyError: any mismatch; ``.problems`` lists each as "path: problem; fix".
    """
    manifest = load_manifest(out, consistency=False)  # its fields against each other: weighed against the records
    manifest_path = join(out, manifest_lib.MANIFEST_NAME)
    problems = labels_problems(manifest_path, manifest)
    images = ImageChecks(out, manifest) if manifest.kind == "images" else None
    listed = set()
    fix = REWRITE
    for name, split in manifest.splits.items():
        tally = Tally(labels=[0] * len(manifest.class_names), split=name, images=images)
        for shard_index, shard in enumerate(split.shards):
            listed.add(shard.file)
            path = join(out, shard.file)
            try:
                stat_regular(path)
            except FileNotFoundError:
                problems.append(f"{path}: missing shard (listed in the manifest); {fix}")
                tally.intact = False
                continue
            except NotRegularFileError as e:
                problems.append(f"{e}; remove it and {fix}")
                tally.intact = False
                continue
            with _readable(path, shard.bytes) as (read_from, sha256, size):
                problems += _shard_problems(out, path, read_from, sha256, size, shard, shard_index, split, manifest,
                                            tally, listed)
        problems += split_problems(manifest_path, name, split, manifest, tally)
        if images is not None:
            problems += images.split_problems(name, split, tally.intact)
    for name in sorted(listdir(out)) if can_list(out) else ():  # a web server cannot list its folders
        if manifest_lib.SHARD_NAME.match(name) and name not in listed:
            problems.append(
                f"{join(out, name)}: unexpected shard (not in the manifest); remove the file, or if an --append was "
                "interrupted writing it, run that --append again to finish it"
            )
    if images is not None:
        problems += images.finish()
    problems += _tfds_problems(out, manifest)
    if problems:
        raise VerifyError(f"{out}: {len(problems)} problem(s): " + " | ".join(problems), problems)
    return manifest


def _shard_problems(out, path, read_from, sha256, size, shard, shard_index, split, manifest, tally, listed):
    """One shard's problems: its size and sha256, then its records (read from ``read_from``) and its index file."""
    unproven = f"remove it and {REWRITE}"  # a file whose bytes are not the manifest's: --overwrite does not remove it
    problems = []
    tally.bytes += size
    tally.intact = tally.intact and size == shard.bytes and sha256 == shard.sha256
    if size < shard.bytes:
        problems.append(f"{path}: truncated shard ({size} bytes, manifest says {shard.bytes}); {unproven}")
    elif size > shard.bytes:  # not read further: its length is unknown and could be anything
        problems.append(f"{path}: shard is longer than the manifest says (> {shard.bytes} bytes); {unproven}")
        return problems
    elif sha256 != shard.sha256:
        problems.append(f"{path}: corrupted shard (sha256 {sha256[:12]}… != manifest "
                        f"{shard.sha256[:12]}…); {unproven}")
    problems += read_shard(path, shard, shard_index, split, manifest, tally, read_from=read_from)
    if shard.index_file is not None:
        listed.add(shard.index_file)
        problems += _index_problems(out, shard, (size, sha256) == (shard.bytes, shard.sha256), read_from)
    return problems


@contextlib.contextmanager
def _readable(path: str, size: int):
    """``(a path TensorFlow reads, sha256, bytes)`` of the shard at ``path``, read at most ``size`` + 1 bytes: the
    path itself, or for a store TensorFlow cannot open (``s3://``, ``https://``...) a temporary local copy of the
    object's bytes as the store gives them now (never a shard cache's copy), removed afterwards."""
    if not uses_fsspec(path):
        yield (path, *file_sha256(path, max_bytes=size))
        return
    digest, got = hashlib.sha256(), 0
    with tempfile.TemporaryDirectory(prefix="tfshard-verify-") as folder:
        local = os.path.join(folder, "shard.tfrecord")
        with open_for_reading(path) as source, open(local, "wb") as copy:
            while got <= size and (chunk := source.read(min(4 * 2**20, size + 1 - got))):
                digest.update(chunk)
                copy.write(chunk)
                got += len(chunk)
        yield local, digest.hexdigest(), got


def _index_problems(out: str, shard: manifest_lib.ShardInfo, intact: bool, shard_copy: str) -> list[str]:
    """A shard's index file: the manifest's sha256, and (of an ``intact`` shard) an ``offset size`` line for each of
    its records, read from their framing (in ``shard_copy``, the shard or its local copy): a manifest that gives a
    lying index its sha256 does not make it true."""
    path = join(out, shard.index_file)
    try:
        size, _ = stat_regular(path)
    except FileNotFoundError:
        return [f"{path}: missing index file; {REWRITE}"]
    except NotRegularFileError as e:
        return [f"{e}; remove it and {REWRITE}"]
    unproven = f"remove it and {REWRITE}"
    if size > 64 * (shard.records + 1) or file_sha256(path)[0] != shard.index_sha256:
        return [f"{path}: index file does not match the manifest's sha256; {unproven}"]
    if not intact:
        return []  # the shard's own problem is reported: its records are not the ones the index was made of
    with open_for_reading(path) as f:
        lines = f.read(size).splitlines()
    with open_for_reading(shard_copy) as f:
        expected = [f"{offset} {length}".encode() for offset, length in record_frames(f, shard.records + 1)]
    for number, (line, want) in enumerate(itertools.zip_longest(lines, expected), 1):
        if line != want:
            got = "nothing" if line is None else repr(line.decode("utf-8", "replace")[:40])
            have = "no more records" if want is None else f"a record at {want.decode()}"
            return [f"{path}: line {number} of the index file does not list the shard's records (got {got}; the "
                    f"shard has {have}); {unproven}"]
    return []


def _tfds_count(value) -> int:
    """A count as TFDS's metadata spells an int64 (a string of digits, or a JSON integer); ValueError otherwise (a
    float such as 1e309 or 2.5, a bool)."""
    if manifest_lib.is_count(value) or (isinstance(value, str) and re.fullmatch(r"[0-9]{1,19}", value)):
        return int(value)
    raise ValueError(f"not a count: {value!r:.40}")


def _tfds_problems(out: str, manifest: manifest_lib.Manifest) -> list[str]:
    """TFDS metadata (``tfshard tfds OUT``), when present, must describe these very shards and classes."""
    path = join(out, "dataset_info.json")
    fix = f"run `tfshard tfds {out}` again (or remove the TFDS files)"
    try:
        info = json_checks.parse_json(read_small_file(path, "TFDS metadata"), path)
    except FileNotFoundError:
        return []
    except ValueError as e:  # not a regular file, too large, not UTF-8 JSON, nested absurdly deep
        return [f"{path}: not TFDS metadata tfshard wrote ({str(e)[:120]}); {fix}"]
    try:
        lengths = {s["name"]: [_tfds_count(n) for n in s["shardLengths"]] for s in info["splits"]}
        ours = manifest.fingerprint in info.get("description", "")
    except (KeyError, TypeError, ValueError):
        return [f"{path}: not TFDS metadata tfshard wrote (no splits with shard lengths); {fix}"]
    if lengths != tfds_shard_lengths(manifest) or not ours:
        return [f"{path}: TFDS metadata of another dataset (its splits or fingerprint differ from dataset.json); {fix}"]
    if labels_file_of(manifest) is None:
        return []
    labels = join(out, labels_file_of(manifest))
    try:
        names = tfds_label_names(read_small_file(labels, "TFDS label names").decode("utf-8"))
    except FileNotFoundError:
        return [f"{labels}: missing, so TFDS has no names for {label_key(manifest)}; {fix}"]
    except ValueError as e:  # UnicodeDecodeError included
        return [f"{labels}: not TFDS label names tfshard wrote ({str(e)[:120]}); {fix}"]
    if names != manifest.class_names:
        i = next(i for i, (a, b) in enumerate(zip([*names, None], [*manifest.class_names, None])) if a != b)
        theirs = names[i] if i < len(names) else None
        ours_name = manifest.class_names[i] if i < len(manifest.class_names) else None
        return [f"{labels}: TFDS reads label {i} as {theirs!r} ({len(names)} names), dataset.json's class_names[{i}] "
                f"is {ours_name!r} ({len(manifest.class_names)} names); {fix}"]
    return []
