"""Running management commands in tests: through call_command, and as `manage.py` runs them."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError


@dataclass
class Result:
    code: int
    out: str
    err: str


def call(name: str, *args: str) -> Result:
    """call_command with captured output; a CommandError becomes its exit code and message."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=err)
    except CommandError as exc:
        return Result(exc.returncode, out.getvalue(), err.getvalue() + str(exc))
    return Result(0, out.getvalue(), err.getvalue())


def run_manage(*argv: str) -> Result:
    """The command line path of `manage.py` (argument parsing, exit code, stderr).

    Django closes the database connections after a command run from the command line, so a
    test using this needs the transactional database.
    """
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", *argv, "--skip-checks"]).execute()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return Result(code, out.getvalue(), err.getvalue())
