"""The Calls page's bulk actions (docs/api.md, "Bulk actions"): the page's filters lead to a
confirm step that counts the matching calls and changes nothing; the confirmed POST acts on each
of them as the API does and goes back to the same list; bad input changes nothing; another
tenant's calls are never counted or touched."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from orchestration.models import ServiceCall
from orchestration.selectors import tags_of
from tests.support.factories import make_call


@pytest.fixture
def owner(client, world):
    client.force_login(world.owner)
    return client


def test_the_confirm_step_counts_and_the_post_cancels_only_the_filtered_calls(owner, world):
    nightly = [make_call(name=f"n{i}", tags=["nightly"], due_in=3600) for i in range(3)]
    other = make_call(name="other", tags=["adhoc"], due_in=3600)
    theirs = make_call("globex", name="theirs", tags=["nightly"], due_in=3600)

    listing = owner.get("/calls/?tag=nightly").content.decode()
    assert "Act on all 3 matching calls" in listing

    confirm = owner.get("/calls/bulk?tag=nightly&action=cancel")
    text = confirm.content.decode()
    assert confirm.status_code == 200 and "<strong>3</strong> calls match" in text and "Cancel them" in text
    assert ServiceCall.objects.filter(status="Cancelled").count() == 0  # counting changes nothing

    done = owner.post("/calls/bulk", {"tag": "nightly", "action": "cancel"}, follow=True)
    assert done.redirect_chain[-1][0] == "/calls/?tag=nightly"
    assert "3 of 3 calls cancelled." in done.content.decode()
    assert {c.status for c in ServiceCall.objects.filter(pk__in=[c.pk for c in nightly])} == {"Cancelled"}
    assert ServiceCall.objects.get(pk=other.pk).status == "Scheduled"
    assert ServiceCall.objects.get(pk=theirs.pk).status == "Scheduled"


def test_a_tag_is_added_to_every_matching_call(owner, world):
    calls = [make_call(name=f"c{i}", tags=["batch-7"]) for i in range(2)]
    confirm = owner.get("/calls/bulk?tag=batch-7&action=addTags&bulkTag=reviewed").content.decode()
    assert "reviewed" in confirm and "Add the tag" in confirm
    owner.post("/calls/bulk", {"tag": "batch-7", "action": "addTags", "bulkTag": "reviewed"})
    assert all("reviewed" in tags_of(ServiceCall.objects.get(pk=c.pk)) for c in calls)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("action=explode", "action:"),
        ("action=addTags&bulkTag=", "tags:"),
        ("action=addTags&bulkTag=two%20words", "tags:"),
        ("action=cancel&dueFrom=yesterday", "filter.dueFrom:"),
    ],
)
def test_bad_input_is_said_and_changes_nothing(owner, world, query, said):
    call = make_call(tags=["t"], due_in=3600)
    answer = owner.get(f"/calls/bulk?{query}")
    assert answer.status_code == 400 and said in answer.content.decode()
    posted = owner.post("/calls/bulk", dict(parse_qsl(query, keep_blank_values=True)))
    assert posted.status_code == 400
    assert ServiceCall.objects.get(pk=call.pk).status == "Scheduled"
