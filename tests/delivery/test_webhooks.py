"""Webhook delivery through the real engine to real receivers on 127.0.0.1 that verify every
signature with `standardwebhooks`: order per call, retries, Retry-After, 410, timeouts,
expiry, secret rotation, and tenants kept apart."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from core.ids import utcnow
from delivery.channels.webhook import webhook_signature
from delivery.envelopes import event_body
from delivery.models import DeliveryAttempt, Notification, Subscription
from delivery.services import (
    GONE_REASON,
    new_webhook_secret,
    notifications_fan_out,
    subscription_create,
    subscription_recover,
    subscription_rotate_secret,
    subscription_send_test,
)
from delivery.validation import SubscriptionInput
from tests.delivery.receivers import receiving
from tests.support.factories import make_call
from tests.support.waiting import wait_for

CALL_EVENTS = ["ServiceCallSubmitted", "ServiceCallScheduled", "ServiceCallRunning", "ServiceCallSucceeded"]


def webhook(url: str, *, tenant_id: str | None = "acme", **fields) -> tuple[Subscription, str]:
    return subscription_create(
        tenant_id=tenant_id, data=SubscriptionInput(kind="webhook", name="hook", url=url, **fields)
    )


def notifications(subscription: Subscription) -> list[Notification]:
    return list(Notification.objects.filter(subscription=subscription).order_by("event_seq"))


def settled(subscription: Subscription, count: int) -> list[Notification]:
    rows = notifications(subscription)
    final = [n for n in rows if n.state in (Notification.State.SUCCEEDED, Notification.State.EXPIRED)]
    return rows if len(rows) >= count and len(final) == len(rows) else []


@pytest.fixture
def fast_retries(settings):
    settings.EVENT_DELIVERY_SCHEDULE = [0.2, 0.2, 0.2]
    settings.WEBHOOK_TIMEOUT_MS = 500


def test_the_standard_webhooks_test_vector_signs_as_the_spec_says():
    # From the Standard Webhooks reference implementation's tests.
    at = datetime.fromtimestamp(1614265330, tz=UTC)
    signature = Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").sign(
        msg_id="msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp=at, data='{"test": 2432232314}'
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_new_secret_is_whsec_and_32_random_bytes():
    import base64

    secret = new_webhook_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert secret != new_webhook_secret()


def test_every_event_of_a_call_arrives_signed_in_order_with_its_event_id(world, engine, http_target):
    with receiving() as receiver:
        subscription, secret = webhook(receiver.url("/ok"))
        receiver.secrets.append(secret)
        call = make_call("acme", url=http_target.url("/json"))
        rows = wait_for(lambda: settled(subscription, 4), timeout=15)

    assert [n.state for n in rows] == [Notification.State.SUCCEEDED] * 4
    envelopes = receiver.envelopes("/ok")
    assert [e["type"] for e in envelopes] == CALL_EVENTS
    assert {e["aggregateId"] for e in envelopes} == {str(call.pk)}
    for request, envelope in zip(receiver.at("/ok"), envelopes, strict=True):
        assert request.verified_with == [secret]
        assert request.headers["webhook-id"] == envelope["id"]
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["User-Agent"].startswith("ServiceAgent/")
    assert DeliveryAttempt.objects.filter(notification__subscription=subscription).count() == 4


def test_another_tenants_subscription_receives_nothing_and_an_operator_wide_one_everything(world, engine, http_target):
    with receiving() as receiver:
        globex, _ = webhook(receiver.url("/ok"), tenant_id="globex")
        everyone, _ = webhook(receiver.url("/ok"), tenant_id=None)
        make_call("acme", url=http_target.url("/json"))
        wait_for(lambda: settled(everyone, 4), timeout=15)
    assert notifications(globex) == []
    assert {n.tenant_id for n in notifications(everyone)} == {"acme"}


def test_a_flaky_receiver_gets_the_event_again_until_it_succeeds_with_the_same_webhook_id(
    world, engine, http_target, fast_retries
):
    with receiving() as receiver:
        subscription, secret = webhook(receiver.url("/flaky/2"), event_types=("ServiceCallSucceeded",))
        make_call("acme", url=http_target.url("/json"))
        [row] = wait_for(lambda: settled(subscription, 1), timeout=15)
    assert row.state == Notification.State.SUCCEEDED and row.attempts == 3
    tries = receiver.at("/flaky/2")
    assert len(tries) == 3 and len({t.headers["webhook-id"] for t in tries}) == 1
    attempts = list(row.delivery_attempts.order_by("n"))
    assert [(a.n, a.status_code) for a in attempts] == [(1, 500), (2, 500), (3, 200)]
    assert all(a.trigger == DeliveryAttempt.Trigger.SCHEDULED for a in attempts)
    subscription.refresh_from_db()
    assert subscription.failing_since is None and subscription.last_success_at is not None


def test_a_later_event_of_a_call_waits_behind_an_earlier_one_that_has_not_succeeded(transactional_db, world, settings):
    settings.EVENT_DELIVERY_SCHEDULE = [3600]
    from delivery.runner import deliver_now

    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/flaky/1"))
        call = make_call("acme", due_in=3600)  # Submitted and Scheduled events only
        from outbox.dispatcher import dispatch_batch

        dispatch_batch()
        assert deliver_now() == 1  # only the first event goes; it fails
        first, second = notifications(subscription)
        assert first.state == Notification.State.FAILED and second.state == Notification.State.PENDING
        assert deliver_now() == 0  # the second waits behind the first, which waits an hour
        assert [e["type"] for e in receiver.envelopes("/flaky/1")] == ["ServiceCallSubmitted"]
        # Another call's events do not wait.
        make_call("acme", due_in=3600, name="other")
        dispatch_batch()
        assert deliver_now() == 1
        assert call.pk  # (the first call's order still holds)


def test_a_receiver_answering_410_disables_the_subscription_at_once(world, engine, http_target, fast_retries):
    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/gone"))
        make_call("acme", url=http_target.url("/json"))
        wait_for(lambda: not Subscription.objects.get(pk=subscription.pk).enabled, timeout=15)
    subscription.refresh_from_db()
    assert subscription.disabled_reason == GONE_REASON
    assert len(receiver.at("/gone")) == 1  # nothing more is sent to it


def test_429_with_retry_after_is_honoured(transactional_db, world, settings):
    settings.EVENT_DELIVERY_SCHEDULE = [30, 30]
    from delivery.runner import deliver_now
    from outbox.dispatcher import dispatch_batch

    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/busy"), event_types=("ServiceCallSubmitted",))
        make_call("acme", due_in=3600)
        dispatch_batch()
        before = utcnow()
        assert deliver_now() == 1
    [row] = notifications(subscription)
    assert row.state == Notification.State.FAILED
    wait = (row.next_attempt_at - before).total_seconds()
    assert 0.9 <= wait <= 2.5, wait  # Retry-After: 1, not the schedule's 30 s


def test_a_slow_receiver_times_out_and_the_schedule_ends_in_expired(world, engine, http_target, fast_retries):
    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/slow"), event_types=("ServiceCallSubmitted",))
        make_call("acme", url=http_target.url("/json"))
        [row] = wait_for(lambda: settled(subscription, 1), timeout=20)
    assert row.state == Notification.State.EXPIRED and row.attempts == 4  # first try + 3 retries
    assert all("Timeout" in a.error or "no complete response" in a.error for a in row.delivery_attempts.all())
    subscription.refresh_from_db()
    assert subscription.failing_since is not None and subscription.enabled


def test_a_redirect_is_a_failure_and_is_not_followed(transactional_db, world, settings):
    from delivery.runner import deliver_now
    from outbox.dispatcher import dispatch_batch

    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/redirect"), event_types=("ServiceCallSubmitted",))
        make_call("acme", due_in=3600)
        dispatch_batch()
        deliver_now()
        assert receiver.at("/ok") == []
    [row] = notifications(subscription)
    assert row.state == Notification.State.FAILED and row.delivery_attempts.get().status_code == 302


def test_an_event_past_its_expiry_is_expired_on_its_next_failure(transactional_db, world, settings):
    from delivery.runner import deliver_now
    from outbox.dispatcher import dispatch_batch

    with receiving() as receiver:
        subscription, _ = webhook(receiver.url("/flaky/9"), event_types=("ServiceCallSubmitted",))
        make_call("acme", due_in=3600)
        dispatch_batch()
        Notification.objects.filter(subscription=subscription).update(event_created_at=utcnow() - timedelta(days=4))
        deliver_now()
    assert notifications(subscription)[0].state == Notification.State.EXPIRED


def test_during_a_rotation_both_secrets_sign_and_either_verifies(world):
    subscription, old = webhook("http://127.0.0.1:9/")
    subscription, new = subscription_rotate_secret(tenant_id="acme", subscription_id=subscription.pk)
    body = event_body({"id": "evt_1", "type": "X"})
    at = utcnow()
    header = webhook_signature(subscription, msg_id="evt_1", at=at, body=body)
    assert len(header.split(" ")) == 2
    headers = {"webhook-id": "evt_1", "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": header}
    assert Webhook(old).verify(body, headers) == json.loads(body)
    assert Webhook(new).verify(body, headers) == json.loads(body)
    # After the overlap only the new secret signs.
    later = at + timedelta(hours=25)
    assert len(webhook_signature(subscription, msg_id="evt_1", at=later, body=body).split(" ")) == 1


def test_a_secret_whose_sealing_key_is_gone_signs_nothing_even_after_it_signed(world, settings):
    """A secret is unsealed once per process and sealing keys (core/secrets.py), not once per
    delivery; with the keys that sealed it gone, it no longer signs, as before that cache."""
    from cryptography.fernet import Fernet

    from core.secrets import SecretUnavailable

    subscription, secret = webhook("http://127.0.0.1:9/")
    body = event_body({"id": "evt_1", "type": "X"})
    at = utcnow()
    header = webhook_signature(subscription, msg_id="evt_1", at=at, body=body)
    headers = {"webhook-id": "evt_1", "webhook-timestamp": str(int(at.timestamp())), "webhook-signature": header}
    assert Webhook(secret).verify(body, headers) == json.loads(body)

    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    with pytest.raises(SecretUnavailable):
        webhook_signature(subscription, msg_id="evt_1", at=at, body=body)


def test_a_test_event_and_recover_go_out_as_manual_tries(transactional_db, world, settings):
    from delivery.runner import deliver_now

    settings.EVENT_DELIVERY_SCHEDULE = [3600]
    with receiving() as receiver:
        subscription, secret = webhook(receiver.url("/flaky/1"))
        receiver.secrets.append(secret)
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
        assert deliver_now() == 1
        [ping] = notifications(subscription)
        assert ping.state == Notification.State.FAILED
        assert (
            subscription_recover(tenant_id="acme", subscription_id=subscription.pk, since=utcnow() - timedelta(hours=1))
            == 1
        )
        assert deliver_now() == 1
    ping.refresh_from_db()
    assert ping.state == Notification.State.SUCCEEDED
    assert [a.trigger for a in ping.delivery_attempts.order_by("n")] == ["manual", "manual"]
    assert [e["type"] for e in receiver.envelopes("/flaky/1")] == ["ServiceAgentPing"] * 2
    assert all(r.verified_with == [secret] for r in receiver.at("/flaky/1"))


def test_the_fan_out_is_idempotent_and_skips_events_older_than_the_subscription(world):
    from delivery.services import FanoutEvent

    subscription, _ = webhook("http://127.0.0.1:9/")
    envelope = {
        "id": "0190f0f0-0000-7000-8000-000000000001",
        "type": "ServiceCallSubmitted",
        "tenantId": "acme",
        "aggregateId": "0190f0f0-0000-7000-8000-000000000002",
    }
    fresh = FanoutEvent(envelope=envelope, seq=1, created_at=utcnow())
    notifications_fan_out(events=[fresh])
    notifications_fan_out(events=[fresh])
    assert len(notifications(subscription)) == 1
    old = FanoutEvent(
        envelope={**envelope, "id": "0190f0f0-0000-7000-8000-000000000003"},
        seq=2,
        created_at=subscription.created_at - timedelta(seconds=1),
    )
    notifications_fan_out(events=[old])
    assert len(notifications(subscription)) == 1


def test_the_fan_outs_subscriptions_are_the_orm_querys(world):
    """The fan-out reads the subscriptions with a statement written once per process (it runs
    inside the dispatcher's write transaction for every batch): the same ones, with the same
    values, as the ORM query it replaced, for one tenant, several, and one with none."""
    from django.db.models import Q

    from delivery.models import Subscription
    from delivery.services.fanout import _fan_out_subscriptions

    webhook("http://127.0.0.1:9/a", tenant_id="acme", event_types=("ServiceCallSucceeded", "ServiceCallFailed"))
    webhook("http://127.0.0.1:9/b", tenant_id="globex")
    webhook("http://127.0.0.1:9/c", tenant_id=None)

    def orm(tenants):
        return sorted(
            (s.subscription_id, s.tenant_id, s.event_types, s.created_at)
            for s in Subscription.objects.filter(Q(tenant_id__in=tenants) | Q(tenant__isnull=True))
        )

    for tenants in (["acme"], ["acme", "globex"], ["initech"]):
        got = sorted(
            (t.subscription_id, t.tenant_id, t.event_types, t.created_at) for t in _fan_out_subscriptions(tenants)
        )
        assert got == orm(tenants), tenants
    assert len(_fan_out_subscriptions(["acme", "globex"])) == 3


def test_an_envelope_nested_near_the_limit_is_claimed_from_a_deep_stack_with_its_body(transactional_db, world):
    """The claim makes each try's body (once per event): an envelope stored nested near the
    JSON decoder's limit (core/fields.py) must neither fail the claim, which would hold back
    every notification due after it, nor lose its body, however deep the claimer's stack."""
    from django.db import connection

    from delivery.services import notifications_claim
    from outbox.dispatcher import dispatch_batch

    subscription, _ = webhook("http://127.0.0.1:9/", event_types=("ServiceCallSubmitted",))
    make_call("acme", due_in=3600)
    dispatch_batch()
    [notification] = notifications(subscription)
    depth = 960
    deep = '{"a":' * depth + "1" + "}" * depth
    shallow = {key: value for key, value in notification.envelope.items() if key != "payload"}
    stored = json.dumps(shallow, separators=(",", ":"))[:-1] + ',"payload":' + deep + "}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Notification._meta.db_table} SET envelope = %s WHERE notification_id = %s",
            [stored, notification.pk.hex],
        )

    def from_deep_stack(frames: int):
        return from_deep_stack(frames - 1) if frames else notifications_claim(limit=10)

    [claimed] = from_deep_stack(60)
    assert claimed.pk == notification.pk
    assert claimed.body == stored


def _submitted_through_the_loop(subscription: Subscription, *, headers: dict[str, str]) -> list[Notification]:
    """A call with these headers, its events fanned out and tried by the delivery loop until its
    ServiceCallSubmitted has settled."""
    from delivery.runner import Deliverer
    from outbox.dispatcher import dispatch_batch

    make_call("acme", headers=headers, due_in=3600)
    dispatch_batch()
    deliverer = Deliverer(concurrency=4, batch_size=4)
    try:
        deliverer.step()
        wait_for(lambda: deliverer.results.qsize() >= 1, timeout=10)
        deliverer.record_ready()
    finally:
        deliverer.stop(timeout=5)
    return notifications(subscription)


def test_an_envelope_goes_as_utf8_json_signed_over_the_exact_bytes_sent(transactional_db, world):
    headers = {f"X-Accented-{n}": "é" * 8192 for n in range(31)}
    with receiving() as receiver:
        subscription, secret = webhook(receiver.url("/ok"), event_types=("ServiceCallSubmitted",))
        receiver.secrets.append(secret)
        [row] = _submitted_through_the_loop(subscription, headers=headers)
    assert row.state == Notification.State.SUCCEEDED
    [request] = receiver.at("/ok")
    assert request.verified_with == [secret]
    assert ("é" * 8192).encode() in request.body and b"\\u00e9" not in request.body
    assert len(request.body) < 600_000  # ASCII-escaped, it was 1.5 MB
    assert json.loads(request.body)["payload"]["requestSpec"]["headers"] == headers


def test_an_envelope_over_the_webhook_limit_is_cut_to_fit_and_still_verifies(transactional_db, world, monkeypatch):
    from delivery.channels import webhook as senders

    monkeypatch.setattr(senders, "WEBHOOK_MAX_BODY_BYTES", 64 * 1024)
    headers = {f"X-Accented-{n}": "é" * 8192 for n in range(31)}
    with receiving() as receiver:
        subscription, secret = webhook(receiver.url("/ok"), event_types=("ServiceCallSubmitted",))
        receiver.secrets.append(secret)
        [row] = _submitted_through_the_loop(subscription, headers=headers)
    assert row.state == Notification.State.SUCCEEDED
    [request] = receiver.at("/ok")
    assert request.verified_with == [secret]
    assert len(request.body) <= 64 * 1024
    envelope = json.loads(request.body)
    assert envelope["payloadTruncated"] is True
    assert envelope["callUrl"].endswith(f"/api/tenants/acme/service-calls/{row.aggregate_id}")
    assert set(envelope["payload"]["requestSpec"]["headers"]) == set(headers)


def test_a_lone_surrogate_in_an_envelope_is_escaped_not_a_body_that_cannot_be_sent():
    envelope = {"id": "evt_1", "payload": {"value": "a\ud800b é"}}
    body = event_body(envelope)
    assert body.encode() and json.loads(body) == envelope


def test_a_delivery_refused_by_the_egress_policy_expires_at_once_and_disables_its_subscription(
    transactional_db, world, settings
):
    """As a call's EgressDenied, never retried: the next try would be refused the same way, and
    a schedule of tries against the operator's network is what a tenant must not get. `localhost`
    resolves here to loopback, refused with an empty allowlist: nothing is sent anywhere."""
    from delivery.runner import Deliverer
    from delivery.services import REFUSED_REASON

    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://agent.example:8000"
    settings.EVENT_DELIVERY_SCHEDULE = [0.1, 0.1, 0.1]
    subscription, _ = webhook("http://localhost:9/hook")
    subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
    deliverer = Deliverer(concurrency=4, batch_size=4)
    try:
        deliverer.step()
        wait_for(lambda: deliverer.results.qsize() >= 1, timeout=10)
        deliverer.record_ready()
    finally:
        deliverer.stop(timeout=5)

    [row] = notifications(subscription)
    assert (row.state, row.attempts, row.next_attempt_at) == (Notification.State.EXPIRED, 1, None)
    assert row.last_error == "localhost points to a loopback address, not in EGRESS_ALLOWLIST"
    subscription.refresh_from_db()
    assert not subscription.enabled and subscription.failing_since is not None
    assert subscription.disabled_reason == f"{REFUSED_REASON}: {row.last_error}"
