"""The manifest's ``duplicates`` field: images whose source bytes are identical, found at conversion. Pure Python.

    summarize({"train": [("train/cat/1.jpg", h1), ("train/dog/4.jpg", h2)], "val": [("val/cat/7.jpg", h1)]}, 0)
    # {"groups": 1, "across_splits": 1, "within_split": 0, "copies": 2, "dropped": 0,
    #  "listed": [{"sha256": h1, "copies": 2, "paths": ["train/cat/1.jpg", "val/cat/7.jpg"]}]}

``groups``: contents found more than once; ``across_splits``: of those, the ones in more than one split;
``within_split``: the ones found twice or more inside one split (a group can be both); ``copies``: the images in
those groups; ``dropped``: the copies ``--dedupe`` left out (each is also in ``rejected``, naming the copy kept);
``listed``: the first ``MAX_LISTED_DUPLICATES`` groups by their first path, each naming at most
``MAX_LISTED_PATHS`` of its paths (sorted), while ``copies`` counts them all.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

MAX_LISTED_DUPLICATES = 100  # groups named in the manifest; the counts cover every one
MAX_LISTED_PATHS = 20  # paths named per group (a blank image can be in thousands of places)
COUNTS = ("groups", "across_splits", "within_split", "copies", "dropped")
SHA256 = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" would also match before a final newline


def summarize(images: dict[str, list[tuple[str, str]]], dropped: int) -> dict[str, Any]:
    """The ``duplicates`` field from each split's ``(path, sha256)`` of every image read (kept or dropped).

    Args:
      images: per split, the images read, kept or dropped by ``--dedupe``.
      dropped: how many of them ``--dedupe`` left out.
    """
    where: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for split, found in images.items():
        for path, sha256 in found:
            where[sha256].append((path, split))
    groups = sorted((sorted(found), sha256) for sha256, found in where.items() if len(found) > 1)
    across = sum(len({split for _, split in found}) > 1 for found, _ in groups)
    within = sum(len({split for _, split in found}) < len(found) for found, _ in groups)
    listed = [{"sha256": sha256, "copies": len(found), "paths": [path for path, _ in found[:MAX_LISTED_PATHS]]}
              for found, sha256 in groups[:MAX_LISTED_DUPLICATES]]
    return {"groups": len(groups), "across_splits": across, "within_split": within,
            "copies": sum(len(found) for found, _ in groups), "dropped": dropped, "listed": listed}


def check_duplicates(check, raw: Any) -> dict[str, Any] | None:
    """``duplicates`` read back from an untrusted manifest, with ``check`` (``format.untrusted``'s checker).

    Raises:
      ManifestError: a field of the wrong type, a count its siblings contradict, a list over its cap.
    """
    if raw is None:
        return None
    check.keys(check.mapping(raw, "duplicates"), "duplicates", {*COUNTS, "listed"})
    for key in COUNTS:
        check.count(raw[key], f"duplicates.{key}")
    for key in ("across_splits", "within_split"):
        if raw[key] > raw["groups"]:
            check.fail(f"duplicates.{key}", f"must be at most the {raw['groups']} groups", raw[key])
    if raw["copies"] < 2 * raw["groups"] or (raw["groups"] == 0 and raw["copies"]):
        check.fail("duplicates.copies", f"must be at least 2 per group ({raw['groups']} groups)", raw["copies"])
    if raw["dropped"] > raw["copies"] - raw["groups"]:
        check.fail("duplicates.dropped", "must leave one copy of each group", raw["dropped"])
    listed = check.sequence(raw["listed"], "duplicates.listed")
    if len(listed) > min(raw["groups"], MAX_LISTED_DUPLICATES):
        check.fail("duplicates.listed", f"must list at most {min(raw['groups'], MAX_LISTED_DUPLICATES)} groups",
                   len(listed))
    for i, group in enumerate(listed):
        at = f"duplicates.listed[{i}]"
        check.keys(check.mapping(group, at), at, {"sha256", "copies", "paths"})
        if not (isinstance(group["sha256"], str) and SHA256.match(group["sha256"])):
            check.fail(f"{at}.sha256", "must be 64 lowercase hex digits", group["sha256"])
        copies = check.count(group["copies"], f"{at}.copies", low=2)
        paths = check.sequence(group["paths"], f"{at}.paths")
        if not 2 <= len(paths) <= min(copies, MAX_LISTED_PATHS):
            check.fail(f"{at}.paths", f"must name 2 to {min(copies, MAX_LISTED_PATHS)} paths", len(paths))
        for j, path in enumerate(paths):
            check.text(path, f"{at}.paths[{j}]")
    return raw
