"""The Operators group (tenants.services.OPERATOR_PERMISSIONS, docs/operations.md): a teammate made
with `create_user --operator --tenant globex` sees exactly the product's admin pages meant for an
operator, only globex's rows in them, and exactly the operator's actions."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from delivery.models import Notification, Subscription
from orchestration.models import ServiceCall
from tenants.models import ApiKey
from tests.commands.cli import call
from tests.support.factories import (
    HOUR,
    make_call,
    make_ceilings,
    make_failed_call,
    make_flow_control,
    make_succeeded_call,
)
from tests.support.schedules import make_schedule
from tests.support.subscriptions import fan_out, make_subscription, record_try
from workers.services import session_start

# app_label.model_name of every changelist an operator is shown, and what each may do there.
VISIBLE = {
    "tenants.tenant",
    "tenants.membership",
    "tenants.apikey",
    "tenants.tenantceilings",
    "orchestration.servicecall",
    "orchestration.flowcontrol",
    "schedules.schedule",
    "timer.timerschedule",
    "execution.httpexecution",
    "outbox.outboxevent",
    "delivery.subscription",
    "delivery.notification",
    "workers.workersession",
    "workers.looprun",
}
ACTIONS = {
    "tenants.apikey": {"revoke"},
    "orchestration.servicecall": {"run_again", "cancel", "add_tag", "remove_tag"},
    "schedules.schedule": {"pause", "resume"},
    "outbox.outboxevent": {"publish_again"},
    "delivery.notification": {"resend_now", "recover"},
}
# Objects whose change page lets an operator save (the others are read-only pages).
EDITABLE = {"tenants.apikey", "delivery.subscription"}


def _url(label: str, view: str, *args) -> str:
    app_label, model_name = label.split(".")
    return reverse(f"admin:{app_label}_{model_name}_{view}", args=args)


@pytest.fixture
def tenant_data(world):
    """Calls, events, a subscription with notifications, a schedule, flow-control limits, in acme and
    globex; a worker session."""
    rows = {}
    for tenant in ("acme", "globex"):
        subscription, _ = make_subscription(tenant, name=f"{tenant}-zq hook")
        calls = [
            make_succeeded_call(tenant, name=f"{tenant}-zq done"),
            make_failed_call(tenant, name=f"{tenant}-zq broken"),
            make_call(tenant, name=f"{tenant}-zq later", due_in=HOUR),
        ]
        for made in calls:
            for notification in fan_out(made.pk):
                record_try(notification, succeeded=False, status_code=503, error="The endpoint answered 503.")
        make_schedule(tenant, name=f"{tenant}-zq schedule")
        make_flow_control(tenant, parallelism=5)
        make_ceilings(tenant, parallelism=8)
        rows[tenant] = {"calls": calls, "subscription": subscription}
    session_start()
    return rows


@pytest.fixture
def operator(client, world, tenant_data):
    result = call("create_user", "opal", "--generate-password", "--operator", "--tenant", "globex")
    assert result.code == 0, result.err
    client.force_login(get_user_model().objects.get(username="opal"))
    return client


def test_the_index_lists_exactly_the_operator_pages(operator):
    html = operator.get(reverse("admin:index")).content.decode()
    shown = {f"{app}.{model}" for app, model in re.findall(r'href="/admin/(\w+)/(\w+)/"', html)}
    assert shown == VISIBLE


@pytest.mark.parametrize("label", sorted(VISIBLE))
def test_each_page_lists_globex_rows_only_and_offers_the_operator_actions(operator, tenant_data, label):
    response = operator.get(_url(label, "changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "acme" not in html.lower()
    rows = response.context["cl"].queryset
    model = response.context["cl"].model
    # Everything the page lists is globex's (worker rows belong to no tenant).
    model_admin = admin.site._registry[model]
    lookup = getattr(model_admin, "tenant_lookup", None)
    if lookup and label.split(".")[0] != "workers":
        assert set(rows.values_list(lookup, flat=True)) == {"globex"}, label
    form = response.context["action_form"]
    offered = {name for name, _ in form.fields["action"].choices if name} if form else set()
    assert offered == ACTIONS.get(label, set())
    # Nothing is added from the admin.
    assert operator.get(_url(label, "add")).status_code == 403


@pytest.mark.parametrize("label", sorted(VISIBLE - {"workers.workersession", "workers.looprun"}))
def test_only_keys_and_subscriptions_can_be_saved(operator, label):
    model = next(m for m in admin.site._registry if m._meta.label_lower == label)
    lookup = admin.site._registry[model].tenant_lookup
    row = model._default_manager.filter(**{lookup: "globex"}).first()
    page = operator.get(_url(label, "change", row.pk))
    assert page.status_code == 200
    assert ('name="_save"' in page.content.decode()) == (label in EDITABLE)


def test_a_globex_call_is_readable_and_an_acme_call_is_missing(operator, tenant_data):
    mine = tenant_data["globex"]["calls"][0]
    theirs = tenant_data["acme"]["calls"][0]
    page = operator.get(_url("orchestration.servicecall", "change", mine.pk))
    assert page.status_code == 200 and "globex-zq done" in page.content.decode()
    assert 'name="_save"' not in page.content.decode()
    missing = operator.get(_url("orchestration.servicecall", "change", theirs.pk), follow=True)
    assert "acme-zq done" not in missing.content.decode()
    assert "doesn’t exist" in missing.content.decode()


def test_other_apps_admins_are_refused(operator):
    for url in ("/admin/auth/user/", "/admin/auth/group/", "/admin/django_q/schedule/", "/admin/axes/accessattempt/"):
        assert operator.get(url).status_code in (403, 404), url
    assert operator.get("/admin/auth/user/").status_code == 403


def test_run_again_submits_a_new_call_of_globex_only(operator, tenant_data):
    mine = tenant_data["globex"]["calls"][1]
    theirs = tenant_data["acme"]["calls"][1]
    before = {tenant: ServiceCall.objects.filter(tenant_id=tenant).count() for tenant in ("acme", "globex")}
    operator.post(
        _url("orchestration.servicecall", "changelist"),
        {"action": "run_again", "_selected_action": [str(mine.pk), str(theirs.pk)]},
    )
    assert ServiceCall.objects.filter(tenant_id="globex").count() == before["globex"] + 1
    assert ServiceCall.objects.filter(tenant_id="acme").count() == before["acme"]


def test_revoke_reaches_globex_keys_only(operator, world):
    keys = {key.tenant_id: key for key in ApiKey.objects.all()}
    operator.post(
        _url("tenants.apikey", "changelist"),
        {"action": "revoke", "_selected_action": [str(keys["acme"].pk), str(keys["globex"].pk)]},
    )
    assert ApiKey.objects.get(pk=keys["globex"].pk).revoked_at is not None
    assert ApiKey.objects.get(pk=keys["acme"].pk).revoked_at is None


def test_resend_reaches_globex_notifications_only(operator, tenant_data):
    failed = {
        tenant: list(
            Notification.objects.filter(subscription__tenant_id=tenant).exclude(state=Notification.State.SUCCEEDED)
        )
        for tenant in ("acme", "globex")
    }
    assert failed["acme"] and failed["globex"]
    before = {n.pk: (n.state, n.next_attempt_at, n.manual) for n in failed["acme"]}
    operator.post(
        _url("delivery.notification", "changelist"),
        {"action": "resend_now", "_selected_action": [str(n.pk) for n in failed["acme"] + failed["globex"]]},
    )
    after = {n.pk: (n.state, n.next_attempt_at, n.manual) for n in Notification.objects.filter(pk__in=list(before))}
    assert after == before
    assert all(n.manual for n in Notification.objects.filter(pk__in=[n.pk for n in failed["globex"]]))


def test_a_disabled_subscription_can_be_turned_back_on(operator, tenant_data):
    subscription = tenant_data["globex"]["subscription"]
    Subscription.objects.filter(pk=subscription.pk).update(enabled=False, disabled_reason="failing for 5 days")
    page = operator.get(_url("delivery.subscription", "change", subscription.pk))
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data["event_types"] = form["event_types"].value() or []
    data["enabled"] = "on"
    response = operator.post(_url("delivery.subscription", "change", subscription.pk), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Subscription.objects.get(pk=subscription.pk).enabled
