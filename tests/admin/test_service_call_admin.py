"""Admin of service calls: filters (a real tag filter), search, inlines, read-only, run again."""

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import HOUR, make_call, make_failed_call, make_succeeded_call

CHANGELIST = "/admin/orchestration/servicecall/"


def _listed(response) -> list[str]:
    return sorted(call.name for call in response.context["cl"].result_list)


def test_the_tag_filter_narrows_the_list_in_sql(admin_client, world):
    make_call("acme", name="tagged billing", tags=["billing"], due_in=HOUR)
    make_call("globex", name="tagged billing too", tags=["billing", "x"], due_in=HOUR)
    make_call("acme", name="untagged", due_in=HOUR)
    response = admin_client.get(CHANGELIST + "?tag=billing")
    assert response.status_code == 200
    assert _listed(response) == ["tagged billing", "tagged billing too"]
    sql = str(response.context["cl"].queryset.query)
    assert "service_call_tags" in sql and "EXISTS" in sql
    # The filter offers the tags that exist, with their counts.
    assert "billing (2)" in response.content.decode()


def test_it_filters_by_status_tenant_and_date(admin_client, world):
    make_call("acme", name="waiting", due_in=HOUR)
    make_failed_call("acme", name="broken")
    make_call("globex", name="other tenant", due_in=HOUR)
    assert _listed(admin_client.get(CHANGELIST + "?status__exact=Failed")) == ["broken"]
    assert _listed(admin_client.get(CHANGELIST + "?tenant__id__exact=globex")) == ["other tenant"]
    today = ServiceCall.objects.get(name="waiting").submitted_at.date()
    window = f"?submitted_at__gte={today}+00:00:00%2B00:00&submitted_at__lt={today.replace(year=today.year + 1)}+00:00:00%2B00:00"
    assert len(admin_client.get(CHANGELIST + window).context["cl"].result_list) == 3
    assert (
        len(admin_client.get(CHANGELIST + f"?submitted_at__lt={today}+00:00:00%2B00:00").context["cl"].result_list) == 0
    )


def test_search_finds_calls_by_name_id_prefix_and_url(admin_client, world):
    by_name = make_call("acme", name="Quarterly export", due_in=HOUR)
    by_url = make_call("acme", name="other", url="https://reports.example.com/q3", due_in=HOUR)
    make_call("acme", name="unrelated", due_in=HOUR)
    assert _listed(admin_client.get(CHANGELIST + "?q=quarterly")) == ["Quarterly export"]
    assert _listed(admin_client.get(CHANGELIST + "?q=reports.example")) == ["other"]
    assert _listed(admin_client.get(CHANGELIST + f"?q={by_url.pk}")) == ["other"]
    prefix = str(by_name.pk)[:13]  # ids of one millisecond share their first characters
    assert "Quarterly export" in _listed(admin_client.get(CHANGELIST + f"?q={prefix}"))
    # The short id the pages show (its last 8 digits) finds exactly that call.
    assert _listed(admin_client.get(CHANGELIST + f"?q={str(by_name.pk)[-8:]}")) == ["Quarterly export"]


def test_the_change_page_shows_tags_timer_attempts_and_events_read_only(admin_client, world):
    from execution.models import HttpExecution

    call = make_succeeded_call("acme", name="inspect me", tags=["alpha"])
    response = admin_client.get(f"{CHANGELIST}{call.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    inline_models = {formset.opts.model for formset in response.context["inline_admin_formsets"]}
    assert {"ServiceCallTag", "TimerSchedule", "HttpExecution"} == {model.__name__ for model in inline_models}
    assert "alpha" in html
    assert "ServiceCallSucceeded" in html and "ServiceCallRunning" in html
    assert 'name="_save"' not in html  # nothing to save: read-only
    attempt = HttpExecution.objects.get(service_call_id=call.pk)
    assert attempt.worker_id in html
    assert f"/admin/execution/httpexecution/{attempt.pk}/change/" in html  # its headers are there
    assert OutboxEvent.objects.filter(aggregate_id=call.pk).count() == 4


def test_secret_header_values_never_appear(admin_client, world):
    call = make_call(
        "acme", name="secret", headers={"Authorization": "Bearer admin-must-not-see", "X-Token": "tok-42"}, due_in=HOUR
    )
    sealed = call.request_spec["headers"]["Authorization"]["$sealed"]
    html = admin_client.get(f"{CHANGELIST}{call.pk}/change/").content.decode()
    assert "admin-must-not-see" not in html and "tok-42" not in html
    assert sealed not in html
    assert "***" in html


def test_calls_cannot_be_added_or_deleted_in_the_admin(admin_client, world):
    call = make_call("acme", name="stays", due_in=HOUR)
    assert admin_client.get(CHANGELIST + "add/").status_code == 403
    assert admin_client.post(f"{CHANGELIST}{call.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ServiceCall.objects.filter(pk=call.pk).exists()


def test_run_again_submits_new_calls_through_orchestration(admin_client, world):
    original = make_failed_call("acme", name="retry me")
    response = admin_client.post(CHANGELIST, {"action": "run_again", "_selected_action": [str(original.pk)]})
    assert response.status_code == 302
    rerun = ServiceCall.objects.get(rerun_of=original.pk)
    assert rerun.status == ServiceCall.Status.SCHEDULED
    assert rerun.request_spec["url"] == original.request_spec["url"]
    assert OutboxEvent.objects.filter(aggregate_id=rerun.pk, event_type="ServiceCallSubmitted").exists()


def test_non_superuser_staff_see_only_their_tenants_calls(staff_client, world):
    acme_call = make_call("acme", name="acme call", tags=["shared-tag"], due_in=HOUR)
    make_call("globex", name="globex call", tags=["shared-tag"], due_in=HOUR)
    response = staff_client.get(CHANGELIST)
    assert response.status_code == 200
    assert _listed(response) == ["globex call"]
    assert _listed(staff_client.get(CHANGELIST + "?tag=shared-tag")) == ["globex call"]
    assert "shared-tag (1)" in response.content.decode()
    # Another tenant's call is as good as absent.
    assert staff_client.get(f"{CHANGELIST}{acme_call.pk}/change/").status_code == 302
    assert ">acme<" not in response.content.decode()


def test_non_superuser_staff_cannot_run_again_another_tenants_call(staff_client, world):
    acme_call = make_failed_call("acme", name="acme call")
    staff_client.post(CHANGELIST, {"action": "run_again", "_selected_action": [str(acme_call.pk)]})
    assert not ServiceCall.objects.filter(rerun_of=acme_call.pk).exists()
