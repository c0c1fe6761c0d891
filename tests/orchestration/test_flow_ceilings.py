"""The engine holds a tenant's calls to the limits in force: its own under the operator's
ceilings (docs/flow-control.md, "Operator ceilings"), whether or not it set limits itself."""

from __future__ import annotations

from datetime import timedelta

from core.ids import utcnow
from orchestration.admission import held_count, tenant_has_limits
from orchestration.models import FlowControl, ServiceCall
from tests.support.factories import make_call, make_ceilings, make_flow_control
from tests.support.starts import start

URL = "http://127.0.0.1:9001/a"


def calls(n: int, tenant: str = "acme", name: str = "c") -> list[ServiceCall]:
    first = utcnow() - timedelta(seconds=1)
    return [make_call(tenant, name=f"{name}{i}", url=URL, due_at=first + timedelta(milliseconds=i)) for i in range(n)]


def test_a_ceiling_holds_the_calls_of_a_tenant_without_limits_of_its_own(world):
    make_ceilings("acme", parallelism=2)
    assert tenant_has_limits("acme")
    rows = calls(4)

    assert start(*rows) == ["c0", "c1"]
    assert held_count(tenant_id="acme") == 2
    # The row the start locks was made for it, without limits of the tenant's own.
    row = FlowControl.objects.get(pk="acme")
    assert (row.parallelism, row.rate_per_second) == (None, None)


def test_the_lower_of_the_tenants_limit_and_the_ceiling_holds(world):
    make_flow_control("acme", parallelism=3)
    make_ceilings("acme", parallelism=1)
    assert start(*calls(3)) == ["c0"]


def test_the_tenants_own_lower_limit_holds_under_a_higher_ceiling(world):
    make_ceilings("acme", parallelism=3)
    make_flow_control("acme", parallelism=1)
    assert start(*calls(3)) == ["c0"]


def test_a_ceiling_on_one_tenant_never_holds_another(world):
    make_ceilings("acme", parallelism=1)
    assert not tenant_has_limits("globex")
    assert start(*calls(2), *calls(2, "globex", "g")) == ["c0", "g0", "g1"]


def test_a_default_ceiling_holds_every_tenant(world, settings):
    settings.CEILING_CALL_PARALLELISM = 1
    assert start(*calls(2), *calls(2, "globex", "g")) == ["c0", "g0"]


def test_a_ceiling_rate_spaces_the_starts(world):
    make_ceilings("acme", ratePerSecond=1)
    assert start(*calls(3)) == ["c0"]
    assert held_count(tenant_id="acme") == 2
