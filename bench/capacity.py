"""Capacity at a latency target (bench/README.md, "Capacity at a latency target").

A steady stream of calls at rising offered rates, each call with its deliveries (two webhook
receivers, and NATS when it answers), `seconds` at each rate; per rate, the calls' lateness p99
(started − due) and their events' delivery lag p99 (made → received, every subscriber). A rate
holds when every call ran and every event arrived, lateness p99 ≤ 50 ms and delivery lag p99
≤ 1 s; the sweep stops after the first rate that does not, and the capacity is the highest rate
that held. The agent, then Celery's two same-work designs (bench/peer_work.py: a task per
delivery, and deliveries inline), at the same rates; a plot draws the curves, capacities marked.

Both sides are given their calls before the first is due (the agent's submitted in batches, as
`POST .../service-calls/batch` stores them; Celery's as ETA tasks), so the figures are the
engines' and not the bench's submission loop, which would take the machine's CPU from either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import agent, peers
from bench.common import log, summary_ms, wait_until

LATENESS_P99_MS = 50.0
DELIVERY_P99_MS = 1000.0
# Steps no wider than the capacity target's ratio (CAPACITY_RATIO) above 100 calls/s: with rates
# doubling, a system that holds 399 calls/s reads 200, and two systems a third apart read the same.
RATES = (50, 100, 150, 200, 300, 400, 600, 800, 1200, 1600)
QUICK_RATES = (20, 40)
# Calls submitted or tasks queued per measured batch, to plan the first due time after the last.
PLAN_SAMPLE = 200
BATCH = 100


def lag_p99_ms(delivery: dict) -> float | None:
    """The worst p99 of the subscriber kinds measured (webhooks, NATS)."""
    p99s = [part["lag_ms"]["p99"] for part in (delivery.get("webhooks"), delivery.get("nats")) if part]
    return max(p99s) if p99s else None


def holds(step: dict) -> bool:
    lateness, lag = step["lateness_ms"]["p99"], lag_p99_ms(step["delivery"])
    return step["complete"] and lateness <= LATENESS_P99_MS and lag is not None and lag <= DELIVERY_P99_MS


def sweep(name: str, step: Callable[[int], dict], rates: tuple[int, ...]) -> dict:
    """`step` at each rate in turn until one does not hold; the steps and the capacity."""
    steps = []
    for rate in rates:
        log(f"capacity, {name}: {rate} calls/s")
        result = {"rate": rate, **step(rate)}
        result["held"] = holds(result)
        log(
            f"capacity, {name}: {rate} calls/s: lateness p99 {result['lateness_ms']['p99']:.1f} ms, delivery lag "
            f"p99 {lag_p99_ms(result['delivery']) or float('nan'):.0f} ms, "
            f"{'complete' if result['complete'] else 'INCOMPLETE'}: {'held' if result['held'] else 'did not hold'}"
        )
        steps.append(result)
        if not result["held"]:
            break
    held = [step["rate"] for step in steps if step["held"]]
    return {"steps": steps, "capacity": max(held) if held else None, "first_rate": rates[0]}


def _dues(count: int, seconds: float, first: float) -> list[float]:
    return [first + seconds * index / count for index in range(count)]


# --- the agent -----------------------------------------------------------------------------------


def _submit_batches(tenant_id: str, url: str, dues: list[float]) -> None:
    from core.ids import iso_ms
    from orchestration.services import service_calls_submit_batch
    from orchestration.validation import validate_submission

    for start in range(0, len(dues), BATCH):
        items = [
            validate_submission(
                {
                    "name": f"capacity-{index}",
                    "requestSpec": {"method": "GET", "url": url},
                    "dueAt": iso_ms(datetime.fromtimestamp(due, UTC)),
                }
            )
            for index, due in enumerate(dues[start : start + BATCH], start)
        ]
        results = service_calls_submit_batch(tenant_id=tenant_id, items=items, correlation_id=f"capacity-{start}")
        refused = [result.error for result in results if result.error is not None]
        if refused:
            raise RuntimeError(f"the agent refused a capacity call: {refused[0]}")


def agent_step(rate: int, *, seconds: float, url: str, delivery: agent.Delivery) -> dict:
    """`rate` calls a second due evenly over `seconds` for a tenant of their own, its events to
    the run's subscribers (agent.steady's measurement at a given pace)."""
    from orchestration.models import ServiceCall

    tenant = f"bench-capacity-{rate}"
    agent.ensure_tenant(tenant)
    agent.ensure_tenant(agent.WARMUP_TENANT)
    delivery.make_stream()
    count = round(rate * seconds)
    started = time.perf_counter()
    _submit_batches(agent.WARMUP_TENANT, url, [time.time() + 3600] * PLAN_SAMPLE)
    per_call_ms = (time.perf_counter() - started) * 1000 / PLAN_SAMPLE
    dues = _dues(count, seconds, time.time() + agent.lead_for(count, per_call_ms, 3.0))
    _submit_batches(tenant, url, dues)
    delivery.subscribe(tenant)
    agent._sleep_until(dues[0] - agent.WINDOW_MARGIN)
    finished = agent._wait_terminal(tenant, count, timeout=max(0.0, dues[-1] - time.time()) + 60)
    published = agent._wait_published(tenant, timeout=60)
    delivered = delivery.wait_delivered(timeout=60)
    figures = delivery.measure(tenant)
    delivery.finish()
    return {
        "seconds": seconds,
        "calls": count,
        "terminal": finished,
        "complete": finished == count and published and delivered and figures["missing"] == 0,
        "lateness_ms": summary_ms(agent.lateness_seconds(ServiceCall.objects.filter(tenant_id=tenant))),
        "delivery": figures,
    }


# --- Celery --------------------------------------------------------------------------------------


def celery_step(rate: int, *, seconds: float, url: str, delivery: agent.Delivery, inline: bool) -> dict:
    """`rate` calls a second as ETA tasks due evenly over `seconds`, each doing a call's work
    (bench/celery_app.py `call`, its start's lateness recorded), delivered to `delivery`'s
    receivers (started, its stream made: this step's alone)."""
    from bench import celery_app

    r = peers._redis()
    r.delete(celery_app.CALLS_DONE_KEY, celery_app.DELIVERY_FAILURES_KEY, celery_app.LATENESS_KEY)
    count = round(rate * seconds)
    hooks = [f"{receiver}/hook" for _, receiver in delivery.receivers]
    nats_url = delivery.nats_url if delivery.stream_made else ""
    tenant = f"bench-celery-{'inline' if inline else 'tasks'}-{rate}"

    def queue(eta: float) -> None:
        celery_app.call.apply_async(
            args=[url, tenant, hooks, nats_url, delivery.prefix, inline],
            kwargs={"eta": eta},
            eta=datetime.fromtimestamp(eta, UTC),
            queue=celery_app.QUEUE,  # consumed from the worker's start, as the lateness peer's ETA tasks
        )

    started = time.perf_counter()
    for _ in range(PLAN_SAMPLE):
        celery_app.ping.delay()
    per_task_ms = (time.perf_counter() - started) * 1000 / PLAN_SAMPLE
    dues = _dues(count, seconds, time.time() + agent.lead_for(count, per_task_ms, 3.0))
    for due in dues:
        queue(due)
    agent._sleep_until(dues[0])
    wait_until(
        lambda: int(r.get(celery_app.CALLS_DONE_KEY) or 0) >= count,
        timeout=max(0.0, dues[-1] - time.time()) + 60,
        interval=0.05,
    )
    calls = int(r.get(celery_app.CALLS_DONE_KEY) or 0)
    delivered, figures = peers.celery_deliveries(delivery, expected=2 * calls, timeout=60)
    lateness = [float(value) for value in r.lrange(celery_app.LATENESS_KEY, 0, -1)]
    return {
        "seconds": seconds,
        "calls": count,
        "terminal": calls,
        "complete": calls == count and delivered and figures["missing"] == 0,
        "lateness_ms": summary_ms(lateness),
        "delivery": figures,
        "delivery_failures": int(r.get(celery_app.DELIVERY_FAILURES_KEY) or 0),
    }


# --- the plot -------------------------------------------------------------------------------------

SYSTEMS = (
    ("agent", "Service Agent", "tab:blue"),
    ("celery_tasks", "Celery, a task per delivery", "tab:orange"),
    ("celery_inline", "Celery, deliveries inline", "tab:green"),
)


def plot(capacity: dict[str, Any], path: Path) -> Path:
    """Lateness p99 and delivery lag p99 against the offered rate, per system, the targets as
    lines and each capacity marked; written as a PNG to `path`."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 7), constrained_layout=True)
    for key, label, colour in SYSTEMS:
        result = capacity.get(key)
        if not result or not result["steps"]:
            continue
        steps = result["steps"]
        rates = [step["rate"] for step in steps]
        top.plot(rates, [step["lateness_ms"]["p99"] for step in steps], "o-", color=colour, label=label)
        bottom.plot(rates, [lag_p99_ms(step["delivery"]) for step in steps], "o-", color=colour, label=label)
        if result["capacity"] is not None:
            for axis in (top, bottom):
                axis.axvline(result["capacity"], color=colour, linestyle=":", linewidth=1.5)
            bottom.annotate(
                f"{result['capacity']}/s", (result["capacity"], DELIVERY_P99_MS), color=colour,
                textcoords="offset points", xytext=(4, 6), fontsize=8,
            )  # fmt: skip
    for axis, limit, name in (
        (top, LATENESS_P99_MS, "lateness p99 (ms)"),
        (bottom, DELIVERY_P99_MS, "delivery lag p99 (ms)"),
    ):
        axis.axhline(limit, color="grey", linestyle="--", linewidth=1)
        axis.set_yscale("log")
        axis.set_ylabel(name)
        axis.grid(True, which="both", alpha=0.3)
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (top, bottom):
        axis.yaxis.set_major_formatter(plain)
        axis.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    bottom.set_xscale("log", base=2)
    rates = sorted({step["rate"] for key, *_ in SYSTEMS for step in (capacity.get(key) or {}).get("steps", [])})
    bottom.set_xticks(rates, [str(rate) for rate in rates])
    bottom.set_xlabel("offered rate (calls/s); dotted: each one's capacity, dashed: the target")
    top.legend(loc="upper left", fontsize=8)
    top.set_title("Capacity at a latency target (lateness p99 ≤ 50 ms, delivery lag p99 ≤ 1 s)")
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


# --- the table ------------------------------------------------------------------------------------

CAPACITY_RATIO = 1.5


def _shown(result: dict | None) -> str | None:
    if not result:
        return None
    return f"{result['capacity']}" if result["capacity"] is not None else f"< {result['first_rate']}"


def _steps(result: dict) -> str:
    """Each rate measured: lateness p99 / delivery lag p99 (ms)."""
    return " · ".join(
        f"{step['rate']}: {step['lateness_ms']['p99']:.0f} / {lag_p99_ms(step['delivery']) or float('nan'):.0f}"
        + ("" if step["complete"] else " (incomplete)")
        for step in result["steps"]
    )


def rows(add: Callable[..., None], results: dict, verdict: Callable[[bool | None, str], str]) -> None:
    """The capacity rows of bench/run.py's table: each system's capacity, the target (the agent's
    ≥ 1.5× Celery's better design's), and what each rate measured."""
    agent_result = results.get("agent")
    designs = [results[key] for key in ("celery_tasks", "celery_inline") if results.get(key)]
    if not agent_result and not designs:
        return
    ok = None
    if agent_result and designs:
        agent_capacity = agent_result["capacity"] or 0
        # A design that missed the first rate has less than it: measured against that rate.
        best = max(design["capacity"] or design["first_rate"] for design in designs)
        ok = agent_capacity >= CAPACITY_RATIO * best
    add(
        f"capacity at lateness p99 ≤ {LATENESS_P99_MS:.0f} ms, delivery lag p99 ≤ {DELIVERY_P99_MS:,.0f} ms (calls/s)",
        _shown(agent_result),
        celery=" / ".join(f"{_shown(design)}" for design in designs) or None,
        target=verdict(ok, f"≥ {CAPACITY_RATIO}× Celery's better design (tasks / inline)"),
    )
    for key, label, _ in SYSTEMS:
        if results.get(key):
            steps = _steps(results[key])
            add(
                f"capacity steps, {label}: rate: lateness p99 / lag p99 (ms)",
                steps if key == "agent" else None,
                celery=None if key == "agent" else steps,
            )
