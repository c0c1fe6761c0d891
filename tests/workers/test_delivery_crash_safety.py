"""At least once, in order, through crashes (docs/events.md, "The guarantees"): SIGKILL the
workers three times while they deliver a burst's events to two real webhook receivers (each
verifying every signature) and to NATS JetStream, then let a last cluster finish.

Afterwards every subscriber has every event of every call at least once; a duplicate carries
the same webhook-id / Nats-Msg-Id and the same body; and after de-duplication (first arrival
kept) each subscriber saw each call's events in the outbox's order.

A worker killed mid-delivery leaves its notifications claimed until the next cluster's
watchdog finds its session dead (WORKER_STALE_SECONDS, 3 s in tests/workers/cluster.py) and
its tries surely over (the longest try after that), not for their lease (a minute and more,
delivery.services.lease_length): each cluster must deliver within 30 s of its start, the last
one finish within FINAL_TIMEOUT, both shorter than the lease, and every claim a kill left must
have been delivered before its lease would have ended.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.services import LEASE, subscription_create
from delivery.validation import validate_subscription
from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.delivery.receivers import receiving
from tests.support.factories import make_call
from tests.support.nats import KEEP_PREFIX, NATS_TEST_URL, jetstream_available, run_js
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster

# Not serial: it kills only its own clusters, and its NATS stream takes subjects of its own
# (NATS_STREAM_SUBJECTS), so it runs beside the other tests.
pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]

CALLS = 60
TENANTS = ("acme", "globex")
# Receivers answer after a moment, so a kill lands while deliveries are on the wire.
RECEIVER_PATH = "/delay/60"
FINAL_TIMEOUT = 45.0  # less than the least lease (delivery.services.LEASE, 60 s)

CALL_EVENT_TYPES = ["ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallRunning"]
TERMINAL_TYPES = {"ServiceCallSucceeded", "ServiceCallFailed"}


def submit_burst(http_target) -> list[str]:
    """60 calls of both tenants over ~9 s, each answered after 150-450 ms; returns their ids."""
    now = datetime.now(UTC)
    ids = []
    for n in range(CALLS):
        call = make_call(
            TENANTS[n % 2],
            name=f"delivery burst {n}",
            method="POST",
            url=http_target.url(f"/delay/{150 + (n % 4) * 100}?m=n{n}"),
            body={"n": n},
            # every fifth call is due at once, the others spread over the next 9 s
            due_at=now + timedelta(milliseconds=150 * n) if n % 5 else None,
            correlation_id=f"delivery-burst-{n}",
        )
        ids.append(str(call.pk))
    return ids


# --- NATS: the test's own view of the server ---------------------------------------------


def create_agent_stream(stream: str, subjects: str) -> None:
    """The stream as the agent ensures it at start (delivery/nats.py: NATS_STREAM_SUBJECTS,
    duplicate window 10 min), made here first so that a server refusing it (subjects another
    stream takes) fails the test before the burst, and not each cluster's publishes."""
    from delivery.nats import JetStreamPublisher

    remove_stale_test_streams()
    publisher = JetStreamPublisher(url=NATS_TEST_URL, stream=stream, subjects=[subjects])
    try:
        assert publisher.ensure_stream() == "created"
    finally:
        publisher.close()


# A run of this test takes under two minutes: a test stream older than this was left behind by
# a run that was killed before its clean-up, and would stay on the server for ever; a stream of
# tests/support/nats.py's `store_kept` stands for a whole session, never this long.
STALE_TEST_STREAM = timedelta(minutes=10)
STALE_KEEP_STREAM = timedelta(hours=6)


def remove_stale_test_streams() -> None:
    async def remove(js) -> None:
        for info in await js.streams_info():
            name, created = info.config.name, info.created
            stale = STALE_KEEP_STREAM if name.startswith(KEEP_PREFIX) else STALE_TEST_STREAM
            if name.startswith("SA_TEST_") and created is not None and datetime.now(UTC) - created > stale:
                await js.delete_stream(name)

    run_js(remove)


def stream_messages(stream: str) -> tuple[float, list[dict]]:
    """The stream's duplicate window (s), and every message in stream order: seq, subject,
    Nats-Msg-Id, data."""

    async def read(js) -> tuple[float, list[dict]]:
        info = await js.stream_info(stream)
        messages = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            messages.append(
                {
                    "seq": msg.seq,
                    "subject": msg.subject,
                    "msg_id": (msg.headers or {}).get("Nats-Msg-Id"),
                    "data": msg.data,
                }
            )
        return info.config.duplicate_window, messages

    return run_js(read)


def delete_stream(stream: str) -> None:
    import nats.js.errors

    async def delete(js) -> None:
        try:
            await js.delete_stream(stream)
        except nats.js.errors.NotFoundError:
            pass

    run_js(delete)


# --- What was received, de-duplicated ------------------------------------------------------


def check_deliveries(
    where: str, arrivals: list[tuple[str, bytes]], events_by_call: dict[str, list[str]]
) -> tuple[int, int]:
    """`arrivals`: (event id, body) in arrival order. Asserts at least once, identical duplicates,
    and each call's order after de-duplication; returns (deliveries, duplicates)."""
    all_ids = {event_id for ids in events_by_call.values() for event_id in ids}
    first: dict[str, bytes] = {}
    order_by_call: dict[str, list[str]] = defaultdict(list)
    for event_id, body in arrivals:
        envelope = json.loads(body)
        assert envelope["id"] == event_id, f"{where}: the id {event_id} does not match its body's {envelope['id']}"
        if event_id in first:
            assert body == first[event_id], f"{where}: event {event_id} arrived again with another body"
            continue
        first[event_id] = body
        order_by_call[envelope["aggregateId"]].append(event_id)
    missing = all_ids - set(first)
    assert not missing, f"{where}: {len(missing)} of {len(all_ids)} events never arrived"
    assert set(first) == all_ids, f"{where}: events of other calls arrived: {set(first) - all_ids}"
    for call_id, expected in events_by_call.items():
        assert order_by_call[call_id] == expected, f"{where}: call {call_id}'s events arrived out of order"
    return len(arrivals), len(arrivals) - len(first)


def progress(call_ids: list[str], subscriptions: int) -> str:
    expected = OutboxEvent.objects.filter(aggregate_id__in=call_ids).count() * subscriptions
    open_calls = ServiceCall.objects.filter(
        pk__in=call_ids, status__in=[ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING]
    ).count()
    unpublished = OutboxEvent.objects.filter(published_at__isnull=True).count()
    states = Counter(Notification.objects.values_list("state", flat=True))
    errors = Counter(Notification.objects.exclude(last_error="").values_list("last_error", flat=True))
    return (
        f"open calls {open_calls}, unpublished events {unpublished}, notifications "
        f"{sum(states.values())}/{expected} {dict(states)}, last errors {dict(errors.most_common(3))}"
    )


def finished(call_ids: list[str], subscriptions: int) -> bool:
    if ServiceCall.objects.filter(
        pk__in=call_ids, status__in=[ServiceCall.Status.SCHEDULED, ServiceCall.Status.RUNNING]
    ).exists():
        return False
    if OutboxEvent.objects.filter(published_at__isnull=True).exists():
        return False
    expected = OutboxEvent.objects.filter(aggregate_id__in=call_ids).count() * subscriptions
    notifications = Notification.objects.all()
    return notifications.count() == expected and not notifications.exclude(state=Notification.State.SUCCEEDED).exists()


# --- The test --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "with_nats",
    [pytest.param(False, id="webhooks"), pytest.param(True, id="webhooks-and-nats", marks=pytest.mark.nats)],
)
def test_sigkill_of_the_workers_three_times_mid_delivery_loses_no_event_and_keeps_each_calls_order(
    world, http_target, tmp_path, settings, with_nats
):
    assert LEASE.total_seconds() > FINAL_TIMEOUT  # so the test fails should the claims wait for it
    if not with_nats and jetstream_available():
        pytest.skip("NATS with JetStream answers here: the webhooks-and-nats case runs and covers the webhooks too")

    # A killed worker's claims are due again the longest try after the watchdog finds it dead
    # (delivery.services.notifications_release_dead_claims): 3 s here, where the receivers
    # answer within 60 ms, rather than the default 15 s.
    timeouts = {"WEBHOOK_TIMEOUT_MS": "3000", "NATS_PUBLISH_TIMEOUT_MS": "1500"}
    env = {"NATS_URL": "", **timeouts}
    stream = token = None
    clusters: list[Cluster] = []
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        if with_nats:
            suffix = secrets.token_hex(4)
            stream, token = f"SA_TEST_{suffix.upper()}", f"satest{suffix}"
            # Subjects of its own, as an agent sharing the server with others takes them: the
            # clusters get them through their environment, this process's validation too.
            subjects, template = f"{token}.>", f"{token}.{{tenantId}}.{{type}}"
            create_agent_stream(stream, subjects)
            settings.NATS_STREAM_SUBJECTS = [subjects]
            env = {
                "NATS_URL": NATS_TEST_URL,
                "NATS_STREAM": stream,
                "NATS_STREAM_SUBJECTS": subjects,
                "NATS_SUBJECT_TEMPLATE": template,
                **timeouts,
            }
            # Made before the burst (a subscription receives the events created from its creation
            # on), through the admin's validation; each engine's nats_subscription_ensure keeps it.
            subscription_create(
                tenant_id=None,
                data=validate_subscription(
                    {"kind": "nats", "name": "NATS (test stream)", "subjectTemplate": template}, operator=True
                ),
            )

        with receiving() as first, receiving() as second:
            receivers = {"first": first, "second": second}
            # receiver name -> tenant -> the secret of that receiver's subscription for the tenant
            secret_of: dict[str, dict[str, str]] = {}
            for name, receiver in receivers.items():
                secret_of[name] = {}
                for tenant in TENANTS:
                    data = validate_subscription({"name": f"{name} receiver", "url": receiver.url(RECEIVER_PATH)})
                    _, secret = subscription_create(tenant_id=tenant, data=data)
                    receiver.secrets.append(secret)
                    secret_of[name][tenant] = secret
            subscriptions = Subscription.objects.count()
            assert subscriptions == len(receivers) * len(TENANTS) + (1 if with_nats else 0)
            per_event = len(receivers) + (1 if with_nats else 0)

            call_ids = submit_burst(http_target)

            def received() -> int:
                return sum(len(r.at(RECEIVER_PATH)) for r in receivers.values())

            # What the kills left claimed (the next cluster's watchdog gives it back): kind by key.
            left: dict = {}
            for round_ in range(3):
                cluster = Cluster(tmp_path, name=f"round{round_}", **env).start()
                clusters.append(cluster)
                # Kill while deliveries are on the wire: after this cluster delivered something.
                before = received()
                wait_for(lambda before=before: received() > before, timeout=30)
                time.sleep(0.2 + 0.4 * round_)
                cluster.kill()
                timings[f"kill {round_}"] = time.monotonic() - started
                claimed = Notification.objects.filter(
                    state=Notification.State.PENDING, locked_until__gt=datetime.now(UTC), claimed_by__gt=""
                )
                left.update(
                    (pk, (kind, until))
                    for pk, kind, until in claimed.values_list("pk", "subscription__kind", "locked_until")
                )
            in_flight_at_kills = len(left)
            left_by_kind = Counter(kind for kind, _ in left.values())

            final = Cluster(tmp_path, name="final", **env).start()
            clusters.append(final)
            deadline = time.monotonic() + FINAL_TIMEOUT
            while not finished(call_ids, per_event):
                assert time.monotonic() < deadline, (
                    f"not delivered within {FINAL_TIMEOUT}s: {progress(call_ids, per_event)}\n{final.log()}"
                )
                time.sleep(0.5)
            timings["all delivered"] = time.monotonic() - started
            final.stop()

            webhook_arrivals = {name: list(receiver.at(RECEIVER_PATH)) for name, receiver in receivers.items()}
        duplicate_window, nats_messages = stream_messages(stream) if with_nats else (None, [])
    finally:
        for cluster in clusters:
            cluster.stop() if cluster.proc else None
        if stream:
            delete_stream(stream)

    # Each call's events, in the outbox's order (which the envelopes' order follows).
    events_by_call: dict[str, list[str]] = {call_id: [] for call_id in call_ids}
    types_by_call: dict[str, list[str]] = {call_id: [] for call_id in call_ids}
    for row in OutboxEvent.objects.filter(aggregate_id__in=call_ids).order_by("id"):
        events_by_call[str(row.aggregate_id)].append(str(row.event_id))
        types_by_call[str(row.aggregate_id)].append(row.event_type)
    for call_id, types in types_by_call.items():
        assert len(types) == 4 and types[:3] == CALL_EVENT_TYPES and types[3] in TERMINAL_TYPES, (call_id, types)
    outcomes = Counter(ServiceCall.objects.filter(pk__in=call_ids).values_list("status", "error_kind"))

    report = {}
    for name, arrivals in webhook_arrivals.items():
        for request in arrivals:
            envelope = json.loads(request.body)
            # Signed with the secret of this receiver's subscription for the event's tenant, and
            # verified by standardwebhooks (timestamp within five minutes included).
            assert request.verified_with == [secret_of[name][envelope["tenantId"]]], (name, request.headers)
            assert request.headers["webhook-id"] == envelope["id"]
        report[f"webhook {name}"] = check_deliveries(
            f"webhook receiver {name}", [(r.headers["webhook-id"], r.body) for r in arrivals], events_by_call
        )

    if with_nats:
        # The stream de-duplicates a retry within ten minutes.
        assert duplicate_window == 600
        # The stream is this test's alone (its own subjects): every message in it is one of ours.
        for message in nats_messages:
            envelope = json.loads(message["data"])
            assert message["subject"] == f"{token}.{envelope['tenantId']}.{envelope['type']}"
        # Stream order: seq ascending, as read.
        report["nats"] = check_deliveries(
            f"NATS stream {stream}", [(m["msg_id"], m["data"]) for m in nats_messages], events_by_call
        )

    succeeded = Notification.objects.filter(state=Notification.State.SUCCEEDED).count()
    attempts = DeliveryAttempt.objects.count()
    shown = {key: round(value, 1) for key, value in timings.items()}
    print(
        f"timings {shown}; outcomes {dict(outcomes)}; claims left by the kills {dict(left_by_kind)}; "
        f"notifications {succeeded}, recorded attempts {attempts}; (deliveries, duplicates) {report}"
    )
    assert succeeded == sum(len(ids) for ids in events_by_call.values()) * per_event
    # A try cut short by a kill is never recorded; every success is.
    assert not Notification.objects.filter(delivery_attempts__isnull=True).exists()
    # The kills landed mid-delivery: some claims were left for the watchdog to give back.
    assert in_flight_at_kills >= 1
    # ... and each was delivered before its lease would have ended: the watchdog gave it back.
    delivered_at = dict(Notification.objects.filter(pk__in=left).values_list("pk", "delivered_at"))
    late = [pk for pk, (_, until) in left.items() if delivered_at[pk] >= until]
    assert not late, f"{len(late)} of the claims the kills left waited for their lease"
