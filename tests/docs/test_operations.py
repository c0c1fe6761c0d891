"""docs/operations.md: its sessions, replayed command by command on a fresh database, print what the
page shows.

What differs from run to run is matched, not compared: a generated password, API keys and their
prefixes, times. A key prefix the page shows is mapped to the one this run made, so that a later
command naming it (`revoke_api_key acme sa_…`) names this run's key.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
FENCE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
EXIT = re.compile(r"\(exit (\d+)\)")
# What a page may show for each volatile value, and the pattern this run's output must match.
KEY = re.compile(r"sa_[A-Za-z0-9_-]{43}")
# A prefix as listed: 10 characters, then "…", a quote or the end of a word (never more key).
PREFIX = re.compile(r"sa_[A-Za-z0-9_-]{7}(?![A-Za-z0-9_-])")
TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d{3})?Z")
GENERATED = "Password (store it now; it is not shown again):"
# The password the page's --password-stdin example reads from the environment.
STDIN_PASSWORD = "a-long-passphrase-from-the-store"


def sessions(path: Path = DOC) -> list[list[tuple[str, list[str], int]]]:
    """Each console block as (command, output lines, exit status) steps."""
    found = []
    for body in FENCE.findall(path.read_text()):
        steps: list[tuple[str, list[str], int]] = []
        command, output = None, []
        for line in body.splitlines():
            if line.startswith("$ "):
                command, output = line[2:], []
            elif EXIT.fullmatch(line):
                assert command is not None, f"{path.name}: an exit line without a command"
                steps.append((command, output, int(EXIT.fullmatch(line).group(1))))
                command = None
            elif command is not None and line:
                output.append(line)
        found.append(steps)
    return found


def environment(data_dir: Path) -> dict[str, str]:
    """A shell's environment for the agent on a fresh SQLite database in data_dir."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "PYTEST", "SECURE_", "SESSION_", "CSRF_"))
        and key not in ("DATABASE_URL", "SECRET_KEY_FILE", "DATA_DIR")
    }
    env.update(
        {
            "DATA_DIR": str(data_dir),
            "DATABASE_URL": f"sqlite:///{data_dir / 'event_service.db'}",
            "SECRET_KEY": "operations-doc-replay-key-not-secret-0123456789abcdefghij",
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "ERIN_PASSWORD": STDIN_PASSWORD,
        }
    )
    return env


def run(command: str, env: dict[str, str]) -> tuple[list[str], int]:
    """One command as a shell runs it, from the repository root; stderr and stdout in order."""
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if line], done.returncode


def prepare(data_dir: Path) -> dict[str, str]:
    """A fresh database with the tenants the page starts from."""
    env = environment(data_dir)
    for command in ("python manage.py migrate -v0", "python manage.py create_tenant acme -v0"):
        lines, status = run(command, env)
        assert status == 0, lines
    lines, status = run("python manage.py create_tenant globex -v0", env)
    assert status == 0, lines
    return env


def _pattern(shown: str) -> re.Pattern:
    """A page's line as a pattern: its volatile values match any value of their kind."""
    parts = re.split(f"({KEY.pattern}|{PREFIX.pattern}|{TIME.pattern})", shown)
    regex = ""
    for index, part in enumerate(parts):
        if index % 2 == 0:
            regex += re.escape(part)
        elif KEY.fullmatch(part):
            regex += f"({KEY.pattern})"
        elif TIME.fullmatch(part):
            regex += f"({TIME.pattern})"
        else:
            regex += f"({PREFIX.pattern})"
    return re.compile(regex)


def compare(shown: list[str], actual: list[str], prefixes: dict[str, str]) -> list[str]:
    """Differences between a step's shown and actual output; learns key prefixes on the way."""
    problems = []
    if len(shown) != len(actual):
        return [f"{len(shown)} lines shown, {len(actual)} printed:\n" + "\n".join(actual)]
    previous = ""
    for page, real in zip(shown, actual, strict=True):
        if previous == GENERATED:
            if not re.fullmatch(r"[A-Za-z0-9_-]{24}", real):
                problems.append(f"not a generated password: {real!r}")
        else:
            match = _pattern(page).fullmatch(real)
            if match is None:
                problems.append(f"shown:   {page}\nprinted: {real}")
            else:
                for doc_prefix, run_prefix in zip(PREFIX.findall(page), PREFIX.findall(real), strict=True):
                    prefixes.setdefault(doc_prefix, run_prefix)
        previous = page
    return problems


def replay(env: dict[str, str]) -> list[str]:
    problems = []
    prefixes: dict[str, str] = {}
    for steps in sessions():
        for command, shown, status in steps:
            live = PREFIX.sub(lambda m: prefixes.get(m.group(0), m.group(0)), command)
            actual, code = run(live, env)
            if code != status:
                problems.append(f"$ {command}\n  exit {code}, shown {status}: {actual}")
            problems += [f"$ {command}\n  {problem}" for problem in compare(shown, actual, prefixes)]
    return problems


def test_the_sessions_print_what_the_page_shows(tmp_path):
    steps = [step for session in sessions() for step in session]
    assert len(steps) >= 10, "docs/operations.md: its sessions were not found"
    problems = replay(prepare(tmp_path))
    assert not problems, "\n".join(problems)


def test_every_command_of_the_page_is_in_a_replayed_session():
    """Commands outside console sessions (in bash blocks) would go untested: the page has none."""
    text = DOC.read_text()
    assert "```bash" not in text and "```sh" not in text


def test_the_comparison_catches_a_wrong_line(tmp_path):
    prefixes: dict[str, str] = {}
    shown = ["Created API key sa_vFccrCw… for tenant acme (cron)."]
    assert compare(shown, ["Created API key sa_Q1w2E3r… for tenant acme (cron)."], prefixes) == []
    assert prefixes == {"sa_vFccrCw": "sa_Q1w2E3r"}
    assert compare(shown, ["Created API key sa_Q1w2E3r… for tenant globex (cron)."], {})
    assert compare(["Password (store it now; it is not shown again):", "x" * 24], [GENERATED, "short"], {})
