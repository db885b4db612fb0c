"""Byte sizes as people write them: ``"64MiB"``, ``"200GB"``, ``500000``; shared by the converter and the readers."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str | int, name: str = "shard size") -> int:
    """Parses a byte size such as ``"64MiB"``, ``"1GB"`` or ``"500000"``.

    Decimal units (kB, MB, GB) are powers of 1000, binary units (KiB, MiB, GiB)
    powers of 1024.

    >>> parse_size("64MiB"), parse_size("1GB")
    (67108864, 1000000000)

    Raises:
      ValueError: the text is not a positive size with a known unit.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise TypeError(f"{name}: a byte count or a size such as '64MiB' (got {text!r})")
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"{name}: not a size (got {text!r}); write a number with an optional unit, "
                "e.g. 64MiB, 1GB or 500000"
            )
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{name}: must be positive (got {text!r}); e.g. 128MiB")
    return value
