"""Every `manage.py` command, web worker and qcluster on SQLite starts without importing nats-py
(with aiohttp) or psycopg's pool: together they cost each process 0.3-0.4 s of a 0.8 s start,
and the replayed command sessions of the docs run seventy of them. The NATS publisher imports
them when NATS_URL is set (delivery/channels/nats.py), Django's backend when the database is
PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.agent_process import ROOT, agent_env

LOADED = """
import json, sys
import django
django.setup()
import eventservice.urls  # every view, the API's schema, the dashboard, the admin
from django.core.management import call_command
call_command("check", verbosity=0)
print(json.dumps({name: name in sys.modules for name in ("nats", "aiohttp", "psycopg_pool")}))
"""


def test_a_process_on_sqlite_without_nats_imports_neither(tmp_path):
    env = agent_env(tmp_path)
    env.pop("NATS_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", LOADED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "nats": False,
        "aiohttp": False,
        "psycopg_pool": False,
    }
