"""Bulk actions (docs/api.md, "Bulk actions"): cancel, run again, add or remove tags on every
call a filter of the list matches, counted first with dryRun (nothing changes), then done, each
change the ordinary transition with its event; more than the limit is a 400 and nothing is done;
bad input names the field; another tenant's calls are never matched; a bulk cancel racing the
timer has one winner per call."""

from __future__ import annotations

import threading
import time

import pytest

from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.services import CallKey
from orchestration.services import bulk as bulk_module
from outbox.models import OutboxEvent
from tests.support.api import ApiClient, assert_problem, calls_url
from tests.support.factories import HOUR, make_call
from workers.pipeline import run_now

pytestmark = pytest.mark.also_postgres


def bulk_url(tenant: str = "acme") -> str:
    return calls_url(tenant) + "/bulk"


def test_a_dry_run_counts_and_changes_nothing_then_the_cancel_cancels_each_with_its_event(acme_api):
    nightly = [make_call("acme", name=f"nightly {n}", tags=["nightly"], due_in=HOUR) for n in range(3)]
    make_call("acme", name="other", tags=["other"], due_in=HOUR)
    make_call("globex", name="globex nightly", tags=["nightly"], due_in=HOUR)
    body = {"action": "cancel", "filter": {"tag": ["nightly"], "status": ["Scheduled"]}}

    counted = acme_api.post(bulk_url(), {**body, "dryRun": True}).json()
    assert (counted["matched"], counted["changed"], counted["dryRun"]) == (3, 0, True)
    assert ServiceCall.objects.filter(status="Cancelled").count() == 0

    done = acme_api.post(bulk_url(), body).json()
    assert (done["matched"], done["changed"], done["skipped"]) == (3, 3, 0)
    assert set(ServiceCall.objects.filter(status="Cancelled").values_list("pk", flat=True)) == {c.pk for c in nightly}
    assert OutboxEvent.objects.filter(event_type="ServiceCallCancelled").count() == 3
    assert ServiceCall.objects.get(tenant_id="globex").status == "Scheduled"
    # Again: nothing Scheduled matches; without the status filter they are already so.
    assert acme_api.post(bulk_url(), body).json()["matched"] == 0
    again = acme_api.post(bulk_url(), {"action": "cancel", "filter": {"tag": ["nightly"]}}).json()
    assert (again["changed"], again["unchanged"]) == (0, 3)


@pytest.mark.django_db(transaction=True)
def test_tags_are_added_and_removed_and_a_finished_call_is_skipped_by_cancel(acme_api, http_target):
    waiting = make_call("acme", name="waiting", tags=["a"], due_in=HOUR)
    finished = make_call("acme", name="finished", url=http_target.url("/ok"), tags=["a"])
    run_now([CallKey("acme", finished.pk)], worker_id="bulk")  # it runs now, whatever its due time

    added = acme_api.post(bulk_url(), {"action": "addTags", "filter": {"tag": ["a"]}, "tags": ["b", "a"]}).json()
    assert (added["changed"], added["unchanged"]) == (2, 0)
    assert sorted(ServiceCallTag.objects.filter(service_call=waiting).values_list("tag", flat=True)) == ["a", "b"]
    removed = acme_api.post(bulk_url(), {"action": "removeTags", "filter": {"q": "wait"}, "tags": ["a"]}).json()
    assert removed["changed"] == 1
    assert list(ServiceCallTag.objects.filter(service_call=waiting).values_list("tag", flat=True)) == ["b"]
    assert OutboxEvent.objects.filter(event_type="ServiceCallTagged", aggregate_id=waiting.pk).count() == 2

    cancelled = acme_api.post(bulk_url(), {"action": "cancel", "filter": {"tag": ["b"]}}).json()
    assert (cancelled["changed"], cancelled["skipped"]) == (1, 1)
    assert cancelled["reasons"] == {"not Scheduled (Running or finished)": 1}
    rerun = acme_api.post(bulk_url(), {"action": "rerun", "filter": {"status": ["Succeeded"]}}).json()
    assert rerun["changed"] == 1
    assert ServiceCall.objects.filter(rerun_of=finished.pk).count() == 1


def test_more_than_the_limit_is_a_400_and_nothing_is_done(acme_api, monkeypatch):
    monkeypatch.setattr(bulk_module, "BULK_MAX", 2)
    for n in range(3):
        make_call("acme", name=f"c{n}", due_in=HOUR)
    answer = acme_api.post(bulk_url(), {"action": "cancel", "filter": {}})
    body = assert_problem(answer, 400, errors_for="filter")
    assert "3 calls match" in body["errors"]["filter"][0]
    assert not ServiceCall.objects.filter(status="Cancelled").exists()
    assert acme_api.post(bulk_url(), {"action": "cancel", "filter": {}, "dryRun": True}).json()["matched"] == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"filter": {}}, "action"),
        ({"action": "delete", "filter": {}}, "action"),
        ({"action": "cancel"}, "filter"),
        ({"action": "cancel", "filter": {"owner": "me"}}, "filter.owner"),
        ({"action": "cancel", "filter": {"status": "Scheduled"}}, "filter.status"),
        ({"action": "cancel", "filter": {"status": ["Sleeping"]}}, "filter.status"),
        ({"action": "cancel", "filter": {"dueFrom": "yesterday"}}, "filter.dueFrom"),
        ({"action": "addTags", "filter": {}}, "tags"),
        ({"action": "addTags", "filter": {}, "tags": ["two words"]}, "tags"),
        ({"action": "cancel", "filter": {}, "tags": ["x"]}, "tags"),
        ({"action": "cancel", "filter": {}, "dryRun": "yes"}, "dryRun"),
        ({"action": "cancel", "filter": {}, "everything": True}, "everything"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(acme_api, body, field):
    call = make_call("acme", name="kept", due_in=HOUR)
    assert_problem(acme_api.post(bulk_url(), body), 400, errors_for=field)
    assert ServiceCall.objects.get(pk=call.pk).status == "Scheduled"


def test_another_tenant_gets_404_and_its_filter_never_reaches_acme(world, globex_api):
    make_call("acme", name="acme", due_in=HOUR)
    assert_problem(globex_api.post(bulk_url("acme"), {"action": "cancel", "filter": {}}), 404)
    assert globex_api.post(bulk_url("globex"), {"action": "cancel", "filter": {}}).json()["matched"] == 0
    assert ServiceCall.objects.get(tenant_id="acme").status == "Scheduled"


@pytest.mark.django_db(transaction=True)
def test_a_bulk_cancel_racing_the_timer_has_one_winner_per_call(world, engine, http_target):
    """Calls falling due while a bulk cancel goes through them: each either ran (its attempt
    reached the target) or was cancelled (it never did), never both, and every one is one of them."""
    calls = [
        make_call("acme", name=f"race {n}", url=http_target.url("/ok"), tags=["race"], due_in=0.3 + n * 0.01)
        for n in range(40)
    ]
    time.sleep(0.25)
    answer: dict = {}
    worker = threading.Thread(
        target=lambda: answer.update(
            ApiClient(world.acme_key).post(bulk_url(), {"action": "cancel", "filter": {"tag": ["race"]}}).json()
        )
    )
    worker.start()
    worker.join(30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and ServiceCall.objects.filter(status__in=["Scheduled", "Running"]).exists():
        time.sleep(0.1)
    statuses = dict(ServiceCall.objects.filter(pk__in=[c.pk for c in calls]).values_list("pk", "status"))
    assert set(statuses.values()) <= {"Cancelled", "Succeeded"}, statuses
    assert answer["changed"] == list(statuses.values()).count("Cancelled")
    assert answer["changed"] + answer["skipped"] + answer["unchanged"] == 40
    assert http_target.count("/ok") == list(statuses.values()).count("Succeeded")


def test_a_bulk_reruns_new_calls_count_against_the_submissions_ceiling(acme_api, still_throttle_clock):
    from tests.support.factories import make_ceilings

    make_ceilings("acme", submissionsPerSecond=2)
    for n in range(3):
        make_call("acme", name=f"r{n}", due_in=HOUR)
    assert acme_api.post(bulk_url(), {"action": "rerun", "filter": {}}).json()["changed"] == 3
    refused = acme_api.post(bulk_url(), {"action": "rerun", "filter": {}})
    assert_problem(refused, 429)
    assert ServiceCall.objects.count() == 6
    # Counting is free: a dry run is no submission.
    assert acme_api.post(bulk_url(), {"action": "rerun", "filter": {}, "dryRun": True}).json()["matched"] == 6
