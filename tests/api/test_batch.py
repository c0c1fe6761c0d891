"""Batch submission (docs/api.md, "Batches"): up to 100 calls in one request, each accepted or
refused on its own with its own answer, in order, each with its own idempotency key; the
accepted ones stored together in one transaction, one INSERT per table; a malformed batch is a
400 that stores nothing; each call counts against the submissions ceiling; another tenant gets
404. The calls then run on the real engine."""

from __future__ import annotations

import math
import threading
import time

import pytest
from django.core.cache import caches
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.db import rows_per_insert
from orchestration.models import ServiceCall, ServiceCallTag
from outbox.models import OutboxEvent
from tests.support.api import ApiClient, assert_problem, calls_url, valid_payload
from tests.support.factories import make_ceilings
from timer.models import TimerSchedule

# The batch's statements (one INSERT per table, the timers' upsert) differ by database: run on both.
pytestmark = pytest.mark.also_postgres


def batch_url(tenant: str = "acme") -> str:
    return calls_url(tenant) + "/batch"


@pytest.fixture(autouse=True)
def empty_limits_cache(db):
    caches["limits"].clear()
    yield
    caches["limits"].clear()


def test_each_item_is_accepted_or_refused_on_its_own_in_order(acme_api):
    bad_url = valid_payload(name="bad url")
    bad_url["requestSpec"]["url"] = "ftp://127.0.0.1/x"
    too_many_tries = valid_payload(name="too many tries", retryPolicy={"maxAttempts": 99})
    items = [valid_payload(name="one", tags=["a"]), bad_url, valid_payload(name="two"), too_many_tries, {"x": 1}]

    answer = acme_api.post(batch_url(), {"calls": items})

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert [result["status"] for result in body["results"]] == [202, 400, 202, 400, 400]
    assert (body["accepted"], body["replayed"], body["refused"]) == (2, 0, 3)
    assert body["results"][0]["call"]["name"] == "one" and body["results"][0]["call"]["tags"] == ["a"]
    assert "requestSpec.url" in body["results"][1]["problem"]["errors"]
    assert "retryPolicy.maxAttempts" in body["results"][3]["problem"]["errors"]
    assert {"name", "requestSpec"} <= set(body["results"][4]["problem"]["errors"])
    stored = {body["results"][i]["call"]["serviceCallId"] for i in (0, 2)}
    assert {str(pk) for pk in ServiceCall.objects.values_list("pk", flat=True)} == stored
    assert ServiceCallTag.objects.filter(tag="a").count() == 1
    assert OutboxEvent.objects.filter(aggregate_id__in=stored).count() == 4  # Submitted, Scheduled each
    assert TimerSchedule.objects.filter(service_call_id__in=stored).count() == 2


def test_a_hundred_calls_are_stored_with_one_insert_per_table(acme_api):
    items = [valid_payload(name=f"call {n}", tags=["bulk"]) for n in range(100)]
    with CaptureQueriesContext(connection) as queries:
        answer = acme_api.post(batch_url(), {"calls": items})
    assert answer.json()["accepted"] == 100
    inserts = [q["sql"].split("(")[0].split()[-1].strip('"') for q in queries if q["sql"].startswith("INSERT INTO")]
    # One INSERT per table, split only where the database's limit of parameters asks.
    for model, columns in (
        (ServiceCall, len(ServiceCall._meta.concrete_fields)),
        (ServiceCallTag, 3),
        (TimerSchedule, 6),
    ):
        assert inserts.count(model._meta.db_table) == math.ceil(100 / rows_per_insert(columns)), inserts
    assert ServiceCall.objects.count() == 100 and OutboxEvent.objects.count() == 200


def test_idempotency_keys_answer_the_stored_call_per_item(acme_api):
    items = [valid_payload(name="keyed", idempotencyKey="k-1"), valid_payload(name="plain")]
    first = acme_api.post(batch_url(), {"calls": items}).json()
    again = acme_api.post(batch_url(), {"calls": items}).json()
    assert [r["status"] for r in first["results"]] == [202, 202]
    assert [r["status"] for r in again["results"]] == [200, 202]
    assert again["results"][0]["call"]["serviceCallId"] == first["results"][0]["call"]["serviceCallId"]

    # The same key twice in one batch: the same call, stored by the first (the second a replay);
    # with another payload: 409.
    twice = [valid_payload(name="twice", idempotencyKey="k-2")] * 2 + [
        valid_payload(name="other", idempotencyKey="k-2")
    ]
    results = acme_api.post(batch_url(), {"calls": twice}).json()["results"]
    assert [r["status"] for r in results] == [202, 200, 409]
    assert results[0]["call"]["serviceCallId"] == results[1]["call"]["serviceCallId"]
    assert ServiceCall.objects.filter(idempotency_key="k-2").count() == 1
    # A key stored by a single submission answers in a batch too.
    single = acme_api.post(calls_url(), valid_payload(name="single", idempotencyKey="k-3")).json()
    replay = acme_api.post(batch_url(), {"calls": [valid_payload(name="single", idempotencyKey="k-3")]}).json()
    assert replay["results"][0] == {"status": 200, "call": replay["results"][0]["call"]}
    assert replay["results"][0]["call"]["serviceCallId"] == single["serviceCallId"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([valid_payload()], "body"),
        ({}, "calls"),
        ({"calls": []}, "calls"),
        ({"calls": "all of them"}, "calls"),
        ({"calls": [valid_payload()] * 101}, "calls"),
        ({"calls": [valid_payload()], "dryRun": True}, "dryRun"),
    ],
)
def test_a_malformed_batch_is_a_400_and_stores_nothing(acme_api, body, field):
    assert_problem(acme_api.post(batch_url(), body), 400, errors_for=field)
    assert not ServiceCall.objects.exists()


def test_another_tenant_gets_404_and_stores_nothing(globex_api):
    assert_problem(globex_api.post(batch_url("acme"), {"calls": [valid_payload()]}), 404)
    assert not ServiceCall.objects.exists()


def test_each_call_counts_against_the_submissions_ceiling(acme_api, still_throttle_clock):
    make_ceilings("acme", submissionsPerSecond=5)
    assert acme_api.post(batch_url(), {"calls": [valid_payload()] * 8}).json()["accepted"] == 8
    refused = acme_api.post(calls_url(), valid_payload())
    assert_problem(refused, 429)
    assert_problem(acme_api.post(batch_url(), {"calls": [valid_payload()]}), 429)
    assert ServiceCall.objects.count() == 8


@pytest.mark.django_db(transaction=True)
def test_two_batches_racing_with_one_key_store_one_call(world):
    answers: list[dict] = []
    start = threading.Barrier(2)

    def post() -> None:
        try:
            start.wait(5)
            payload = {"calls": [valid_payload(name="raced", idempotencyKey="race"), valid_payload(name="free")]}
            answers.append(ApiClient(world.acme_key).post(batch_url(), payload).json())
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 2
    raced = {answer["results"][0]["call"]["serviceCallId"] for answer in answers}
    assert len(raced) == 1 and ServiceCall.objects.filter(idempotency_key="race").count() == 1
    assert sorted(answer["results"][0]["status"] for answer in answers) == [200, 202]
    assert ServiceCall.objects.filter(name="free").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_batch_due_now_runs_on_the_engine(world, engine, http_target):
    items = [valid_payload(name=f"now {n}") for n in range(20)]
    for item in items:
        item["requestSpec"]["url"] = http_target.url("/ok")
    assert ApiClient(world.acme_key).post(batch_url(), {"calls": items}).json()["accepted"] == 20
    deadline = time.monotonic() + 60  # bounded; a loaded machine is slow, never this slow
    while time.monotonic() < deadline and ServiceCall.objects.filter(status="Succeeded").count() < 20:
        time.sleep(0.1)
    assert ServiceCall.objects.filter(status="Succeeded").count() == 20
    assert http_target.count("/ok") == 20


def test_a_batchs_calls_are_charged_at_the_ceilings_pace(acme_api, monkeypatch):
    """A batch of ten at a ceiling of five a second holds the key's next submission for two
    seconds, not one: the charge is the calls', not the request's."""
    from eventservice.api.throttles import CeilingThrottle

    clock = [1_000_000.0]
    monkeypatch.setattr(CeilingThrottle, "timer", staticmethod(lambda: clock[0]))
    make_ceilings("acme", submissionsPerSecond=5)
    assert acme_api.post(batch_url(), {"calls": [valid_payload()] * 10}).json()["accepted"] == 10
    clock[0] += 1.1
    assert_problem(acme_api.post(calls_url(), valid_payload()), 429)
    clock[0] += 1.0
    assert acme_api.post(calls_url(), valid_payload()).status_code == 202


def test_an_item_due_in_the_past_says_so_in_its_result(acme_api):
    """As a single submission's Warning header does: the call is kept, due now."""
    items = [valid_payload(name="late", dueAt="2020-01-01T00:00:00Z"), valid_payload(name="now")]

    results = acme_api.post(batch_url(), {"calls": items}).json()["results"]

    assert [result["status"] for result in results] == [202, 202]
    assert results[0]["warning"] == "dueAt 2020-01-01T00:00:00.000Z is in the past: the call is due now."
    assert "warning" not in results[1]
    # Sent again under the same key: the call stored earlier, and no second word about its time.
    again = acme_api.post(batch_url(), {"calls": [{**items[0], "idempotencyKey": "late-1"}] * 2}).json()["results"]
    assert [result["status"] for result in again] == [202, 200] and "warning" not in again[1]
