"""manage.py cancel_call (docs/commands.md): the API's cancel from the shell."""

from __future__ import annotations

import uuid

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.commands.cli import call
from tests.support.factories import HOUR, make_call, make_succeeded_call


def test_it_cancels_scheduled_calls_and_says_so(world):
    first, second = make_call(due_in=HOUR), make_call(due_in=HOUR)
    result = call("cancel_call", "--tenant", "acme", str(first.pk), str(second.pk))
    assert result.code == 0, result.err
    assert result.out.splitlines() == [f"{first.pk} Cancelled", f"{second.pk} Cancelled"]
    assert set(ServiceCall.objects.values_list("status", flat=True)) == {"Cancelled"}
    # Again: the same answer, no second event.
    assert call("cancel_call", "--tenant", "acme", str(first.pk)).code == 0
    assert OutboxEvent.objects.filter(aggregate_id=first.pk, event_type="ServiceCallCancelled").count() == 1


def test_a_finished_call_is_refused_with_its_status_and_others_still_go(world):
    done, waiting = make_succeeded_call(), make_call(due_in=HOUR)
    result = call("cancel_call", "--tenant", "acme", str(done.pk), str(waiting.pk))
    assert result.code == 1
    assert f"{done.pk} is Succeeded; only a Scheduled call can be cancelled" in result.err
    assert result.out.splitlines() == [f"{waiting.pk} Cancelled"]
    assert ServiceCall.objects.get(pk=done.pk).status == "Succeeded"


def test_bad_ids_unknown_tenants_and_other_tenants_calls_change_nothing(world):
    theirs = make_call("globex", due_in=HOUR)
    assert "is not a service call id" in call("cancel_call", "--tenant", "acme", "nope").err
    assert "does not exist" in call("cancel_call", "--tenant", "nobody", str(theirs.pk)).err
    result = call("cancel_call", "--tenant", "acme", str(theirs.pk))
    assert result.code == 1 and "not found" in result.err
    assert call("cancel_call", "--tenant", "acme", str(uuid.uuid4())).code == 1
    assert ServiceCall.objects.get(pk=theirs.pk).status == "Scheduled"
