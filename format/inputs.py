"""``inputs.json``: every input an image dataset has read, and each split's exact pixel sums. Pure Python.

Every image conversion writes it beside ``dataset.json`` (atomically, before the manifest), and every append
(``ingest/append.py``) rewrites it, so an append can tell which inputs are new, which changed or went away since
they were converted, and merge the pixel statistics from exact integer sums rather than from rounded means.

    {"fingerprint": "<dataset.json's fingerprint>", "format_version": 1,
     "pixel_sums": {"train": {"count": 4096, "sums": [r, g, b], "squares": [r, g, b]}},
     "inputs": [{"path": "cat/000.jpg", "split": "train", "label": "cat", "size": 631, "mtime_ns": 17...,
                 "ctime_ns": 17..., "sha256": "9f86...", "state": "written"}, ...]}

``state``: ``"written"`` (its record is in a shard), ``"dropped"`` (a copy ``--dedupe`` left out) or
``"rejected"`` (read and refused by a worker; ``sha256`` null). Inputs the scan refused (unreadable, broken links)
have no size or time and are not listed. ``label``: the class name (class folders, or labels ``"class"``), the
list of class names (``"multi"``), or the list of floats (``"value"``). Read back as untrusted input: size-capped
before it is read, then checked field by field against the manifest it belongs to (one ``ManifestError`` naming
the file and the field). The manifest written with it records its sha256 (``inputs_sha256``), and it is believed
only while its bytes are those: a path renamed, an entry dropped or a sha256 edited would otherwise have an append
convert an image again or drop a new one as a copy, and pass every check above.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import Any

from .dataset import read_small_file
from .errors import ManifestError, NotRegularFileError
from .json_checks import REWRITE, SHA256, Checker, parse_json
from .manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    Manifest,
    check_format_version,
    is_count,
    is_finite_number,
)
from .names import INPUTS_NAME, SPLIT_NAME
from .statistics import pixel_sums_problem
from .storage import exists, join

STATES = ("written", "dropped", "rejected")


@dataclasses.dataclass(frozen=True)
class InputRecord:
    """One input read into the dataset: where it is, what it was when read, and what became of it."""

    path: str
    split: str
    label: str | list | None
    size: int
    mtime_ns: int
    ctime_ns: int
    sha256: str | None
    state: str

    def same_file(self, other: InputRecord) -> bool:
        """Whether ``other`` (the same path, scanned now) is this input unchanged: same size, times, split and label.

        ctime changes with every write and cannot be set back, so equal times mean equal bytes.
        """
        return (self.size, self.mtime_ns, self.ctime_ns, self.split, self.label) == (
            other.size, other.mtime_ns, other.ctime_ns, other.split, other.label)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The whole of ``inputs.json``.

    Attributes:
      fingerprint: the fingerprint of the ``dataset.json`` it belongs to.
      pixel_sums: per split, the exact integer pixel sums of its records: ``{"count", "sums", "squares"}``.
      inputs: every input read, by path.
    """

    fingerprint: str
    pixel_sums: dict[str, dict[str, Any]]
    inputs: list[InputRecord]
    format_version: int = FORMAT_VERSION


def to_json(inputs: Inputs) -> str:
    """Canonical JSON text (sorted keys and paths, one input per line, ASCII-escaped like the manifest)."""
    head = {k: v for k, v in dataclasses.asdict(inputs).items() if k != "inputs"}
    rows = ",\n".join(json.dumps(dataclasses.asdict(r), sort_keys=True) for r in sorted(inputs.inputs,
                                                                                         key=lambda r: r.path))
    return json.dumps(head, sort_keys=True)[:-1] + ', "inputs": [\n' + rows + "\n]}\n"


def _label(check: Checker, label: Any, where: str, manifest: Manifest) -> None:
    names = set(manifest.class_names)
    if manifest.labels in (None, "class"):
        if not (isinstance(label, str) and label in names):
            check.fail(where, "must be one of the dataset's class_names", label)
    elif manifest.labels == "multi":
        if not (isinstance(label, list) and all(isinstance(n, str) and n in names for n in label)):
            check.fail(where, "must be a list of the dataset's class_names (labels is 'multi')", label)
    elif not (isinstance(label, list) and len(label) == len(manifest.label_columns)
              and all(map(is_finite_number, label))):
        check.fail(where, f"must be {len(manifest.label_columns)} finite numbers (labels is 'value')", label)


def _pixel_sums(check: Checker, raw: Any, manifest: Manifest) -> None:
    sums = check.mapping(raw, "pixel_sums")
    if set(sums) != set(manifest.splits):
        check.fail("pixel_sums", f"must name exactly the dataset's splits {sorted(manifest.splits)!r}", sorted(sums))
    for split, entry in sums.items():
        at = f"pixel_sums[{split!r}]"
        check.keys(check.mapping(entry, at), at, {"count", "sums", "squares"})
        count = check.count(entry["count"], f"{at}.count")
        for key, top in (("sums", 255 * count), ("squares", 255 * 255 * count)):
            values = check.sequence(entry[key], f"{at}.{key}")
            if len(values) != 3 or not all(is_count(v, 0, top) for v in values):
                check.fail(f"{at}.{key}", f"must be 3 integers in [0, {top}] (8-bit pixels)", values)
        problem = pixel_sums_problem(count, entry["sums"], entry["squares"])
        if problem is not None:
            check.fail(f"{at}.squares", f"must be possible beside its sums ({problem})", entry["squares"])


def inputs_from_dict(raw: Any, source: str, manifest: Manifest) -> Inputs:
    """A validated ``Inputs`` from parsed JSON, checked against the manifest it must belong to.

    Raises:
      ManifestError: the first field that is wrong, named with its path, e.g. ``inputs[3].sha256``.
    """
    check = Checker(source)
    check.keys(check.mapping(raw, "(top level)"), "(top level)", {"fingerprint", "pixel_sums", "inputs"},
               {"format_version"})
    check_format_version(raw.get("format_version", FORMAT_VERSION), source)
    if raw["fingerprint"] != manifest.fingerprint:
        check.fail("fingerprint", f"must be the fingerprint of the {INPUTS_NAME}'s dataset.json "
                   f"({manifest.fingerprint[:12]}...): this file belongs to another dataset", raw["fingerprint"])
    _pixel_sums(check, raw["pixel_sums"], manifest)
    records, seen = [], set()
    written: collections.Counter = collections.Counter()
    fields = {f.name for f in dataclasses.fields(InputRecord)}
    for i, entry in enumerate(check.sequence(raw["inputs"], "inputs")):
        at = f"inputs[{i}]"
        check.keys(check.mapping(entry, at), at, fields)
        path = check.text(entry["path"], f"{at}.path")
        if not path or path in seen:
            check.fail(f"{at}.path", "must be a path named once", path)
        if path.startswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
            check.fail(f"{at}.path", "must be a relative path inside SRC (no '..', '.', empty parts or leading /)",
                       path)
        seen.add(path)
        if not (isinstance(entry["split"], str) and SPLIT_NAME.match(entry["split"])):
            check.fail(f"{at}.split", "must be a split name", entry["split"])
        _label(check, entry["label"], f"{at}.label", manifest)
        check.count(entry["size"], f"{at}.size")
        for key in ("mtime_ns", "ctime_ns"):
            check.of(entry[key], int, f"{at}.{key}", "an integer")
        if entry["state"] not in STATES:
            check.fail(f"{at}.state", f"must be one of {STATES}", entry["state"])
        hashed = isinstance(entry["sha256"], str) and SHA256.match(entry["sha256"])
        if not hashed and not (entry["sha256"] is None and entry["state"] == "rejected"):
            check.fail(f"{at}.sha256", "must be 64 lowercase hex digits (null only for a rejected input)",
                       entry["sha256"])
        if entry["state"] == "written":
            if entry["split"] not in manifest.splits:
                check.fail(f"{at}.split", f"must be a split of the dataset {sorted(manifest.splits)!r}",
                           entry["split"])
            written[entry["split"]] += 1
        records.append(InputRecord(**entry))
    for split, info in manifest.splits.items():
        if written[split] != info.records:
            check.fail("inputs", f"must list the {info.records} written inputs of split {split!r}", written[split])
    return Inputs(raw["fingerprint"], raw["pixel_sums"], records, raw.get("format_version", FORMAT_VERSION))


def text_sha256(text: str) -> str:
    """The sha256 of an inputs file's text as it is written (UTF-8): what the manifest's ``inputs_sha256`` holds."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read(path: str) -> bytes:
    try:
        return read_small_file(path, "inputs file", MAX_MANIFEST_BYTES)
    except NotRegularFileError as e:  # --overwrite cannot prove it tfshard's, so it is not removed by it
        fix = f"{INPUTS_NAME} must be the file tfshard wrote, so remove it first; {REWRITE}"
        raise ManifestError(f"{e}; {fix}") from None


def recorded_bytes_problem(path: str, manifest: Manifest, data: bytes | None = None) -> str | None:
    """Why the inputs file at ``path`` (its bytes ``data``, read when None) is not the one the manifest recorded
    writing (``inputs_sha256``), or None: it is, or the manifest records none (episodes, or written before)."""
    if manifest.inputs_sha256 is None:
        return None
    found = hashlib.sha256(_read(path) if data is None else data).hexdigest()
    if found == manifest.inputs_sha256:
        return None
    return (f"{path}: not the inputs file {MANIFEST_NAME} was written with (got sha256 {found[:12]}..., its "
            f"inputs_sha256 is {manifest.inputs_sha256[:12]}...): edited or replaced since, so which inputs the "
            f"dataset holds cannot be told from it; {REWRITE}")


def load_inputs(out: str, manifest: Manifest, name: str = INPUTS_NAME, *, recorded: bool = True) -> Inputs | None:
    """``out/inputs.json`` read (size-capped first, regular files only) and validated; None when there is none.

    ``recorded``: once every field is checked, its bytes must also be those the manifest recorded
    (``recorded_bytes_problem``); ``verify``, which weighs every field against the records, passes False and reports
    that separately.

    Raises:
      ManifestError: not an inputs file of this dataset (naming the field), or not the one it was written with.
    """
    path = join(out, name)
    if not exists(path):
        return None
    data = _read(path)
    inputs = inputs_from_dict(parse_json(data, path), path, manifest)
    problem = recorded_bytes_problem(path, manifest, data) if recorded else None
    if problem is not None:
        raise ManifestError(problem)
    return inputs
