"""Submit, start and finish: conditional transitions with their events in one transaction."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import Conflict
from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.services import (
    CallKey,
    service_call_finish,
    service_call_interrupt,
    service_call_rerun,
    service_call_start,
    service_call_submit,
    service_call_tags_set,
    service_calls_start,
)
from outbox.models import OutboxEvent
from tests.support.factories import make_call, make_submission
from timer.models import TimerSchedule


def events(call):
    return list(OutboxEvent.objects.filter(aggregate_id=call.pk).order_by("id").values_list("event_type", flat=True))


def test_submit_stores_a_scheduled_call_with_tags_timer_and_two_events(world):
    due = datetime.now(UTC) + timedelta(minutes=5)
    call = make_call(tags=["a", "b"], due_at=due)
    stored = ServiceCall.objects.get(pk=call.pk)
    assert stored.status == ServiceCall.Status.SCHEDULED
    assert abs((stored.due_at - due).total_seconds()) < 0.001
    assert sorted(ServiceCallTag.objects.filter(service_call=call).values_list("tag", flat=True)) == ["a", "b"]
    timer = TimerSchedule.objects.get(service_call=call)
    assert timer.state == TimerSchedule.State.SCHEDULED and timer.due_at == stored.due_at
    assert events(call) == ["ServiceCallSubmitted", "ServiceCallScheduled"]
    assert stored.service_call_id.version == 7


def test_a_past_due_time_means_now(world):
    call = make_call(due_at=datetime.now(UTC) - timedelta(hours=1))
    stored = ServiceCall.objects.get(pk=call.pk)
    assert stored.due_at == stored.submitted_at


def test_start_is_conditional_and_a_duplicate_is_harmless(world):
    call = make_call()
    first = service_call_start(tenant_id="acme", service_call_id=call.pk)
    second = service_call_start(tenant_id="acme", service_call_id=call.pk)
    assert first is not None and second is None
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.RUNNING
    assert events(call).count("ServiceCallRunning") == 1


def test_it_never_starts_a_call_before_its_due_time(world):
    call = make_call(due_in=60)
    assert service_calls_start(keys=[CallKey("acme", call.pk)]) == []
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SCHEDULED


def test_it_refuses_to_start_a_call_under_another_tenant(world):
    call = make_call()
    assert service_calls_start(keys=[CallKey("globex", call.pk)]) == []
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SCHEDULED


def test_finish_records_the_outcome_once_and_terminal_states_never_change(world):
    call = make_call()
    service_call_start(tenant_id="acme", service_call_id=call.pk)
    ok = Outcome(succeeded=True, status=200, headers={"a": "b"}, body_snippet="{}", latency_ms=12)
    assert service_call_finish(tenant_id="acme", service_call_id=call.pk, outcome=ok)
    assert not service_call_interrupt(tenant_id="acme", service_call_id=call.pk, reason="late")
    stored = ServiceCall.objects.get(pk=call.pk)
    assert stored.status == ServiceCall.Status.SUCCEEDED and stored.error_kind is None
    assert stored.outcome_meta["responseMeta"]["latencyMs"] == 12
    assert events(call) == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]


def test_a_failure_carries_its_error_kind(world):
    call = make_call()
    service_call_start(tenant_id="acme", service_call_id=call.pk)
    service_call_finish(
        tenant_id="acme",
        service_call_id=call.pk,
        outcome=Outcome.failure(ErrorKind.TIMEOUT, "too slow", latency_ms=1000),
    )
    stored = ServiceCall.objects.get(pk=call.pk)
    assert (stored.status, stored.error_kind) == (ServiceCall.Status.FAILED, "Timeout")
    assert stored.outcome_meta == {"errorMeta": {"kind": "Timeout", "message": "too slow", "latencyMs": 1000}}


def test_a_scheduled_call_cannot_be_finished(world):
    call = make_call()
    assert not service_call_finish(
        tenant_id="acme", service_call_id=call.pk, outcome=Outcome(succeeded=True, status=200)
    )
    assert ServiceCall.objects.get(pk=call.pk).status == ServiceCall.Status.SCHEDULED


def test_the_same_idempotency_key_and_payload_returns_the_existing_call(world):
    first, created = service_call_submit(
        tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="x"
    )
    again, created_again = service_call_submit(
        tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="y"
    )
    assert created and not created_again and first.pk == again.pk
    assert ServiceCall.objects.count() == 1


def test_the_same_idempotency_key_with_another_payload_conflicts_and_stores_nothing(world):
    service_call_submit(tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="x")
    with pytest.raises(Conflict):
        service_call_submit(
            tenant_id="acme", submission=make_submission(idempotency_key="k-1", name="other"), correlation_id="y"
        )
    assert ServiceCall.objects.count() == 1 and OutboxEvent.objects.count() == 2


def test_a_key_stored_by_a_racing_request_answers_its_call_and_this_transaction_leaves_nothing(world, monkeypatch):
    from orchestration.services import submit as services

    first, _ = service_call_submit(
        tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="x"
    )
    real_match = services._idempotent_match
    checks = []

    def match_late(tenant_id, key, fingerprint):
        # The first check runs before the racing request has committed: it finds nothing.
        checks.append(key)
        return None if len(checks) == 1 else real_match(tenant_id, key, fingerprint)

    monkeypatch.setattr(services, "_idempotent_match", match_late)
    again, created = service_call_submit(
        tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="y"
    )
    assert not created and again.pk == first.pk and len(checks) == 2
    assert ServiceCall.objects.count() == 1 and ServiceCallTag.objects.count() == len(make_submission().tags)
    assert OutboxEvent.objects.count() == 2 and TimerSchedule.objects.count() == 1


def test_idempotency_keys_are_per_tenant(world):
    a, _ = service_call_submit(tenant_id="acme", submission=make_submission(idempotency_key="k-1"), correlation_id="x")
    b, created = service_call_submit(
        tenant_id="globex", submission=make_submission(idempotency_key="k-1"), correlation_id="y"
    )
    assert created and a.pk != b.pk


def test_tags_replace_the_set_and_emit_one_tagged_event(world):
    call = make_call(tags=["a", "b"])
    service_call_tags_set(tenant_id="acme", service_call_id=call.pk, tags=["b", "c", "favorite"])
    service_call_tags_set(tenant_id="acme", service_call_id=call.pk, tags=["b", "c", "favorite"])  # no change
    assert sorted(ServiceCallTag.objects.filter(service_call=call).values_list("tag", flat=True)) == [
        "b",
        "c",
        "favorite",
    ]
    tagged = OutboxEvent.objects.filter(aggregate_id=call.pk, event_type="ServiceCallTagged")
    assert tagged.count() == 1
    assert tagged.get().event_payload["payload"]["added"] == ["c", "favorite"]


def test_rerun_submits_a_new_call_with_the_same_request_and_sealed_secrets(world):
    call = make_call(
        method="POST", url="https://example.test/x", headers={"Authorization": "Bearer s3cr3t"}, body={"a": 1}
    )
    again = service_call_rerun(tenant_id="acme", service_call_id=call.pk, correlation_id="rerun")
    assert again.pk != call.pk and again.rerun_of == call.pk
    started = service_call_start(tenant_id="acme", service_call_id=again.pk)
    assert started.headers == {"Authorization": "Bearer s3cr3t"} and started.body == {"a": 1}


def test_an_unknown_call_is_not_found(world):
    from core.errors import NotFound

    with pytest.raises(NotFound):
        service_call_tags_set(tenant_id="acme", service_call_id=uuid.uuid4(), tags=[])


def test_a_call_whose_sealed_secret_no_key_opens_fails_at_start_without_being_sent(world, settings):
    from cryptography.fernet import Fernet

    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    call = make_call(url="https://example.test/x", headers={"X-Api-Key": "k-123"})
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]  # the old key is gone
    assert service_calls_start(keys=[CallKey("acme", call.pk)]) == []
    stored = ServiceCall.objects.get(pk=call.pk)
    assert (stored.status, stored.error_kind) == ("Failed", "InternalError")
    assert "nothing was sent" in stored.outcome_meta["errorMeta"]["message"]
    assert events(call)[-2:] == ["ServiceCallRunning", "ServiceCallFailed"]


def test_the_idempotency_fingerprint_is_keyed_not_a_bare_hash_of_the_payload(world):
    import hashlib
    import json

    fields = {"idempotency_key": "k-9", "headers": {"Authorization": "Bearer weak"}}
    call = make_call(**fields)
    canonical = json.dumps(make_submission(**fields).fingerprint_payload(), sort_keys=True, separators=(",", ":"))
    stored = ServiceCall.objects.get(pk=call.pk).request_fingerprint
    assert len(stored) == 64 and stored != hashlib.sha256(canonical.encode()).hexdigest()
