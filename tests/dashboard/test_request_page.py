"""The request page: define a call, execute now or schedule it, errors per field."""

from datetime import UTC, datetime, timedelta

import pytest

from core.secrets import SEALED, unseal_headers
from orchestration.models import ServiceCall, ServiceCallTag


def _form(**overrides):
    data = {
        "name": "Create invoice",
        "method": "POST",
        "url": "https://billing.example.com/invoices",
        "header_name": ["Content-Type", "Authorization"],
        "header_value": ["application/json", "Bearer top-secret-value"],
        "body_format": "json",
        "body": '{"amount": 12.5, "items": [1, 2]}',
        "tags": "billing, nightly",
        "when": "now",
        "idempotency_key": "dashboard-test-key-1",
    }
    data.update(overrides)
    return data


def test_the_page_has_labelled_controls_for_every_part_of_a_request(owner_client):
    response = owner_client.get("/calls/new/")
    assert response.status_code == 200
    html = response.content.decode()
    for control in ("id_name", "id_method", "id_url", "id_body", "id_tags", "id_due_local", "id_timeout_ms"):
        assert f'for="{control}"' in html, control
    assert "+ Add row" in html
    assert "Execute now" in html and "Schedule" in html
    assert 'name="idempotency_key"' in html


def test_submitting_stores_the_call_with_headers_json_body_and_tags(owner_client, world):
    response = owner_client.post("/calls/new/", _form())
    assert response.status_code == 200
    call = ServiceCall.objects.get(tenant_id="acme")
    assert call.name == "Create invoice"
    assert call.status == ServiceCall.Status.SCHEDULED
    assert call.request_spec["method"] == "POST"
    assert call.request_spec["body"] == {"amount": 12.5, "items": [1, 2]}
    assert SEALED in call.request_spec["headers"]["Authorization"]
    assert unseal_headers(call.request_spec["headers"])["Authorization"] == "Bearer top-secret-value"
    assert set(ServiceCallTag.objects.filter(service_call=call).values_list("tag", flat=True)) == {"billing", "nightly"}
    assert call.due_at == call.submitted_at  # "now"
    html = response.content.decode()
    assert f'data-live-url="/calls/{call.pk}/live"' in html
    # The secret typed into the form is not echoed back into the page.
    assert "top-secret-value" not in html


def test_schedule_stores_the_utc_time_the_browser_computed(owner_client, world):
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    owner_client.post("/calls/new/", _form(when="schedule", due_at=due.isoformat().replace("+00:00", "Z")))
    call = ServiceCall.objects.get(tenant_id="acme")
    assert call.due_at == due


def test_schedule_without_script_uses_the_local_time_and_browser_offset(owner_client, world):
    # 10:00 local in a zone two hours ahead of UTC (getTimezoneOffset() == -120) is 08:00 UTC.
    day = (datetime.now(UTC) + timedelta(days=3)).date()
    owner_client.post("/calls/new/", _form(when="schedule", due_local=f"{day}T10:00", tz_offset="-120"))
    call = ServiceCall.objects.get(tenant_id="acme")
    assert call.due_at == datetime(day.year, day.month, day.day, 8, 0, tzinfo=UTC)


def test_it_refuses_schedule_without_a_time_and_stores_nothing(owner_client, world):
    response = owner_client.post("/calls/new/", _form(when="schedule"))
    assert response.status_code == 400
    assert "Choose the date and time" in response.content.decode()
    assert not ServiceCall.objects.exists()


def test_it_refuses_invalid_json_under_the_body_field_and_stores_nothing(owner_client, world):
    response = owner_client.post("/calls/new/", _form(body='{"amount": 12.5,'))
    assert response.status_code == 400
    assert response.context["form"].errors["body"][0].startswith("The body is not valid JSON")
    assert not ServiceCall.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"url": "ftp://example.com/file"}, "url", "http or https"),
        ({"name": ""}, "name", "A name is required."),
        ({"header_name": ["Bad Header"], "header_value": ["x"]}, "headers", "not a valid token"),
        ({"header_name": ["Host"], "header_value": ["evil.example"]}, "headers", "set by the agent"),
        ({"tags": "ok " + "x" * 65}, "tags", "without whitespace"),
        ({"timeout_ms": "999999"}, "timeout_ms", "less than or equal to 120000"),
    ],
)
def test_it_shows_validation_errors_on_their_field_and_stores_nothing(owner_client, world, overrides, field, message):
    response = owner_client.post("/calls/new/", _form(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(message in error for error in errors[field]), errors
    assert not ServiceCall.objects.exists()


def test_a_text_body_is_stored_as_the_string_typed(owner_client, world):
    owner_client.post(
        "/calls/new/",
        _form(body_format="text", body="plain {not json}", header_name=["Content-Type"], header_value=["text/plain"]),
    )
    assert ServiceCall.objects.get(tenant_id="acme").request_spec["body"] == "plain {not json}"


def test_sending_the_same_form_twice_stores_one_call(owner_client, world):
    first = owner_client.post("/calls/new/", _form())
    second = owner_client.post("/calls/new/", _form())
    assert ServiceCall.objects.filter(tenant_id="acme").count() == 1
    assert first.context["call"].pk == second.context["call"].pk
    # The page that follows a submission carries a new key for the next one.
    assert first.context["form"]["idempotency_key"].value() != "dashboard-test-key-1"


def test_a_call_is_stored_for_the_current_tenant_only(outsider_client, world):
    outsider_client.post("/calls/new/", _form())
    assert list(ServiceCall.objects.values_list("tenant_id", flat=True)) == ["globex"]


def test_every_mistake_is_shown_at_once(owner_client, world):
    response = owner_client.post("/calls/new/", _form(name="", url="ftp://x", body="{oops", when="schedule"))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert {"name", "url", "body", "due_local"} <= set(errors), errors
    assert not ServiceCall.objects.exists()


def test_a_connection_is_chosen_by_name_refused_when_unknown_and_kept_by_a_copy(owner_client, world):
    from execution.connections import connection_create, validate_connection

    data = {"name": "crm", "kind": "apiKeyHeader", "headerName": "X-Key", "headerValue": "v-1"}
    connection_create(tenant_id="acme", data=validate_connection(data))
    page = owner_client.get("/calls/new/").content.decode()
    assert '<datalist id="connection-names"><option value="crm">' in page

    unknown = owner_client.post("/calls/new/", _form(connection="nope", idempotency_key="k-conn-0"))
    assert unknown.status_code == 400 and "No connection named" in unknown.context["form"].errors["connection"][0]
    clash = owner_client.post(
        "/calls/new/",
        _form(connection="crm", header_name=["X-Key"], header_value=["mine"], idempotency_key="k-conn-1"),
    )
    assert clash.status_code == 400 and "set by connection" in " ".join(clash.context["form"].errors["headers"])
    assert not ServiceCall.objects.exists()

    assert owner_client.post("/calls/new/", _form(connection="crm", idempotency_key="k-conn-2")).status_code == 200
    call = ServiceCall.objects.get()
    assert call.request_spec["connection"] == "crm"
    copy = owner_client.get(f"/calls/new/?from={call.pk}")
    assert copy.context["form"]["connection"].value() == "crm"
