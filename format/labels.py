"""Pure: the label fields of an untrusted ``dataset.json``: the kind of labels, class names and value columns, the
label record keys, each split's class counts, and an episode's own label.

``format/untrusted.py`` calls these as it validates a manifest; the converter checks an episode's label with the
same ``label_problem``. Any problem is one ``ManifestError`` naming the field (``format/json_checks.py``).

    label_problem(3, "class", classes=2)  # 'must be an index into the 2 class_names (labels is 'class')'
"""

from __future__ import annotations

from typing import Any

from .json_checks import Checker
from .manifest import LABEL_KINDS, is_count, is_finite_number
from .records import IMAGE_LABEL_KINDS, LABEL_FEATURES, LABEL_KEY, image_features_of, same_keys


def label_problem(label: Any, labels: str | None, classes: int) -> str | None:
    """What is wrong with an episode's ``label`` given the manifest's ``labels``, or None: it must be None without
    labels, an index into the ``classes`` class names for ``"class"``, a finite number for ``"value"``."""
    if labels is None and label is not None:
        return "must be null: the dataset has no labels (labels is null)"
    if labels == "class" and not is_count(label, 0, classes - 1):
        return f"must be an index into the {classes} class_names (labels is 'class')"
    if labels == "value" and not is_finite_number(label):
        return "must be a finite number (labels is 'value')"
    return None


def check_class_counts(check: Checker, where: str, counts: dict, class_names: list[str], records: int,
                       consistency: bool, labels: str | None = None) -> None:
    """A split's ``class_counts``: counts (multi-label: each at most the split's records); with ``consistency``,
    empty for value labels, else naming exactly the ``class_names`` and (single labels) summing to ``records``."""
    for key, value in counts.items():
        check.count(value, f"{where}[{key!r}]")
        if labels == "multi" and value > records:
            check.fail(f"{where}[{key!r}]", f"must be at most the split's {records} records", value)
    if not consistency:
        return
    if labels == "value":
        if counts:
            check.fail(where, "must be empty: value labels have no classes", sorted(counts)[:3])
        return
    if set(counts) != set(class_names):
        missing, extra = sorted(set(class_names) - set(counts)), sorted(set(counts) - set(class_names))
        check.fail(where, f"must name exactly the class_names (lacks {missing[:3]!r}, names {extra[:3]!r} "
                   "that are not classes)", sorted(counts))
    if labels != "multi" and sum(counts.values()) != records:  # multi-label: an image counts in each of its classes
        check.fail(where, f"must sum to the split's {records} records", sum(counts.values()))


def _check_image_labels(check: Checker, labels: Any, raw: dict, consistency: bool) -> None:
    """An image dataset's ``labels``: null (class folders) or one of ``IMAGE_LABEL_KINDS``, with class names except
    for ``"value"``, ``label_columns`` only for ``"value"``, and the kind's record keys in ``features``."""
    if labels is not None and (not isinstance(labels, str) or labels not in IMAGE_LABEL_KINDS):
        check.fail("labels", f"must be null or one of {IMAGE_LABEL_KINDS} for an images dataset", labels)
    columns = check.sequence(raw.get("label_columns", []), "label_columns")
    named: set[str] = set()
    for i, name in enumerate(columns):
        check.text(name, f"label_columns[{i}]")
        if name in named:
            check.fail(f"label_columns[{i}]", "names a column a second time", name)
        named.add(name)
    if (labels == "value") != bool(columns):
        check.fail("label_columns", "must name the value columns (labels is 'value')" if labels == "value" else
                   f"must be empty: only value labels have columns (labels is {labels!r})", columns)
    if (labels != "value") != bool(raw["class_names"]):
        check.fail("class_names", "must be empty: value labels have no classes" if labels == "value" else
                   "must name the classes", raw["class_names"])
    if consistency:
        expected = image_features_of(labels, columns)
        features = raw["features"]
        if not same_keys(features, expected):
            check.fail("features", f"must be the record keys of {labels or 'class'} labels "
                       f"({', '.join(sorted(expected))})", sorted(features))


def check_labels(check: Checker, labels: Any, raw: dict, consistency: bool) -> None:
    """``labels``: null, or for episodes ``"class"`` (with class_names) or ``"value"`` (without); its features key."""
    if raw["kind"] == "images":
        _check_image_labels(check, labels, raw, consistency)
        return
    if labels is not None and (not isinstance(labels, str) or labels not in LABEL_KINDS):
        check.fail("labels", f"must be null or one of {LABEL_KINDS}", labels)
    if raw.get("label_columns"):
        check.fail("label_columns", "must be empty for an episodes dataset (its labels have one value)",
                   raw["label_columns"])
    if raw["kind"] == "episodes" and (labels == "class") != bool(raw["class_names"]):
        need = "must name the classes (labels is 'class')" if labels == "class" else \
            f"must be empty: an episode dataset has class names only with labels 'class' (labels is {labels!r})"
        check.fail("class_names", need, raw["class_names"])
    if not consistency:
        return
    features = raw["features"]
    if labels is None and LABEL_KEY in features:
        check.fail(f"features[{LABEL_KEY!r}]", "must be absent: the dataset has no labels (labels is null)",
                   features[LABEL_KEY])
    if labels is not None and features.get(LABEL_KEY, {}).get("dtype") != LABEL_FEATURES[labels]["dtype"]:
        check.fail(f"features[{LABEL_KEY!r}]", f"must be a {LABEL_FEATURES[labels]['dtype']} feature "
                   f"(labels is {labels!r})", features.get(LABEL_KEY))
