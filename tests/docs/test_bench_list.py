"""bench/README.md's list benchmark command, at a small size: its loader must follow the schema
(a column added by a migration without a database default broke it once, unnoticed)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_list_benchmark_loads_the_current_schema_and_plans_from_the_tag_index():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "list_query.py"), "--calls", "400", "--tenants", "4", "--queries", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["calls"] == 400
    assert all(result["plan_ok"] for result in report["results"].values()), report["results"]
