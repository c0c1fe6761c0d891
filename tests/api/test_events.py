"""GET /api/tenants/{tenantId}/events: the tenant's events feed, `{data, iterator, done}`.

A reader that follows `iterator` sees every published event of its tenant once, in feed order;
the concurrent case (writers and dispatchers committing out of order on PostgreSQL) is
tests/outbox/test_feed_gap_free.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction

from core.ids import new_id, utcnow
from outbox.dispatcher import dispatch_batch
from outbox.models import OutboxEvent
from outbox.selectors import events_feed
from outbox.services import outbox_delete_published_before, outbox_publish_again
from outbox.sinks import LogSink
from tests.support.api import assert_problem, submit_via_api
from tests.support.factories import make_event
from tests.support.plans import query_plan, recorded_queries, selects_from

URL = "/api/tenants/{tenant}/events"


def _publish_all() -> int:
    return dispatch_batch(limit=1000, sinks=[LogSink()])


def _feed(api, tenant: str = "acme", **params) -> dict:
    response = api.get(URL.format(tenant=tenant), params)
    assert response.status_code == 200, response.content
    return response.json()


def _read_all(api, *, after: str | None = None, limit: int = 2, **params) -> tuple[list[dict], str]:
    """Follow `iterator` until `done`; returns every event read and the last iterator."""
    events: list[dict] = []
    for _ in range(100):
        page = _feed(api, limit=limit, **params, **({"after": after} if after is not None else {}))
        events += page["data"]
        after = page["iterator"]
        if page["done"]:
            return events, after
    raise AssertionError("the feed never reported done")


def _labels(events: list[dict]) -> list[str]:
    return [event["payload"]["label"] for event in events]


def test_it_answers_published_events_oldest_first_with_an_iterator(acme_api, globex_api):
    first = submit_via_api(acme_api, name="one")["serviceCallId"]
    second = submit_via_api(acme_api, name="two")["serviceCallId"]
    submit_via_api(globex_api, "globex", name="theirs")
    _publish_all()

    body = _feed(acme_api)

    assert set(body) == {"data", "iterator", "done"}
    assert body["done"] is True and isinstance(body["iterator"], str)
    rows = list(OutboxEvent.objects.filter(tenant_id="acme").order_by("feed_seq"))
    assert [e["id"] for e in body["data"]] == [str(row.event_id) for row in rows]
    assert [e["sequence"] for e in body["data"]] == [row.id for row in rows]
    assert [e["aggregateId"] for e in body["data"]] == [first, first, second, second]
    assert [e["type"] for e in body["data"]] == ["ServiceCallSubmitted", "ServiceCallScheduled"] * 2
    assert all(e["tenantId"] == "acme" and e["publishedAt"].endswith("Z") for e in body["data"])
    assert set(body["data"][0]) >= {
        "id",
        "type",
        "tenantId",
        "aggregateId",
        "timestampMs",
        "correlationId",
        "causationId",
        "payload",
        "sequence",
        "publishedAt",
    }


def test_unpublished_events_are_not_served_until_published(acme_api):
    submit_via_api(acme_api)
    empty = _feed(acme_api)
    assert empty["data"] == [] and empty["done"] is True

    _publish_all()
    assert len(_feed(acme_api, after=empty["iterator"])["data"]) == 2


def test_following_the_iterator_reads_every_event_once_and_stays_put_when_nothing_is_new(acme_api):
    for n in range(5):
        make_event(payload={"label": f"e{n}"})
    _publish_all()

    page = _feed(acme_api, limit=2)
    assert _labels(page["data"]) == ["e0", "e1"] and page["done"] is False
    page = _feed(acme_api, limit=2, after=page["iterator"])
    assert _labels(page["data"]) == ["e2", "e3"] and page["done"] is False
    page = _feed(acme_api, limit=2, after=page["iterator"])
    assert _labels(page["data"]) == ["e4"] and page["done"] is True
    again = _feed(acme_api, limit=2, after=page["iterator"])
    assert again == {"data": [], "iterator": page["iterator"], "done": True}

    make_event(payload={"label": "e5"})
    _publish_all()
    assert _labels(_feed(acme_api, after=again["iterator"])["data"]) == ["e5"]


def test_the_default_limit_is_50(acme_api):
    for n in range(51):
        make_event(payload={"label": f"e{n}"})
    _publish_all()

    page = _feed(acme_api)

    assert len(page["data"]) == 50 and page["done"] is False
    assert _labels(_feed(acme_api, after=page["iterator"])["data"]) == ["e50"]


def test_an_event_published_after_a_later_one_is_not_skipped(acme_api):
    early = make_event(payload={"label": "early"})
    make_event(payload={"label": "late"})
    # Another dispatcher holds the early event (it was inserted first, but publishes last).
    OutboxEvent.objects.filter(pk=early.pk).update(locked_until=utcnow() + timedelta(seconds=30))
    _publish_all()

    events, iterator = _read_all(acme_api)
    assert _labels(events) == ["late"]

    OutboxEvent.objects.filter(pk=early.pk).update(locked_until=None)
    _publish_all()
    assert _labels(_read_all(acme_api, after=iterator)[0]) == ["early"]


def test_an_event_published_again_stays_once_in_the_feed_at_its_first_place(acme_api):
    first = make_event(payload={"label": "a"})
    make_event(payload={"label": "b"})
    _publish_all()
    everything, iterator = _read_all(acme_api)

    assert outbox_publish_again(ids=[first.pk]) == 1
    assert _publish_all() == 1

    assert _read_all(acme_api, after=iterator)[0] == []
    again, _ = _read_all(acme_api)
    assert _labels(again) == ["a", "b"]
    assert [e["id"] for e in again] == [e["id"] for e in everything]


def test_types_filters_the_events_and_the_iterator_still_moves_past_the_others(acme_api):
    for n, event_type in enumerate(
        ["ServiceCallTagged", "ServiceCallRunning", "ServiceCallTagged", "ServiceCallFailed"]
    ):
        make_event(event_type=event_type, payload={"label": f"e{n}"})
    _publish_all()

    events, iterator = _read_all(acme_api, limit=1, types="ServiceCallRunning,ServiceCallFailed")
    assert _labels(events) == ["e1", "e3"]
    # Repeated `types` parameters count as one list.
    both = _feed(acme_api, types=["ServiceCallRunning", "ServiceCallFailed"])
    assert _labels(both["data"]) == ["e1", "e3"]

    # Only filtered-out events: none served, and the position moves past them all the same.
    none_match = _feed(acme_api, types="ServiceCallSubmitted")
    assert none_match["data"] == [] and none_match["done"] is True

    make_event(payload={"label": "e4"})
    _publish_all()
    assert _labels(_read_all(acme_api, after=none_match["iterator"])[0]) == ["e4"]
    assert _labels(_read_all(acme_api, after=iterator)[0]) == ["e4"]


def test_after_an_event_id_reads_on_behind_that_event(acme_api):
    events = [make_event(payload={"label": f"e{n}"}) for n in range(3)]
    _publish_all()

    body = _feed(acme_api, after=str(events[0].event_id))

    assert _labels(body["data"]) == ["e1", "e2"]


def test_a_position_older_than_retention_resumes_at_the_oldest_event_kept(acme_api):
    for n in range(4):
        make_event(payload={"label": f"e{n}"})
    _publish_all()
    start = _feed(acme_api, limit=1)
    old = OutboxEvent.objects.filter(tenant_id="acme").order_by("feed_seq")[:2]
    OutboxEvent.objects.filter(pk__in=[row.pk for row in old]).update(published_at=utcnow() - timedelta(days=40))
    assert outbox_delete_published_before(before=utcnow() - timedelta(days=30)) == 2

    assert _labels(_read_all(acme_api, after=start["iterator"])[0]) == ["e2", "e3"]
    assert _labels(_read_all(acme_api)[0]) == ["e2", "e3"]


def test_numbers_keep_growing_when_retention_has_deleted_every_event(acme_api):
    make_event(payload={"label": "old"})
    _publish_all()
    _, iterator = _read_all(acme_api)
    OutboxEvent.objects.update(published_at=utcnow() - timedelta(days=40))
    outbox_delete_published_before(before=utcnow() - timedelta(days=30))

    make_event(payload={"label": "new"})
    _publish_all()

    assert _labels(_read_all(acme_api, after=iterator)[0]) == ["new"]


def test_each_tenant_reads_only_its_own_feed(acme_api, globex_api):
    make_event(payload={"label": "ours"})
    make_event("globex", payload={"label": "theirs"})
    _publish_all()

    assert _labels(_read_all(acme_api)[0]) == ["ours"]
    assert _labels(_read_all(globex_api, tenant="globex")[0]) == ["theirs"]
    assert_problem(acme_api.get(URL.format(tenant="globex")), 404)


def test_it_refuses_bad_after_types_and_limit_values(acme_api, globex_api):
    make_event("globex")
    make_event()
    _publish_all()
    theirs = str(OutboxEvent.objects.get(tenant_id="globex").event_id)
    url = URL.format(tenant="acme")
    head = _feed(acme_api)["iterator"]

    for after in ("yesterday", "42", "fs_", "fs_1x", "fs_99999999999999999999", str(new_id())):
        assert_problem(acme_api.get(url, {"after": after}), 400, errors_for="after")
    # Another tenant's event id is unknown here, not a way into their feed.
    assert_problem(acme_api.get(url, {"after": theirs}), 400, errors_for="after")
    # A position beyond any this feed has given out (another tenant's, or made up).
    ahead = assert_problem(acme_api.get(url, {"after": head + "0"}), 400, errors_for="after")
    assert "ahead" in ahead["errors"]["after"][0]
    unknown = assert_problem(acme_api.get(url, {"types": "ServiceCallTagged,Nope"}), 400, errors_for="types")
    assert "Nope" in unknown["errors"]["types"][0]
    assert_problem(acme_api.get(url, {"limit": "0"}), 400, errors_for="limit")
    assert_problem(acme_api.get(url, {"limit": "201"}), 400, errors_for="limit")
    assert _feed(acme_api, limit=200)["done"] is True


def test_an_unpublished_events_id_is_not_a_position_yet(acme_api):
    pending = make_event()
    assert_problem(acme_api.get(URL.format(tenant="acme"), {"after": str(pending.event_id)}), 400, errors_for="after")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="plans asserted on SQLite")
@pytest.mark.parametrize("types", [None, {"ServiceCallRunning", "ServiceCallFailed"}])
def test_the_feed_query_is_a_range_of_the_tenant_feed_index_in_order(db, types):
    for tenant in ("acme", "globex"):
        for _ in range(3):
            make_event(tenant)
    _publish_all()

    with recorded_queries() as queries:
        events_feed(tenant_id="acme", after=1, limit=50, types=types)

    [(sql, params)] = selects_from(queries, "outbox")
    plan = "\n".join(query_plan(sql, params))
    assert "USING INDEX outbox_tenant_feed (tenant_id=? AND feed_seq>? AND feed_seq<?)" in plan, plan
    assert "SCAN" not in plan and "TEMP B-TREE" not in plan, plan
    [(head_sql, head_params)] = selects_from(queries, "outbox_feed_counters")
    head_plan = "\n".join(query_plan(head_sql, head_params))
    assert "SEARCH outbox_feed_counters USING INDEX sqlite_autoindex_outbox_feed_counters_1 (tenant_id=?)" in head_plan


@pytest.mark.postgres
def test_postgresql_answers_the_feed_query_from_the_tenant_feed_index_in_order(world):
    for tenant in ("acme", "globex"):
        for _ in range(3):
            make_event(tenant)
    _publish_all()
    with recorded_queries() as queries:
        events_feed(tenant_id="acme", after=1, limit=50, types={"ServiceCallTagged"})
    [(sql, params)] = selects_from(queries, "outbox")

    # A few rows would be read by a scan anyway: forbid it to see that the index fits the query
    # (its `feed_seq IS NOT NULL` is implied by `feed_seq > %s`).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    # The outbox is partitioned by day (docs/schema.md): each partition read is read through its
    # own feed index, in feed order, merged without a sort.
    scans = [line for line in plan.splitlines() if " on outbox" in line]
    assert scans and all("_tenant_feed on outbox_" in line for line in scans), plan
    assert not re.search(r"(^|->)\s*Sort\s+\(", plan, re.MULTILINE), plan
