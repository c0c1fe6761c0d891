"""PUT /api/tenants/{tenantId}/service-calls/{id}/tags: replace the tag set."""

from __future__ import annotations

from orchestration.models import ServiceCallTag
from outbox.models import OutboxEvent
from tests.support.api import assert_problem, call_url, stored_counts, submit_via_api


def _tags(call_id: str) -> list[str]:
    return sorted(ServiceCallTag.objects.filter(service_call_id=call_id).values_list("tag", flat=True))


def test_it_replaces_the_tag_set_and_answers_the_call(acme_api):
    call_id = submit_via_api(acme_api, tags=["old", "keep"])["serviceCallId"]

    response = acme_api.put(call_url(call_id, suffix="/tags"), {"tags": ["keep", "new", "favorite"]})

    assert response.status_code == 200
    body = response.json()
    assert body["serviceCallId"] == call_id
    assert sorted(body["tags"]) == ["favorite", "keep", "new"] and body["favorite"] is True
    assert _tags(call_id) == ["favorite", "keep", "new"]


def test_a_change_emits_service_call_tagged_with_added_and_removed(acme_api):
    call_id = submit_via_api(acme_api, tags=["old", "keep"])["serviceCallId"]

    acme_api.put(
        call_url(call_id, suffix="/tags"), {"tags": ["keep", "new"]}, headers={"X-Correlation-Id": "tagging-1"}
    )

    [event] = OutboxEvent.objects.filter(aggregate_id=call_id, event_type=OutboxEvent.Type.TAGGED)
    payload = event.event_payload["payload"]
    assert payload["tags"] == ["keep", "new"] and payload["added"] == ["new"] and payload["removed"] == ["old"]
    assert event.event_payload["causationId"] == "tagging-1"


def test_the_same_set_again_changes_nothing_and_emits_nothing(acme_api):
    call_id = submit_via_api(acme_api, tags=["a", "b"])["serviceCallId"]
    before = stored_counts()

    response = acme_api.put(call_url(call_id, suffix="/tags"), {"tags": ["b", "a"]})

    assert response.status_code == 200
    assert stored_counts() == before


def test_an_empty_list_removes_every_tag(acme_api):
    call_id = submit_via_api(acme_api, tags=["a", "b"])["serviceCallId"]
    assert acme_api.put(call_url(call_id, suffix="/tags"), {"tags": []}).json()["tags"] == []
    assert _tags(call_id) == []


def test_it_refuses_invalid_tags_and_keeps_the_old_set(acme_api):
    call_id = submit_via_api(acme_api, tags=["a"])["serviceCallId"]
    before = stored_counts()

    for body in (
        {"tags": ["two words"]},
        {"tags": ["t" * 65]},
        {"tags": [f"t{i}" for i in range(21)]},
        {"tags": "a"},
        {},
        {"tags": ["a"], "other": 1},
    ):
        field = "body" if "other" in body else "tags"
        assert_problem(acme_api.put(call_url(call_id, suffix="/tags"), body), 400, errors_for=field)

    assert _tags(call_id) == ["a"]
    assert stored_counts() == before


def test_tags_of_an_unknown_call_are_404(acme_api, world):
    assert_problem(acme_api.put(call_url("0190a000-0000-7000-8000-000000000000", suffix="/tags"), {"tags": ["a"]}), 404)
    assert_problem(acme_api.put(call_url("nope", suffix="/tags"), {"tags": ["a"]}), 404)


def test_other_methods_on_tags_are_405(acme_api):
    call_id = submit_via_api(acme_api)["serviceCallId"]
    assert_problem(acme_api.get(call_url(call_id, suffix="/tags")), 405)
