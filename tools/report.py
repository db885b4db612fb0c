"""What ``tfshard info`` shows of a dataset, as lines of text (the CLI prints them), and TensorFlow's op errors cut
to one line. A conversion's summary, which ``info`` ends with, is ``ingest/summary.py``'s.

    for line in describe_lines("photos-tfr", manifest):
        print(line)    # photos-tfr: images, format 1, compression none / ... / photos-tfr: 3,670 records, ...
"""

from __future__ import annotations

import json
import re

from ..format.records import data_features
from ..ingest.summary import first_names, label_kind_text, summary_lines


def _short_list(values: list[float | None] | None, limit: int = 6) -> str:
    """``[0.1, n/a, 2]``: a null (a statistic that was not finite, e.g. NaN kept with --on-nan keep) shows as n/a."""
    if values is None:
        return "n/a"
    shown = ", ".join("n/a" if v is None else f"{v:.4g}" for v in values[:limit])
    if len(values) > limit:
        return f"[{shown}, ...] ({len(values)} values)"
    return f"[{shown}]"


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
    return _first_of([f"{n} {c}" for n, c in zip(manifest.class_names, counts)])


SHOWN_CLASSES = 20  # a line of `tfshard info` names this many classes at most; --json lists them all


def _first_of(items: list[str]) -> str:
    """``a, b, c``, or the first ``SHOWN_CLASSES`` of them and how many more (``--json`` lists them all)."""
    return first_names(items, SHOWN_CLASSES, lambda more: f"{more} more class{'es' if more > 1 else ''} (all of "
                                                          "them: --json)")


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
            lines.append(f"  labels: {label_kind_text(manifest)}")
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
            lines.append(f"  labels: {label_kind_text(manifest)}")
        if manifest.labels != "value":
            names = _first_of(manifest.class_names)
            lines.append(f"  classes ({len(manifest.class_names)}): {names}")
        for name, split in manifest.splits.items():
            counts = _first_of([f"{k} {v}" for k, v in split.class_counts.items()])
            per = " (images holding each class)" if manifest.labels == "multi" else ""
            lines.append(f"  {name}: {split.records:,} images{': ' + counts + per if counts else ''}")
            lines.append(f"    pixel mean {split.pixel_mean}, std {split.pixel_std}")
    for record in manifest.appends:  # what each --append added, and what it found changed or deleted
        new = record["new_classes"]
        classes = f", new classes {_first_of(new)}" if new else ""
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
