"""The JSON feed that keeps the status page's statuses live."""

from tests.support.factories import HOUR, make_call, make_succeeded_call


def test_it_returns_the_status_and_times_of_the_requested_calls(owner_client, world):
    waiting = make_call("acme", name="waiting", due_in=HOUR)
    done = make_succeeded_call("acme", name="done")
    response = owner_client.get(f"/calls/live?id={waiting.pk}&id={done.pk}")
    assert response.status_code == 200
    calls = {item["serviceCallId"]: item for item in response.json()["calls"]}
    assert calls[str(waiting.pk)]["status"] == "Scheduled"
    assert calls[str(waiting.pk)]["startedAt"] is None
    assert calls[str(done.pk)]["status"] == "Succeeded"
    assert calls[str(done.pk)]["finishedAt"].endswith("Z")


def test_it_never_answers_for_another_tenants_calls(outsider_client, world):
    acme_call = make_call("acme", name="acme call", due_in=HOUR)
    response = outsider_client.get(f"/calls/live?id={acme_call.pk}")
    assert response.json() == {"calls": []}


def test_it_skips_ids_that_are_not_uuids(owner_client, world):
    call = make_call("acme", name="real", due_in=HOUR)
    response = owner_client.get(f"/calls/live?id=not-a-uuid&id={call.pk}")
    assert [item["serviceCallId"] for item in response.json()["calls"]] == [str(call.pk)]
