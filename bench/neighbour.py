"""The noisy-neighbour row (docs/flow-control.md and docs/events.md, "Fair shares"): a quiet
tenant's start lateness and delivery lag, alone and then beside a tenant that fills its share
of the engine, in the same run on the same workers.

The noisy tenant does what an attacker did: calls to a target that answers after 20 s (as many
as the cluster's threads), eight webhook subscriptions to a receiver that answers after 14 s
(each for one of its calls' event types) and test pings to each.

Runs in the bench process after django.setup(), with the agent's qcluster running.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from bench.agent import _sleep_until, _submit, ensure_tenant, lateness_seconds, lead_for, submit_ms_per_call
from bench.common import PYTHON, ROOT, Children, log, summary_ms, wait_until

QUIET_TENANT = "bench-nn-quiet"
NOISY_TENANT = "bench-nn-noisy"
SLOW_TARGET_MS = 20_000
SLOW_RECEIVER_MS = 14_000
NOISY_SUBSCRIPTIONS = 8
NOISY_PINGS = 20
EVENT_TYPES = ("ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallRunning", "ServiceCallSucceeded")


def _records(base: str) -> dict[str, float]:
    """webhook-id -> first receive time, from a bench receiver."""
    with urllib.request.urlopen(f"{base}/records", timeout=10) as response:  # noqa: S310 - 127.0.0.1
        records = json.load(response)["records"]
    first: dict[str, float] = {}
    for webhook_id, at in records:
        first.setdefault(webhook_id, at)
    return first


def _round(url: str, receiver: str, prefix: str, count: int, spread: float, per_call_ms: float) -> dict[str, Any]:
    """`count` calls of the quiet tenant due evenly over `spread` seconds: their start lateness,
    and the lag of their events (made -> received by the quiet tenant's receiver)."""
    from orchestration.models import ServiceCall
    from outbox.models import OutboxEvent

    first_due = time.time() + lead_for(count, per_call_ms, 1.5)
    dues = [first_due + spread * n / max(1, count - 1) for n in range(count)]
    _submit(QUIET_TENANT, url, dues, prefix)
    _sleep_until(dues[-1])
    calls = ServiceCall.objects.filter(tenant_id=QUIET_TENANT, name__startswith=f"{prefix}-")
    wait_until(lambda: calls.filter(status__in=ServiceCall.TERMINAL).count() >= count, timeout=60, interval=0.1)
    events = {
        str(event_id): made
        for event_id, made in OutboxEvent.objects.filter(aggregate_id__in=calls.values("pk")).values_list(
            "event_id", "created_at"
        )
    }
    received: dict[str, float] = {}

    def all_received() -> bool:
        received.update(_records(receiver))
        return all(event_id in received for event_id in events)

    wait_until(all_received, timeout=60, interval=0.2)
    lateness = lateness_seconds(calls)
    lag = [received[event_id] - made.timestamp() for event_id, made in events.items() if event_id in received]
    return {
        "lateness_ms": summary_ms(lateness),
        "delivery_lag_ms": summary_ms(lag),
        "events": len(events),
        "received": len(lag),
    }


def noisy_neighbour(*, children: Children, env: dict[str, str], url: str, count: int, spread: float) -> dict:
    from django.conf import settings

    from delivery.services import subscription_create, subscription_delete, subscription_send_test
    from delivery.validation import validate_subscription

    ensure_tenant(QUIET_TENANT)
    ensure_tenant(NOISY_TENANT)
    child = children.start(
        "neighbour-receiver", [PYTHON, str(ROOT / "bench" / "receiver.py")], env=env, stdout_pipe=True
    )
    receiver = f"http://127.0.0.1:{int(child.proc.stdout.readline().strip())}"
    noisy: list = []
    try:
        subscription_create(
            tenant_id=QUIET_TENANT,
            data=validate_subscription({"kind": "webhook", "name": "quiet", "url": f"{receiver}/ok"}),
        )
        per_call_ms = submit_ms_per_call(url)
        log(f"noisy neighbour: {count} calls of a quiet tenant over {spread:.0f}s, alone")
        alone = _round(url, receiver, "nn-alone", count, spread, per_call_ms)

        slow_calls = settings.EXECUTION_CONCURRENCY * settings.Q_CLUSTER["workers"]
        log(
            f"noisy neighbour: the same beside a tenant with {slow_calls} calls to a {SLOW_TARGET_MS} ms target, "
            f"{NOISY_SUBSCRIPTIONS} subscriptions to a {SLOW_RECEIVER_MS} ms receiver and {NOISY_PINGS} pings each"
        )
        for n in range(NOISY_SUBSCRIPTIONS):
            data = {
                "kind": "webhook",
                "name": f"slow {n}",
                "url": f"{receiver}/delay/{SLOW_RECEIVER_MS}",
                "eventTypes": [EVENT_TYPES[n % len(EVENT_TYPES)]],
            }
            noisy.append(subscription_create(tenant_id=NOISY_TENANT, data=validate_subscription(data))[0])
        target = url.rsplit("/", 1)[0]
        _submit(NOISY_TENANT, f"{target}/delay/{SLOW_TARGET_MS}", [time.time()] * slow_calls, "nn-noisy")
        for subscription in noisy:
            for _ in range(NOISY_PINGS):
                subscription_send_test(tenant_id=NOISY_TENANT, subscription_id=subscription.pk)
        time.sleep(2.0)  # its calls out, its deliveries out
        window_start = time.time()
        beside = _round(url, receiver, "nn-beside", count, spread, per_call_ms)
        window = time.time() - window_start
    finally:
        # Its deliveries would take minutes at 14 s each: gone with their subscriptions.
        for subscription in noisy:
            subscription_delete(tenant_id=NOISY_TENANT, subscription_id=subscription.pk)
        children.stop(child)
    if window >= SLOW_TARGET_MS / 1000:
        log("noisy neighbour: the window outlasted the slow calls; the figures beside are not all beside them")
    return {"calls": count, "noisy_calls": slow_calls, "alone": alone, "beside": beside, "window_seconds": window}
