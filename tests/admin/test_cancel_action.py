"""The admin's Cancel action and the retry fields of a call's page (docs/retries.md)."""

from __future__ import annotations

from django.contrib.auth.models import Permission

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import HOUR, make_call, make_succeeded_call
from timer.models import TimerSchedule

CHANGELIST = "/admin/orchestration/servicecall/"


def _cancel(client, *calls):
    return client.post(
        CHANGELIST,
        {"action": "cancel", "_selected_action": [str(call.pk) for call in calls]},
        follow=True,
    )


def test_cancel_calls_off_scheduled_calls_and_names_those_it_could_not(admin_client, world):
    waiting = make_call("acme", name="waiting", due_in=HOUR)
    done = make_succeeded_call("acme", name="done")
    response = _cancel(admin_client, waiting, done)
    assert response.status_code == 200
    text = response.content.decode()
    assert "Cancelled 1 call(s)" in text and "no longer Scheduled" in text and "(Succeeded)" in text
    waiting.refresh_from_db()
    done.refresh_from_db()
    assert (waiting.status, done.status) == (ServiceCall.Status.CANCELLED, ServiceCall.Status.SUCCEEDED)
    assert not TimerSchedule.objects.filter(service_call_id=waiting.pk).exists()
    assert OutboxEvent.objects.filter(aggregate_id=waiting.pk, event_type=OutboxEvent.Type.CANCELLED).count() == 1


def test_staff_need_the_change_permission_and_reach_only_their_tenants(client, world):
    theirs = make_call("globex", name="theirs", due_in=HOUR)
    other = make_call("acme", name="not theirs", due_in=HOUR)
    staff = world.staff_globex
    staff.user_permissions.set(Permission.objects.filter(codename="view_servicecall"))
    client.force_login(staff)
    page = client.get(CHANGELIST)
    assert 'value="cancel"' not in page.content.decode()  # no change permission: no action
    _cancel(client, theirs)
    theirs.refresh_from_db()
    assert theirs.status == ServiceCall.Status.SCHEDULED

    staff.user_permissions.add(Permission.objects.get(codename="change_servicecall"))
    _cancel(client, theirs, other)
    theirs.refresh_from_db()
    other.refresh_from_db()
    assert theirs.status == ServiceCall.Status.CANCELLED
    assert other.status == ServiceCall.Status.SCHEDULED  # another tenant's: outside the queryset


def test_the_change_page_shows_the_attempt_and_the_retry_policy(admin_client, world):
    policy = {"maxAttempts": 4, "minBackoffMs": 500, "maxBackoffMs": 5000, "retryOn": ["Timeout"]}
    call = make_call("acme", name="with policy", due_in=HOUR, retry_policy=policy)
    html = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert "0 of 4" in html and "maxBackoffMs" in html
    listing = admin_client.get(CHANGELIST).content.decode()
    assert "0 of 4" in listing


def test_a_tag_is_added_to_and_removed_from_the_selected_calls_each_with_its_event(admin_client, world):
    from orchestration.selectors import tags_of

    first, second = make_call("acme", name="a"), make_call("globex", name="b", tags=["keep"])
    selected = [str(first.pk), str(second.pk)]
    asked = admin_client.post(CHANGELIST, {"action": "add_tag", "_selected_action": selected})
    assert asked.status_code == 200 and 'name="tag"' in asked.content.decode()  # the tag asked for first
    refused = admin_client.post(
        CHANGELIST, {"action": "add_tag", "_selected_action": selected, "tag": "two words", "apply": "1"}
    )
    assert "without whitespace" in refused.content.decode() and tags_of(ServiceCall.objects.get(pk=first.pk)) == []
    done = admin_client.post(
        CHANGELIST, {"action": "add_tag", "_selected_action": selected, "tag": "audited", "apply": "1"}, follow=True
    )
    assert "Tag &#x27;audited&#x27; added to 2 of 2 call(s)." in done.content.decode()
    assert sorted(tags_of(ServiceCall.objects.get(pk=second.pk))) == ["audited", "keep"]
    assert OutboxEvent.objects.filter(aggregate_id=first.pk, event_type=OutboxEvent.Type.TAGGED).count() == 1
    admin_client.post(
        CHANGELIST, {"action": "remove_tag", "_selected_action": selected, "tag": "audited", "apply": "1"}
    )
    assert tags_of(ServiceCall.objects.get(pk=second.pk)) == ["keep"]
