"""Deployment hardening at start-up: no public secret key outside DEBUG, env-driven HTTPS
settings that make `check --deploy` clean, and one-line refusals. Each case starts the real
`manage.py` (or gunicorn) with eventservice.settings. docs/security.md#6-deployment-hardening"""

from __future__ import annotations

import secrets
import subprocess

import pytest
from django.conf import settings

from tests.support.agent_process import GUNICORN, ROOT, agent_env, free_port, manage

HTTPS_ENV = {
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
}


def _env(tmp_path, **extra: str) -> dict[str, str]:
    env = agent_env(tmp_path, **extra)
    if "SECRET_KEY" not in extra:
        env.pop("SECRET_KEY", None)
    return env


def _print_setting(env: dict[str, str], name: str) -> subprocess.CompletedProcess:
    return manage(env, "shell", "--no-imports", "-c", f"from django.conf import settings; print(repr(settings.{name}))")


def test_check_deploy_is_clean_with_the_https_settings_from_the_environment(tmp_path):
    env = _env(tmp_path, SECRET_KEY=secrets.token_urlsafe(50), **HTTPS_ENV)
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "System check identified no issues" in result.stdout


def test_check_deploy_warns_without_them(tmp_path):
    env = _env(tmp_path, SECRET_KEY=secrets.token_urlsafe(50))
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr


def test_the_proxy_ssl_header_is_read_as_a_pair(tmp_path):
    env = _env(tmp_path, SECRET_KEY="k" * 50, SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO, https")
    assert _print_setting(env, "SECURE_PROXY_SSL_HEADER").stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https')"


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto,https", "must name the header as Django sees it"),
        ("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO", "must be two comma-separated values"),
        ("SECURE_HSTS_SECONDS", "a year", "SECURE_HSTS_SECONDS must be an integer"),
        ("SESSION_COOKIE_SECURE", "sometimes", "SESSION_COOKIE_SECURE must be true or false"),
    ],
)
def test_a_malformed_setting_stops_start_up_with_one_line(tmp_path, name, value, message):
    result = manage(_env(tmp_path, SECRET_KEY="k" * 50, **{name: value}), "check")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Service Agent cannot start: ")
    assert message in result.stderr


@pytest.mark.parametrize("command", [["check"], ["migrate", "--noinput"], ["seed_demo"], ["qcluster"]])
def test_without_a_secret_key_outside_debug_manage_py_refuses_with_one_line(tmp_path, command):
    result = manage(_env(tmp_path), *command, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (
        f"Service Agent cannot start: SECRET_KEY is not set: set SECRET_KEY, or SECRET_KEY_FILE, or create "
        f"{tmp_path / 'secret_key'} (scripts/start does), or DEBUG=true for a development key\n"
    )


def test_without_a_secret_key_gunicorn_stops_with_that_line_instead_of_serving(tmp_path):
    result = subprocess.run(
        [str(GUNICORN), "eventservice.wsgi:application", "--bind", f"127.0.0.1:{free_port()}", "--workers", "1"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "Service Agent cannot start: SECRET_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_key_file_in_the_data_directory_is_used(tmp_path):
    (tmp_path / "secret_key").write_text("a-key-from-the-file-" + "x" * 40 + "\n")
    result = _print_setting(_env(tmp_path), "SECRET_KEY")
    assert result.stdout.strip() == repr("a-key-from-the-file-" + "x" * 40)


def test_the_environment_wins_over_the_key_file(tmp_path):
    (tmp_path / "secret_key").write_text("from-the-file")
    result = _print_setting(_env(tmp_path, SECRET_KEY="from-the-environment"), "SECRET_KEY")
    assert result.stdout.strip() == "'from-the-environment'"


def test_a_named_key_file_that_is_missing_is_refused(tmp_path):
    result = manage(_env(tmp_path, SECRET_KEY_FILE=str(tmp_path / "nope")), "check")
    assert result.returncode == 1
    assert result.stderr == f"Service Agent cannot start: SECRET_KEY_FILE {tmp_path / 'nope'} does not exist\n"


def test_debug_runs_on_the_marked_development_key_and_check_deploy_says_so(tmp_path):
    env = _env(tmp_path, DEBUG="true")
    assert "dev-insecure" in _print_setting(env, "SECRET_KEY").stdout
    result = manage(env, "check", "--deploy")
    assert "serviceagent.W001" in result.stderr


def test_the_test_settings_do_not_run_on_the_development_key():
    # settings_test sets a test key (unless the environment already has one).
    assert not settings.SECRET_KEY.startswith("dev-insecure")
    assert not settings.DEBUG


def test_django_q2s_scheduler_is_off_so_no_schedule_row_ever_runs_a_function():
    # A Schedule row (added before the admin was locked down, or by hand) names any importable
    # function; the cluster's scheduler is what would run it. The product has no such rows.
    from django_q.conf import Conf

    assert Conf.SCHEDULER is False
