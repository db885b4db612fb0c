"""The manifest's ``appends`` field: one record per ``--append``, in order. Pure Python.

    {"generation": 1, "records_added": 120, "new_classes": ["emu"], "changed": 2, "deleted": 1,
     "changed_paths": ["cat/003.jpg", "dog/010.jpg"], "deleted_paths": ["cat/007.jpg"]}

``generation``: the generation of the shards it added (``train-g0001-...``); ``new_classes``: the classes it
added after the old ones; ``changed`` / ``deleted``: inputs already in the dataset that had changed or were gone
from SRC (their old records stay: shards are never rewritten), the first ``MAX_LISTED_PATHS`` named.
"""

from __future__ import annotations

from typing import Any

from .names import MAX_GENERATION

MAX_LISTED_PATHS = 100  # paths named per list; the counts cover every one
KEYS = ("generation", "records_added", "new_classes", "changed", "deleted", "changed_paths", "deleted_paths")


def append_record(generation: int, records_added: int, new_classes: list[str], changed: list[str],
                  deleted: list[str]) -> dict[str, Any]:
    """One ``appends`` entry; ``changed`` and ``deleted`` are every such path (listed up to the cap, sorted)."""
    return {"generation": generation, "records_added": records_added, "new_classes": list(new_classes),
            "changed": len(changed), "deleted": len(deleted), "changed_paths": sorted(changed)[:MAX_LISTED_PATHS],
            "deleted_paths": sorted(deleted)[:MAX_LISTED_PATHS]}


def check_appends(check, raw: Any, class_names: list[str], total_records: int | None) -> list[dict[str, Any]]:
    """``appends`` read back from an untrusted manifest, with ``check`` (``format.untrusted``'s checker).

    ``total_records``: the dataset's records, which the appends' ``records_added`` cannot exceed (None: not checked).

    Raises:
      ManifestError: a field of the wrong type, generations out of order, a class that is not one, a list over its cap.
    """
    previous, added, named = 0, 0, set(class_names)
    for i, entry in enumerate(check.sequence(raw, "appends")):
        at = f"appends[{i}]"
        check.keys(check.mapping(entry, at), at, set(KEYS))
        generation = check.count(entry["generation"], f"{at}.generation", low=1)
        if generation <= previous or generation > MAX_GENERATION:
            check.fail(f"{at}.generation", f"must rise from {previous + 1} to at most {MAX_GENERATION}", generation)
        previous = generation
        added += check.count(entry["records_added"], f"{at}.records_added")
        classes = check.sequence(entry["new_classes"], f"{at}.new_classes")
        if not all(isinstance(c, str) and c in named for c in classes) or len(set(classes)) != len(classes):
            check.fail(f"{at}.new_classes", "must name class_names, each once", classes)
        for what in ("changed", "deleted"):
            count = check.count(entry[what], f"{at}.{what}")
            paths = check.sequence(entry[f"{what}_paths"], f"{at}.{what}_paths")
            if len(paths) != min(count, MAX_LISTED_PATHS) or not all(isinstance(p, str) for p in paths):
                check.fail(f"{at}.{what}_paths", f"must name the first {min(count, MAX_LISTED_PATHS)} paths", paths)
    if total_records is not None and added > total_records:
        check.fail("appends", f"must add at most the dataset's {total_records} records", added)
    return raw
