"""orchestration.filters.ServiceCallFilter: the plans of the list's queries (docs/schema.md,
"Indexes and the queries that use them"; bench/README.md measures them at 1M calls).

The tag-filtered list must be answered from indexes: service_call_tags_tag for each tag and
the (tenant_id, service_call_id) index of service_calls in id order — no full scan of
service_calls and no temporary B-tree for ORDER BY, on every page of the cursor. The queries
explained are the ones the API and the admin run (recorded from a real request), so a change
to the selector, the FilterSet or the paging changes what is explained.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.http import QueryDict

from eventservice.api.base import Cursor
from orchestration.filters import ServiceCallFilter, uuid7_floor
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.selectors import service_calls_for_tenant
from tests.support.api import calls_url
from tests.support.factories import make_call
from tests.support.plans import Query, query_plan, recorded_queries, selects_from

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="plans asserted on SQLite")

PIVOT = uuid.UUID("0190a000-0000-7000-8000-000000000000")


def _page_query(api, params: str, *, direction: str = "first") -> Query:
    """The query of one page of acme's list, recorded from GET /api/tenants/acme/service-calls
    (service_calls_for_tenant, ServiceCallFilter, keyset_page)."""
    query = QueryDict(params, mutable=True)
    if direction != "first":
        query["cursor"] = Cursor("n" if direction == "next" else "p", PIVOT).encode()
    with recorded_queries() as queries:
        response = api.get(f"{calls_url('acme')}?{query.urlencode()}")
    assert response.status_code == 200, response.content
    [page] = selects_from(queries, "service_calls")
    return page


def _plan(query: Query) -> list[str]:
    return query_plan(*query)


def _assert_index_only(plan: list[str]) -> None:
    text = "\n".join(plan)
    assert not any(line.startswith("SCAN service_calls") for line in plan), text
    assert not any(line.startswith("SCAN") for line in plan), text
    assert "TEMP B-TREE FOR ORDER BY" not in text, text
    assert any(line.startswith("SEARCH service_calls USING") for line in plan), text


@pytest.mark.parametrize("direction", ["first", "next", "previous"])
@pytest.mark.parametrize(
    "params", ["tag=red", "tag=red&tag=blue", "tag=red&tag=blue&tag=green", "favorite=true", "tag=red&favorite=true"]
)
def test_the_tag_filtered_page_is_answered_from_indexes(acme_api, params, direction):
    plan = _plan(_page_query(acme_api, params, direction=direction))

    _assert_index_only(plan)
    tag_lookups = [
        line for line in plan if "USING COVERING INDEX service_call_tags_tag (tenant_id=? AND tag=?)" in line
    ]
    assert len(tag_lookups) == params.count("tag=") + params.count("favorite=true")


@pytest.mark.parametrize(
    "params",
    [
        "",
        "status=Running",
        "status=Running&status=Failed",
        "tag=red&status=Failed",
        "q=report",
        "submittedFrom=2024-05-01",
        "favorite=false",
    ],
)
def test_other_list_pages_use_an_index_in_id_order(acme_api, params):
    _assert_index_only(_plan(_page_query(acme_api, params)))


def test_across_tenants_the_tag_is_a_lookup_in_the_unique_tag_index(world, admin_client):
    # The operator admin's tag filter: the FilterSet without a tenant, on the admin's queryset.
    make_call("acme", tags=["red"])
    make_call("globex", tags=["red", "blue"])
    with recorded_queries() as queries:
        response = admin_client.get("/admin/orchestration/servicecall/", {"tag": "red"})
    assert response.status_code == 200
    filtered = [query for query in selects_from(queries, "service_calls") if '"service_call_tags"' in query[0]]
    assert filtered, queries
    for query in filtered:
        plan = _plan(query)
        text = "\n".join(plan)
        # U0: Django's alias of service_call_tags in the EXISTS subquery.
        assert not any(line.startswith(("SCAN service_call_tags", "SCAN U0")) for line in plan), text
        assert text.count("service_call_tags_unique") + text.count("sqlite_autoindex_service_call_tags") >= 1, text


def test_all_tags_make_one_id_list_of_per_tag_index_selects(acme_api):
    sql, params = _page_query(acme_api, "tag=red&tag=blue&favorite=true")
    assert sql.count('"service_call_id" IN (SELECT') == 1
    assert sql.count("INTERSECT") == 2
    assert list(params).count("acme") == 4 and {"red", "blue", "favorite"} <= set(params)


def test_a_single_tag_is_a_plain_in_subquery(acme_api):
    sql, _ = _page_query(acme_api, "tag=red")
    assert sql.count('"service_call_id" IN (SELECT') == 1 and "INTERSECT" not in sql


def test_filters_return_the_right_rows(world):
    both = make_call(name="both", tags=["red", "blue"])
    make_call(name="red only", tags=["red"])
    starred = make_call(name="starred red", tags=["red", "favorite"])
    make_call("globex", name="other tenant both", tags=["red", "blue"])

    for tenant_id in ("acme", None):
        base = service_calls_for_tenant(tenant_id="acme") if tenant_id else ServiceCall.objects.filter(tenant_id="acme")
        filterset = ServiceCallFilter(QueryDict("tag=red&tag=blue"), queryset=base, tenant_id=tenant_id)
        assert [c.pk for c in filterset.qs] == [both.pk]
        starred_red = ServiceCallFilter(QueryDict("tag=red&favorite=true"), queryset=base, tenant_id=tenant_id)
        assert [c.pk for c in starred_red.qs] == [starred.pk]
        unstarred = ServiceCallFilter(QueryDict("tag=red&favorite=false"), queryset=base, tenant_id=tenant_id)
        assert {c.pk for c in unstarred.qs} == {both.pk} | {c.pk for c in base if c.name == "red only"}
    assert ServiceCallTag.objects.filter(tag="red").count() == 4


def test_uuid7_floor_orders_with_the_ids_minted_at_that_time():
    from datetime import UTC, datetime

    from core.ids import new_id

    before = datetime.now(UTC)
    minted = new_id()
    assert uuid7_floor(before) <= minted
