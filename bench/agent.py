"""The agent's side: its workers (`manage.py qcluster`), timer lateness, drain, outbox lag,
and the delivery of the drain's events to subscribers (two webhook receivers, NATS).

Runs in the bench process after django.setup(); calls are submitted through the same service
the API uses (orchestration.services.service_call_submit), outcomes are read back from the DB.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from bench.common import PYTHON, ROOT, Child, Children, cpu_seconds, group_pids, log, summary_ms, wait_until

LATENESS_TENANT = "bench-lateness"
STEADY_TENANT = "bench-steady"
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


def lateness_seconds(calls) -> list[float]:
    """Each of `calls`' lateness (a ServiceCall query set): its first attempt's departure (the
    attempt log's startedAt, taken in its thread as its request set out) − its due time. The
    call's own startedAt is when its request was to leave (docs/architecture.md, "Started ahead,
    sent on time"); the departure is what a target sees, and what Celery's tasks record."""
    from execution.models import HttpExecution

    rows = HttpExecution.objects.filter(service_call__in=calls.values("pk"), attempt=1).values_list(
        "service_call__due_at", "started_at"
    )
    return [(departed - due).total_seconds() for due, departed in rows]


def ensure_tenant(slug: str) -> None:
    from tenants.models import Tenant
    from tenants.services import tenant_create

    if not Tenant.objects.filter(id=slug).exists():
        tenant_create(slug=slug, name=slug)


def start_workers(
    children: Children, env: dict[str, str], *, name: str = "agent-qcluster", workers: int = 2, timeout: float = 60.0
) -> Child:
    """Start `manage.py qcluster`; ready when its worker processes' sessions beat (its own:
    another cluster may run on the same database)."""
    from workers.models import WorkerSession

    since = datetime.now(UTC)
    child = children.start(name, [PYTHON, "manage.py", "qcluster"], env=env)

    def ready() -> bool:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{child.tail()}")
        return (
            WorkerSession.objects.filter(
                started_at__gte=since, status=WorkerSession.Status.RUNNING, pid__in=group_pids(child.proc.pid)
            ).count()
            >= workers
        )

    if not wait_until(ready, timeout=timeout, interval=0.1):
        raise RuntimeError(f"{name} not ready within {timeout}s:\n{child.tail()}")
    time.sleep(0.5)  # the engine's first full timer refresh
    return child


# How late PostgreSQL may count a transaction in pg_stat_database (its idle backends' flush).
PG_STATS_FLUSH_SECONDS = 11.0


def idle_figures(workers: Child, *, seconds: float, settle: float = 5.0) -> dict[str, float]:
    """What one cluster costs with nothing to do, over `seconds` once it settled (its retention
    loop's first run, 2 s after it starts, is over): the CPU of its
    processes as a percentage of one core, and on PostgreSQL the transactions a second its
    database counts (every statement outside a transaction is one) and the connections open to
    it (docs/architecture.md, "Wake, don't poll")."""
    from django.db import connection

    time.sleep(settle)
    postgres = connection.vendor == "postgresql"
    if postgres:
        # A backend reports its transactions to pg_stat_database when it goes idle, up to 10 s
        # later (PostgreSQL 15's shared-memory statistics): the start's own would count in the
        # window.
        time.sleep(PG_STATS_FLUSH_SECONDS)
        _autovacuum_quiet()
    pids = group_pids(workers.proc.pid)
    before, xacts_before, started = cpu_seconds(pids), _transactions() if postgres else 0, time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    figures = {"cpu_percent": (cpu_seconds(pids) - before) / elapsed * 100, "seconds": round(elapsed, 1)}
    if postgres:
        # Less the two reads of the count itself.
        figures["transactions_per_second"] = (_transactions() - xacts_before - 2) / elapsed
        figures["connections"] = _connections() - 1  # not the bench's own
    return figures


def _autovacuum_quiet(*, quiet: float = 5.0, longest: float = 180.0) -> None:
    """Wait (`longest` at most) until no autovacuum worker has worked on the database for `quiet`
    seconds: after a fill, the server's autovacuum goes through every table and partition, and
    its transactions, which the server counts as the database's, are its own, not the cluster's."""
    from django.db import connection

    deadline, quiet_since = time.monotonic() + longest, time.monotonic()
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'autovacuum worker'"
            )
            if cursor.fetchone()[0]:
                quiet_since = time.monotonic()
        if time.monotonic() - quiet_since >= quiet:
            return
        time.sleep(0.2)


def _transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        # The statistics of this transaction's snapshot: a fresh one each time.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


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
    calls = ServiceCall.objects.filter(tenant_id=LATENESS_TENANT)
    values = lateness_seconds(calls)
    failed = calls.filter(status=ServiceCall.Status.FAILED).count()
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


def drain(
    *,
    url: str,
    count: int,
    lead: float,
    window: Window = nullcontext,
    delivery: Delivery | None = None,
    tenant: str = DRAIN_TENANT,
) -> dict:
    """`count` calls of `tenant` due at one instant; rate to all terminal and to all bookkeeping done.

    With `delivery`, its subscriptions for the drain's tenant are made after the submissions
    and before the due instant, so they receive exactly the burst's events (Running and
    Succeeded/Failed); the window then also waits for every delivery to succeed."""
    from execution.models import HttpExecution
    from orchestration.models import ServiceCall
    from outbox.models import OutboxEvent

    ensure_tenant(tenant)
    if delivery is not None:
        delivery.make_stream()
    # The due instant must come after the last submission, whatever this machine's speed.
    lead = lead_for(count, submit_ms_per_call(url), lead)
    due = round(time.time() + lead, 3)
    log(f"agent drain: submitting {count} calls all due at +{lead:.1f}s")
    submit = _submit(tenant, url, [due] * count, "drain")
    log(f"agent drain: submitted in {submit['seconds']:.1f}s; waiting")
    if delivery is not None:
        delivery.subscribe(tenant)
        if time.time() > due:
            log("agent drain: the subscriptions were made after the due instant; some events miss them")
    _sleep_until(due - WINDOW_MARGIN)
    with window():
        finished = _wait_terminal(tenant, count, timeout=max(0.0, due - time.time()) + 120)
        published = _wait_published(tenant, timeout=60)
        delivered = delivery.wait_delivered(timeout=DELIVERY_TIMEOUT) if delivery is not None else None
    calls = ServiceCall.objects.filter(tenant_id=tenant)
    due_at = datetime.fromtimestamp(due, UTC)
    last_finished = max(calls.exclude(finished_at=None).values_list("finished_at", flat=True))
    first_started = min(calls.exclude(started_at=None).values_list("started_at", flat=True))
    last_started = max(calls.exclude(started_at=None).values_list("started_at", flat=True))
    last_logged = max(
        HttpExecution.objects.filter(tenant_id=tenant).exclude(finished_at=None).values_list("finished_at", flat=True)
    )
    events = list(OutboxEvent.objects.filter(tenant_id=tenant).values_list("event_type", "created_at", "published_at"))
    published_times = [p for _, _, p in events if p is not None]
    after_due = [(p - c).total_seconds() for t, c, p in events if p is not None and c >= due_at]
    all_lags = [(p - c).total_seconds() for _, c, p in events if p is not None]
    to_terminal = (last_finished - due_at).total_seconds()
    bookkeeping = (max([last_finished, last_logged, *published_times]) - due_at).total_seconds()
    result = {
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
    if delivery is not None:
        result["delivery"] = {**delivery.measure(tenant), "all_succeeded_in_db": delivered}
        delivery.finish()
    return result


def steady(
    *, url: str, count: int, spread: float, lead: float, delivery: Delivery, tenant: str = STEADY_TENANT
) -> dict:
    """Event delivery at an even pace, the load of an ordinary day: `count` calls of `tenant`
    due uniformly over `spread` seconds, their events (Running, Succeeded/Failed) to the same
    subscribers as the drain's; per subscriber kind, created → received as the drain measures it."""
    ensure_tenant(tenant)
    delivery.make_stream()
    lead = lead_for(count, submit_ms_per_call(url), lead)
    now = time.time()
    dues = [now + lead + spread * index / max(1, count - 1) for index in range(count)]
    log(f"agent steady delivery: {count} calls due over {spread:.0f}s from +{lead:.1f}s")
    submit = _submit(tenant, url, dues, "steady")
    delivery.subscribe(tenant)
    _sleep_until(dues[0] - WINDOW_MARGIN)
    finished = _wait_terminal(tenant, count, timeout=max(0.0, dues[-1] - time.time()) + 60)
    _wait_published(tenant, timeout=60)
    delivered = delivery.wait_delivered(timeout=DELIVERY_TIMEOUT)
    result = {
        "calls": count,
        "spread_s": spread,
        "terminal": finished,
        "submission": submit,
        "delivery": {**delivery.measure(tenant), "all_succeeded_in_db": delivered},
    }
    delivery.finish()
    return result


def bare_requests(*, url: str, count: int) -> dict:
    """The ceiling: one requests.Session, one thread, GETs in a loop against the same target.

    Also the floor of the CPU per call: the loop's process CPU time (user + system, this
    process only; the target's is not counted) per request."""
    import requests

    with requests.Session() as session:
        session.trust_env = False
        session.get(url, timeout=5).raise_for_status()
        cpu_before = time.process_time()
        started = time.perf_counter()
        for _ in range(count):
            session.get(url, timeout=5).content  # noqa: B018
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_before
    return {
        "requests": count,
        "seconds": elapsed,
        "rate": count / elapsed,
        "cpu_seconds": cpu,
        "cpu_per_request_ms": cpu * 1000 / count,
    }


# --- Event delivery during the drain ----------------------------------------------------------

WEBHOOK_RECEIVERS = 2
# After the drain's events are published, how long the window waits for every delivery.
DELIVERY_TIMEOUT = 60.0
# How long the drain waits for its stream to be made (NATS answering, no other stream on the
# server taking its subjects) before it skips NATS.
NATS_STREAM_WAIT = 20.0


def nats_unreachable_reason(url: str) -> str | None:
    """Why no NATS server with JetStream answers at url (read from its INFO line), or None."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout=1) as sock:
            sock.settimeout(1)
            line = sock.makefile("rb").readline(64 * 1024)
    except OSError as exc:
        return f"no NATS server at {url} ({exc}; BENCH_NATS_URL sets another)"
    try:
        info = json.loads(line[5:]) if line.startswith(b"INFO ") else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return f"{url} does not answer as a NATS server"
    if not info.get("jetstream"):
        return f"NATS at {url} runs without JetStream (nats-server -js)"
    return None


def _on_nats(url: str, action: Callable[[Any], Awaitable[Any]]) -> Any:
    """`action(js)` on a connection of its own, bounded in time."""
    import nats

    async def main() -> Any:
        nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5)
        try:
            return await asyncio.wait_for(action(nc.jetstream(timeout=5)), 120)
        finally:
            await nc.close()

    return asyncio.run(main())


def delivery_figures(created: dict[str, float], records: dict[str, list[tuple[str, float]]]) -> dict:
    """Per subscriber and per kind (`webhook-*`, `nats`): deliveries of the events in `created`
    (event id -> the instant it was made), their lag (each one's first arrival), what is
    missing. `records` holds each subscriber's arrivals, (event id, receive time), tries
    included."""
    first: dict[str, dict[str, float]] = {}
    per_subscriber = {}
    for name, arrivals in records.items():
        got = first[name] = {}
        for event_id, at in arrivals:
            if event_id in created and at < got.get(event_id, float("inf")):
                got[event_id] = at
        lags = [at - created[event_id] for event_id, at in got.items()]
        per_subscriber[name] = {
            "received": len(got),
            "tries_received": sum(1 for event_id, _ in arrivals if event_id in created),
            "missing": len(created) - len(got),
            "lag_ms": summary_ms(lags),
        }
    start = min(created.values(), default=None)

    def kind(names: list[str]) -> dict | None:
        names = [name for name in names if name in first]
        if not names:
            return None
        times = [at for name in names for at in first[name].values()]
        lags = [at - created[event_id] for name in names for event_id, at in first[name].items()]
        seconds = max(times) - start if times and start is not None else None
        return {
            "subscribers": names,
            "deliveries": len(times),
            "missing": sum(per_subscriber[name]["missing"] for name in names),
            "lag_ms": summary_ms(lags),
            "first_created_to_last_received_s": seconds,
            "rate": len(times) / seconds if seconds else None,
        }

    return {
        "events": len(created),
        "subscribers": list(records),
        "expected": len(created) * len(records),
        "missing": sum(part["missing"] for part in per_subscriber.values()),
        "webhooks": kind([name for name in records if name.startswith("webhook")]),
        "nats": kind(["nats"]),
        "per_subscriber": per_subscriber,
    }


def _receiver_says(url: str, what: str) -> Any:
    """`GET <url>/<what>` of a receiver (bench/receiver.py): its answer's `what`."""
    import requests

    with requests.Session() as session:
        session.trust_env = False
        answer = session.get(f"{url}/{what}", timeout=30)
        answer.raise_for_status()
        return answer.json()[what]


class Delivery:
    """The event delivery rows: two webhook receivers (bench/receiver.py, a process each) and,
    when NATS answers, a throwaway JetStream stream; the subscriptions of the drain's tenant,
    made just before its burst; what each subscriber received, read back at the end.

    Lag = receive time - the event's outbox created_at (the envelope's timestampMs): a
    receiver's time.time() once it has read the body; for NATS, the time the stream stored the
    message (JetStream message metadata). Everything runs on this machine, one clock."""

    def __init__(self, children: Children, env: dict[str, str], nats_url: str) -> None:
        self.children = children
        self.env = env
        self.nats_url = nats_url
        self.receivers: list[tuple[Child, str]] = []
        suffix = secrets.token_hex(4)
        self.stream = f"BENCH_{suffix.upper()}"
        # Subjects of its own (the agent's NATS_STREAM_SUBJECTS): runs on one server never meet.
        self.prefix = f"bench{suffix}"
        self.subjects = [f"{self.prefix}.>"]
        self.template = self.prefix + ".{tenantId}.{type}"
        self.nats_skipped = nats_unreachable_reason(nats_url)
        self.stream_made = False
        self.subscriptions: dict[str, Any] = {}  # subscriber name -> Subscription
        self.since: datetime | None = None

    def start_receivers(self) -> None:
        for n in range(1, WEBHOOK_RECEIVERS + 1):
            child = self.children.start(
                f"receiver-{n}", [PYTHON, str(ROOT / "bench" / "receiver.py")], env=self.env, stdout_pipe=True
            )
            port = int(child.proc.stdout.readline().strip())
            self.receivers.append((child, f"http://127.0.0.1:{port}"))

    def start(self) -> dict[str, str]:
        """Start the receivers; returns the qcluster's extra environment (NATS, when it answers)."""
        from delivery.services import subscription_create

        self.start_receivers()
        if self.nats_skipped:
            return {}
        # With NATS_URL set, each engine keeps an operator-wide NATS subscription for every
        # tenant's events (made enabled at start when missing). Made here disabled, so the
        # lateness and submission phases publish nothing; the burst has a subscription of its own.
        subscription_create(
            tenant_id=None,
            data=self._nats_subscription(
                {
                    "kind": "nats",
                    "name": "NATS JetStream (off: the bench subscribes the drain's tenant only)",
                    "subjectTemplate": self.template,
                    "enabled": False,
                }
            ),
        )
        return {
            "NATS_URL": self.nats_url,
            "NATS_STREAM": self.stream,
            "NATS_STREAM_SUBJECTS": ",".join(self.subjects),
            "NATS_SUBJECT_TEMPLATE": self.template,
        }

    def make_stream(self, *, wait: float = NATS_STREAM_WAIT) -> None:
        """The stream as the engine ensures it (the bench's own subjects, duplicate window 10 min),
        made by the bench so that the bench deletes it. While it cannot be made (NATS not
        answering, another stream taking those subjects) it waits up to `wait`, then skips NATS."""
        if self.nats_skipped or self.stream_made:
            return
        import nats.js.errors
        from nats.js.api import StreamConfig

        from delivery.nats import MIN_DUPLICATE_WINDOW_S, subject_covers

        async def create(js: Any) -> str | None:
            config = StreamConfig(name=self.stream, subjects=self.subjects, duplicate_window=MIN_DUPLICATE_WINDOW_S)
            try:
                await js.add_stream(config)
                return None
            except nats.js.errors.APIError as exc:
                taking = [
                    info.config.name
                    for info in await js.streams_info()
                    if any(
                        subject_covers(mine, theirs) or subject_covers(theirs, mine)
                        for mine in self.subjects
                        for theirs in info.config.subjects or []
                    )
                ]
                return f"{exc.description}" + (f" (stream {', '.join(taking)})" if taking else "")

        deadline = time.monotonic() + wait
        while True:
            try:
                problem = _on_nats(self.nats_url, create)
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                self.stream_made = True
                log(f"delivery: NATS stream {self.stream} made, subjects {', '.join(self.subjects)}")
                return
            if time.monotonic() >= deadline:
                self.nats_skipped = (
                    f"the agent's stream ({', '.join(self.subjects)}) could not be made on NATS at "
                    f"{self.nats_url} within {wait:.0f}s: {problem}"
                )
                log(f"delivery: NATS skipped: {self.nats_skipped}")
                return
            log(f"delivery: NATS stream not made yet ({problem}); waiting up to {wait:.0f}s")
            time.sleep(2.0)

    def subscribe(self, tenant_id: str) -> None:
        """The burst's subscriptions for `tenant_id`: the two webhooks, and NATS when its stream
        is made. A test event to each warms its connection (not counted: another event id)."""
        from delivery.services import subscription_create, subscription_send_test
        from delivery.validation import validate_subscription

        for n, (_, url) in enumerate(self.receivers, 1):
            data = validate_subscription({"name": f"bench receiver {n}", "url": f"{url}/hook"})
            self.subscriptions[f"webhook-{n}"], _ = subscription_create(tenant_id=tenant_id, data=data)
        if self.stream_made:
            data = self._nats_subscription({"kind": "nats", "name": "bench NATS", "subjectTemplate": self.template})
            self.subscriptions["nats"], _ = subscription_create(tenant_id=tenant_id, data=data)
        self.since = max(subscription.created_at for subscription in self.subscriptions.values())
        for subscription in self.subscriptions.values():
            subscription_send_test(tenant_id=tenant_id, subscription_id=subscription.subscription_id)
        log(f"delivery: subscribed {', '.join(self.subscriptions)} to {tenant_id}")

    def _nats_subscription(self, data: dict[str, Any]) -> Any:
        """A NATS subscription validated as the qclusters validate it: against this run's stream
        subjects (their NATS_STREAM_SUBJECTS), not the bench process's default ones."""
        from django.test import override_settings

        from delivery.validation import validate_subscription

        with override_settings(NATS_STREAM_SUBJECTS=self.subjects):
            return validate_subscription(data, operator=True)

    def _ids(self) -> list[Any]:
        return [subscription.subscription_id for subscription in self.subscriptions.values()]

    def wait_delivered(self, *, timeout: float) -> bool:
        """Until no notification of these subscriptions is open (the events are fanned out
        when they are published, so call this after those are)."""
        from delivery.models import Notification
        from delivery.selectors import OPEN_STATES

        ids = self._ids()
        return bool(
            wait_until(
                lambda: not Notification.objects.filter(subscription_id__in=ids, state__in=OPEN_STATES).exists(),
                timeout=timeout,
                interval=0.05,
            )
        )

    def webhook_records(self, url: str) -> list[tuple[str, float]]:
        return [(event_id, at) for event_id, at in _receiver_says(url, "records")]

    def webhook_count(self, url: str) -> int:
        """How many requests the receiver at `url` has recorded, tries included."""
        return int(_receiver_says(url, "count"))

    def stream_count(self) -> int:
        """How many messages the bench's stream holds."""

        async def count(js: Any) -> int:
            return (await js.stream_info(self.stream)).state.messages

        return _on_nats(self.nats_url, count)

    def stream_records(self) -> list[tuple[str, float]]:
        """(Nats-Msg-Id, stored at) of every message under the bench's subject prefix."""
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        async def read(js: Any) -> list[tuple[str, float]]:
            config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
            sub = await js.pull_subscribe(f"{self.prefix}.>", stream=self.stream, config=config)
            records = []
            try:
                while True:
                    try:
                        messages = await sub.fetch(batch=1000, timeout=2)
                    except (TimeoutError, nats.errors.TimeoutError):
                        break
                    for msg in messages:
                        msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
                        records.append((msg_id, msg.metadata.timestamp.timestamp()))
                    if not messages or messages[-1].metadata.num_pending == 0:
                        break
            finally:
                await sub.unsubscribe()
            return records

        return _on_nats(self.nats_url, read)

    def measure(self, tenant_id: str) -> dict:
        """Per subscriber and per kind: deliveries of the burst's events, lag, what is missing."""
        from django.db.models import Count, Sum

        from delivery.models import Notification
        from delivery.services import PING_TYPE
        from outbox.models import OutboxEvent

        created = {
            str(event_id): at.timestamp()
            for event_id, at in OutboxEvent.objects.filter(tenant_id=tenant_id, created_at__gte=self.since).values_list(
                "event_id", "created_at"
            )
        }
        records = {f"webhook-{n}": self.webhook_records(url) for n, (_, url) in enumerate(self.receivers, 1)}
        if "nats" in self.subscriptions:
            records["nats"] = self.stream_records()
        notifications = Notification.objects.filter(subscription_id__in=self._ids()).exclude(event_type=PING_TYPE)
        states = {row["state"]: row["n"] for row in notifications.order_by().values("state").annotate(n=Count("pk"))}
        return {
            **delivery_figures(created, records),
            "notifications": states,
            "tries": notifications.aggregate(n=Sum("attempts"))["n"],
            "retried": notifications.filter(attempts__gt=1).count(),
            "nats_stream": self.stream if "nats" in records else None,
        }

    def finish(self) -> None:
        """After the measurement: the bench's subscriptions off, the stream deleted."""
        from delivery.services import subscription_update
        from delivery.validation import SubscriptionInput

        for subscription in self.subscriptions.values():
            subscription_update(
                tenant_id=subscription.tenant_id,
                subscription_id=subscription.subscription_id,
                data=SubscriptionInput(enabled=False),
            )
        self.delete_stream()

    def delete_stream(self) -> None:
        if not self.stream_made:
            return
        import nats.js.errors

        async def delete(js: Any) -> None:
            try:
                await js.delete_stream(self.stream)
            except nats.js.errors.NotFoundError:
                pass

        try:
            _on_nats(self.nats_url, delete)
            self.stream_made = False
            log(f"delivery: NATS stream {self.stream} deleted")
        except Exception as exc:
            log(f"delivery: could not delete the NATS stream {self.stream}: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Delete the stream if it is still there; stop the receivers (idempotent)."""
        self.delete_stream()
        for child, _ in self.receivers:
            self.children.stop(child)
        self.receivers = []
