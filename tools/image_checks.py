"""What ``tfshard verify`` weighs of an image dataset besides its labels: the pixel statistics and ``inputs.json``,
against what its records hold, in verify's one pass over them.

Pixel statistics are exact integer sums, so they are compared exactly. A record that is its input's very bytes
(a JPEG kept as it is: its sha256 is the one ``inputs.json`` lists for its path) added the sums of its 1/8-scale
decode, which are recomputed here with the converter's own function (``ingest/images.py``
``passthrough_pixel_sums``). A record re-encoded at conversion (PNG, CMYK, rotated, resized, ...) added the sums of
its pixels before JPEG encoding, which no record keeps: its pixel count (height × width) is exact, its sums are only
bounded (8-bit pixels). So a split of kept JPEGs is weighed exactly: ``inputs.json``'s ``pixel_sums`` against the
records', and the manifest's ``pixel_mean``/``pixel_std`` against the mean and std those sums give
(``PixelSums.mean_std``, as the converter rounds them). ``inputs.json`` itself is untrusted: it is loaded through its
validator, and every input it lists as written must be one record of its split, with its label, and (kept as it
is) its size and sha256; no record may be missing from it.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ..format import json_checks
from ..format import manifest as manifest_lib
from ..format.inputs import load_inputs, recorded_bytes_problem
from ..format.manifest import is_count
from ..format.names import INPUTS_NAME
from ..format.statistics import pixel_problems, pixel_sums_problem
from ..format.storage import join
from ..ingest.images import PixelSums, passthrough_pixel_sums
from .record_checks import ENCODED, FILENAME, HEIGHT, WIDTH
from .shard_read import REWRITE, first_finding, record_text

_DECODE_ERRORS = (OSError, ValueError, SyntaxError, MemoryError)  # PIL's and TurboJPEG's, on bytes that lie


@dataclasses.dataclass
class _SplitPixels:
    """What a split's records add to its pixel sums, as they are read."""

    kept: PixelSums = PixelSums()  # exact: records that are their input's bytes
    converted: int = 0  # records re-encoded at conversion: their sums are not in the records
    converted_pixels: int = 0
    unknown: int = 0  # records of no known input (no inputs.json, or not listed in it)
    undecodable: int = 0


def _sums(raw: dict) -> PixelSums:
    return PixelSums(raw["count"], tuple(raw["sums"]), tuple(raw["squares"]))


def _shown(sums: PixelSums) -> str:
    return f"count {sums.count}, sums {list(sums.sums)}, squares {list(sums.squares)}"


def _with_fix(message: str) -> str:
    """A problem of ``inputs.json`` as verify words it: with verify's fix for the dataset in place of the loader's
    (or added), but for a format this tfshard does not read, which an upgrade fixes."""
    if message.endswith(json_checks.REWRITE):
        return f"{message[:-len(json_checks.REWRITE)]}{REWRITE}"
    return message if "upgrade tfshard" in message else f"{message}; {REWRITE}"


def _same_label(listed, held) -> bool:
    """An input's label in ``inputs.json`` (a class name, a list of them, or a list of floats) against its record's
    (the same forms; value labels as the record's float32 values)."""
    if isinstance(held, np.ndarray):
        try:
            return np.array_equal(np.asarray(listed, np.float32), held)
        except (TypeError, ValueError):
            return False
    return listed == held


class ImageChecks:
    """One verify run's image checks: ``shard`` collects each record as it is read, ``split_problems`` weighs a
    split once its shards are read, ``problems`` holds those of ``inputs.json`` as a whole (``finish`` adds the
    last ones)."""

    def __init__(self, out: str, manifest: manifest_lib.Manifest):
        self.manifest = manifest
        self.manifest_path = join(out, manifest_lib.MANIFEST_NAME)
        self.inputs_path = join(out, INPUTS_NAME)
        self.problems: list[str] = []
        self.inputs = None
        try:
            self.inputs = load_inputs(out, manifest, recorded=False)  # each field weighed below, not the bytes alone
        except ValueError as e:  # not valid (names the field), of another dataset, not a regular file, too large
            self.problems.append(_with_fix(str(e)))
        if self.inputs is not None:
            edited = recorded_bytes_problem(self.inputs_path, manifest)  # an edit the records cannot show (a time)
            self.problems += [_with_fix(edited)] if edited else []
        if self.inputs is None and manifest.appends and not self.problems:
            self.problems.append(f"{self.inputs_path}: missing, though dataset.json records {len(manifest.appends)} "
                                 f"append(s), which keep it; {REWRITE}")
        self.written = {} if self.inputs is None else {r.path: r for r in self.inputs.inputs if r.state == "written"}
        image = manifest.options.get("image")
        self.validate = not (isinstance(image, dict) and image.get("validate") is False)  # else no sums were kept
        claimed = manifest.options.get("converted_images")
        self.converted_claimed = claimed if is_count(claimed) else None
        self.seen: dict[str, str] = {}  # every record's input path -> its split
        self.converted: list[str] = []  # the inputs whose records are not their bytes
        self.splits: dict[str, _SplitPixels] = {}
        self.complete = True  # every shard read whole: only then can an input be missing from the records

    def shard(self, path: str, split: str) -> _ShardImages:
        """The collector of one shard's records."""
        return _ShardImages(self, path, self.splits.setdefault(split, _SplitPixels()), split)

    def _claimed(self, split: str) -> PixelSums | None:
        if self.inputs is None or split not in self.inputs.pixel_sums:
            return None
        return _sums(self.inputs.pixel_sums[split])

    def split_problems(self, name: str, split: manifest_lib.ImageSplitInfo, intact: bool) -> list[str]:
        """``inputs.json``'s pixel sums of a split against its records, and the manifest's ``pixel_mean`` and
        ``pixel_std`` against what those sums give; weighed against the records only when every shard of the split
        was ``intact`` (read whole, as listed), else against ``inputs.json`` alone."""
        self.complete = self.complete and intact
        pixels = self.splits.get(name, _SplitPixels())
        claimed = self._claimed(name)
        problems, reference, source = [], claimed, f"{INPUTS_NAME}'s exact pixel sums"
        if intact and not pixels.unknown and not pixels.undecodable:
            if not pixels.converted:
                reference, source = pixels.kept, "its records' pixels"
                if claimed is not None and claimed != pixels.kept:
                    problems.append(f"{self.inputs_path}: field pixel_sums[{name!r}]: {_shown(claimed)}, its records' "
                                    f"pixels give {_shown(pixels.kept)}; {REWRITE}")
            elif claimed is not None:
                rest = PixelSums(claimed.count - pixels.kept.count,
                                 tuple(a - b for a, b in zip(claimed.sums, pixels.kept.sums)),
                                 tuple(a - b for a, b in zip(claimed.squares, pixels.kept.squares)))
                if rest.count != pixels.converted_pixels or pixel_sums_problem(rest.count, rest.sums, rest.squares):
                    reference = None
                    problems.append(
                        f"{self.inputs_path}: field pixel_sums[{name!r}]: {_shown(claimed)}, which its records cannot "
                        f"give: beside the exact {_shown(pixels.kept)} of its kept JPEGs, that leaves "
                        f"{_shown(rest)} for the {pixels.converted_pixels} pixels of its {pixels.converted} "
                        f"re-encoded images; {REWRITE}")
        return problems + self._statistics_problems(name, split, reference, source)

    def _statistics_problems(self, name: str, split, reference: PixelSums | None, source: str) -> list[str]:
        where = f"{self.manifest_path}: field splits[{name!r}]"
        said = (split.pixel_mean, split.pixel_std)
        if reference is not None and said != reference.mean_std():
            mean, std = reference.mean_std()
            return [f"{where}.pixel_mean: {split.pixel_mean!r} with pixel_std {split.pixel_std!r}, {source} give "
                    f"{mean!r} and {std!r}; {REWRITE}"]
        if split.pixel_mean is None or split.pixel_std is None:
            if said == (None, None):
                return []
            return [f"{where}.pixel_mean: {split.pixel_mean!r} with pixel_std {split.pixel_std!r}: both are measured "
                    f"or neither; {REWRITE}"]
        return [f"{where}.{field}: {problem} (got {value!r}); {REWRITE}"
                for field, problem, value in pixel_problems(split.pixel_mean, split.pixel_std)]

    def finish(self) -> list[str]:
        """The checks of ``inputs.json`` as a whole, once every record was read: no written input without its
        record, every dropped copy a written input's bytes, and as many re-encoded records as the manifest says."""
        if self.inputs is None or not self.complete:
            return self.problems
        problems = list(self.problems)
        missing = [path for path in self.written if path not in self.seen]
        if missing:
            problems.append(f"{self.inputs_path}: lists {len(missing)} written input(s) no record holds (first: "
                            f"{missing[0]!r}, split {self.written[missing[0]].split!r}); {REWRITE}")
        hashes = {r.sha256 for r in self.written.values()}
        strays = [r.path for r in self.inputs.inputs if r.state == "dropped" and r.sha256 not in hashes]
        if strays:
            problems.append(f"{self.inputs_path}: lists {len(strays)} input(s) as dropped copies whose sha256 is no "
                            f"written input's (first: {strays[0]!r}); {REWRITE}")
        if self.converted_claimed is not None and len(self.converted) != self.converted_claimed:
            first = f" (first: {self.converted[0]!r})" if self.converted else ""
            problems.append(f"{self.inputs_path}: {len(self.converted)} written input(s) have a sha256 other than "
                            f"their records' bytes{first}, but dataset.json's options.converted_images says "
                            f"{self.converted_claimed} image(s) were re-encoded; {REWRITE}")
        return problems


class _ShardImages:
    """One shard's records as ``ImageChecks`` weighs them: findings per kind (the first kept), sums per split."""

    def __init__(self, checks: ImageChecks, path: str, pixels: _SplitPixels, split: str):
        self.checks, self.path, self.pixels, self.split = checks, path, pixels, split
        self.found: dict[str, list] = {}

    def add(self, index: int, record: dict, label) -> None:
        """One record; ``label`` as ``inputs.json`` holds it (None: the record's label is already a problem)."""
        checks, name = self.checks, record_text(record[FILENAME])
        encoded = record[ENCODED]
        if name in checks.seen:
            first_finding(self.found, "twice", (index, name, checks.seen[name]))
        checks.seen[name] = self.split
        entry = checks.written.get(name)
        if checks.inputs is not None and entry is None:
            first_finding(self.found, "unlisted", (index, name))
        if entry is not None:
            if entry.split != self.split:
                first_finding(self.found, "split", (index, name, entry.split))
            if label is not None and not _same_label(entry.label, label):
                first_finding(self.found, "label", (index, name, entry.label, label))
        kept = entry.sha256 == hashlib.sha256(encoded).hexdigest() if entry is not None else (
            True if checks.inputs is None and checks.converted_claimed == 0 else None)  # none re-encoded: all kept
        if kept is None:
            self.pixels.unknown += 1
        elif not kept:
            checks.converted.append(name)
            self.pixels.converted += 1
            self.pixels.converted_pixels += int(record[HEIGHT]) * int(record[WIDTH])
        else:
            if entry is not None and entry.size != len(encoded):
                first_finding(self.found, "size", (index, name, entry.size, len(encoded)))
            if checks.validate:
                try:
                    self.pixels.kept += passthrough_pixel_sums(encoded)
                except _DECODE_ERRORS as e:
                    self.pixels.undecodable += 1
                    first_finding(self.found, "decode", (index, name, f"{type(e).__name__}: {e}"))

    def problems(self, records: int) -> list[str]:
        """One line per kind of finding, naming its first record, of a shard of ``records`` records."""
        lines, inputs = [], self.checks.inputs_path
        for kind, (count, details) in self.found.items():
            index, name, *rest = details
            first = f"first: record {index}, {name!r}"
            if kind == "twice":
                what = f"hold an input another record holds too ({first}, also in split {rest[0]!r})"
            elif kind == "unlisted":
                what = f"hold an input {inputs} does not list as written ({first})"
            elif kind == "split":
                what = f"hold an input {inputs} puts in another split ({first}, listed in split {rest[0]!r})"
            elif kind == "label":
                shown = rest[1].tolist() if isinstance(rest[1], np.ndarray) else rest[1]
                what = f"hold another label than {inputs} lists ({first}, listed {rest[0]!r}, held {shown!r})"
            elif kind == "size":
                what = (f"are their input's bytes but not its size in {inputs} ({first}, listed {rest[0]}, held "
                        f"{rest[1]})")
            else:
                what = (f"are their input's bytes, so JPEGs kept as they are, yet do not decode as one ({first}: "
                        f"{rest[0]:.120})")
            lines.append(f"{self.path}: {count} of {records} records {what}; {REWRITE}")
        return lines
