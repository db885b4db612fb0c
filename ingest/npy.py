"""Reading ``.npy`` and ``.npz`` files without numpy's loader: headers and member names first, data after, never
a pickle. Pure numpy.

Every file is untrusted: a header may declare terabytes, an ``.npz`` may name one array twice or hold a
hundred thousand of them, bytes may be missing. Each problem is a ``BadFile`` in our own words (numpy's errors
quote the file's bytes), raised before anything large is read.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import zipfile

import numpy as np

from ..format.storage import NotRegularFileError, open_regular

# Each feature is a record key, a manifest entry and a decode op in every reader, and each member costs a header
# parse at scan time: an .npz of more arrays than this is no plausible episode, and is refused unread.
MAX_FEATURES = 1024


class BadFile(ValueError):
    """A problem with an episode file, in our own words: never the file's bytes (numpy's errors quote them)."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One array of an episode file: where its data starts, and what its header declares."""

    name: str | None  # the .npz member name, or None for a .npy file
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def declared_bytes(self) -> int:
        return int(self.dtype.itemsize) * math.prod(self.shape)


def read_header(f, available: int, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """(dtype, shape, fortran order) of one .npy stream of ``available`` bytes, left at its data; checks the
    data the header declares fits in the stream."""
    try:
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(f, max_header_size=2**16)
    except EOFError:
        raise BadFile(f"{where}truncated .npy header") from None
    except (ValueError, SyntaxError, TypeError):
        raise BadFile(f"{where}not a readable numpy file (bad magic string or header)") from None
    shape = tuple(int(n) for n in shape)
    if dtype.hasobject:
        return dtype, shape, bool(fortran)  # refused by the caller, with its own reason; never read
    declared = int(dtype.itemsize) * math.prod(shape)
    if declared > available - f.tell():
        raise BadFile(f"{where}truncated: the header declares {declared:,} bytes of data, the file holds "
                       f"{max(available - f.tell(), 0):,}")
    return dtype, shape, bool(fortran)


def members(path: str, size: int, max_features: int = MAX_FEATURES) -> list[Member]:
    """The arrays of a .npy/.npz file from their headers, reading no data; ambiguous .npz names are refused, and so
    is an .npz of more than ``max_features`` arrays (before any of their headers is read)."""
    if path.lower().endswith(".npy"):
        with open_regular(path) as f:
            dtype, shape, _ = read_header(f, size, "")
            return [Member(None, dtype, shape)]
    with open_regular(path) as f, zipfile.ZipFile(f) as archive:
        names = archive.namelist()
        counts = collections.Counter(names)  # one pass: names.count(n) per name made the scan quadratic in members
        duplicates = sorted(n for n, c in counts.items() if c > 1)
        arrays = sorted(n for n in counts if n.endswith(".npy"))
        clashes = sorted({n[: -len(".npy")] for n in arrays} & counts.keys())
        if duplicates or clashes:
            which = duplicates[:10] or [f"{n!r} and {n + '.npy'!r}" for n in clashes[:10]]
            more = f" and {len(duplicates or clashes) - 10:,} more" if len(duplicates or clashes) > 10 else ""
            raise BadFile(f"ambiguous member names in the .npz ({', '.join(map(str, which))}{more} both name one "
                           "array); re-export it with one member per array")
        if len(arrays) > max_features:
            raise BadFile(f"the .npz holds {len(arrays):,} arrays, over the limit of {max_features:,} features per "
                           "episode; stack arrays that share a shape into one feature")
        found = []
        for member in arrays:
            info = archive.getinfo(member)
            with archive.open(info) as stream:
                dtype, shape, _ = read_header(stream, info.file_size, f"member {member!r}: ")
            found.append(Member(member, dtype, shape))
        return found


def problem(error: Exception) -> str:
    """A reason for an unreadable episode file that quotes none of its content."""
    if isinstance(error, BadFile):
        return str(error)
    if isinstance(error, NotRegularFileError):
        return "not a regular file (a FIFO, device or folder); only regular files are read"
    if isinstance(error, zipfile.BadZipFile):
        return "not a valid .npz (zip) archive"
    if isinstance(error, OSError):
        return f"cannot read: {error.strerror or type(error).__name__}"
    return f"unreadable ({type(error).__name__})"


READ_ERRORS = (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, RuntimeError, NotImplementedError)
