"""Pure: untrusted JSON read (``parse_json``) and type-checked field by field (``Checker``).

Nothing read from disk is believed until it is checked: any problem is one ``ManifestError`` naming the file and the
field's path (``splits['train'].shards[0].file``), the value, and the fix (``REWRITE``). ``dataset.json``
(``format/untrusted.py``), ``inputs.json`` (``format/inputs.py``) and the converter's state files are all read
through these.

    Checker("dataset.json").count(-1, "splits['train'].records")
    # ManifestError: dataset.json: field splits['train'].records: must be at least 0 (got -1); rewrite the dataset ...
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ManifestError
from .manifest import is_count, is_finite_number

SHA256 = re.compile(r"^[0-9a-f]{64}\Z")  # \Z: "$" would also match before a final newline
REWRITE = "rewrite the dataset with `tfshard images|episodes SRC OUT --overwrite` (or remove OUT)"


class _DuplicateKey(Exception):
    pass


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict, refusing a key given twice: ``json`` keeps the last value silently, where another
    reader of the same file may keep the first (and tfshard never writes one)."""
    found = dict(pairs)
    if len(found) < len(pairs):  # rare: only then is the key looked for
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON text of an untrusted file → Python values; any problem is one ``ManifestError`` naming ``source``."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=_one_value_per_key)
    except _DuplicateKey as e:
        raise ManifestError(f"{source}: an object gives key {e.args[0]!r:.80} twice (JSON readers disagree on which "
                            f"value counts, and tfshard never writes one); {REWRITE}") from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"{source}: not UTF-8 text (byte {e.start}); {REWRITE}") from None
    except RecursionError:
        raise ManifestError(f"{source}: JSON nested too deeply to be a tfshard file; {REWRITE}") from None
    except json.JSONDecodeError as e:
        where = f"{e.msg} at line {e.lineno} column {e.colno}"
        raise ManifestError(f"{source}: not valid JSON ({where}); {REWRITE}") from None
    except ValueError as e:  # an integer of more digits than Python converts (4300): nothing tfshard writes
        raise ManifestError(f"{source}: not JSON tfshard writes ({str(e).split(';')[0]}); {REWRITE}") from None


class Checker:
    """Type checks of untrusted JSON, each failing with the file and the field's path in the message."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, problem: str, value: Any = None) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ManifestError(f"{self.source}: field {where}: {problem} (got {shown}); {REWRITE}")

    def of(self, value: Any, types, where: str, what: str) -> Any:
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            self.fail(where, f"must be {what}", value)
        if not isinstance(value, types):
            self.fail(where, f"must be {what}", value)
        return value

    def count(self, value: Any, where: str, low: int = 0) -> int:
        self.of(value, int, where, "an integer")
        if not is_count(value, low):
            self.fail(where, f"must be at least {low}", value)
        return value

    def text(self, value: Any, where: str) -> str:
        return self.of(value, str, where, "a string")

    def mapping(self, value: Any, where: str) -> dict:
        return self.of(value, dict, where, "an object")

    def sequence(self, value: Any, where: str) -> list:
        return self.of(value, list, where, "a list")

    def numbers(self, value: Any, where: str, nullable: bool = True) -> None:
        if value is None and nullable:
            return
        for i, v in enumerate(self.sequence(value, where)):
            if v is None and nullable:
                continue
            if not is_finite_number(v):
                self.fail(f"{where}[{i}]", "must be a finite number", v)

    def keys(self, value: dict, where: str, required: set, optional: set = frozenset()) -> None:
        missing = sorted(required - set(value))
        unknown = sorted(set(value) - required - set(optional))
        if missing:
            self.fail(where, f"lacks {', '.join(missing)}", sorted(value))
        if unknown:
            self.fail(where, f"has unknown keys {', '.join(unknown)}", sorted(value))
