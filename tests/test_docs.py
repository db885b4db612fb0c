"""The README and docs/: every relative link reaches its file, every ``#anchor`` a heading of its page.

The pages are read from disk (``README.md`` and ``docs/**/*.md``), so a page that is linked but missing — such as a
generated reference page not generated yet — fails its link's check. Links to other sites are not fetched; links
inside fenced code blocks and inline code are not links. Anchors follow GitHub's heading slugs: lowercase, spaces
to ``-``, punctuation dropped except ``-`` and ``_``, a repeated heading's slug suffixed ``-1``, ``-2``, ...
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
README_MAX_LINES = 220

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# [text](target "title") and ![alt](target); the text may hold one level of brackets (an image inside a link).
_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\(\s*(<[^>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*(<[^>\n]*>|\S+)", re.MULTILINE)
_ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_ISSUE_NUMBER = re.compile(r"\bissues?\b[\s#:]*\d", re.IGNORECASE)


def prose(text: str) -> str:
    """``text`` with fenced code blocks and inline code blanked out (newlines kept, so offsets keep their line)."""
    lines, fence = text.split("\n"), None
    for i, line in enumerate(lines):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            lines[i] = ""
        elif fence is not None:
            closing = _FENCE.match(line)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence) \
                    and not line.strip().lstrip(fence[0]):
                fence = None
            lines[i] = ""
    return _INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "\n".join(lines))


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every inline link, image and link definition outside code."""
    found = []

    def scan(chunk: str, offset: int) -> None:
        for m in _LINK.finditer(chunk):
            found.append((offset + m.start(2), m.group(2).strip("<>")))
            scan(m.group(1), offset + m.start(1))  # an image inside a link's text

    body = prose(text)
    scan(body, 0)
    found += [(m.start(1), m.group(1).strip("<>")) for m in _DEFINITION.finditer(body)]
    return sorted((body.count("\n", 0, at) + 1, target) for at, target in found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: ``"Safety: what tfshard never does"`` →
    ``safety-what-tfshard-never-does``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (numbered when repeated) and ``<a name=/id=>`` targets."""
    lines, seen, result = prose(text).split("\n"), {}, set()
    raw = text.split("\n")
    for i, line in enumerate(lines):
        heading = None
        atx = _ATX.match(line)
        if atx:
            heading = atx.group(1) or ""
        elif i > 0 and _SETEXT.match(line) and lines[i - 1].strip() and not _ATX.match(lines[i - 1]) \
                and not lines[i - 1].lstrip().startswith(("-", "*", "+", ">", "|")):
            heading = lines[i - 1].strip()
        if heading is None:
            continue
        # Inline code was blanked for finding links; the slug keeps its text, so take the heading from the raw line.
        source = raw[i] if atx else raw[i - 1]
        heading = (_ATX.match(source).group(1) or "") if atx else source.strip()
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    result.update(_HTML_ANCHOR.findall(text))
    return result


def problems(page: Path, root: Path = REPO) -> list[str]:
    """One line per broken link of ``page``: ``file:line: link 'target': problem``."""
    where = page.relative_to(root)
    found, cache = [], {}

    def offered(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    for line, target in links(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # another site (http, https, mailto): not fetched
        path_part, _, anchor = target.partition("#")
        path_part = urllib.parse.unquote(path_part)
        if not path_part:
            path = page
        elif path_part.startswith("/"):
            path = root / path_part.lstrip("/")
        else:
            path = page.parent / path_part
        path = path.resolve()

        def fail(problem: str, line=line, target=target) -> None:
            found.append(f"{where}:{line}: link {target!r}: {problem}")

        if not path.is_relative_to(root.resolve()):
            fail("points outside the repository")
        elif not path.exists():
            fail(f"no such file {path.relative_to(root.resolve())}; fix the link or add the page")
        elif anchor and path.suffix != ".md":
            fail("an #anchor into a file that is not a Markdown page")
        elif anchor and urllib.parse.unquote(anchor) not in offered(path):
            fail(f"no heading of {path.relative_to(root.resolve())} has the anchor #{anchor}; "
                 f"the page offers {sorted(offered(path))[:8]}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = problems(page)
    assert not broken, "\n".join(broken)


def test_the_docs_index_and_the_readme_link_the_generated_reference():
    for page in (REPO / "README.md", DOCS / "README.md"):
        targets = {target.partition("#")[0] for _, target in links(page.read_text(encoding="utf-8"))}
        prefix = "docs/" if page.parent == REPO else ""
        assert {f"{prefix}reference/cli.md", f"{prefix}reference/api.md"} <= targets, page


def test_readme_is_the_short_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (f"README.md: {lines} lines (got more than {README_MAX_LINES}); "
                                       "move detail to docs/")


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(p for p in DOCS.rglob("*") if p.is_file())],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_issue_numbers(page):
    try:
        text = page.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return  # a picture
    hits = [f"{page.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in _ISSUE_NUMBER.finditer(text)]
    assert not hits, "issue numbers mean nothing to a reader; say what was done instead:\n" + "\n".join(hits)


# The checker itself, on pages made in tmp_path.


@pytest.mark.parametrize("heading, expected", [
    ("Safety: what tfshard never does", "safety-what-tfshard-never-does"),
    ("The converter: `tfshard images SRC OUT`", "the-converter-tfshard-images-src-out"),
    ("Network storage (gs://)", "network-storage-gs"),
    ("Sliding windows: `readers.windows()`", "sliding-windows-readerswindows"),
    ("Index files: `--index`", "index-files---index"),
    ("snake_case and  two spaces", "snake_case-and--two-spaces"),
    ("**Bold** and [a link](x.md)", "bold-and-a-link"),
    ("Über größe", "über-größe"),
])
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


def test_checker_finds_broken_files_and_anchors_and_skips_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## Part: one\n\n## Part: one\n\nText\n---\n")
    (tmp_path / "pic.png").write_bytes(b"\x89PNG")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n"
        "[good](docs/other.md#part-one) [second](docs/other.md#part-one-1) [setext](docs/other.md#text)\n"
        "[self](#top) ![pic](pic.png) [web](https://example.com/missing.md) [mail](mailto:a@b.c)\n"
        "[gone](docs/missing.md)\n"
        "[bad anchor](docs/other.md#part-two)\n"
        "[wrapped\ntext](docs/also-missing.md)\n"
        "```bash\n[in a fence](docs/fenced.md)\n```\n"
        "`[inline](docs/inline.md)` and [out](../outside.md)\n"
        "[![badge](pic.png)](docs/nope.md)\n"
        "[ref]: docs/ref-missing.md\n"
    )
    found = problems(page, root=tmp_path)
    assert [line.split(": ", 1)[0] for line in found] == [
        "README.md:4", "README.md:5", "README.md:7", "README.md:11", "README.md:12", "README.md:13"]
    assert "'docs/missing.md': no such file docs/missing.md" in found[0]
    assert "no heading of docs/other.md has the anchor #part-two" in found[1]
    assert "'docs/also-missing.md'" in found[2]
    assert "points outside the repository" in found[3]
    assert "'docs/nope.md'" in found[4] and "'docs/ref-missing.md'" in found[5]
    assert not any("fenced" in line or "inline" in line for line in found)


def test_the_generated_reference_pages_are_current():
    """docs/reference/cli.md and api.md are made from the typer app and the docstrings: `make docs` after a change.
    (Generated in this process, as `make_reference.py --check` does: no TensorFlow process of its own.)"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_reference", DOCS / "make_reference.py")
    make_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_reference)
    for name, text in make_reference.generate().items():
        path = make_reference.PAGES[name]
        assert Path(path).read_text(encoding="utf-8") == text, f"{path}: out of date; run `make docs`"
