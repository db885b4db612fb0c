"""What both kinds of input do with a scanned tree before it becomes their items: ``on_error``'s rule for the
inputs the scan rejected, and a labels file (``ingest/labels.py``) applied to the inputs found.
"""

from __future__ import annotations

import logging
import os

from ...format.errors import InputError
from .. import labels as labels_lib
from ..scan import Rejection, SourceTree

log = logging.getLogger(__name__)


def fail_on(src: str, rejected: list[Rejection], on_error: str) -> None:
    """Raises an InputError naming the first of ``rejected`` when ``on_error`` is ``"fail"``."""
    if rejected and on_error == "fail":
        first = rejected[0]
        raise InputError(f"{os.path.join(src, first.relpath)}: {first.reason}; or pass --on-error skip")


def read_labels(src: str, labels_file: str, tree: SourceTree, on_error: str, *, images: bool,
                 forced: str | None = None):
    """A labels file applied to the inputs of a scanned tree, readable or not (``labels.decide``).

    Returns:
      ``(labels, rejected, unlisted, unlabelled)``: a ``labels.Labels``, the bad rows as Rejections (the first of
      those naming no input; ``unlisted`` counts the rest), and the inputs no row labels that no bad row names
      (sorted).

    Raises:
      InputError: a bad labels file; a bad row with ``on_error="fail"``.
    """
    found = [f.relpath for files in tree.files.values() for f in files] + [r.relpath for r in tree.rejected]
    kinds = labels_lib.LABEL_KINDS if images else ("class", "value")
    with labels_lib.open_rows(labels_file, splits=images, columns=images) as rows:
        labels, problems = labels_lib.decide(rows, src, found, kinds=kinds, forced=forced)
    if problems and on_error == "fail":
        raise problems[0].error(labels_file)
    log.info("%s (%s): label kind %s: %s", labels_file, rows.dialect, labels.kind, labels.rule)
    rejected = [Rejection(p.path or p.text, p.reason(labels_file)) for p in problems]
    left_out = set(labels.by_path) | {p.path for p in problems}
    return labels, rejected, problems.unlisted, sorted(p for p in found if p not in left_out)
