"""Human-readable summaries of a dataset and of a conversion run, as lines of text (the CLI prints them), and
TensorFlow's op errors cut to one line.

    for line in summary_lines("photos-tfr", manifest, seconds=3.2):
        print(line)    #   train  3,670 records  2 shards  228.1 MB / photos-tfr: 3,670 records, ... (1,147 img/s)
"""

from __future__ import annotations

import json
import re

from ..format.records import data_features


def _short_list(values: list[float | None] | None, limit: int = 6) -> str:
    """``[0.1, n/a, 2]``: a null (a statistic that was not finite, e.g. NaN kept with --on-nan keep) shows as n/a."""
    if values is None:
        return "n/a"
    shown = ", ".join("n/a" if v is None else f"{v:.4g}" for v in values[:limit])
    if len(values) > limit:
        return f"[{shown}, ...] ({len(values)} values)"
    return f"[{shown}]"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _rate(manifest, seconds: float, status) -> str:
    """`` in 3.2 s (1,234 img/s)``, counting only what this run wrote (a resumed run kept the rest)."""
    records = manifest.total_records - (status.kept_records if status else 0)
    size = manifest.total_bytes - (status.kept_bytes if status else 0)
    if status is not None and status.resumed:
        episodes = manifest.kind == "episodes"  # episodes in the kept shards are not counted: bytes say it
        per_second = f"{size / seconds / 1e6:,.1f} MB/s" if episodes else f"{records / seconds:,.0f} img/s"
        return f" in {seconds:.1f} s ({records:,} records written: {per_second})"
    if manifest.kind == "episodes":
        episodes = sum(len(split.episodes) for split in manifest.splits.values())
        return f" in {seconds:.1f} s ({episodes / seconds:,.1f} episodes/s, {size / seconds / 1e6:,.1f} MB/s)"
    return f" in {seconds:.1f} s ({records / seconds:,.0f} img/s)"


def _label_kind(manifest) -> str:
    """``class, 3 classes (run, sit, walk)``, ``multi-label, ...``, ``value (float32)`` or ``value (float32 [2]: age,
    score)``."""
    if manifest.labels == "value":
        columns = manifest.label_columns
        return "value (float32)" if len(columns) <= 1 else f"value (float32 [{len(columns)}]: {_first(columns)})"
    names = manifest.class_names
    kind = "multi-label" if manifest.labels == "multi" else "class"
    return f"{kind}, {len(names)} classes ({_first(names)})"


def _first(names: list[str], shown: int = 10) -> str:
    """``a, b, ... 3 more``: a summary line stays one line however many names a labels file gives."""
    return ", ".join(names[:shown]) + (f", ... {len(names) - shown} more" if len(names) > shown else "")


def _split_rule(manifest) -> str | None:
    """``held out: val 10%, test 5% of train (hash of each path, seed 0)``, or None."""
    rule = manifest.split_rule
    if rule is None:
        return None
    shares = ", ".join(f"{name} {fraction:.4g}" for name, fraction in rule["fractions"].items())
    how = "exact per-class counts" if rule["method"] == "stratified" else "a seeded hash of each path"
    return f"  held out: {shares} of {rule['from']} ({how}, seed {rule['seed']})"


def _label_counts(manifest, split) -> str:
    """A split's episodes per class (``run 2, sit 0, walk 3``), or its values' ``min .. mean .. max``."""
    labels = [e.label for e in split.episodes]
    if manifest.labels == "value":
        if not labels:
            return "none"
        return f"min {min(labels):.6g}, mean {sum(labels) / len(labels):.6g}, max {max(labels):.6g}"
    counts = [0] * len(manifest.class_names)
    for label in labels:
        counts[label] += 1
    shown = ", ".join(f"{n} {c}" for n, c in list(zip(manifest.class_names, counts))[:20])
    return shown + (f", ... {len(counts) - 20} more classes" if len(counts) > 20 else "")


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
                     f"({_label_kind(manifest)}){left_out}")
        rule = manifest.options.get("label_rule")  # how a labels file's kind was decided (ingest/label_kinds.py)
        if isinstance(rule, str):
            lines.append(f"  label kind: {labels} ({rule:.300})")
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
            lines.append(f"    {item['path']}: {item['reason']}")
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
            lines.append(f"    {path}")
        named = ignored["other"] + ignored.get("unlabelled", 0)  # the files ignored_files names the first of
        if listed and named > len(listed[:10]):
            more = named - len(listed[:10])
            lines.append(f"    ... and {more} more (dataset.json names the first {len(listed)})")
    return lines + duplicate_lines(manifest.duplicates)


def append_lines(out: str, found, complete: bool, shown: int = 5) -> list[str]:
    """What an append found (``ingest.append.AppendFound``): the new images, and the inputs in the dataset that
    changed or were deleted since, which stay as they were converted."""
    lines = []
    if not complete:
        classes = f" (new classes: {', '.join(found.new_classes[:20])})" if found.new_classes else ""
        lines.append(f"  appended: {found.new_inputs:,} new images as generation {found.generation}{classes}")
    unlabelled = set(found.unlabelled)
    if unlabelled:  # not changed: the labels file leaves them out, and reconverting with it would drop them
        more = f", ... {len(unlabelled) - shown} more" if len(unlabelled) > shown else ""
        lines.append(f"  no row in the labels file: {len(unlabelled):,} images of the dataset, kept as converted: "
                     f"{', '.join(found.unlabelled[:shown])}{more}; pass the whole labels file (old rows and new)")
    changed = [path for path in found.changed if path not in unlabelled]
    for paths, what, fix in ((changed, "changed since they were converted", "take the new versions"),
                             (found.deleted, "deleted from SRC", "drop them")):
        if paths:
            more = f", ... {len(paths) - shown} more" if len(paths) > shown else ""
            lines.append(f"  {what}: {len(paths):,}, kept as converted (shards are never rewritten): "
                         f"{', '.join(paths[:shown])}{more}; to {fix}, reconvert with "
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
        lines.append(f"    {' = '.join(paths)}{more}")
    if duplicates["groups"] > shown:
        lines.append(f"    ... and {duplicates['groups'] - shown} more (dataset.json names the first "
                     f"{len(duplicates['listed'])})")
    return lines


def window_of(length: int | None, shift: int | None, horizon: int | None) -> tuple[int, int, int] | None:
    """``tfshard info``'s ``(length, shift, horizon)`` of ``--length/--shift/--horizon``, or None without
    ``--length``; ``--shift`` or ``--horizon`` alone is refused (they say nothing without a window length)."""
    if length is None:
        if shift is not None or horizon is not None:
            raise ValueError("--shift/--horizon: they shape the windows counted with --length (got no --length); "
                             "pass --length too")
        return None
    return length, 1 if shift is None else shift, 0 if horizon is None else horizon


def window_lines(manifest, length: int, shift: int = 1, horizon: int = 0) -> list[str]:
    """Per split: the windows ``readers.windows(length=, shift=, targets=horizon or None)`` yields an epoch, and the
    episodes too short for any (the reader skips them and logs it), from the manifest alone."""
    from ..readers.windowing.starts import WindowSpec  # pure numpy, but under the readers package (TensorFlow)

    if manifest.kind != "episodes":
        raise ValueError(f"--length: windows are for episode datasets (got kind {manifest.kind!r}); drop --length")
    spec = WindowSpec(length, shift, offset=horizon, width=horizon)
    span = f"{spec.extent} steps" if not horizon else f"{length} + {horizon} steps"
    lines = [f"  windows of {span} every {shift} (readers.windows(length={length}, shift={shift}"
             f"{f', targets={horizon}' if horizon else ''})):"]
    for name, split in manifest.splits.items():
        lengths = split.episode_lengths
        short, served = spec.too_short(lengths), spec.served_by_padding(lengths)
        fix = f"; padding='start' serves {served} of them" if served else ""
        lines.append(f"    {name}: {spec.count(lengths):,} windows; {short} of {len(lengths)} episodes too short for "
                     f"one{fix}")
    return lines


def describe_lines(out: str, manifest, window: tuple[int, int, int] | None = None) -> list[str]:
    """What ``tfshard info`` shows: kind, features or classes, per-split statistics, options, then the summary;
    ``window``: ``(length, shift, horizon)``, the windows and too-short episodes per split too."""
    lines = []
    lines.append(f"{out}: {manifest.kind}, format {manifest.format_version}, "
                 f"compression {manifest.compression or 'none'}")
    if manifest.kind == "episodes":
        data = data_features(manifest.features)
        lines.append("  features: " + ", ".join(f"{n} {v['dtype']}{v['shape']}" for n, v in data.items()))
        if manifest.labels is not None:
            lines.append(f"  labels: {_label_kind(manifest)}")
        for name, split in manifest.splits.items():
            lengths = split.episode_lengths
            lines.append(f"  {name}: {len(lengths)} episodes, {sum(lengths):,} steps, length "
                       f"{min(lengths, default=0)}..{max(lengths, default=0)}")
            for feature in data:
                mean, std = (split.feature_mean or {}).get(feature), (split.feature_std or {}).get(feature)
                if mean is not None:
                    lines.append(f"    {feature}: mean {_short_list(mean)}, std {_short_list(std)}")
            if manifest.labels is not None:
                lines.append(f"    labels: {_label_counts(manifest, split)}")
        if window is not None:
            lines.extend(window_lines(manifest, *window))
    else:
        if window is not None:
            window_lines(manifest, *window)  # refuses it, naming the flag
        if manifest.labels is not None:
            lines.append(f"  labels: {_label_kind(manifest)}")
        if manifest.labels != "value":
            lines.append(f"  classes ({len(manifest.class_names)}): {', '.join(manifest.class_names)}")
        for name, split in manifest.splits.items():
            counts = ", ".join(f"{k} {v}" for k, v in split.class_counts.items())
            per = " (images holding each class)" if manifest.labels == "multi" else ""
            lines.append(f"  {name}: {split.records:,} images{': ' + counts + per if counts else ''}")
            lines.append(f"    pixel mean {split.pixel_mean}, std {split.pixel_std}")
    for record in manifest.appends:  # what each --append added, and what it found changed or deleted
        classes = f", new classes {', '.join(record['new_classes'][:20])}" if record["new_classes"] else ""
        lines.append(f"  append {record['generation']}: +{record['records_added']:,} records{classes}; "
                     f"{record['changed']} changed and {record['deleted']} deleted inputs kept as converted")
    kind_options = "image" if manifest.kind == "images" else "episode"
    options = {k: v for k, v in manifest.options.items() if k != kind_options}
    lines.append(f"  options: {json.dumps(options, sort_keys=True)}")
    lines.append(f"  {kind_options} options: {json.dumps(manifest.options.get(kind_options, {}), sort_keys=True)}")
    return lines + summary_lines(out, manifest)


def short_tf_error(message: str) -> str:
    """TensorFlow's op error without its graph-function wrapper and op name, e.g. "corrupted record at 120"."""
    lines = message.strip().splitlines() or [""]
    text = re.sub(r"\{\{function_node [^}]*\}\}", "", lines[0])
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text)
    return text.split("' failed with")[0].strip()
