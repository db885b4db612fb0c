"""A labels file's lines, read as text one at a time within bounds: the file opened only when it is a regular
file within ``MAX_LABELS_BYTES`` and not UTF-16 or UTF-32, each line numbered (a line that is not UTF-8 refuses the
file, naming its row), a line over ``MAX_ROW_CHARS`` skipped a piece at a time (never held whole), and what makes a
line no row in either format before it is parsed. Pure Python.

    with open_labels("labels.csv") as f:
        list(numbered_lines("labels.csv", text_of(f)))
        # [(1, 'path,label'), (2, 'a.jpg,cat'), ...]
"""

from __future__ import annotations

import io
import os
import re

from ..format.errors import InputError
from ..format.storage import NotRegularFileError, file_kind, is_url, open_regular

MAX_LABELS_BYTES = 1 << 30  # checked before the file is read
# A longer line is a bad row, skipped a piece at a time (never held whole); csv's own field limit, so no field of a
# row that fits is refused by csv.
MAX_ROW_CHARS = 131_072
SHOWN = 200  # characters of a bad row kept to name it
UNSEEN = re.compile("[\x00\ufeff]")  # in no path or label: a NUL (UTF-16 read as UTF-8), a BOM inside the file
# A byte that is no UTF-8, as surrogateescape decodes it: found on its line, so the error names the row that holds it
# (a strict decoder fails on a whole 8 KiB chunk read ahead, rows before it).
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
_FIX = "fix the labels file (a header row, then one `path,label` row per input)"


def bad_file(path: str, problem: str, fix: str = _FIX) -> InputError:
    return InputError(f"{path}: {problem}; {fix}")


def version(f) -> tuple[int, int]:
    """What says an open file was written to since: its size and modification time."""
    stat = os.fstat(f.fileno())
    return stat.st_size, stat.st_mtime_ns


def open_labels(path: str):
    """The labels file opened in binary, once it is a regular file within the size limit and not UTF-16 or UTF-32."""
    if is_url(path):  # the source tree is local, so is its labels file
        raise bad_file(path, "labels file is a URL, but only a local file is read", "copy it to a local file first "
                       "(gcloud storage cp, curl -o) and pass that")
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise bad_file(path, "labels file not found", "pass the CSV of `path,label` rows (--labels FILE)") from None
    except NotRegularFileError:
        kind = file_kind(os.stat(path).st_mode)
        raise bad_file(path, f"labels file is {kind}, not a regular file", "pass a CSV file") from None
    except OSError as e:
        raise bad_file(path, f"cannot open the labels file ({e.strerror})", "make it readable") from None
    size = os.fstat(f.fileno()).st_size
    if size > MAX_LABELS_BYTES:
        f.close()
        raise bad_file(path, f"labels file of {size:,} bytes is over the {MAX_LABELS_BYTES:,}-byte limit",
                       "split the dataset, or shorten the paths")
    start = f.peek(4)[:4]
    wide = "UTF-32" if start in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff") else \
        "UTF-16" if start[:2] in (b"\xff\xfe", b"\xfe\xff") else None
    if wide is not None:
        f.close()
        raise bad_file(path, f"is {wide} text (a spreadsheet's 'Unicode text')", "save the labels file as UTF-8 "
                       "(CSV UTF-8)")
    return f


def text_of(binary) -> io.TextIOWrapper:
    """The labels file as text: lines end at ``\\n``; a byte that is no UTF-8 kept as a surrogate escape, for
    ``numbered_lines`` to name its row; a spreadsheet's byte-order mark (utf-8-sig) not part of the first column's
    name."""
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors="surrogateescape", newline="\n")


def _not_utf8(path: str, number: int, line: str) -> InputError:
    raw = line.encode("utf-8", "surrogateescape")
    at = max(0, raw.find(_NOT_UTF8.search(line).group().encode("utf-8", "surrogateescape")) - 20)
    return bad_file(path, f"row {number} is not UTF-8 text (got {raw[at:at + 40]!r}; Latin-1 or Windows-1252, as "
                    "older spreadsheets save a CSV?)", "save the labels file as UTF-8 (CSV UTF-8), or convert it: "
                    "iconv -f cp1252 -t utf-8")


class TooLong(str):
    """A line over ``MAX_ROW_CHARS``: its first characters, to name it."""


NUL_OR_BOM = "holds a NUL or a byte-order mark (files joined together, or UTF-16?); save the labels file as UTF-8 text"


def line_problem(line: str) -> str | None:
    """What makes a line no row in either format, before it is parsed, or None."""
    if isinstance(line, TooLong):
        return f"is over {MAX_ROW_CHARS:,} characters; shorten the row"
    if UNSEEN.search(line):
        return NUL_OR_BOM
    if "\r" in (line[:-1] if line.endswith("\r") else line):  # \r\n ends a line, a \r inside it is no line end
        return ("holds a carriage return inside the line (lines ending in \\r alone, or files joined together?); save "
                "the labels file with lines ending in \\n or \\r\\n")
    return None


def numbered_lines(path: str, text):
    """``(number, line)`` without its line end, blank lines left out; a line over ``MAX_ROW_CHARS`` is a
    ``TooLong``, read a piece at a time and never held whole. A file still growing is read no further than the
    size limit (a character is at least a byte). ``text``: ``text_of`` the file.

    Raises:
      InputError: a line that is not UTF-8, naming its row; a file grown past the size limit.
    """
    number = read = 0
    while line := text.readline(MAX_ROW_CHARS + 1):
        number += 1
        read += len(line)
        if len(line) > MAX_ROW_CHARS and not line.endswith("\n"):
            while (rest := text.readline(MAX_ROW_CHARS)) and not rest.endswith("\n") and read <= MAX_LABELS_BYTES:
                read += len(rest)
            yield number, TooLong(line[:SHOWN])
        elif line.strip():
            if _NOT_UTF8.search(line) and "\x00" not in line:  # a NUL: UTF-16 or UTF-32, as line_problem says
                raise _not_utf8(path, number, line)
            yield number, line[:-1] if line.endswith("\n") else line
        if read > MAX_LABELS_BYTES:
            raise bad_file(path, f"labels file grew past the {MAX_LABELS_BYTES:,}-byte limit while it was read",
                           "let whatever writes it finish, or split the dataset")
