"""The call's details page lists, for each of its events, the delivery to every subscription of
the tenant (name, state, attempts, next attempt), read in one query; the operator's and other
tenants' subscriptions stay out of it."""

from tests.support.factories import HOUR, make_call
from tests.support.plans import recorded_queries, selects_from
from tests.support.subscriptions import fan_out, make_subscription, record_try


def test_each_event_shows_its_delivery_to_each_of_the_tenants_subscriptions(owner_client, world, settings):
    settings.EVENT_DELIVERY_SCHEDULE = [300.0]
    billing, _ = make_subscription("acme", name="Billing hook")
    audit, _ = make_subscription("acme", name="Audit hook", event_types=["ServiceCallScheduled"])
    make_subscription(None, name="Operator hook")
    make_subscription("globex", name="Globex hook")
    call = make_call("acme", name="c", due_in=HOUR)
    fan_out(call.pk)
    submitted = billing.notifications.get(event_type="ServiceCallSubmitted")
    record_try(submitted, succeeded=False, status_code=503)

    response = owner_client.get(f"/calls/{call.pk}/")

    rows = {
        event.event_type: [(d.subscription.name, d.state, d.attempts) for d in ds]
        for event, ds in response.context["event_rows"]
    }
    assert rows == {
        "ServiceCallSubmitted": [("Billing hook", "FAILED", 1)],
        "ServiceCallScheduled": [("Billing hook", "PENDING", 0), ("Audit hook", "PENDING", 0)],
    }
    html = response.content.decode()
    assert "Operator hook" not in html and "Globex hook" not in html
    assert (
        f'<a href="/subscriptions/{billing.pk}/">Billing hook</a> <span class="badge badge-failed">FAILED</span>'
        in html
    )
    assert "1 attempt · next <time" in html


def test_the_deliveries_of_all_events_are_read_in_one_query(owner_client, world):
    for n in range(3):
        make_subscription("acme", name=f"hook {n}")
    call = make_call("acme", name="c", due_in=HOUR)
    fan_out(call.pk)
    with recorded_queries() as queries:
        response = owner_client.get(f"/calls/{call.pk}/")
    assert sum(len(ds) for _, ds in response.context["event_rows"]) == 6
    assert len(selects_from(queries, "event_notifications")) == 1


def test_a_call_without_subscribers_shows_no_deliveries(owner_client, world):
    call = make_call("acme", name="c", due_in=HOUR)
    fan_out(call.pk)
    response = owner_client.get(f"/calls/{call.pk}/")
    assert all(ds == [] for _, ds in response.context["event_rows"])
    assert response.content.decode().count('<td class="deliveries-cell"><span class="muted">—</span></td>') == 2
