"""The flow-control page under the operator's ceilings (docs/flow-control.md, "Operator
ceilings"): it shows them, refuses a limit above one naming the field, and stores nothing."""

from __future__ import annotations

from orchestration.models import FlowControl
from tests.support.factories import make_ceilings, make_flow_control

PAGE = "/flow-control/"


def _form(**fields) -> dict[str, str]:
    data = {"parallelism": "", "rate": "", "host-count": "3"}
    data.update({key: str(value) for key, value in fields.items()})
    return data


def test_it_shows_the_ceilings_and_the_limits_in_force(owner_client, world):
    make_ceilings("acme", parallelism=6, testPingsPerMinute=4)
    make_flow_control("acme", rate=2)

    html = owner_client.get(PAGE).content.decode()

    assert "The operator&#x27;s ceilings" in html or "The operator's ceilings" in html
    assert "<td>6</td>" in html and "in force: 6" in html
    assert "<td>4</td>" in html
    assert "in force: 2.0" in html


def test_a_limit_above_the_ceiling_is_refused_and_nothing_is_stored(owner_client, world):
    make_ceilings("acme", parallelism=6)
    make_flow_control("acme", parallelism=2)

    response = owner_client.post(PAGE, _form(parallelism=7))

    assert response.status_code == 400
    assert "At most 6 for this tenant" in response.content.decode()
    assert FlowControl.objects.get(pk="acme").parallelism == 2


def test_another_tenants_ceilings_are_not_shown(owner_client, world):
    make_ceilings("acme", parallelism=777)
    owner_client.force_login(world.outsider)
    assert "777" not in owner_client.get(PAGE).content.decode()
