"""CONTRIBUTING.md's checklists name files that exist.

Each checklist lists the files a newcomer touches, in order. A file that moves or a package that
is split leaves a checklist sending the newcomer nowhere: this test replays every path the page
names against the tree. A placeholder (`workers/loops/<name>.py`) or a glob
(`templates/dashboard/_*.html`) must match at least one file: the example the newcomer copies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "CONTRIBUTING.md"
CHECKLISTS = ("A new API field", "A new page", "A new loop", "A new channel", "A new command")
# The repository's top-level entries a path may start with; a placeholder may stand for an app.
TOP = (
    "core",
    "tenants",
    "timer",
    "outbox",
    "execution",
    "delivery",
    "orchestration",
    "schedules",
    "workers",
    "eventservice",
    "tests",
    "docs",
    "templates",
    "static",
    "bench",
    "scripts",
)
FILES = ("pyproject.toml", "pytest.ini", "manage.py", "README.md", "CONTRIBUTING.md", ".env.example")
_TOP = "|".join(TOP)
_FILES = "|".join(re.escape(name) for name in FILES)
_SEGMENT = r"[\w<*][\w.<>*-]*"
_PATH = re.compile(rf"(?<![\w/.<>*-])(?P<path>(?:{_TOP}|<\w+>)/(?:{_SEGMENT})?(?:/{_SEGMENT})*/?|{_FILES})(?![\w/])")


def sections(text: str) -> dict[str, str]:
    """The page's sections by heading (### and ##), each with its text up to the next heading."""
    parts = re.split(r"^#{2,3} +(.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def named_paths(text: str) -> list[str]:
    """The paths a piece of the page names: in backticks, in links and in console lines."""
    found = []
    for match in _PATH.finditer(text):
        path = match["path"]
        if path.endswith((".", ",")):
            path = path[:-1]
        found.append(path)
    return found


def missing(paths: list[str]) -> list[str]:
    gone = []
    for path in paths:
        pattern = re.sub(r"<\w+>", "*", path.rstrip("/"))
        matches = list(ROOT.glob(pattern)) if "*" in pattern else [ROOT / pattern]
        if not any(match.exists() and (match.is_dir() or not path.endswith("/")) for match in matches):
            gone.append(path)
    return gone


def test_the_page_has_each_checklist():
    titles = sections(PAGE.read_text())
    for checklist in CHECKLISTS:
        assert checklist in titles, f"CONTRIBUTING.md has no checklist '### {checklist}'"


@pytest.mark.parametrize("checklist", CHECKLISTS)
def test_every_file_a_checklist_names_exists(checklist):
    body = sections(PAGE.read_text())[checklist]
    paths = named_paths(body)
    assert len(paths) >= 5, f"'{checklist}' names only {paths}: has the page's format changed?"
    assert not missing(paths), f"the checklist '{checklist}' names files that are not in the tree: {missing(paths)}"


def test_every_other_file_the_page_names_exists():
    assert not missing(named_paths(PAGE.read_text()))


def test_a_moved_file_fails_its_checklist():
    text = (
        "1. `workers/loops/<name>.py` and `workers/loops/__init__.py`, as `templates/dashboard/_*.html`\n"
        "2. `workers/loop_registry.py`, then `python bench/run.py --quick` and `<app>/management/commands/`\n"
        "3. `delivery/senders.py`.\n"
    )
    paths = named_paths(text)
    assert paths == [
        "workers/loops/<name>.py",
        "workers/loops/__init__.py",
        "templates/dashboard/_*.html",
        "workers/loop_registry.py",
        "bench/run.py",
        "<app>/management/commands/",
        "delivery/senders.py",
    ]
    assert missing(paths) == ["workers/loop_registry.py", "delivery/senders.py"]
