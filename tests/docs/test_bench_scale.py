"""bench/README.md's history-at-scale command (bench/scale.py), at a small size on PostgreSQL: its
fill must follow the schema the migrations make (partitions included), and each of its rows must
be measured: pages, the retention of the oldest day with the probe beside it, bytes per call,
an idle cluster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


def test_the_history_bench_fills_the_current_schema_and_measures_every_row():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--calls", "200", "--tenants", "20", "--days", "2"]
        + ["--reads", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The result is its one JSON line (the scratch database's drop is logged after it).
    [line] = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(line)
    assert set(result["pages_ms"]) == {"list", "list_by_tag", "feed", "detail"}
    retention = result["retention"]
    # The oldest day went (its partitions, and the loop runs' rows), and the probe read meanwhile.
    assert retention["rows_or_partitions"] > 0, retention
    assert retention["probe_rounds"] > 0 and retention["longest_query_wait_ms"] < 1000, retention
    assert result["bytes_per_call"] > 0
    assert result["idle"]["connections"] > 0
