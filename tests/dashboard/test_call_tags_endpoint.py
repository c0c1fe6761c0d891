"""Tag editing on the details page."""

from orchestration.models import ServiceCallTag
from orchestration.services import service_call_favorite_set
from tests.support.factories import HOUR, make_call


def _tags(call) -> set[str]:
    return set(ServiceCallTag.objects.filter(service_call_id=call.pk).values_list("tag", flat=True))


def test_it_replaces_the_tags_and_keeps_the_star(owner_client, world):
    call = make_call("acme", name="tagged", tags=["old", "keep"], due_in=HOUR)
    service_call_favorite_set(tenant_id="acme", service_call_id=call.pk, favorite=True)
    response = owner_client.post(f"/calls/{call.pk}/tags", {"tags": "keep, new-one"})
    assert response.status_code == 302 and response["Location"] == f"/calls/{call.pk}/"
    assert _tags(call) == {"keep", "new-one", "favorite"}


def test_it_refuses_an_invalid_tag_and_changes_nothing(owner_client, world):
    call = make_call("acme", name="tagged", tags=["old"], due_in=HOUR)
    response = owner_client.post(f"/calls/{call.pk}/tags", {"tags": "x" * 70}, follow=True)
    assert "without whitespace" in response.content.decode()
    assert _tags(call) == {"old"}


def test_it_answers_json_to_a_script(owner_client, world):
    call = make_call("acme", name="tagged", due_in=HOUR)
    response = owner_client.post(f"/calls/{call.pk}/tags", {"tags": "a b"}, HTTP_ACCEPT="application/json")
    assert response.json() == {"tags": ["a", "b"]}


def test_an_outsider_cannot_tag_another_tenants_call(outsider_client, world):
    call = make_call("acme", name="private", tags=["mine"], due_in=HOUR)
    assert outsider_client.post(f"/calls/{call.pk}/tags", {"tags": "hijacked"}).status_code == 404
    assert _tags(call) == {"mine"}


def test_a_form_that_does_not_validate_is_refused_and_changes_nothing(owner_client, world):
    # Before, the view ignored form.is_valid(): an over-long field silently cleared the tags.
    call = make_call("acme", name="tagged", tags=["old"], due_in=HOUR)
    response = owner_client.post(f"/calls/{call.pk}/tags", {"tags": "a " * 1500}, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert "tags" in response.json()["errors"]
    assert _tags(call) == {"old"}


def test_the_star_counts_toward_the_tag_limit_when_it_is_kept(owner_client, world):
    call = make_call("acme", name="tagged", tags=["old"], due_in=HOUR)
    service_call_favorite_set(tenant_id="acme", service_call_id=call.pk, favorite=True)
    twenty = " ".join(f"t{n}" for n in range(20))
    response = owner_client.post(f"/calls/{call.pk}/tags", {"tags": twenty}, HTTP_ACCEPT="application/json")
    assert response.status_code == 400
    assert _tags(call) == {"old", "favorite"}
