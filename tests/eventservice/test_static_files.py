"""Pages have their CSS whether or not `collectstatic` ran, with DEBUG unset (README, "The two
commands"): a real `manage.py runserver`, then gunicorn, on a free 127.0.0.1 port."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.support.agent_process import ROOT, agent_env, gunicorn, manage, runserver

STYLESHEET = re.compile(r'<link rel="stylesheet" href="([^"]+)"')


def _env(tmp_path: Path, static_root: Path) -> dict[str, str]:
    env = agent_env(tmp_path, SECRET_KEY="k" * 50, STATIC_ROOT=str(static_root))
    env.pop("DEBUG")  # unset, as in a fresh shell
    return env


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback only
        return response.status, dict(response.headers), response.read()


def _stylesheet(port: int) -> tuple[int, dict[str, str], bytes]:
    status, _, page = _get(f"http://127.0.0.1:{port}/login/")
    assert status == 200
    hrefs = STYLESHEET.findall(page.decode())
    assert hrefs, page[:2000]
    return _get(f"http://127.0.0.1:{port}{hrefs[0]}")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    static_root = tmp_path / "staticfiles"
    static_root.mkdir()  # there, and empty: collectstatic has not run
    environment = _env(tmp_path, static_root)
    migrated = manage(environment, "migrate", "--noinput", "-v0")
    assert migrated.returncode == 0, migrated.stderr
    return environment


def test_runserver_without_debug_or_collectstatic_serves_the_css(env):
    with runserver(env) as port:
        status, headers, body = _stylesheet(port)

    assert status == 200
    assert headers["Content-Type"].startswith("text/css")
    assert body == (ROOT / "static" / "css" / "app.css").read_bytes()


def test_gunicorn_without_collectstatic_serves_the_css(env):
    with gunicorn(env) as port:
        status, headers, _ = _stylesheet(port)

    assert status == 200 and headers["Content-Type"].startswith("text/css")


def test_once_collected_the_compressed_copy_is_served(env):
    collected = manage(env, "collectstatic", "--noinput", "-v0")
    assert collected.returncode == 0, collected.stderr

    with gunicorn(env) as port:
        status, headers, _ = _stylesheet(port)

    assert status == 200 and headers["Content-Type"].startswith("text/css")
    assert headers.get("Content-Encoding") == "gzip"  # from STATIC_ROOT, not the app folders


def test_favicon_ico_leads_to_the_icon(client):
    answer = client.get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"].endswith(".svg")
    assert "favicon" in answer["Location"]
