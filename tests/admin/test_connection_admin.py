"""The admin of connections (docs/connections.md): made and changed through the API's checks (a
bad field said beside it, nothing stored), the secret never shown and kept when left empty, a
delete refused while a live call names the connection; staff reach their own tenants' only."""

from __future__ import annotations

from django.contrib.auth.models import Permission

from core.secrets import unseal_value
from execution.connections import connection_create, validate_connection
from execution.models import Connection
from orchestration.services import service_call_cancel
from tests.support.factories import make_call

CHANGELIST = "/admin/execution/connection/"


def _make(tenant: str, name: str = "crm") -> Connection:
    data = {"name": name, "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": f"{tenant}-adm-secret"}
    return connection_create(tenant_id=tenant, data=validate_connection(data))


def test_a_connection_is_made_and_changed_through_the_apis_checks_and_its_secret_never_shown(admin_client, world):
    form = {
        "tenant": "acme",
        "name": "billing",
        "kind": "oauth2ClientCredentials",
        "tokenUrl": "https://auth.example.com/token",
        "clientId": "agent",
        "clientAuth": "",
        "secret_value": "",
    }
    refused = admin_client.post(f"{CHANGELIST}add/", form)
    assert refused.status_code == 200 and "Required: a non-empty string." in refused.content.decode()
    assert not Connection.objects.exists()

    made = admin_client.post(f"{CHANGELIST}add/", {**form, "secret_value": "adm-cs-1"}, follow=True)
    assert made.status_code == 200
    connection = Connection.objects.get(name="billing")
    assert connection.config == {
        "tokenUrl": "https://auth.example.com/token",
        "clientId": "agent",
        "clientAuth": "basic",
    }
    assert unseal_value(connection.secret) == "adm-cs-1"

    page = admin_client.get(f"{CHANGELIST}{connection.pk}/change/")
    assert "adm-cs-1" not in page.content.decode() and "https://auth.example.com/token" in page.content.decode()
    change = {
        "tokenUrl": "https://auth.example.com/token",
        "clientId": "agent-2",
        "clientAuth": "body",
        "secret_value": "",
    }
    admin_client.post(f"{CHANGELIST}{connection.pk}/change/", change)
    connection.refresh_from_db()
    assert connection.config["clientId"] == "agent-2" and connection.version == 2
    assert unseal_value(connection.secret) == "adm-cs-1"  # left empty: kept


def test_a_delete_is_refused_while_a_live_call_names_the_connection(admin_client, world):
    connection = _make("acme")
    call = make_call(url="http://127.0.0.1:9/", connection="crm", due_in=3600)
    page = admin_client.post(f"{CHANGELIST}{connection.pk}/delete/", {"post": "yes"}, follow=True)
    assert f"call {call.pk}" in page.content.decode() and Connection.objects.filter(pk=connection.pk).exists()
    service_call_cancel(tenant_id="acme", service_call_id=call.pk)
    admin_client.post(f"{CHANGELIST}{connection.pk}/delete/", {"post": "yes"})
    assert not Connection.objects.filter(pk=connection.pk).exists()


def test_staff_see_and_change_only_their_own_tenants_connections(client, world):
    world.staff_globex.user_permissions.set(
        Permission.objects.filter(codename__in=["view_connection", "change_connection", "delete_connection"])
    )
    client.force_login(world.staff_globex)
    acme, globex = _make("acme"), _make("globex")
    listing = client.get(CHANGELIST).content.decode()
    assert f"/{globex.pk}/change/" in listing and f"/{acme.pk}/change/" not in listing
    assert client.get(f"{CHANGELIST}{acme.pk}/change/").status_code in (302, 404)
    client.post(f"{CHANGELIST}{acme.pk}/delete/", {"post": "yes"})
    assert Connection.objects.filter(pk=acme.pk).exists()
    assert "acme-adm-secret" not in listing
