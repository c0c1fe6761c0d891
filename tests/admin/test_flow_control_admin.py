"""The admin's flow-control pages (docs/flow-control.md): every change through
orchestration's flow_control_set, checked like the API's, and scoped to the staff's tenants."""

from __future__ import annotations

from django.contrib.auth.models import Permission

from orchestration.models import FlowControl
from tests.support.factories import make_flow_control

CHANGELIST = "/admin/orchestration/flowcontrol/"


def test_a_superuser_sets_limits_for_a_tenant(admin_client, world):
    response = admin_client.post(
        f"{CHANGELIST}add/",
        {
            "tenant": "acme",
            "parallelism": "4",
            "rate_per_second": "2.5",
            "hosts": '{"API.example.com": {"parallelism": 1}}',
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    row = FlowControl.objects.get(pk="acme")
    assert (row.parallelism, row.rate_per_second) == (4, 2.5)
    assert row.hosts == {"api.example.com": {"parallelism": 1, "ratePerSecond": None}}
    assert row.updated_at is not None


def test_a_change_keeps_the_rate_state(admin_client, world):
    make_flow_control("acme", rate=1)
    FlowControl.objects.filter(pk="acme").update(tenant_tat=4_000_000_000.0)
    response = admin_client.post(
        f"{CHANGELIST}acme/change/", {"parallelism": "2", "rate_per_second": "1", "hosts": "{}"}
    )
    assert response.status_code == 302
    row = FlowControl.objects.get(pk="acme")
    assert (row.parallelism, row.tenant_tat) == (2, 4_000_000_000.0)


def test_bad_limits_are_form_errors_and_nothing_changes(admin_client, world):
    make_flow_control("acme", parallelism=3)
    for data in (
        {"parallelism": "0", "hosts": "{}"},
        {"rate_per_second": "-1", "hosts": "{}"},
        {"parallelism": "2", "hosts": '{"not a host": {"parallelism": 1}}'},
        {"parallelism": "", "rate_per_second": "", "hosts": "{}"},
    ):
        response = admin_client.post(f"{CHANGELIST}acme/change/", data)
        assert response.status_code == 200, data
        assert response.context["adminform"].form.errors, data
        assert FlowControl.objects.get(pk="acme").parallelism == 3


def test_deleting_removes_the_limits(admin_client, world):
    make_flow_control("acme", parallelism=3)
    response = admin_client.post(f"{CHANGELIST}acme/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not FlowControl.objects.exists()


def test_staff_see_and_change_only_their_tenants_limits(client, world):
    make_flow_control("acme", parallelism=3)
    make_flow_control("globex", parallelism=5)
    staff = world.staff_globex
    staff.user_permissions.set(Permission.objects.filter(codename__endswith="flowcontrol"))
    client.force_login(staff)
    page = client.get(CHANGELIST).content.decode()
    assert "/admin/orchestration/flowcontrol/globex/change/" in page and "flowcontrol/acme/" not in page
    client.post(f"{CHANGELIST}acme/change/", {"parallelism": "9", "hosts": "{}"})
    client.post(CHANGELIST, {"action": "delete_selected", "_selected_action": ["acme"], "post": "yes"})
    assert FlowControl.objects.get(pk="acme").parallelism == 3
    form = client.get(f"{CHANGELIST}add/").context["adminform"].form
    assert list(form.fields["tenant"].queryset.values_list("id", flat=True)) == ["globex"]
