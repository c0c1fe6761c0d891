"""A subscription kind is a channel module and a line in the registry (delivery/channels/;
docs/architecture.md, "Adding a channel"): a third channel, defined here alone, is validated,
created and delivered to by the same validation, services and delivery loop as webhooks and NATS,
with no edit anywhere else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from django.db import connection

from core.errors import ValidationFailed
from core.ids import utcnow
from delivery import channels as registry
from delivery.channels import Channel, ChannelField, NewSubscription, channel_for, kinds
from delivery.models import Notification, Subscription
from delivery.runner import Deliverer, deliver_now
from delivery.services import subscription_create, subscription_send_test, subscription_update
from delivery.tries import ClaimedNotification, SendResult
from delivery.validation import validate_subscription
from tests.support.waiting import wait_for

pytestmark = pytest.mark.also_postgres

ADDRESS = ChannelField(wire="address", column="url", only="Only inbox subscriptions have an address.")


class InboxChannel(Channel):
    """Delivers into a list in memory: a test's stand-in for SMTP, a queue, a chat."""

    kind = "inbox"
    label = "Inbox"
    fields = (ADDRESS,)
    batched = True  # a claim's inbox notifications are one try, as NATS's
    target_label = "address"

    def __init__(self) -> None:
        self.received: list[tuple[str, str]] = []  # (address, event id)

    def validate(self, data: Mapping[str, Any], *, kind: Any, partial: bool, error: Any) -> dict[str, Any]:
        address = data.get("address")
        if kind == self.kind and address is None:
            error("address", "An inbox subscription needs an address.")
        elif address is not None and (not isinstance(address, str) or not address.startswith("box-")):
            error("address", "An address starts with 'box-'.")
        return {} if address is None else {"url": address}

    def create(self, data: Any) -> NewSubscription:
        return NewSubscription(columns={"subject_template": f"inbox.{data.url}"})

    def target(self, subscription: Subscription) -> str:
        return subscription.url

    def send(self, batch: list[ClaimedNotification]) -> list[SendResult]:
        started = utcnow()
        for notification in batch:
            self.received.append((notification.subscription.url, notification.envelope["id"]))
        return [SendResult(succeeded=True, started_at=started, latency_ms=0) for _ in batch]


@pytest.fixture
def inbox(transactional_db, world, monkeypatch):
    """The inbox channel registered for this test only. The stored kinds' check constraint was
    made with the registered kinds by the migrations; a real channel gets its migration from
    makemigrations, this one has the check lifted for the test."""
    monkeypatch.setattr(registry, "_CHANNELS", dict(registry._CHANNELS))
    channel = registry.register(InboxChannel())
    constraints = Subscription._meta.constraints
    [check] = [c for c in constraints if c.name == "subscriptions_kind_valid"]
    # SQLite remakes the table from the model's constraints: the model goes without it too.
    monkeypatch.setattr(Subscription._meta, "constraints", [c for c in constraints if c is not check])
    with connection.schema_editor() as editor:
        editor.remove_constraint(Subscription, check)
    try:
        yield channel
    finally:
        Subscription.objects.filter(kind=channel.kind).delete()  # the check comes back over the rows left
        Subscription._meta.constraints = constraints
        with connection.schema_editor() as editor:
            editor.add_constraint(Subscription, check)


def test_a_registered_channel_is_a_kind_with_its_own_fields_checked(inbox):
    assert channel_for("inbox") is inbox and kinds()[-1] == "inbox"
    data = validate_subscription({"kind": "inbox", "name": "mailroom", "address": "box-7"})
    assert (data.kind, data.url) == ("inbox", "box-7")

    with pytest.raises(ValidationFailed) as missing:
        validate_subscription({"kind": "inbox", "name": "mailroom"})
    assert missing.value.errors == {"address": ["An inbox subscription needs an address."]}
    with pytest.raises(ValidationFailed) as wrong:
        validate_subscription({"kind": "inbox", "name": "mailroom", "address": "7", "url": "http://x/"})
    # Its own rule, and the webhook channel's for a URL on another kind.
    assert wrong.value.errors == {
        "url": ["Only webhook subscriptions have a URL."],
        "address": ["An address starts with 'box-'."],
    }


def test_a_subscription_of_a_registered_channel_is_created_and_delivered_to(inbox):
    subscription, shown_once = subscription_create(
        tenant_id="acme", data=validate_subscription({"kind": "inbox", "name": "mailroom", "address": "box-7"})
    )
    stored = Subscription.objects.get(pk=subscription.pk)
    assert (stored.kind, stored.url, stored.subject_template, stored.secret) == ("inbox", "box-7", "inbox.box-7", None)
    assert shown_once is None

    # The delivery loop: the claim's inbox notifications go out as one batch on the loop's thread.
    pings = [subscription_send_test(tenant_id="acme", subscription_id=subscription.pk) for _ in range(3)]
    deliverer = Deliverer(concurrency=2, batch_size=10)
    try:
        assert deliverer.step() == 3
        wait_for(lambda: deliverer.results.qsize() == 3, timeout=5)
        assert deliverer.record_ready() == 3
    finally:
        deliverer.stop()
    assert sorted(inbox.received) == sorted(("box-7", str(p.event_id)) for p in pings)
    assert set(Notification.objects.values_list("state", flat=True)) == {Notification.State.SUCCEEDED}

    # And one at a time (commands, tests).
    last = subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
    assert deliver_now() == 1
    assert inbox.received[-1] == ("box-7", str(last.event_id))
    assert Notification.objects.get(pk=last.pk).state == Notification.State.SUCCEEDED


def test_another_kinds_field_is_refused_on_an_update(inbox):
    subscription, _ = subscription_create(
        tenant_id="acme", data=validate_subscription({"kind": "inbox", "name": "mailroom", "address": "box-7"})
    )
    with pytest.raises(ValidationFailed) as refused:
        subscription_update(
            tenant_id="acme",
            subscription_id=subscription.pk,
            data=validate_subscription({"subjectTemplate": "serviceagent.x"}, partial=True, operator=True),
        )
    assert refused.value.errors == {"subjectTemplate": ["Only NATS subscriptions have a subject template."]}
    updated = subscription_update(
        tenant_id="acme",
        subscription_id=subscription.pk,
        data=validate_subscription({"address": "box-8"}, partial=True),
    )
    assert Subscription.objects.get(pk=updated.pk).url == "box-8"
