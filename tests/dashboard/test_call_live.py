"""The JSON a page polls to follow one call: the API's representation, tenant-checked."""

from tests.support.factories import HOUR, make_call, make_succeeded_call


def test_it_answers_the_calls_representation_with_its_outcome(owner_client, world):
    call = make_succeeded_call("acme", name="done", headers={"Authorization": "Bearer hidden-1"})
    body = owner_client.get(f"/calls/{call.pk}/live").json()
    assert body["serviceCallId"] == str(call.pk)
    assert body["status"] == "Succeeded"
    assert body["outcome"]["responseMeta"]["status"] == 200
    assert body["requestSpec"]["headers"]["Authorization"] == "***"


def test_an_outsider_gets_404(outsider_client, world):
    call = make_call("acme", name="private", due_in=HOUR)
    assert outsider_client.get(f"/calls/{call.pk}/live").status_code == 404
