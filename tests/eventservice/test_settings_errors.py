"""A malformed or unexpected environment variable stops start-up with one line naming it
(README, "Configuration"): `manage.py` (every command, qcluster included) and gunicorn, each
started for real on eventservice.settings. Switches take what people type."""

from __future__ import annotations

import subprocess

import pytest

from core.env import SettingsError, env_bool, env_choice
from tests.support.agent_process import GUNICORN, ROOT, agent_env, free_port, manage

PREFIX = "Service Agent cannot start: "


def _env(tmp_path, **extra: str) -> dict[str, str]:
    return agent_env(tmp_path, SECRET_KEY="k" * 50, **extra)


def _assert_one_line(result: subprocess.CompletedProcess, name: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(PREFIX), result.stderr
    assert name in result.stderr
    return result.stderr


@pytest.mark.parametrize(
    "name,value",
    [
        ("DEBUG", "maybe"),
        ("METRICS_PUBLIC", "2"),
        ("LOG_LEVEL", "chatty"),
        ("LOG_FORMAT", "xml"),
        ("EVENT_LOG_LEVEL", "loud"),
        ("Q_LOG_LEVEL", "verbose"),
        ("DATABASE_URL", "mysql//agent@db/agent"),
        ("DATA_DIR", "/proc/not-a-place-for-data"),
        ("AGENT_BASE_URL", "127.0.0.1:8000"),
        ("Q_WORKERS", "two"),
        ("TIMER_HORIZON_MS", "5"),
        ("EVENT_DELIVERY_SCHEDULE", "soon"),
        ("DELIVERY_CLAIM_AHEAD", "0"),
        # Digits of other scripts and underscores, which Python's int() reads.
        ("EXECUTION_CONCURRENCY", "4_8"),
        ("CEILING_TEST_PINGS_PER_MINUTE", "\uff11\uff10"),
        ("EXECUTION_PER_TENANT", "999"),
        ("DELIVERY_PER_TENANT", "0"),
        ("NATS_STREAM_SUBJECTS", "serviceagent..>"),
        ("NATS_STREAM_SUBJECTS", ""),
        ("NATS_SUBJECT_TEMPLATE", "{tenantId}.{type}"),  # no fixed first token: outside serviceagent.>
    ],
)
def test_a_malformed_value_stops_manage_py_with_one_line_naming_the_variable(tmp_path, name, value):
    _assert_one_line(manage(_env(tmp_path, **{name: value}), "check"), name)


def test_a_malformed_database_url_is_refused_without_echoing_its_password(tmp_path):
    line = _assert_one_line(manage(_env(tmp_path, DATABASE_URL="postgres://agent:s3cr3t@db:port/agent"), "check"), "")

    assert "DATABASE_URL" in line and "s3cr3t" not in line


@pytest.mark.parametrize("command", [["help"], ["shell", "-c", "print(1)"], ["qcluster"]])
def test_commands_that_django_runs_without_settings_refuse_too(tmp_path, command):
    # Django runs `help` and `shell` without settings when they fail to load (a note at most).
    _assert_one_line(manage(_env(tmp_path, LOG_LEVEL="chatty"), *command, timeout=60), "LOG_LEVEL")


def test_gunicorn_stops_with_the_line_instead_of_a_traceback(tmp_path):
    result = subprocess.run(
        [str(GUNICORN), "eventservice.wsgi:application", "--bind", f"127.0.0.1:{free_port()}", "--workers", "1"],
        cwd=ROOT,
        env=_env(tmp_path, DEBUG="maybe"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode != 0
    assert f"{PREFIX}DEBUG must be true or false" in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_1_is_debug(tmp_path):
    result = manage(
        _env(tmp_path, DEBUG="1"),
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings; print(settings.DEBUG)",
    )

    assert (result.returncode, result.stdout, result.stderr) == (0, "True\n", "")


def test_the_subject_template_must_fall_inside_the_streams_own_subjects(tmp_path):
    """Agents sharing one NATS server each take subjects of their own (docs/events.md, "NATS
    JetStream"): the default template is refused outside the default subjects."""
    line = _assert_one_line(manage(_env(tmp_path, NATS_STREAM_SUBJECTS="agent-eu.>"), "check"), "NATS_SUBJECT_TEMPLATE")
    assert "subjects 'serviceagent.*.*' ('*': any value) fall outside the stream's subjects (agent-eu.>)" in line

    result = manage(
        _env(tmp_path, NATS_STREAM_SUBJECTS="agent-eu.>, agent-eu-audit", NATS_SUBJECT_TEMPLATE="agent-eu.{type}"),
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings; print(settings.NATS_STREAM_SUBJECTS, settings.NATS_SUBJECT_TEMPLATE)",
    )
    assert (result.returncode, result.stdout) == (0, "['agent-eu.>', 'agent-eu-audit'] agent-eu.{type}\n"), (
        result.stderr
    )


@pytest.mark.parametrize(
    "extra,depth",
    [
        ({}, "4"),  # SQLite: a claim waits its turn for the write lock
        ({"DATABASE_URL": "postgres://agent@127.0.0.1:5432/agent"}, "2"),  # read, never connected to
        ({"DATABASE_URL": "postgres://agent@127.0.0.1:5432/agent", "DELIVERY_CLAIM_AHEAD": "3"}, "3"),
    ],
)
def test_the_claim_depth_follows_the_database_unless_set(tmp_path, extra, depth):
    result = manage(
        _env(tmp_path, **extra),
        "shell",
        "--no-imports",
        "-c",
        "from django.conf import settings; print(settings.DELIVERY_CLAIM_AHEAD)",
    )

    assert (result.returncode, result.stdout) == (0, f"{depth}\n"), result.stderr


@pytest.mark.parametrize("raw", ["true", "TRUE", "1", "yes", "Yes", "on", " on "])
def test_a_switch_takes_what_people_type_for_on(monkeypatch, raw):
    monkeypatch.setenv("SOME_SWITCH", raw)
    assert env_bool("SOME_SWITCH", False) is True


@pytest.mark.parametrize("raw", ["false", "False", "0", "no", "NO", "off"])
def test_a_switch_takes_what_people_type_for_off(monkeypatch, raw):
    monkeypatch.setenv("SOME_SWITCH", raw)
    assert env_bool("SOME_SWITCH", True) is False


@pytest.mark.parametrize("raw", ["2", "y", "enabled", "truee", "-1"])
def test_a_switch_refuses_anything_else(monkeypatch, raw):
    monkeypatch.setenv("SOME_SWITCH", raw)
    with pytest.raises(SettingsError, match=r"^SOME_SWITCH must be true or false \(or 1/0, yes/no, on/off\), got"):
        env_bool("SOME_SWITCH", False)


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("SOME_SWITCH", raising=False)
    assert env_bool("SOME_SWITCH", True) is True
    monkeypatch.setenv("SOME_SWITCH", "")
    assert env_bool("SOME_SWITCH", False) is False
    assert env_choice("SOME_SWITCH", "INFO", ("INFO", "DEBUG")) == "INFO"


def test_a_choice_is_matched_whatever_the_case_and_named_as_listed(monkeypatch):
    monkeypatch.setenv("SOME_LEVEL", "debug")
    assert env_choice("SOME_LEVEL", "INFO", ("INFO", "DEBUG")) == "DEBUG"
    monkeypatch.setenv("SOME_LEVEL", "loud")
    with pytest.raises(SettingsError, match=r"^SOME_LEVEL must be one of INFO, DEBUG; got 'loud'$"):
        env_choice("SOME_LEVEL", "INFO", ("INFO", "DEBUG"))
