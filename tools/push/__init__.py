"""``tfshard.tools.push``, the import path ``tfshard push``'s upload had before it moved to ``tfshard.ingest.push``
(a conversion into a store pushes from the converter, which imports no tool): its names, unchanged.

A package rather than a ``tools/push.py`` module, so that git sees ``tools/push.py`` renamed to ``ingest/push.py``
and merges changes made to either.
"""

from ...ingest.push import JOURNAL, UPLOADS, PushReport, push

__all__ = ["JOURNAL", "UPLOADS", "PushReport", "push"]
