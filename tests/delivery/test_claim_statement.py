"""The delivery claim's candidates come from a statement written once per process
(delivery.services._due_keys), not compiled by the ORM on every claim. It must pick exactly the
rows, in exactly the order, of the ORM query it replaces, over every case the claim knows:
leases running and run out, tries not yet due, finished notifications, a disabled
subscription, subscriptions left out for their cap, and later events behind an open earlier one."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from core.db import rows_by_key
from core.ids import utcnow
from delivery.models import Notification, Subscription
from delivery.selectors import OPEN_STATES, notifications_due_exist
from delivery.services import _due_keys, subscription_create, subscription_send_test
from delivery.validation import SubscriptionInput
from outbox.dispatcher import dispatch_batch
from tests.support.factories import make_call
from tests.support.locks import in_another_connection, locks_at_once, row_locked_elsewhere


def orm_due_keys(*, now, excluded, limit):
    earlier_open = Notification.objects.filter(
        subscription_id=OuterRef("subscription_id"),
        aggregate_id=OuterRef("aggregate_id"),
        next_attempt_at__isnull=False,
        event_seq__lt=OuterRef("event_seq"),
    )
    return list(
        Notification.objects.filter(
            Q(locked_until__isnull=True) | Q(locked_until__lte=now),
            next_attempt_at__lte=now,
            subscription__enabled=True,
        )
        .exclude(subscription_id__in=excluded)
        .filter(~Exists(earlier_open))
        .order_by("next_attempt_at", "event_seq")
        .values_list("pk", "subscription_id")[:limit]
    )


@pytest.fixture
def mixed(world):
    """Three tenants' worth of notifications in every state the claim tells apart."""
    hooks = [
        subscription_create(
            tenant_id=tenant, data=SubscriptionInput(kind="webhook", name=f"hook {n}", url="http://127.0.0.1:9/")
        )[0]
        for n, tenant in enumerate(["acme", "acme", "globex", None])
    ]
    for n in range(12):
        make_call("acme" if n % 3 else "globex", name=f"c{n}", due_in=3600)  # Submitted + Scheduled each
    dispatch_batch()
    Subscription.objects.filter(pk=hooks[1].pk).update(enabled=False)
    now = utcnow()
    rng = random.Random(7)
    for i, notification in enumerate(Notification.objects.all()):
        kind = rng.choice(["due", "due", "leased", "lease over", "later", "done"])
        # Every due time differs (no ties in the claim's order, so a limit cuts at one place).
        due = now - timedelta(seconds=rng.randint(1, 50), milliseconds=i)
        changes = {
            "due": {"next_attempt_at": due},
            "leased": {"next_attempt_at": due, "locked_until": now + timedelta(seconds=30)},
            "lease over": {"next_attempt_at": due, "locked_until": now - timedelta(seconds=1)},
            "later": {"next_attempt_at": now + timedelta(seconds=60, milliseconds=i)},
            "done": {"next_attempt_at": None, "state": Notification.State.SUCCEEDED},
        }[kind]
        Notification.objects.filter(pk=notification.pk).update(**changes)
    # Two events a call: acme's 8 calls × (2 hooks + the operator's), globex's 4 × (1 + 1).
    assert Notification.objects.count() == 8 * 2 * 3 + 4 * 2 * 2
    return hooks, now


@pytest.mark.parametrize("limit", [1, 5, 1000])
@pytest.mark.parametrize("left_out", [[], [0], [2, 3]])
def test_it_picks_the_rows_of_the_orm_query_in_its_order(db, mixed, limit, left_out):
    hooks, now = mixed
    excluded = [hooks[i].pk for i in left_out]
    with transaction.atomic():
        got = _due_keys(now=now, excluded=excluded, limit=limit)
    want = orm_due_keys(now=now, excluded=excluded, limit=limit)
    assert got == want
    if limit == 1000:
        assert want, "the data must leave something due"
        assert {sub for _, sub in want} - {hooks[1].pk} == {sub for _, sub in want}  # the disabled one: never


def test_the_idle_look_answers_as_the_orm_query_does(db, mixed):
    """notifications_due_exist, the delivery loop's look 20 times a second."""
    hooks, now = mixed

    def orm(at):
        return Notification.objects.filter(
            Q(locked_until__isnull=True) | Q(locked_until__lte=at),
            state__in=OPEN_STATES,
            next_attempt_at__lte=at,
            subscription__enabled=True,
        ).exists()

    moments = [now - timedelta(seconds=60), now, now + timedelta(seconds=90)]
    assert [notifications_due_exist(now=at) for at in moments] == [orm(at) for at in moments] == [False, True, True]
    Subscription.objects.update(enabled=False)
    assert notifications_due_exist(now=now) is orm(now) is False


def test_rows_by_key_loads_every_field_or_the_named_ones_and_refuses_a_condition_it_cannot_write(db, world):
    hook = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="h", url="http://x/"))[0]
    [whole] = rows_by_key(Subscription, keys=[hook.pk])
    assert (whole.url, whole.kind, whole.secret, whole.enabled) == (hook.url, hook.kind, hook.secret, True)
    [some] = rows_by_key(Subscription, keys=[hook.pk], fields=["name"], where={"enabled": True})
    assert some.name == "h" and some.get_deferred_fields() >= {"url", "secret"}
    assert rows_by_key(Subscription, keys=[hook.pk], where={"enabled": False}) == []
    for where in ({"enabled": None}, {"created_at__gt": utcnow()}):
        with pytest.raises(ValueError, match="is not an = or <= of a value"):
            rows_by_key(Subscription, keys=[hook.pk], where=where)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_notification_another_claim_holds_is_skipped_and_the_subscription_stays_unlocked(world):
    hook = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="webhook", name="h", url="http://x/"))[0]
    held, free = (subscription_send_test(tenant_id="acme", subscription_id=hook.pk) for _ in range(2))
    with row_locked_elsewhere(Notification, held.pk), transaction.atomic():
        keys = _due_keys(now=utcnow(), excluded=[], limit=10)
        assert keys == [(free.pk, hook.pk)]  # skipped, not waited for

        # The candidate is locked by this transaction; its subscription is not.
        assert not in_another_connection(lambda: locks_at_once(Notification, free.pk))
        assert in_another_connection(lambda: locks_at_once(Subscription, hook.pk))
