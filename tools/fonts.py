"""Text on preview pictures in any script a font on the machine has, and a visible placeholder for the rest.

Pillow's default font (Aileron, Latin only) draws its missing-glyph box for a Cyrillic, Greek or CJK
class name. DejaVu Sans has Latin, Greek, Cyrillic, Armenian, Georgian, Hebrew, Arabic and more:
matplotlib ships it (the ``preview`` extra) and most Linux systems have it. Each character is drawn
with the first font that has a glyph for it; one that none has gets matplotlib's Last Resort glyph
(a box naming its Unicode block) or, without matplotlib, an outlined box: a visible placeholder,
never another character's glyph. No font is read until a sheet is drawn.

    labeller = Labeller(default_fonts())
    labeller.draw(ImageDraw.Draw(sheet), (4, 4), "Кошка · γάτα · 猫", width=142, fill=(20, 20, 20))
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Sequence

from PIL import ImageDraw, ImageFont

FONT_SIZE = 10  # pixels; a caption is 16 pixels tall
# Common homes of the scripts DejaVu lacks (CJK, Indic, Thai, ...); Pillow looks a bare file name up in the
# system's font folders (on Linux, every fonts/ folder of XDG_DATA_DIRS), so a missing one costs one search.
SYSTEM_FONTS = ("DejaVuSans.ttf", "NotoSans-Regular.ttf", "NotoSansCJK-Regular.ttc", "DroidSansFallbackFull.ttf",
                "arialuni.ttf")
_UNMAPPED = "\U0010ffff"  # a noncharacter, which no font maps: what a font draws for it is its missing-glyph box
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _matplotlib_fonts() -> str | None:
    """matplotlib's font folder, found without importing matplotlib (its start-up is not needed to read a file)."""
    try:
        spec = importlib.util.find_spec("matplotlib")
    except (ImportError, ValueError):  # ValueError: a half-imported or stubbed-out matplotlib
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], "mpl-data", "fonts", "ttf")
    return folder if os.path.isdir(folder) else None


def default_fonts() -> list[str]:
    """The fonts labels try, in order: matplotlib's DejaVu Sans (when it is installed), ``SYSTEM_FONTS``, then
    matplotlib's Last Resort, which has a placeholder glyph for every character and so comes last."""
    folder = _matplotlib_fonts()
    if folder is None:
        return list(SYSTEM_FONTS)
    return [os.path.join(folder, "DejaVuSans.ttf"), *SYSTEM_FONTS, os.path.join(folder, "LastResortHE-Regular.ttf")]


@functools.lru_cache(maxsize=32)
def _load(name: str, size: int):
    try:
        return ImageFont.truetype(name, size)
    except (OSError, ImportError):  # not on this machine (or a Pillow built without FreeType)
        return None


def _mask(face, text: str) -> tuple:
    mask = face.getmask(text)
    return mask.size, bytes(mask)


class Labeller:
    """Draws one line of text cut to a width, each character in the first of ``fonts`` that has it.

    Args:
      fonts: font files, or file names Pillow finds in the system's font folders; ones that do not load are
        skipped. Pillow's own font (Latin) is always tried after them, so ``()`` means Pillow alone.
      size: pixels.
    """

    def __init__(self, fonts: Sequence[str], size: int = FONT_SIZE):
        loaded = [face for face in (_load(str(name), size) for name in fonts) if face is not None]
        self.faces = loaded + [ImageFont.load_default(size)]
        self.size = size
        self._missing = [_mask(face, _UNMAPPED) for face in self.faces]
        self._chosen: dict[str, int | None] = {}

    def face_of(self, char: str):
        """The first font with a glyph for ``char`` (white space: the first font), or None: the placeholder."""
        if char not in self._chosen:
            if char.isspace():  # a space draws nothing, which is also what a font with an empty missing glyph draws
                self._chosen[char] = 0
            elif "\ud800" <= char <= "\udfff":  # half of a pair (a file name's undecodable byte): no character
                self._chosen[char] = None
            else:
                self._chosen[char] = next((i for i, (face, missing) in enumerate(zip(self.faces, self._missing))
                                           if _mask(face, char) != missing), None)
        index = self._chosen[char]
        return None if index is None else self.faces[index]

    def runs(self, text: str) -> list[tuple[str, object]]:
        """``text`` cut into runs of one font each (so shaping and kerning work inside a run): ``(text, font or
        None)``."""
        runs: list[tuple[str, object]] = []
        for char in text:
            face = self.face_of(char)
            if runs and runs[-1][1] is face:
                runs[-1] = (runs[-1][0] + char, face)
            else:
                runs.append((char, face))
        return runs

    @property
    def _box(self) -> int:
        return max(3, round(self.size * 0.6))

    def length(self, text: str) -> float:
        """Width in pixels of ``text`` as ``draw`` draws it."""
        return sum(self._box * len(run) if face is None else face.getlength(run) for run, face in self.runs(text))

    def fit(self, text: str, width: float) -> str:
        """``text`` on one line (a control character, such as a newline in a file name, becomes "?"), cut (with …)
        to ``width`` pixels."""
        text = _CONTROL.sub("?", text)
        if self.length(text) <= width:
            return text
        low, high = 0, len(text)  # the longest prefix that fits with "…": a binary search, not a cut per character
        while low < high:
            middle = (low + high + 1) // 2
            if self.length(text[:middle] + "…") <= width:
                low = middle
            else:
                high = middle - 1
        return text[:low] + "…"

    def draw(self, draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, width: float, fill) -> None:
        """Draws ``fit(text, width)`` with its top-left at ``xy``, every run on the first font's baseline."""
        x, top = xy
        first = self.faces[0]
        baseline = top + (first.getmetrics()[0] if hasattr(first, "getmetrics") else self.size)
        for run, face in self.runs(self.fit(text, width)):
            if face is None:
                for _ in run:  # an outlined box per character no font has
                    draw.rectangle((x + 1, baseline - round(self.size * 0.75), x + self._box - 1, baseline),
                                   outline=fill)
                    x += self._box
                continue
            if isinstance(face, ImageFont.FreeTypeFont):
                draw.text((x, baseline), run, font=face, fill=fill, anchor="ls")
            else:  # Pillow's bitmap font takes no anchor
                draw.text((x, top), run, font=face, fill=fill)
            x += face.getlength(run)
