"""A line of a labels file as its fields, in either format: CSV in the delimiter its header uses, or JSON Lines
by the first object's keys. Pure Python.

Each line is parsed on its own: a field never spans lines (``label_rows``). A line that gives no fields gives the
problem with it instead, a text ending in its fix.
"""

from __future__ import annotations

import csv
import json
import unicodedata

MULTI_SEPARATOR = ";"
DELIMITERS = (",", "\t", ";")  # a CSV's delimiter: the first of these its header holds


def fold(text: str) -> str:
    """``text`` in Unicode NFC: ``café`` typed (NFC) and ``café`` as macOS writes it (NFD) are one name."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def column_key(name: str) -> str:
    """How a column name is matched: stripped, NFC, ignoring case (``" Split"`` is ``split``)."""
    return fold(name.strip()).casefold()


class _OneLine:
    """csv.reader's input, one line at a time: a quote left open then ends with its line (a bad row) instead of
    reading on through every later line."""

    def __init__(self):
        self.line: str | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line, self.line = self.line, None
        if line is None:
            raise StopIteration
        return line


class Csv:
    """A CSV's lines as fields, each line parsed on its own in the header's delimiter."""

    def __init__(self, header_line: str, delimiter: str | None = None):
        """``delimiter``: as Excel's ``sep=`` line names it, else the first of ``DELIMITERS`` the header holds."""
        self.delimiter = delimiter or next((d for d in DELIMITERS if d in header_line), ",")
        self._line = _OneLine()
        # skipinitialspace: `a.jpg, "cat, big"` as written by hand is a quoted field, not one holding the quotes
        self._reader = csv.reader(self._line, delimiter=self.delimiter, skipinitialspace=True, strict=True)

    def describe(self) -> str:
        return "CSV" if self.delimiter == "," else f"CSV separated by {self.delimiter!r}"

    def fields(self, line: str) -> list[str] | str:
        """The line's fields, or the problem with it and the fix."""
        self._line.line = line[:-1] if line.endswith("\r") else line
        try:
            return next(self._reader, [])
        except csv.Error as e:
            return (f"does not parse as CSV ({e}); close each quote on its line, and quote a field holding a quote "
                    f"or a {self.delimiter!r}")


class _Number(str):
    """A JSON number as the file writes it (``1e-05``): a label's kind is decided over the text, never rounded."""


class _Pairs(list):
    """A JSON object's ``(key, value)`` pairs in order, so a key given twice is seen (``json`` keeps the last)."""


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")


_DECODER = json.JSONDecoder(object_pairs_hook=_Pairs, parse_float=_Number, parse_int=_Number,
                            parse_constant=_no_constant)

_JSON_PROBLEMS = {  # what JsonLines says of a line that is no row, and the fix
    "not an object": "is not a JSON object of the columns; write one object per line",
    "keys": "has other keys than the first line; give every line the first line's keys",
    "value": "has a value that is not a text, a number or a list of them (null, true, an object, a mixed list); "
             "give each key a text, a number, or a list of names or of numbers",
    "width": "has a list of numbers of another length than the first line's; give every line's list as many "
             "numbers",
}


class JsonLines:
    """JSON Lines as fields: the first object's keys are the header, each object a row of texts in that order (keys
    matched ignoring case). A list of names is one ``;``-joined text (its key is then in ``listed``: multi-label), a
    list of numbers that many columns."""

    def __init__(self, line: str):
        """Reads the header from the first line; ``problem`` says why it gives none (the file is then unread)."""
        record, self.problem = self._decode(line)
        self.header: list[str] = []  # a list of numbers spreads over as many columns: key[0], key[1], ...
        self.first: list[str] | str = []
        if not isinstance(record, _Pairs) or not record:
            self.problem = self.problem or f"is not a JSON object of the columns (got {line!r:.80})"
            return
        self.listed: set[str] = set()
        self._keys: list[str] = []
        self._widths: dict[str, int] = {}
        for key, value in record:
            folded = column_key(key)
            texts = self._texts(value, folded) or [""]
            self._keys.append(folded)
            self._widths.setdefault(folded, len(texts))
            self.header += [key] if len(texts) == 1 else [f"{key}[{i}]" for i in range(len(texts))]
        self.first: list[str] | str = self.fields(line)

    @staticmethod
    def describe() -> str:
        return "JSON Lines"

    @staticmethod
    def _decode(line: str) -> tuple[object, str | None]:
        """The line's JSON value, or None and the problem with the fix."""
        try:
            return _DECODER.decode(line), None
        except RecursionError:
            return None, "is nested too deep for a row; write one flat object per line"
        except ValueError as e:
            return None, f"is not JSON ({e}); write one JSON object per line"

    def _texts(self, value, key: str) -> list[str] | None:
        if isinstance(value, str):
            return [str(value)]
        if isinstance(value, list) and not isinstance(value, _Pairs):
            if all(isinstance(v, str) and not isinstance(v, _Number) for v in value):
                self.listed.add(key)  # a list is multi-label however long: ["cat"] and [] too
                return [MULTI_SEPARATOR.join(value)]
            if value and all(isinstance(v, _Number) for v in value):
                return [str(v) for v in value]
        return None

    def fields(self, line: str) -> list[str] | str:
        """The line's fields in the header's order, or the problem with it and the fix."""
        record, problem = self._decode(line)
        if problem is not None:
            return problem
        if not isinstance(record, _Pairs) or not record:
            return _JSON_PROBLEMS["not an object"]
        values: dict[str, list] = {}
        for key, value in record:
            values.setdefault(column_key(key), []).append(value)
        if values.keys() != set(self._keys) or any(len(v) > 1 for v in values.values()):
            return _JSON_PROBLEMS["keys"]
        fields = []
        for key in self._keys:
            texts = self._texts(values[key][0], key)
            if texts is None:
                return _JSON_PROBLEMS["value"]
            if len(texts) != self._widths[key]:
                return _JSON_PROBLEMS["width"]
            fields += texts
        return fields
