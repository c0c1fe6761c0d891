"""orchestration.filters.ServiceCallFilter: the plans of the list page's queries (SPEC §12).

The tag-filtered list must be answered from indexes: service_call_tags_tag for each tag and
the (tenant_id, service_call_id) index of service_calls in id order — no full scan of
service_calls and no temporary B-tree for ORDER BY, on every page of the cursor.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.http import QueryDict

from orchestration.filters import ServiceCallFilter, uuid7_floor
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.selectors import service_calls_for_tenant

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="plans asserted on SQLite")

PIVOT = uuid.UUID("0190a000-0000-7000-8000-000000000000")


def _page_query(params: str, *, direction: str = "first", tenant_id: str | None = "acme"):
    """The query of one list page exactly as eventservice.api.base.keyset_page runs it."""
    base = service_calls_for_tenant(tenant_id=tenant_id) if tenant_id else ServiceCall.objects.all()
    filterset = ServiceCallFilter(QueryDict(params), queryset=base, tenant_id=tenant_id)
    assert filterset.is_valid(), filterset.errors
    qs = filterset.qs
    if direction == "next":
        qs = qs.filter(pk__lt=PIVOT).order_by("-pk")
    elif direction == "previous":
        qs = qs.filter(pk__gt=PIVOT).order_by("pk")
    else:
        qs = qs.order_by("-pk")
    return qs[:26]


def _plan(qs) -> list[str]:
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return [row[3] for row in cursor.fetchall()]


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
def test_the_tag_filtered_page_is_answered_from_indexes(db, params, direction):
    plan = _plan(_page_query(params, direction=direction))

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
def test_other_list_pages_use_an_index_in_id_order(db, params):
    _assert_index_only(_plan(_page_query(params)))


def test_across_tenants_each_tag_is_a_lookup_in_the_unique_tag_index(db):
    plan = _plan(_page_query("tag=red&tag=blue", tenant_id=None))
    text = "\n".join(plan)
    assert "SCAN service_call_tags" not in text, text
    assert text.count("service_call_tags_unique") + text.count("sqlite_autoindex_service_call_tags") >= 2, text


def test_all_tags_make_one_id_list_of_per_tag_index_selects(db):
    sql, params = _page_query("tag=red&tag=blue&favorite=true").query.sql_with_params()
    assert sql.count('"service_call_id" IN (SELECT') == 1
    assert sql.count("INTERSECT") == 2
    assert list(params).count("acme") == 4 and {"red", "blue", "favorite"} <= set(params)


def test_a_single_tag_is_a_plain_in_subquery(db):
    sql, _ = _page_query("tag=red").query.sql_with_params()
    assert sql.count('"service_call_id" IN (SELECT') == 1 and "INTERSECT" not in sql


def test_filters_return_the_right_rows(world):
    from orchestration.services import service_call_submit
    from orchestration.validation import validate_submission

    def make(name, tags, tenant="acme"):
        data = {"name": name, "requestSpec": {"method": "GET", "url": "http://127.0.0.1:9/"}, "tags": tags}
        return service_call_submit(tenant_id=tenant, submission=validate_submission(data), correlation_id="c")[0]

    both = make("both", ["red", "blue"])
    make("red only", ["red"])
    starred = make("starred red", ["red", "favorite"])
    make("other tenant both", ["red", "blue"], tenant="globex")

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
