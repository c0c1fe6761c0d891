"""The examples in README.md and docs/*.md work on any day.

A due time written into an example (`--due ...` of a command, `"dueAt": "..."` of a request)
goes stale: the API refuses one more than a year ahead, and one in the past runs at once
instead of when the example says. Examples compute the time (`DUE=$(date -u -d '+1 hour' ...)`)
or use `--in 30s`; output shown after a command may carry dates, it depends on none.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
ISO = r"(\d{4}-\d{2}-\d{2}(?:[T ][0-9:.]+)?(?:Z|[+-]\d{2}:?\d{2})?)"
# A due time the example sends: a command's --due, or dueAt in a request it sends (not in a
# response it shows, which is output).
DUE_INPUT = re.compile(r"--due[ =]['\"]?" + ISO + r"|\"dueAt\"\s*:\s*\"" + ISO + '"')


def _example_lines(path: Path) -> list[str]:
    """Lines of the fenced blocks that are commands: a `$ ` prompt in a console block, every
    line of a bash block (its continuation lines included)."""
    lines = []
    for block in FENCE.finditer(path.read_text()):
        body = block.group(1)
        if "$ " in body and block.group(0).startswith("```console"):
            lines += [line for line in body.splitlines() if line.startswith("$ ")]
        elif block.group(0).startswith(("```bash", "```sh", "```shell")):
            lines += body.splitlines()
    return lines


def _instant(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def fixed_due_times(path: Path) -> list[str]:
    return [a or b for line in _example_lines(path) for a, b in DUE_INPUT.findall(line)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_example_sends_a_due_time_that_is_past_or_more_than_a_year_ahead(path):
    now = datetime.now(UTC)
    stale = [due for due in fixed_due_times(path) if not now < _instant(due) <= now + timedelta(days=365)]
    assert not stale, f"{path.name}: compute the time in the shell or use --in; stale: {stale}"


def test_the_scan_finds_due_times_in_commands_and_requests(tmp_path):
    doc = tmp_path / "example.md"
    doc.write_text(
        "```bash\n"
        'curl -d \'{"name": "x",\n'
        '     "dueAt": "2030-01-01T09:00:00Z"}\'\n'
        "```\n\n"
        "```console\n"
        "$ python manage.py submit_call --due 2027-01-01T09:00:00+01:00\n"
        '  "dueAt": "2020-01-01T00:00:00.000Z",\n'
        "```\n"
    )
    assert fixed_due_times(doc) == ["2030-01-01T09:00:00Z", "2027-01-01T09:00:00+01:00"]


def test_the_readme_and_commands_examples_compute_their_due_times():
    for path in (ROOT / "README.md", ROOT / "docs" / "commands.md"):
        assert fixed_due_times(path) == [], path.name
        assert "date -u -d '+" in path.read_text(), path.name
