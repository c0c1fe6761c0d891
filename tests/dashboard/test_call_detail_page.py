"""The details page: request (redacted), response or error, timeline, attempts, events."""

from datetime import timedelta

from tests.support.factories import HOUR, make_call, make_failed_call, make_member, make_succeeded_call


def test_it_shows_the_request_with_secret_header_values_redacted(owner_client, world):
    call = make_call(
        "acme",
        name="with secrets",
        method="POST",
        body={"amount": 3},
        headers={"Authorization": "Bearer never-show-me", "X-Api-Key": "k-123-secret", "Accept": "text/csv"},
        due_in=HOUR,
    )
    response = owner_client.get(f"/calls/{call.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "never-show-me" not in html and "k-123-secret" not in html
    assert "$sealed" not in html
    assert "text/csv" in html
    assert html.count("***") == 2
    assert "&quot;amount&quot;: 3" in html  # pretty-printed JSON body


def test_a_succeeded_call_shows_its_response_body_pretty_and_headers_as_a_table(owner_client, world):
    call = make_succeeded_call("acme", name="fetch", response_body='{"hello":"world","n":[1,2]}')
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert 'Response <span class="http-status ok">200</span>' in html
    assert "&quot;hello&quot;: &quot;world&quot;,\n  &quot;n&quot;: [" in html
    assert '<th scope="row" class="mono">X-Served-By</th><td class="mono break">target-7</td>' in html


def test_a_failed_call_shows_the_error_kind_and_message(owner_client, world):
    call = make_failed_call("acme", name="broken")
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert '<span class="error-kind">HttpError</span>' in html
    assert "The target answered 503 Service Unavailable." in html


def test_the_timeline_shows_each_step_with_lateness_and_latency(owner_client, world):
    call = make_succeeded_call("acme", name="timed")
    response = owner_client.get(f"/calls/{call.pk}/")
    steps = {step.label: step for step in response.context["timeline"]}
    assert list(steps) == ["Submitted", "Scheduled", "Due", "Started", "Finished"]
    [attempt] = response.context["attempts"]  # when its request set out
    assert steps["Started"].at == attempt.started_at
    assert steps["Started"].measure == attempt.started_at - call.due_at
    assert steps["Finished"].note == "latency" and steps["Finished"].measure == 42
    html = response.content.decode()
    assert "lateness" in html and "42 ms" in html


def test_the_lateness_is_the_departure_of_a_call_started_ahead(owner_client, world):
    """Started ahead, the call's startedAt is its due time; the attempt log says when the
    request left, and the timeline reads that (also while the attempt is still out: the plan)."""
    from execution.models import HttpExecution
    from orchestration.models import ServiceCall

    call = make_succeeded_call("acme", name="ahead")
    ServiceCall.objects.filter(pk=call.pk).update(started_at=call.due_at)
    departure = call.due_at + timedelta(milliseconds=30)
    HttpExecution.objects.filter(service_call_id=call.pk).update(started_at=departure)
    steps = {step.label: step for step in owner_client.get(f"/calls/{call.pk}/").context["timeline"]}
    assert steps["Started"].at == departure
    assert steps["Started"].measure == timedelta(milliseconds=30)

    HttpExecution.objects.filter(service_call_id=call.pk).update(
        state=HttpExecution.State.SENDING, finished_at=None, started_at=call.due_at - timedelta(milliseconds=60)
    )
    steps = {step.label: step for step in owner_client.get(f"/calls/{call.pk}/").context["timeline"]}
    assert steps["Started"].at == call.due_at and steps["Started"].measure == timedelta(0)


def test_a_scheduled_call_has_no_start_yet(owner_client, world):
    call = make_call("acme", name="later", due_in=600)
    response = owner_client.get(f"/calls/{call.pk}/")
    steps = {step.label: step for step in response.context["timeline"]}
    assert steps["Started"].at is None and steps["Finished"].at is None
    assert steps["Due"].note == "after submission"
    assert "Not started yet" in response.content.decode()


def test_it_lists_attempts_and_events_with_their_publication_state(owner_client, world):
    from outbox.dispatcher import dispatch_batch

    call = make_succeeded_call("acme", name="events")
    dispatch_batch(sinks=[])  # publish what is there (no sink: marks rows published)
    make_call("acme", name="other", due_in=HOUR)  # unpublished events of another call do not show
    response = owner_client.get(f"/calls/{call.pk}/")
    events = response.context["events"]
    assert [e.event_type for e in events] == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]
    assert all(e.published_at for e in events)
    html = response.content.decode()
    assert html.count('<span class="pub pub-yes">published</span>') == 4
    assert [a.worker_id for a in response.context["attempts"]] == ["test-worker-1"]
    assert "test-worker-1" in html


def test_unpublished_events_are_marked_pending(owner_client, world):
    call = make_call("acme", name="fresh", due_in=HOUR)
    html = owner_client.get(f"/calls/{call.pk}/").content.decode()
    assert html.count('<span class="pub pub-no">pending</span>') == 2


def test_an_outsider_gets_404_for_another_tenants_call(outsider_client, world):
    call = make_call("acme", name="private", due_in=HOUR)
    assert outsider_client.get(f"/calls/{call.pk}/").status_code == 404


def test_a_call_of_another_of_the_users_tenants_opens_and_offers_the_switch(owner_client, world):
    from eventservice.dashboard.tenancy import SESSION_KEY

    make_member("owner", "globex")
    call = make_call("globex", name="shared link", due_in=HOUR)
    owner_client.get("/calls/")
    assert owner_client.session[SESSION_KEY] == "acme"
    response = owner_client.get(f"/calls/{call.pk}/")
    html = response.content.decode()
    assert response.status_code == 200 and "shared link" in html
    assert "This call belongs to <strong>Globex</strong>" in html
    assert f'<input type="hidden" name="next" value="/calls/{call.pk}/">' in html
    # Opening a link never changes the current tenant; the offered POST does.
    assert owner_client.session[SESSION_KEY] == "acme"


def test_a_rerun_links_back_to_its_original(owner_client, world):
    from orchestration.services import service_call_rerun

    original = make_call("acme", name="first run", due_in=HOUR)
    rerun = service_call_rerun(tenant_id="acme", service_call_id=original.pk, correlation_id="c")
    html = owner_client.get(f"/calls/{rerun.pk}/").content.decode()
    assert f'href="/calls/{original.pk}/"' in html


def test_the_actions_keep_their_places_and_a_call_that_never_ran_is_not_run_again(owner_client, world):
    """Cancel comes first (it goes once the call starts, the others stay where they are); a
    Scheduled call that never ran shows Run again disabled: running it "again" makes a second."""
    import re

    def actions(call) -> list[str]:
        html = owner_client.get(f"/calls/{call.pk}/").content.decode()
        head = html.split('class="head-actions"', 1)[1].split('<div class="grid-2">', 1)[0]
        return re.findall(r"Cancel…|← Calls|Copy into a new request|Run again|Run at a chosen time…", head)

    waiting, failed = make_call(due_in=HOUR), make_failed_call()
    assert actions(waiting) == ["Cancel…", "← Calls", "Copy into a new request", "Run again", "Run at a chosen time…"]
    assert actions(failed) == ["← Calls", "Copy into a new request", "Run again", "Run at a chosen time…"]
    html = owner_client.get(f"/calls/{waiting.pk}/").content.decode()
    assert 'aria-disabled="true" title="It has not run yet' in html
    assert f'action="/calls/{waiting.pk}/rerun" class="inline"' not in html
    # The correlation id and the attempts are the call's details, the tags a part of them.
    about = html.split('id="about-h"', 1)[1].split("</section>", 1)[0]
    assert about.index("Correlation id") < about.index('id="tags-h"')
