"""Admin of the outbox: publication filter, lag, 'publish again' through the dispatcher."""

from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxEvent
from tests.support.factories import HOUR, make_call

CHANGELIST = "/admin/outbox/outboxevent/"


def _ids(response) -> set[int]:
    return {row.id for row in response.context["cl"].result_list}


def test_it_filters_published_and_unpublished_events_and_shows_the_lag(admin_client, world):
    make_call("acme", name="published", due_in=HOUR)
    dispatch_batch(sinks=[])
    make_call("acme", name="waiting", due_in=HOUR)
    published = set(OutboxEvent.objects.filter(published_at__isnull=False).values_list("id", flat=True))
    unpublished = set(OutboxEvent.objects.filter(published_at__isnull=True).values_list("id", flat=True))
    assert published and unpublished
    assert _ids(admin_client.get(CHANGELIST + "?published=yes")) == published
    response = admin_client.get(CHANGELIST + "?published=no")
    assert _ids(response) == unpublished
    assert "waiting " in response.content.decode()  # lag of an unpublished event: how long it waits
    assert " ms</td>" in admin_client.get(CHANGELIST + "?published=yes").content.decode()


def test_publish_again_puts_events_back_in_the_dispatchers_queue(admin_client, world):
    make_call("acme", name="again", due_in=HOUR)
    dispatch_batch(sinks=[])
    event = OutboxEvent.objects.order_by("id").first()
    assert event.published_at is not None
    response = admin_client.post(CHANGELIST, {"action": "publish_again", "_selected_action": [str(event.pk)]})
    assert response.status_code == 302
    event.refresh_from_db()
    assert event.published_at is None and event.next_attempt_at is None


def test_non_superuser_staff_see_only_their_tenants_events(staff_client, world):
    make_call("acme", name="acme call", due_in=HOUR)
    globex_call = make_call("globex", name="globex call", due_in=HOUR)
    response = staff_client.get(CHANGELIST)
    assert response.status_code == 200
    assert {row.tenant_id for row in response.context["cl"].result_list} == {"globex"}
    assert {row.aggregate_id for row in response.context["cl"].result_list} == {globex_call.pk}
    acme_event = OutboxEvent.objects.filter(tenant_id="acme").first()
    assert staff_client.get(f"{CHANGELIST}{acme_event.pk}/change/").status_code == 302


def test_non_superuser_staff_cannot_republish_another_tenants_event(staff_client, world):
    make_call("acme", name="acme call", due_in=HOUR)
    dispatch_batch(sinks=[])
    acme_event = OutboxEvent.objects.filter(tenant_id="acme").first()
    staff_client.post(CHANGELIST, {"action": "publish_again", "_selected_action": [str(acme_event.pk)]})
    acme_event.refresh_from_db()
    assert acme_event.published_at is not None
