"""Every command of this project's apps has a working `--help` that says what it does.

The commands are found as `manage.py help` finds them, so a command added later is checked
without touching this file; Django's and django-q2's commands are theirs to document.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import get_commands

from tests.commands.cli import run_manage

ROOT = Path(__file__).resolve().parents[2]


def project_commands() -> list[str]:
    """The commands of the apps whose code is in this repository (not in the venv)."""
    ours = {
        config.name
        for config in apps.get_app_configs()
        if Path(config.path).is_relative_to(ROOT) and not Path(config.path).is_relative_to(ROOT / ".venv")
    }
    return sorted(name for name, app in get_commands().items() if app in ours)


def description(help_text: str) -> str | None:
    """The paragraph after the usage block, unless it is the first option heading."""
    paragraphs = [p for p in help_text.split("\n\n") if p.strip()]
    if len(paragraphs) < 2 or not paragraphs[0].startswith("usage:"):
        return None
    text = " ".join(paragraphs[1].split())
    return None if text.endswith(":") or text.startswith(("positional arguments:", "options:")) else text


def test_the_project_commands_are_found():
    found = project_commands()
    expected = {"add_member", "create_api_key", "create_tenant", "list_calls", "seed_demo", "submit_call"}
    assert expected <= set(found), found
    assert "qcluster" not in found and "migrate" not in found


@pytest.mark.parametrize("name", project_commands())
def test_its_help_works_and_says_what_it_does(name):
    result = run_manage(name, "--help")
    assert result.code == 0, result.err
    assert result.out.startswith(f"usage: manage.py {name} ")
    text = description(result.out)
    assert text, f"{name} --help has no description: give the command a `help`"
    assert len(text.split()) >= 5, f"{name} --help says too little: {text!r}"


def test_a_help_without_a_description_is_caught():
    bare = (
        "usage: manage.py bare [-h] [--version]\n\n"
        "options:\n  -h, --help  show this help message and exit\n  --version  Show program's version number.\n"
    )
    assert description(bare) is None
    assert description(bare.replace("\n\noptions:", "\n\nDo the thing, and say so.\n\noptions:")) == (
        "Do the thing, and say so."
    )
