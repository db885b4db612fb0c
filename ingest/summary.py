"""A conversion's summary as lines of text: per-split counts and sizes, labels, held-out splits, converted inputs,
rejects with their reasons, ignored and unlabelled files, duplicates, what an append found, where TFDS reads it.
Pure: the library never prints; ``ConversionResult.summary()`` joins these lines and the CLI prints them.

    for line in summary_lines("photos-tfr", manifest, seconds=3.2):
        print(line)    #   train  3,670 records  2 shards  228.1 MB / photos-tfr: 3,670 records, ... (1,147 img/s)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..format import objects
from ..format.manifest import Manifest
from ..format.names import printable
from .holdout import HELD_OUT


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _rate(manifest, seconds: float, status) -> str:
    """`` in 3.2 s (1,234 img/s)``, counting only what this run wrote (a resumed run kept the rest; an append wrote
    only its generation's records)."""
    records = manifest.total_records
    if status is not None and status.append is not None and manifest.appends:
        records = manifest.appends[-1]["records_added"]
    records -= status.kept_records if status else 0
    size = manifest.total_bytes - (status.kept_bytes if status else 0)
    if status is not None and status.resumed:
        episodes = manifest.kind == "episodes"  # episodes in the kept shards are not counted: bytes say it
        per_second = f"{size / seconds / 1e6:,.1f} MB/s" if episodes else f"{records / seconds:,.0f} img/s"
        return f" in {seconds:.1f} s ({records:,} records written: {per_second})"
    if manifest.kind == "episodes":
        episodes = sum(len(split.episodes) for split in manifest.splits.values())
        return f" in {seconds:.1f} s ({episodes / seconds:,.1f} episodes/s, {size / seconds / 1e6:,.1f} MB/s)"
    return f" in {seconds:.1f} s ({records / seconds:,.0f} img/s)"


def label_kind_text(manifest) -> str:
    """``class, 3 classes (run, sit, walk)``, ``multi-label, ...``, ``value (float32)`` or ``value (float32 [2]: age,
    score)``."""
    if manifest.labels == "value":
        columns = manifest.label_columns
        return "value (float32)" if len(columns) <= 1 else f"value (float32 [{len(columns)}]: {first_names(columns)})"
    names = manifest.class_names
    kind = "multi-label" if manifest.labels == "multi" else "class"
    return f"{kind}, {len(names)} classes ({first_names(names)})"


def first_names(names: list[str], shown: int = 10, more: Callable[[int], str] = "{} more".format) -> str:
    """``a, b, ... 3 more`` (``more(3)``), each name ``printable``: a line stays one line however many names a
    labels file or a manifest gives."""
    tail = f", ... {more(len(names) - shown)}" if len(names) > shown else ""
    return ", ".join(map(printable, names[:shown])) + tail


def _split_rule(manifest) -> str | None:
    """``held out: val 10%, test 5% of train (hash of each path, seed 0)``, or None."""
    rule = manifest.split_rule
    if rule is None:
        return None
    fractions = rule["fractions"]  # dataset.json sorts its keys: shown in the order they are taken, val first
    ordered = [name for name in HELD_OUT if name in fractions] + sorted(set(fractions) - set(HELD_OUT))
    shares = ", ".join(f"{name} {fractions[name]:.4g}" for name in ordered)
    how = "exact per-class counts" if rule["method"] == "stratified" else "a seeded hash of each path"
    return f"  held out: {shares} of {rule['from']} ({how}, seed {rule['seed']})"


def summary_lines(out: str, manifest, seconds: float | None = None, status=None) -> list[str]:
    """The per-split table and totals; ``seconds``: how long this run took (no rate without it).

    ``status``: the conversion's ``RunStatus``; a run that found the dataset complete shows no rate.
    """
    lines = []
    if status is not None and status.complete:
        done = "nothing new to append" if status.append is not None else \
            "already complete for these inputs and options; nothing converted"
        lines.append(f"{out}: {done}")
        seconds = None
    for name, split in manifest.splits.items():
        episodes = getattr(split, "episodes", None)  # an EpisodeSplitInfo
        steps = f"  {len(episodes):,} episodes, {sum(split.episode_lengths):,} steps" if episodes else ""
        lines.append(f"  {name:<12} {split.records:>9,} records  {len(split.shards):>4} shards  "
                     f"{_mb(split.bytes):>12}{steps}")
    rate = _rate(manifest, seconds, status) if seconds else ""
    lines.append(f"{out}: {manifest.total_records:,} records, {_mb(manifest.total_bytes)}{rate}")
    labels = manifest.labels
    unlabelled = manifest.ignored.get("unlabelled")
    if labels is not None:
        episodes = manifest.kind == "episodes"
        labelled = sum(len(split.episodes) if episodes else split.records for split in manifest.splits.values())
        left_out = "" if unlabelled is None else f", {unlabelled:,} unlabelled (no row in the labels file; left out)"
        lines.append(f"  labels: {labelled:,} {'episodes' if episodes else 'images'} labelled "
                     f"({label_kind_text(manifest)}){left_out}")
        rule = manifest.options.get("label_rule")  # how a labels file's kind was decided (ingest/label_kinds.py)
        if isinstance(rule, str):
            lines.append(f"  label kind: {labels} ({printable(rule):.300})")
    rule = _split_rule(manifest)
    if rule is not None:
        lines.append(rule)
    converted = manifest.options.get("converted_images", 0)
    if converted:
        lines.append(f"  converted to JPEG: {converted} (non-JPEG content, CMYK, EXIF rotation, resize...)")
    listed, unlisted = manifest.rejected, manifest.rejected_unlisted
    if listed or unlisted:
        total = len(listed) + unlisted
        where = "listed in dataset.json" if not unlisted else \
            f"dataset.json lists {len(listed):,}; {unlisted:,} more bad rows of the labels file are only counted"
        lines.append(f"  rejected: {total:,} {'files' if not unlisted else 'files and labels rows'} ({where}):")
        for item in listed[:10]:
            lines.append(f"    {printable(item['path'])}: {printable(item['reason'])}")
        if total > 10:
            lines.append(f"    ... and {total - 10:,} more")
    ignored = manifest.ignored
    if any(ignored.values()):
        kind = "non-image" if manifest.kind == "images" else "non-.npy/.npz"
        listed = manifest.ignored_files
        unit = "image" if manifest.kind == "images" else "episode"
        unlabelled = f", {ignored['unlabelled']} unlabelled {unit}" if ignored.get("unlabelled") else ""
        lines.append(f"  ignored: {ignored['hidden']} hidden, {ignored['other']} {kind}{unlabelled} files"
                     f"{':' if listed else ''}")
        for path in listed[:10]:
            lines.append(f"    {printable(path)}")
        named = ignored["other"] + ignored.get("unlabelled", 0)  # the files ignored_files names the first of
        if listed and named > len(listed[:10]):
            more = named - len(listed[:10])
            lines.append(f"    ... and {more} more (dataset.json names the first {len(listed)})")
    return lines + duplicate_lines(manifest.duplicates)


def append_lines(out: str, found, complete: bool, shown: int = 5, added: int | None = None) -> list[str]:
    """What an append found (``ingest.append.AppendFound``): the new images (``added`` of them written, when known),
    and the inputs in the dataset that changed or were deleted since, which stay as they were converted."""
    lines = []
    if not complete:
        classes = f" (new classes: {first_names(found.new_classes, 20)})" if found.new_classes else ""
        left = "" if added is None or added == found.new_inputs else \
            f"; the other {found.new_inputs - added:,} were rejected or dropped as copies (see rejected)"
        of = "" if not left else f"{added:,} of "
        lines.append(f"  appended: {of}{found.new_inputs:,} new images as generation {found.generation}{classes}"
                     f"{left}")
    unlabelled = set(found.unlabelled)
    if unlabelled:  # not changed: the labels file leaves them out, and reconverting with it would drop them
        more = f", ... {len(unlabelled) - shown} more" if len(unlabelled) > shown else ""
        lines.append(f"  no row in the labels file: {len(unlabelled):,} images of the dataset, kept as converted: "
                     f"{', '.join(map(printable, found.unlabelled[:shown]))}{more}; pass the whole labels file (old "
                     "rows and new)")
    changed = [path for path in found.changed if path not in unlabelled]
    for paths, what, fix in ((changed, "changed since they were converted", "take the new versions"),
                             (found.deleted, "deleted from SRC", "drop them")):
        if paths:
            more = f", ... {len(paths) - shown} more" if len(paths) > shown else ""
            lines.append(f"  {what}: {len(paths):,}, kept as converted (shards are never rewritten): "
                         f"{', '.join(map(printable, paths[:shown]))}{more}; to {fix}, reconvert with "
                         f"`tfshard images SRC {out} --overwrite`")
    return lines


def duplicate_lines(duplicates: dict | None, shown: int = 5) -> list[str]:
    """Identical images the conversion found (the manifest's ``duplicates``): counts, then the first groups."""
    if not duplicates or not duplicates["groups"]:
        return []
    dropped = f"; {duplicates['dropped']} copies dropped (--dedupe, listed in rejected)" if duplicates["dropped"] \
        else "; pass --dedupe to keep one copy of each"
    lines = [f"  duplicates: {duplicates['groups']} images found more than once ({duplicates['across_splits']} "
             f"across splits, {duplicates['within_split']} within a split){dropped}:"]
    for group in duplicates["listed"][:shown]:
        paths = group["paths"][:4]
        more = f" (+{group['copies'] - len(paths)} more)" if group["copies"] > len(paths) else ""
        lines.append(f"    {' = '.join(map(printable, paths))}{more}")
    if duplicates["groups"] > shown:
        lines.append(f"    ... and {duplicates['groups'] - shown} more (dataset.json names the first "
                     f"{len(duplicates['listed'])})")
    return lines


def tfds_written(out: str, what: str, manifest) -> str:
    """The line after TFDS metadata (``what``) is written beside ``manifest``: how to open it and, after an append,
    how TFDS reads each whole split (each generation is a TFDS split of its own).

    Example:
      tfds_written("/data/out", "TFDS metadata", manifest)
      # "/data/out: wrote TFDS metadata; open it with tfds.builder_from_directory('/data/out')"
    """
    from ..format.tfds import tfds_read_splits

    whole = {split: names for split, names in tfds_read_splits(manifest).items() if "+" in names}
    return (f"{out}: wrote {what}; open it with tfds.builder_from_directory({out!r})"
            + "".join(f"; split={names!r} reads all of {split}" for split, names in whole.items()))


@dataclasses.dataclass(frozen=True, eq=False)
class ConversionResult:
    """What ``convert_images`` or ``convert_episodes`` did: the dataset's manifest and the run that made it.

    ``summary()`` (and ``str()``) is the text ``tfshard images``/``episodes`` print once they finish: each split's
    records, shards and size, the labels, held-out splits and converted inputs, rejected files with their reasons,
    ignored and unlabelled files, duplicates, what an append found, the TFDS line and the upload's.

    For code written when the conversions returned the manifest, the manifest's attributes are read through
    (``result.splits`` is ``result.manifest.splits``), and a result equals another of the same manifest, or that
    manifest.

    Attributes:
      out: the output folder (a store's URL as given).
      manifest: the dataset's manifest, as written to ``out/dataset.json``.
      status: what the run found in ``out`` first (``ingest.resume.RunStatus``: complete, resumed, an append's
        findings), or None.
      seconds: how long the call took.
      tfds_folder: where TFDS metadata was written (``tfds=True``; a store's staging folder), else None.
      uploads: an ``s3://`` or ``az://`` ``out``'s upload reports (``ingest.push.PushReport``).

    Example:
      result = convert_images("photos/", "photos-tfr/", val_fraction=0.1)
      print(result)  #   train  3,303 records  1 shards  205.2 MB / val  367 records ... / rejected: 2 files ...
      result.manifest.splits["val"].records  # 367
    """

    out: str
    manifest: Manifest
    status: Any = None
    seconds: float | None = None
    tfds_folder: str | None = None
    uploads: tuple = ()

    def lines(self) -> list[str]:
        """The summary's lines, as the CLI prints them."""
        shown, status = objects.redact(self.out), self.status
        lines = summary_lines(shown, self.manifest, self.seconds, status)
        if status is not None and status.append is not None:
            record = self.manifest.appends[-1] if self.manifest.appends else {}
            added = record.get("records_added") if record.get("generation") == status.append.generation else None
            lines += append_lines(shown, status.append, status.complete, added=added)
        if self.tfds_folder is not None:
            lines.append(tfds_written(self.tfds_folder, "TFDS metadata", self.manifest))
        for report in self.uploads:
            lines += report.lines()
        return lines

    def summary(self) -> str:
        """The summary as one text, a line each."""
        return "\n".join(self.lines())

    def __str__(self) -> str:
        return self.summary()

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "manifest":  # not set yet (a copy being made): no manifest to ask
            raise AttributeError(name)
        return getattr(self.manifest, name)

    def __eq__(self, other) -> bool:
        if isinstance(other, ConversionResult):
            return self.manifest == other.manifest
        return self.manifest == other if isinstance(other, Manifest) else NotImplemented

    __hash__ = None
