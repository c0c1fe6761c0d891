"""The pages, the README's "Try it" and the docs call the pages by the same names: the ones
the navigation shows ("Calls", "New request")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLD_NAMES = ("All calls", "New call")


def _nav_links(html: str) -> set[str]:
    nav = re.search(r'<nav class="mainnav".*?</nav>', html, re.S).group(0)
    return {text.strip() for text in re.findall(r">([^<]+)</a>", nav)}


def _title(html: str) -> str:
    return re.search(r"<title>(.*?) · Service Agent</title>", html).group(1)


def test_the_pages_are_titled_as_the_navigation_names_them(owner_client, world):
    calls = owner_client.get("/calls/").content.decode()
    request = owner_client.get("/calls/new/").content.decode()
    assert {"Calls", "New request"} <= _nav_links(calls)
    assert _title(calls) == "Calls" and "<h1>Calls</h1>" in calls
    assert _title(request) == "New request" and "<h1>New request</h1>" in request


def test_the_readmes_try_it_names_the_pages_as_the_navigation_does(owner_client, world):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\*\*([^*]+)\*\*", section))
    assert named, "the Try it section names no page"
    assert named <= _nav_links(owner_client.get("/calls/").content.decode())


def test_no_page_template_readme_or_doc_uses_the_old_names():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "templates").rglob("*.html"))]
    offenders = [
        f"{path.relative_to(ROOT)}: {name}" for path in files for name in OLD_NAMES if name in path.read_text()
    ]
    assert offenders == []
