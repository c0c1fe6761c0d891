"""The star: a form post without script, a CSRF-protected fetch with it."""

from django.test import Client

from orchestration.models import ServiceCallTag
from tests.support.factories import HOUR, make_call


def _starred(call) -> bool:
    return ServiceCallTag.objects.filter(service_call_id=call.pk, tag="favorite").exists()


def test_starring_and_unstarring_return_to_the_page_it_came_from(owner_client, world):
    call = make_call("acme", name="star me", due_in=HOUR)
    response = owner_client.post(f"/calls/{call.pk}/favorite", {"favorite": "on", "next": "/calls/?q=star"})
    assert response.status_code == 302 and response["Location"] == "/calls/?q=star"
    assert _starred(call)
    owner_client.post(f"/calls/{call.pk}/favorite", {"favorite": ""})
    assert not _starred(call)


def test_it_does_not_redirect_to_another_site(owner_client, world):
    call = make_call("acme", name="star me", due_in=HOUR)
    response = owner_client.post(f"/calls/{call.pk}/favorite", {"favorite": "on", "next": "https://evil.example/"})
    assert response["Location"] == f"/calls/{call.pk}/"


def test_a_script_needs_the_csrf_token(world):
    call = make_call("acme", name="star me", due_in=HOUR)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(world.owner)
    assert (
        browser.post(f"/calls/{call.pk}/favorite", {"favorite": "on"}, HTTP_ACCEPT="application/json").status_code
        == 403
    )
    assert not _starred(call)
    browser.get("/calls/")  # sets the csrftoken cookie
    token = browser.cookies["csrftoken"].value
    response = browser.post(
        f"/calls/{call.pk}/favorite", {"favorite": "on"}, HTTP_ACCEPT="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert response.json() == {"serviceCallId": str(call.pk), "favorite": True}
    assert _starred(call)


def test_an_outsider_cannot_star_another_tenants_call(outsider_client, world):
    call = make_call("acme", name="private", due_in=HOUR)
    assert outsider_client.post(f"/calls/{call.pk}/favorite", {"favorite": "on"}).status_code == 404
    assert not _starred(call)
