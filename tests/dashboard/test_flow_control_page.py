"""The flow-control settings page and the held time on a call's details page
(docs/flow-control.md)."""

from __future__ import annotations

import re
from datetime import timedelta

from core.ids import utcnow
from orchestration.admission import flow_limits_get
from orchestration.models import FlowControl, ServiceCall
from orchestration.services import CallKey, service_calls_start
from tests.support.factories import HOUR, make_call, make_flow_control

PAGE = "/flow-control/"


def _form(**fields) -> dict[str, str]:
    data = {"parallelism": "", "rate": "", "host-count": "3"}
    data.update({key.replace("_", "-"): str(value) for key, value in fields.items()})
    return data


def test_it_shows_the_tenants_limits_and_how_many_calls_are_held(owner_client, world):
    make_flow_control("acme", parallelism=1, hosts={"acme-only.example.com": {"ratePerSecond": 2.5}})
    calls = [make_call("acme", name=f"c{n}", url="http://127.0.0.1:9001/x") for n in range(3)]
    service_calls_start(keys=[CallKey("acme", call.pk) for call in calls])
    response = owner_client.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(r'name="parallelism" id="fc-parallelism" value="1"', html)
    assert 'value="acme-only.example.com"' in html and 'name="host-0-rate" id="host-0-rate" value="2.5"' in html
    assert "<strong>2</strong> calls held now" in html
    # Another tenant's page shows its own limits: none.
    owner_client.force_login(world.outsider)
    other = owner_client.get(PAGE).content.decode()
    assert "acme-only" not in other
    assert "No call is held now" in other


def test_saving_the_form_sets_the_limits(owner_client, world):
    response = owner_client.post(
        PAGE, _form(parallelism=4, rate="0.5", host_0_name="API.example.com", host_0_parallelism=2, host_2_rate=3)
    )
    # Row 2 gives a rate but no host: refused, nothing stored.
    assert response.status_code == 400
    assert "Name the host these limits are for." in response.content.decode()
    assert not FlowControl.objects.exists()
    response = owner_client.post(
        PAGE, _form(parallelism=4, rate="0.5", host_0_name="API.example.com", host_0_parallelism=2)
    )
    assert response.status_code == 302 and response["Location"] == PAGE
    assert flow_limits_get(tenant_id="acme").as_wire() == {
        "parallelism": 4,
        "ratePerSecond": 0.5,
        "hosts": {"api.example.com": {"parallelism": 2, "ratePerSecond": None}},
    }
    # An empty form removes every limit.
    assert owner_client.post(PAGE, _form()).status_code == 302
    assert not FlowControl.objects.exists()


def test_bad_values_are_shown_by_their_fields_and_nothing_is_stored(owner_client, world):
    make_flow_control("acme", parallelism=3)
    response = owner_client.post(
        PAGE,
        _form(parallelism=0, rate="fast", host_0_name="not a host", host_0_parallelism=1, host_1_name="b.example.com"),
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "nothing was stored" in html
    assert 'id="parallelism-errors"' in html and 'id="rate-errors"' in html
    assert 'id="host-0-errors"' in html and 'id="host-1-errors"' in html
    assert 'value="not a host"' in html  # what was entered comes back
    assert FlowControl.objects.get(pk="acme").parallelism == 3


def test_the_page_needs_a_login(client, world):
    response = client.get(PAGE)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert client.post(PAGE, _form(parallelism=1)).status_code == 302
    assert not FlowControl.objects.exists()


def test_the_details_page_shows_how_long_a_call_was_held(owner_client, world):
    call = make_call("acme", name="held once", due_in=HOUR)
    started = utcnow()
    ServiceCall.objects.filter(pk=call.pk).update(
        status=ServiceCall.Status.RUNNING, started_at=started, attempts=1, held_ms=2500
    )
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert re.search(r'<span class="step-label">Held</span>.*held by flow control for <strong>2\.5', html, re.S), html


def test_the_details_page_shows_a_wait_in_progress(owner_client, world):
    call = make_call("acme", name="held now", due_in=HOUR)
    ServiceCall.objects.filter(pk=call.pk).update(held_since=utcnow() - timedelta(seconds=3), held_queue="")
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert "waiting for room under flow control, so far" in html


def test_a_call_never_held_has_no_held_step(owner_client, world):
    call = make_call("acme", name="never held", due_in=HOUR)
    assert '<span class="step-label">Held</span>' not in owner_client.get(f"/calls/{call.pk}/").content.decode()
