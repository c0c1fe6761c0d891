"""Citations of a heading name one that exists.

Code and docs cite the project's pages by heading, never by item number: a page's path from the
repository's root, or a Markdown link to it, then the heading in quotes (`docs/events.md, "Fair
shares"`, `bench/HISTORY.md, 'Before and after: cheaper tries'`). A heading renamed or moved
leaves such a citation pointing nowhere; this test finds it. What counts as a heading: a
Markdown heading, cited with or without its section number ("8. Upgrades" as "Upgrades") and
without a date or note in brackets at its end; and a paragraph's or list item's bold lead-in,
the pages' smallest sections ("**Due order.** Held calls start ...")."""

from __future__ import annotations

import re
from pathlib import Path

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]
SUFFIXES = {".py", ".md", ".html", ".js", ".toml", ".txt"}
SKIP = {".git", ".venv", "node_modules", "data", "test-artifacts", "results", "__pycache__"}

_SEP = r"(?:[,:]?[ \t]*\n[ \t]*(?:#|\*|//)?[ \t]*|,[ \t]*|[ \t]+)"
_QUOTED = r"""(?:"(?P<dq>[^"\n]+(?:\n[^"\n]+)?)"|“(?P<cq>[^”\n]+(?:\n[^”\n]+)?)”|'(?P<sq>(?:[^'\n]|'(?=[A-Za-z])|\n(?!\s*\n))+?)'(?![A-Za-z]))"""
# A page named by its path from the repository's root, or a Markdown link to it.
PLAIN = re.compile(r"(?<![\w/.\[-])(?P<page>(?:docs|bench)/[\w-]+\.md|README\.md|CONTRIBUTING\.md)" + _SEP + _QUOTED)
LINKED = re.compile(r"\]\((?P<href>[^)#\s]+\.md)\)" + _SEP + _QUOTED)
HEADING = re.compile(r"^#{1,6}[ \t]+(?:\d+\.[ \t]+)?(?P<text>.+?)[ \t]*#*[ \t]*$")
LEAD_IN = re.compile(r"^(?:[ \t]*(?:[-*]|\d+\.)[ \t]+)?\*\*(?P<text>[^*]+?)[.:]?\*\*")


def headings(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line) or LEAD_IN.match(line)):
            found.add(match["text"])
    return found


def _normal(text: str) -> str:
    return re.sub(r"\s*\n\s*(?:#|\*|//)?\s*", " ", text).strip()


def names_a_heading(cited: str, known: set[str]) -> bool:
    cited = re.sub(r"^\d+\.\s+", "", cited)
    return any(heading == cited or heading.startswith(f"{cited} (") for heading in known)


def citations(path: Path) -> list[tuple[int, Path, str]]:
    text = path.read_text(errors="replace")
    found = []
    for pattern in (PLAIN, LINKED):
        for match in pattern.finditer(text):
            if "page" in pattern.groupindex:
                page = ROOT / match["page"]
            else:
                page = (path.parent / match["href"]).resolve()
            cited = _normal(match["dq"] or match["cq"] or match["sq"])
            found.append((text.count("\n", 0, match.start()) + 1, page, cited))
    return found


def _files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT).parts
        if path.suffix in SUFFIXES and path.is_file() and not SKIP.intersection(relative) and path != THIS:
            found.append(path)
    return sorted(found)


def stale_citations() -> list[str]:
    known: dict[Path, set[str]] = {}
    stale = []
    for path in _files():
        for line, page, cited in citations(path):
            if not page.is_file():
                stale.append(f"{path.relative_to(ROOT)}:{line}: {page.name} does not exist (cites {cited!r})")
                continue
            if page not in known:
                known[page] = headings(page)
            if not names_a_heading(cited, known[page]):
                where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
                stale.append(f"{path.relative_to(ROOT)}:{line}: {where} has no heading {cited!r}")
    return stale


def test_every_cited_heading_exists():
    stale = stale_citations()
    assert not stale, "citations of headings that do not exist:\n" + "\n".join(stale)


def test_a_citation_is_found_in_its_forms_and_checked(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "# Page\n\n## 2. Fair shares\n\n### Before and after: a step (2026-11-27)\n\n"
        "- **Due order.** Held calls start oldest due first.\n\n```\n# not a heading\n```\n"
    )
    source = tmp_path / "docs" / "other.md"
    source.write_text(
        'As [page.md](page.md), "Fair shares" says, and [page.md](page.md), "Before and after:\n'
        "a step\" too, and [page.md](page.md), 'Due order'; [page.md](page.md), 'not a heading'"
        " does not.\n"
    )
    found = citations(source)
    assert [(page_, cited) for _, page_, cited in found] == [
        (page, "Fair shares"),
        (page, "Before and after: a step"),
        (page, "Due order"),
        (page, "not a heading"),
    ]
    known = headings(page)
    assert [names_a_heading(cited, known) for _, _, cited in found] == [True, True, True, False]


def test_a_python_comment_citing_across_lines_is_read_whole():
    text = '# the loop (docs/architecture.md, "Where the\n# loops run: inside django-q2") and\n'
    match = PLAIN.search(text)
    assert match is not None
    assert match["page"] == "docs/architecture.md"
    assert _normal(match["dq"]) == "Where the loops run: inside django-q2"
