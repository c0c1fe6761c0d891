"""Every environment variable the agent reads is documented.

The settings (eventservice/settings.py and the project modules it imports) are read with `ast`:
each `env_*("NAME", ...)`, `os.environ.get("NAME")`, `os.environ["NAME"]` and `os.getenv("NAME")`.
Each must be a row of README.md's "Configuration" table and a line of `.env.example`. The
variables `scripts/start` reads (`${NAME:-default}`) must be in that table or in "The two
commands", where the README describes the script.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "eventservice" / "settings.py"
START = ROOT / "scripts" / "start"
README = ROOT / "README.md"
ENV_EXAMPLE = ROOT / ".env.example"

NAME = r"[A-Z][A-Z0-9_]*"
SCRIPT_READ = re.compile(r"\$\{(" + NAME + r"):?[-=?+]")
BACKTICKED = re.compile(r"`(" + NAME + r")`")
EXAMPLE_LINE = re.compile(r"^#?\s*(" + NAME + r")=", re.M)


def _constant_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(NAME, node.value):
        return node.value
    return None


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _reads(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            reader = (
                (isinstance(func, ast.Name) and func.id.startswith("env_"))
                or (isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value))
                or (isinstance(func, ast.Attribute) and func.attr == "getenv")
            )
            if reader and (name := _constant_name(node.args[0])):
                names.add(name)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and (name := _constant_name(node.slice)):
            names.add(name)
    return names


def _project_module(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def settings_variables(path: Path = SETTINGS, root: Path = ROOT) -> set[str]:
    """The variables `path` reads, and the project modules it imports (transitively)."""
    names: set[str] = set()
    seen: set[Path] = set()
    todo = [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        tree = ast.parse(current.read_text())
        names |= _reads(tree)
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package import module` imports the module too
                modules += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                modules.extend(alias.name for alias in node.names)
            todo.extend(found for module in modules if (found := _project_module(module, root)))
    return names


def script_variables(path: Path = START) -> set[str]:
    return set(SCRIPT_READ.findall(path.read_text()))


def section(readme: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def table_variables(text: str) -> set[str]:
    """The variables named in the first column of the tables in `text`."""
    names = set()
    for line in text.splitlines():
        if line.startswith("|"):
            names |= set(BACKTICKED.findall(line.split("|")[1]))
    return names


def missing_from_readme(readme: str, *, settings: set[str], script: set[str]) -> list[str]:
    """The variables read but not documented where they belong, in order."""
    configuration = table_variables(section(readme, "Configuration"))
    commands = set(BACKTICKED.findall(section(readme, "The two commands")))
    return sorted((settings - configuration) | (script - configuration - commands))


# --- the repository ---------------------------------------------------------------------------


def test_every_variable_the_settings_and_scripts_start_read_is_in_the_readme():
    missing = missing_from_readme(README.read_text(), settings=settings_variables(), script=script_variables())
    assert not missing, (
        f"README.md does not document {', '.join(missing)}: add each to the table of its "
        "'Configuration' section (or, for a variable only scripts/start reads, to 'The two commands')"
    )


def test_env_example_lists_every_variable_the_settings_read():
    listed = set(EXAMPLE_LINE.findall(ENV_EXAMPLE.read_text()))
    missing = sorted(settings_variables() - listed)
    assert not missing, f".env.example does not list {', '.join(missing)}"


def test_the_scan_finds_the_variables_read_in_each_way():
    assert {"DEBUG", "ENGINE_ENABLED", "Q_CLUSTER_NAME", "SQLITE_CLOSE_CONNECTIONS", "LOG_FORMAT"} <= (
        settings_variables()
    )
    assert {"HOST", "PORT", "PYTHON", "WEB_WORKERS", "WEB_THREADS", "LOG_FORMAT"} <= script_variables()


# --- the check itself, on planted files --------------------------------------------------------

README_TEXT = """# Agent

## The two commands

`scripts/start` listens on `PORT`.

## Configuration

| Variable | Default | Meaning |
|---|---|---|
| `DEBUG` | `false` | Debug mode; see `WEB_THREADS` |
| `LOG_LEVEL` / `EVENT_LOG_LEVEL` | `INFO` / `WARNING` | Logs |

## Scale out

`NEW_KNOB` here does not count.
"""


def test_a_variable_read_but_not_in_the_table_is_named(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "knobs.py").write_text(
        "import os\nTIMEOUT = os.environ.get('HELPER_TIMEOUT', '5')\nPATH = os.environ['HELPER_PATH']\n"
    )
    settings = tmp_path / "settings.py"
    settings.write_text(
        "import os\nfrom core.env import env_bool, env_int\nfrom helpers import knobs\n"
        "DEBUG = env_bool('DEBUG', False)\nKNOB = env_int('NEW_KNOB', 1, minimum=0)\n"
        "LEVEL = os.getenv('LOG_LEVEL', 'INFO')\nlabel = env_int(f'{DEBUG}', 1)\n"
    )
    script = tmp_path / "start"
    script.write_text('PORT="${PORT:-8000}"\nHOST="${HOST:-127.0.0.1}"\necho "${PORT}"\n')

    read = settings_variables(settings, root=tmp_path)
    assert read == {"DEBUG", "NEW_KNOB", "LOG_LEVEL", "HELPER_TIMEOUT", "HELPER_PATH"}
    assert missing_from_readme(README_TEXT, settings=read, script=script_variables(script)) == [
        "HELPER_PATH",
        "HELPER_TIMEOUT",
        "HOST",
        "NEW_KNOB",
    ]


def test_a_variable_named_in_a_tables_meaning_column_does_not_count():
    assert missing_from_readme(README_TEXT, settings={"WEB_THREADS", "EVENT_LOG_LEVEL"}, script=set()) == [
        "WEB_THREADS"
    ]
