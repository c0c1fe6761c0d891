"""bench/README.md's cost commands (bench/cost.py) at a small size: each drives the real path
(receivers in their own processes, the WSGI handler) to its end, or says why it could not."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cost(*args: str, timeout: int = 300) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cost.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize(
    ("subject", "count", "expected"),
    [
        ("delivery", "15", "60 notifications in "),
        ("call", "30", "30 calls in "),
        ("post", "20", "20 POSTs in "),
        ("floor", "20", "20 POSTs in "),
        ("batch", "150", "200 calls in "),  # two batches of a hundred
        ("post", "60", "60 POSTs in "),  # past the default submissions ceiling: the run lifts it
    ],
)
def test_each_subject_runs_to_its_end_and_reports_its_cost(subject, count, expected):
    out = _cost(subject, "--count", count)
    assert expected in out
    assert float(re.search(r"([\d.]+) ms per ", out).group(1)) > 0


@pytest.mark.nats
def test_delivery_to_nats_runs_to_its_end_on_a_stream_of_its_own():
    """`--kind nats`: one NATS subscription (BENCH_NATS_URL, here the tests' server), published
    to a throwaway stream on subjects of its own (beside any other run) that the run deletes."""
    from tests.support.nats import NATS_TEST_URL, run_js

    async def streams(js) -> set[str]:
        return {info.config.name for info in await js.streams_info()}

    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cost.py"), "delivery", "--kind", "nats", "--count", "15"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "BENCH_NATS_URL": NATS_TEST_URL},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "30 notifications in " in done.stdout
    made = re.search(r"NATS stream (COST_[0-9A-F]{8}) made on \S+, subjects cost([0-9a-f]{8})\.>", done.stdout)
    assert made and made.group(1) == f"COST_{made.group(2).upper()}", done.stdout[-2000:]
    assert made.group(1) not in run_js(streams)


def test_a_count_below_one_is_refused_with_a_reason():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cost.py"), "delivery", "--count", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--count must be at least 1" in done.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian package valgrind)")
def test_under_callgrind_it_counts_the_instructions_of_a_delivered_notification():
    out = _cost("delivery", "--count", "10", "--callgrind", timeout=300)
    per = int(
        re.search(r"instructions per delivered notification \(webhook\): ([\d,]+)", out).group(1).replace(",", "")
    )
    assert 100_000 < per < 50_000_000  # a try signs, sends, records: hundreds of thousands at least
