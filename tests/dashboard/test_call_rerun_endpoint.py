"""'Run again' on the details page."""

from core.secrets import unseal_headers
from orchestration.models import ServiceCall
from tests.support.factories import HOUR, make_call, make_failed_call


def test_it_submits_a_new_call_with_the_same_request_and_opens_it(owner_client, world):
    original = make_failed_call("acme", name="flaky", headers={"Authorization": "Bearer keep-me"}, tags=["ops"])
    response = owner_client.post(f"/calls/{original.pk}/rerun")
    rerun = ServiceCall.objects.exclude(pk=original.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/calls/{rerun.pk}/"
    assert rerun.rerun_of == original.pk
    assert rerun.status == ServiceCall.Status.SCHEDULED
    assert rerun.request_spec["url"] == original.request_spec["url"]
    assert unseal_headers(rerun.request_spec["headers"]) == {"Authorization": "Bearer keep-me"}


def test_it_needs_a_post(owner_client, world):
    call = make_call("acme", name="once", due_in=HOUR)
    assert owner_client.get(f"/calls/{call.pk}/rerun").status_code == 405
    assert ServiceCall.objects.count() == 1


def test_an_outsider_cannot_run_another_tenants_call(outsider_client, world):
    call = make_call("acme", name="private", due_in=HOUR)
    assert outsider_client.post(f"/calls/{call.pk}/rerun").status_code == 404
    assert ServiceCall.objects.count() == 1
