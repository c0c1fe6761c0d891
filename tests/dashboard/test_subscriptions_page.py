"""The Subscriptions page: the current tenant's webhook subscriptions with their state, health
and pending count; nothing of another tenant's, nor the operator's."""

from delivery.services import subscription_update
from delivery.validation import SubscriptionInput
from tests.support.factories import HOUR, make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try


def test_it_lists_the_tenants_subscriptions_with_their_state_and_pending_count(owner_client, world):
    billing, _ = make_subscription("acme", name="Billing hook", event_types=["ServiceCallSucceeded"])
    audit, _ = make_subscription("acme", name="Audit hook")
    make_subscription("globex", name="Globex hook")
    make_subscription(None, name="Operator hook")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)  # Submitted and Scheduled: the audit hook gets both
    subscription_update(tenant_id="acme", subscription_id=audit.pk, data=SubscriptionInput(enabled=False))

    response = owner_client.get("/subscriptions/")

    assert response.status_code == 200
    rows = {row["subscription"].name: row["pending"] for row in response.context["rows"]}
    assert rows == {"Billing hook": 0, "Audit hook": 2}
    html = response.content.decode()
    assert "Globex hook" not in html and "Operator hook" not in html
    assert '<span class="chip chip-small chip-type">ServiceCallSucceeded</span>' in html
    assert "All events" in html
    assert '<span class="badge badge-enabled">Enabled</span>' in html
    assert '<span class="badge badge-disabled">Disabled</span>' in html and "disabled by a user" in html
    assert billing.url in html


def test_it_shows_since_when_a_subscription_fails_and_its_last_success(owner_client, world):
    failing, _ = make_subscription("acme", name="Failing hook")
    working, _ = make_subscription("acme", name="Working hook")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    for notification in failing.notifications.all():
        record_try(notification, succeeded=False, status_code=500)
    for notification in working.notifications.all():
        record_try(notification, succeeded=True, status_code=200)
    failing.refresh_from_db()
    working.refresh_from_db()

    html = owner_client.get("/subscriptions/").content.decode()

    assert failing.failing_since is not None and working.last_success_at is not None
    assert html.count("<time datetime=") == 2


def test_a_tenant_without_subscriptions_is_offered_the_first_one(owner_client, world):
    html = owner_client.get("/subscriptions/").content.decode()
    assert "No subscriptions yet." in html and 'href="/subscriptions/new/"' in html


def test_the_header_links_to_it_and_marks_it_current(owner_client, world):
    assert 'href="/subscriptions/" >Subscriptions</a>' in owner_client.get("/calls/").content.decode()
    html = owner_client.get("/subscriptions/new/").content.decode()
    assert 'href="/subscriptions/" aria-current="page">Subscriptions</a>' in html


def test_it_is_for_signed_in_members_only(client, world):
    response = client.get("/subscriptions/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
