"""Admin of event delivery: subscriptions (operator-wide ones, NATS) created and changed through
delivery's services after delivery.validation, a webhook's secret shown once and sealed secrets
never; notifications read-only with their attempts, filters, search and the "Resend now" and
"Recover" actions; non-superuser staff scoped to their tenants, operator-wide rows refused."""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from core.secrets import unseal_value
from delivery.models import Notification, Subscription
from delivery.services import nats_subscription_ensure
from tests.support.factories import HOUR, make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try

SUBSCRIPTIONS = "/admin/delivery/subscription/"
NOTIFICATIONS = "/admin/delivery/notification/"
# What an operator group would grant for delivery.
DELIVERY_PERMISSIONS = [
    "view_subscription",
    "add_subscription",
    "change_subscription",
    "delete_subscription",
    "view_notification",
    "change_notification",
]


@pytest.fixture
def delivery_staff(client, world):
    """staffglobex (member of globex only) with the delivery permissions."""
    world.staff_globex.user_permissions.set(Permission.objects.filter(codename__in=DELIVERY_PERMISSIONS))
    client.force_login(world.staff_globex)
    return client


def _add(client, **fields):
    data = {"name": "Operator hook", "kind": "webhook", "url": "https://hooks.example.com/ops", "enabled": "on"}
    data.update(fields)
    return client.post(SUBSCRIPTIONS + "add/", {k: v for k, v in data.items() if v is not None})


def _secret_from(response) -> str:
    from tests.admin.test_admin_secrets_and_staff_subscriptions import shown_secret

    return shown_secret(response, "whsec_")


def test_an_operator_wide_webhook_is_created_with_its_secret_shown_once(admin_client, world):
    response = _add(admin_client, event_types=["ServiceCallFailed"])

    subscription = Subscription.objects.get()
    assert subscription.tenant_id is None and subscription.kind == Subscription.Kind.WEBHOOK
    assert subscription.event_types == ["ServiceCallFailed"] and subscription.enabled
    secret = _secret_from(response)
    assert unseal_value(subscription.secret) == secret
    assert "no-store" in response["Cache-Control"]  # on the answer to the add, once
    for url in (SUBSCRIPTIONS, f"{SUBSCRIPTIONS}{subscription.pk}/change/"):
        html = admin_client.get(url).content.decode()
        assert secret not in html and "$sealed" not in html and subscription.secret["$sealed"] not in html
    assert "shown once" in admin_client.get(f"{SUBSCRIPTIONS}{subscription.pk}/change/").content.decode()


def test_a_nats_subscription_gets_no_secret_and_its_subject_template_is_checked(admin_client, world):
    response = _add(admin_client, kind="nats", name="Stream", url="", subject_template="serviceagent.{tenantId}.x")
    assert response.status_code == 302
    nats = Subscription.objects.get()
    assert nats.kind == Subscription.Kind.NATS and nats.secret is None
    assert nats.subject_template == "serviceagent.{tenantId}.x"
    assert not [m for m in get_messages(response.wsgi_request) if "Signing secret" in str(m)]

    refused = _add(admin_client, kind="nats", name="Elsewhere", url="", subject_template="other.{type}")
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["subject_template"]
    assert Subscription.objects.count() == 1


def test_a_subject_template_is_checked_against_the_deployments_stream_subjects(admin_client, world, settings):
    settings.NATS_STREAM_SUBJECTS = ["agent-eu.>"]  # another agent takes serviceagent.> on the server

    refused = _add(admin_client, kind="nats", name="Default", url="", subject_template="serviceagent.{tenantId}.x")
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["subject_template"] == [
        "its subjects 'serviceagent.*.x' ('*': any value) fall outside the stream's subjects (agent-eu.>)"
    ]
    assert not Subscription.objects.exists()

    assert (
        _add(admin_client, kind="nats", name="Ours", url="", subject_template="agent-eu.{tenantId}.x").status_code
        == 302
    )
    assert Subscription.objects.get().subject_template == "agent-eu.{tenantId}.x"


def test_input_is_checked_by_delivery_validation_and_nothing_is_stored(admin_client, world):
    response = _add(admin_client, name="  ", url="ftp://files.example.com/x")
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["name"] == ["A name is required."]
    assert errors["url"] == ["The URL must be absolute and use http or https."]
    assert not Subscription.objects.exists()


def test_a_change_goes_through_subscription_update(admin_client, world):
    subscription, _ = make_subscription("acme", name="Acme hook")
    url = f"{SUBSCRIPTIONS}{subscription.pk}/change/"
    form = admin_client.get(url).context["adminform"].form
    assert "tenant" not in form.fields and "kind" not in form.fields  # they never change

    response = admin_client.post(url, {"name": "Renamed", "url": subscription.url, "event_types": []})

    assert response.status_code == 302
    subscription.refresh_from_db()
    assert subscription.name == "Renamed" and subscription.tenant_id == "acme"
    assert not subscription.enabled and subscription.disabled_reason == "disabled by a user"


def test_delete_goes_through_subscription_delete(admin_client, world):
    subscription, _ = make_subscription("acme")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    confirm = admin_client.get(f"{SUBSCRIPTIONS}{subscription.pk}/delete/")
    assert confirm.status_code == 200 and "Notifications: 2" in confirm.content.decode()
    response = admin_client.post(f"{SUBSCRIPTIONS}{subscription.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Subscription.objects.exists() and not Notification.objects.exists()


def test_staff_see_and_make_only_their_tenants_subscriptions(delivery_staff, world):
    make_subscription("acme", name="Acme hook")
    operator, _ = make_subscription(None, name="Operator hook")
    globex, _ = make_subscription("globex", name="Globex hook")

    listed = delivery_staff.get(SUBSCRIPTIONS)
    assert [s.name for s in listed.context["cl"].result_list] == ["Globex hook"]
    assert delivery_staff.get(f"{SUBSCRIPTIONS}{operator.pk}/change/").status_code == 302  # "does not exist"
    form = delivery_staff.get(SUBSCRIPTIONS + "add/").context["adminform"].form
    assert list(form.fields["tenant"].queryset.values_list("id", flat=True)) == ["globex"]

    # An operator-wide one (no tenant) and one for another tenant are refused.
    assert _add(delivery_staff, tenant="").context["adminform"].form.errors["tenant"]
    assert _add(delivery_staff, tenant="acme").context["adminform"].form.errors["tenant"]
    assert Subscription.objects.count() == 3
    _secret_from(_add(delivery_staff, tenant="globex", name="Second"))  # made: its secret shown
    assert Subscription.objects.get(name="Second").tenant_id == "globex"


def _deliveries(settings) -> dict[str, Notification]:
    """acme's hook, globex's hook and the operator-wide NATS subscription, with one call each."""
    settings.EVENT_DELIVERY_SCHEDULE = [300.0]
    acme, _ = make_subscription("acme", name="Acme hook")
    make_subscription("globex", name="Globex hook")
    settings.NATS_URL = "nats://127.0.0.1:4222"
    nats_subscription_ensure()  # operator-wide, every event type
    fan_out(make_call("acme", name="a", due_in=HOUR).pk)
    fan_out(make_call("globex", name="g", due_in=HOUR).pk)
    submitted, scheduled = acme.notifications.order_by("event_seq")
    failed = record_try(submitted, succeeded=False, status_code=503, error="The endpoint answered 503.")
    record_try(scheduled, succeeded=False, status_code=503, error="The endpoint answered 503.")
    expired = record_try(scheduled, succeeded=False, status_code=503, error="The endpoint answered 503.")
    return {"failed": failed, "expired": expired}


def test_notifications_filter_by_state_kind_and_tenant_and_search_by_event_or_call(admin_client, world, settings):
    rows = _deliveries(settings)

    def listed(query: str) -> set:
        return {n.pk for n in admin_client.get(NOTIFICATIONS + query).context["cl"].result_list}

    assert listed("?state=FAILED") == {rows["failed"].pk}
    assert listed("?state=EXPIRED") == {rows["expired"].pk}
    nats = set(Notification.objects.filter(subscription__kind="nats").values_list("pk", flat=True))
    assert len(nats) == 4 and listed("?subscription__kind=nats") == nats
    globex = set(Notification.objects.filter(tenant_id="globex").values_list("pk", flat=True))
    assert listed("?tenant=globex") == globex
    assert listed(f"?q={rows['failed'].event_id}") == {rows["failed"].pk} | {
        n.pk for n in Notification.objects.filter(event_id=rows["failed"].event_id)
    }
    assert listed(f"?q={rows['failed'].aggregate_id}") == set(
        Notification.objects.filter(aggregate_id=rows["failed"].aggregate_id).values_list("pk", flat=True)
    )


def test_a_notification_is_read_only_with_its_attempts_inline(admin_client, world, settings):
    rows = _deliveries(settings)
    response = admin_client.get(f"{NOTIFICATIONS}{rows['expired'].pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="_save"' not in html
    assert html.count("The endpoint answered 503.") >= 2  # last error, and an attempt's error
    assert admin_client.get(NOTIFICATIONS + "add/").status_code == 403


def test_resend_now_requeues_the_selected_and_recover_only_failed_or_expired(admin_client, world, settings):
    rows = _deliveries(settings)
    delivered = record_try(Notification.objects.filter(tenant_id="globex").first(), succeeded=True, status_code=204)
    selected = [str(rows["failed"].pk), str(rows["expired"].pk), str(delivered.pk)]

    admin_client.post(NOTIFICATIONS, {"action": "recover", "_selected_action": selected})
    states = dict(Notification.objects.filter(pk__in=selected).values_list("pk", "state"))
    assert states == {
        rows["failed"].pk: Notification.State.PENDING,
        rows["expired"].pk: Notification.State.PENDING,
        delivered.pk: Notification.State.SUCCEEDED,
    }

    admin_client.post(NOTIFICATIONS, {"action": "resend_now", "_selected_action": [str(delivered.pk)]})
    delivered.refresh_from_db()
    assert delivered.state == Notification.State.PENDING and delivered.manual


def test_staff_see_and_resend_only_their_tenants_subscriptions_notifications(delivery_staff, world, settings):
    rows = _deliveries(settings)
    listed = delivery_staff.get(NOTIFICATIONS).context["cl"].result_list
    # globex's hook's, not the operator-wide NATS subscription's (those carry globex's events too).
    assert {(n.tenant_id, n.subscription.name) for n in listed} == {("globex", "Globex hook")}

    delivery_staff.post(NOTIFICATIONS, {"action": "resend_now", "_selected_action": [str(rows["failed"].pk)]})
    assert Notification.objects.get(pk=rows["failed"].pk).state == Notification.State.FAILED
    assert delivery_staff.get(f"{NOTIFICATIONS}{rows['failed'].pk}/change/").status_code == 302
