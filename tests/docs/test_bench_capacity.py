"""The capacity sweep's rules (bench/capacity.py, bench/README.md "Capacity at a latency
target"): a rate holds when every call ran and every event arrived within the targets; the
sweep stops after the first rate that does not; the capacity is the highest that held; the
table's verdict compares the agent's with Celery's better design; the plot is written."""

from __future__ import annotations

import pytest

from bench import capacity


def _step(lateness_p99: float, lag_p99: float | None, *, complete: bool = True, nats: float | None = None) -> dict:
    webhooks = None if lag_p99 is None else {"lag_ms": {"p99": lag_p99}}
    return {
        "complete": complete,
        "lateness_ms": {"p99": lateness_p99},
        "delivery": {"webhooks": webhooks, "nats": None if nats is None else {"lag_ms": {"p99": nats}}},
    }


@pytest.mark.parametrize(
    ("step", "held"),
    [
        (_step(12, 300), True),
        (_step(50, 1000), True),
        (_step(51, 300), False),
        (_step(12, 1001), False),
        (_step(12, 300, nats=1500), False),  # the worst subscriber kind decides
        (_step(12, 300, complete=False), False),  # a call that never ran is no latency met
        (_step(12, None), False),  # nothing delivered
    ],
)
def test_a_rate_holds_when_every_call_and_event_is_within_the_targets(step, held):
    assert capacity.holds(step) is held


def test_the_sweep_stops_after_the_first_rate_that_does_not_hold():
    measured = []

    def step(rate: int) -> dict:
        measured.append(rate)
        return _step(10 if rate <= 200 else 80, 200)

    result = capacity.sweep("agent", step, (50, 100, 200, 400, 800))

    assert measured == [50, 100, 200, 400]
    assert result["capacity"] == 200 and [s["held"] for s in result["steps"]] == [True, True, True, False]
    assert capacity.sweep("celery", lambda rate: _step(90, 200), (50, 100))["capacity"] is None


def _table(results: dict) -> list[tuple]:
    table = []

    def add(metric, agent_value=None, djq=None, celery=None, bare=None, target="", digits=1):
        table.append((metric, agent_value, celery, target))

    capacity.rows(add, results, lambda ok, text: f"{text}: {'met' if ok else 'MISSED'}")
    return table


def _sweep(capacity_: int | None, *rates: int) -> dict:
    steps = [{"rate": rate, "held": True, **_step(5, 100)} for rate in rates]
    return {"steps": steps, "capacity": capacity_, "first_rate": 50}


def test_the_table_says_each_capacity_and_the_verdict_against_celerys_better_design():
    results = {
        "agent": _sweep(400, 50, 100, 200, 400),
        "celery_tasks": _sweep(100, 50, 100),
        "celery_inline": _sweep(200, 50, 100, 200),
    }
    [headline, *steps] = _table(results)
    assert headline[1:] == ("400", "100 / 200", "≥ 1.5× Celery's better design (tasks / inline): met")
    assert steps[0][1] == "50: 5 / 100 · 100: 5 / 100 · 200: 5 / 100 · 400: 5 / 100" and steps[1][2].startswith("50: 5")
    results["agent"] = _sweep(200, 50, 100, 200)
    assert _table(results)[0][3].endswith("MISSED")
    # A design below the first rate counts as that rate: the agent needs 1.5× of it.
    results = {"agent": _sweep(None, 50), "celery_tasks": _sweep(None, 50)}
    assert _table(results)[0][1:] == ("< 50", "< 50", "≥ 1.5× Celery's better design (tasks / inline): MISSED")


def test_the_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib comes with requirements-bench.txt")
    results = {"agent": _sweep(400, 50, 100, 200, 400), "celery_tasks": _sweep(100, 50, 100)}
    path = capacity.plot(results, tmp_path / "capacity.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
