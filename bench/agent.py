"""The agent's side: its workers (`manage.py qcluster`), timer lateness, drain, outbox lag.

Runs in the bench process after django.setup(); calls are submitted through the same service
the API uses (orchestration.services.service_call_submit), outcomes are read back from the DB.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime

from bench.common import PYTHON, Child, Children, log, summary_ms, wait_until

LATENESS_TENANT = "bench-lateness"
DRAIN_TENANT = "bench-drain"
WARMUP_TENANT = "bench-warmup"
# The due window (profiled, CPU counted) opens this long before the first due time.
WINDOW_MARGIN = 0.3

# Wraps the due window: run.py passes its CPU counter / profiler here.
Window = Callable[[], AbstractContextManager]


def _sleep_until(moment: float) -> None:
    pause = moment - time.time()
    if pause > 0:
        time.sleep(pause)


def ensure_tenant(slug: str) -> None:
    from tenants.models import Tenant
    from tenants.services import tenant_create

    if not Tenant.objects.filter(id=slug).exists():
        tenant_create(slug=slug, name=slug)


def start_workers(
    children: Children, env: dict[str, str], *, name: str = "agent-qcluster", workers: int = 2, timeout: float = 60.0
) -> Child:
    """Start `manage.py qcluster`; ready when its worker processes' sessions beat."""
    from workers.models import WorkerSession

    since = datetime.now(UTC)
    child = children.start(name, [PYTHON, "manage.py", "qcluster"], env=env)

    def ready() -> bool:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{child.tail()}")
        return (
            WorkerSession.objects.filter(started_at__gte=since, status=WorkerSession.Status.RUNNING).count() >= workers
        )

    if not wait_until(ready, timeout=timeout, interval=0.1):
        raise RuntimeError(f"{name} not ready within {timeout}s:\n{child.tail()}")
    time.sleep(0.5)  # the engine's first full timer refresh
    return child


def _submit(tenant_id: str, url: str, dues: list[float], prefix: str) -> dict[str, float]:
    """Submit one call per due time (in due order); returns submission statistics."""
    from core.ids import iso_ms
    from orchestration.services import service_call_submit
    from orchestration.validation import validate_submission

    late = 0
    started = time.perf_counter()
    for index, due in enumerate(dues):
        data = {
            "name": f"{prefix}-{index}",
            "requestSpec": {"method": "GET", "url": url},
            "dueAt": iso_ms(datetime.fromtimestamp(due, UTC)),
            "tags": ["bench", prefix],
        }
        service_call_submit(
            tenant_id=tenant_id, submission=validate_submission(data), correlation_id=f"{prefix}-{index}"
        )
        if time.time() > due:
            late += 1
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "per_call_ms": elapsed * 1000 / max(1, len(dues)), "submitted_after_due": late}


def _wait_terminal(tenant_id: str, count: int, *, timeout: float) -> int:
    from orchestration.models import ServiceCall

    def done() -> bool:
        return ServiceCall.objects.filter(tenant_id=tenant_id, status__in=ServiceCall.TERMINAL).count() >= count

    wait_until(done, timeout=timeout, interval=0.05)
    return ServiceCall.objects.filter(tenant_id=tenant_id, status__in=ServiceCall.TERMINAL).count()


def _wait_published(tenant_id: str, *, timeout: float) -> bool:
    from outbox.models import OutboxEvent

    return bool(
        wait_until(
            lambda: not OutboxEvent.objects.filter(tenant_id=tenant_id, published_at__isnull=True).exists(),
            timeout=timeout,
            interval=0.05,
        )
    )


def submit_ms_per_call(url: str, *, samples: int = 50) -> float:
    """Time a few submissions (due in an hour, another tenant) to plan the due times."""
    ensure_tenant(WARMUP_TENANT)
    far = time.time() + 3600
    return _submit(WARMUP_TENANT, url, [far] * samples, "warmup")["per_call_ms"]


def lead_for(count: int, per_call_ms: float, minimum: float) -> float:
    """A lead long enough that the last submission lands before the first due time."""
    return max(minimum, 1.3 * count * per_call_ms / 1000 + 1.0)


def lateness(
    *, url: str, count: int, lead: float = 3.0, spread: float = 10.0, seed: int = 12, window: Window = nullcontext
) -> dict:
    """`count` calls due uniformly over [t+lead, t+lead+spread]; startedAt - dueAt.

    `window` wraps the wait from just before the first due time until all are done.

    The lead is at least `lead` and long enough for every submission to land before the first
    due time, so the timers are measured, not the submission path (measured on its own).
    """
    from orchestration.models import ServiceCall

    ensure_tenant(LATENESS_TENANT)
    lead = lead_for(count, submit_ms_per_call(url), lead)
    rng = random.Random(seed)
    now = time.time()
    dues = sorted(now + lead + rng.uniform(0, spread) for _ in range(count))
    log(f"agent lateness: submitting {count} calls due over [+{lead:.1f}s, +{lead + spread:.1f}s]")
    submit = _submit(LATENESS_TENANT, url, dues, "lateness")
    log(f"agent lateness: submitted in {submit['seconds']:.1f}s ({submit['per_call_ms']:.2f} ms/call); waiting")
    _sleep_until(dues[0] - WINDOW_MARGIN)
    with window():
        finished = _wait_terminal(LATENESS_TENANT, count, timeout=max(0.0, dues[-1] - time.time()) + 30)
        _wait_published(LATENESS_TENANT, timeout=30)
    rows = list(
        ServiceCall.objects.filter(tenant_id=LATENESS_TENANT)
        .exclude(started_at=None)
        .values_list("due_at", "started_at", "status")
    )
    values = [(started - due).total_seconds() for due, started, _ in rows]
    failed = sum(1 for *_, status in rows if status == ServiceCall.Status.FAILED)
    return {
        "calls": count,
        "terminal": finished,
        "failed": failed,
        "submission": submit,
        "lead_s": lead,
        "submitted_before_window": submit["seconds"] < lead,
        "lateness_ms": summary_ms(values),
        "early": sum(1 for v in values if v < 0),
    }


def drain(*, url: str, count: int, lead: float, window: Window = nullcontext) -> dict:
    """`count` calls due at one instant; rate to all terminal and to all bookkeeping done."""
    from execution.models import HttpExecution
    from orchestration.models import ServiceCall
    from outbox.models import OutboxEvent

    ensure_tenant(DRAIN_TENANT)
    # The due instant must come after the last submission, whatever this machine's speed.
    lead = lead_for(count, submit_ms_per_call(url), lead)
    due = round(time.time() + lead, 3)
    log(f"agent drain: submitting {count} calls all due at +{lead:.1f}s")
    submit = _submit(DRAIN_TENANT, url, [due] * count, "drain")
    log(f"agent drain: submitted in {submit['seconds']:.1f}s; waiting")
    _sleep_until(due - WINDOW_MARGIN)
    with window():
        finished = _wait_terminal(DRAIN_TENANT, count, timeout=max(0.0, due - time.time()) + 120)
        published = _wait_published(DRAIN_TENANT, timeout=60)
    calls = ServiceCall.objects.filter(tenant_id=DRAIN_TENANT)
    due_at = datetime.fromtimestamp(due, UTC)
    last_finished = max(calls.exclude(finished_at=None).values_list("finished_at", flat=True))
    first_started = min(calls.exclude(started_at=None).values_list("started_at", flat=True))
    last_started = max(calls.exclude(started_at=None).values_list("started_at", flat=True))
    last_logged = max(
        HttpExecution.objects.filter(tenant_id=DRAIN_TENANT)
        .exclude(finished_at=None)
        .values_list("finished_at", flat=True)
    )
    events = list(
        OutboxEvent.objects.filter(tenant_id=DRAIN_TENANT).values_list("event_type", "created_at", "published_at")
    )
    published_times = [p for _, _, p in events if p is not None]
    after_due = [(p - c).total_seconds() for t, c, p in events if p is not None and c >= due_at]
    all_lags = [(p - c).total_seconds() for _, c, p in events if p is not None]
    to_terminal = (last_finished - due_at).total_seconds()
    bookkeeping = (max([last_finished, last_logged, *published_times]) - due_at).total_seconds()
    return {
        "calls": count,
        "terminal": finished,
        "all_published": published,
        "succeeded": calls.filter(status=ServiceCall.Status.SUCCEEDED).count(),
        "submission": submit,
        "first_start_after_due_s": (first_started - due_at).total_seconds(),
        "last_start_after_due_s": (last_started - due_at).total_seconds(),
        "terminal_after_due_s": to_terminal,
        "bookkeeping_after_due_s": bookkeeping,
        "rate_terminal": count / to_terminal if to_terminal > 0 else None,
        "rate_bookkeeping": count / bookkeeping if bookkeeping > 0 else None,
        "events": len(events),
        # Lag of the events the drain itself wrote (Running, Succeeded/Failed), and of all
        # the drain calls' events (Submitted/Scheduled were written during submission).
        "outbox_lag_ms": summary_ms(after_due),
        "outbox_lag_all_ms": summary_ms(all_lags),
    }


def bare_requests(*, url: str, count: int) -> dict:
    """The ceiling: one requests.Session, one thread, GETs in a loop against the same target."""
    import requests

    with requests.Session() as session:
        session.trust_env = False
        session.get(url, timeout=5).raise_for_status()
        started = time.perf_counter()
        for _ in range(count):
            session.get(url, timeout=5).content  # noqa: B018
        elapsed = time.perf_counter() - started
    return {"requests": count, "seconds": elapsed, "rate": count / elapsed}
