"""Every admin page, generated from `admin.site._registry`, as non-superuser staff of globex who
holds every permission in the database (what an operator granting "select all" gives).

docs/security.md §5: such a user sees globex's rows only; the admins of apps that are not the
product's (auth, django-q2, axes) are refused to them, so no permission can turn into running
code, editing accounts or reading other tenants' task arguments. A model registered later
without tenant scoping makes these tests fail: its pages show acme's data, or it is a
third-party admin that answers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.urls import reverse
from django_q.models import Failure, OrmQ, Schedule, Success, Task
from django_q.tasks import async_task

from tenants.models import ApiKey, Membership
from tests.support.factories import (
    HOUR,
    make_call,
    make_failed_call,
    make_flow_control,
    make_member,
    make_succeeded_call,
)
from tests.support.schedules import make_schedule
from tests.support.subscriptions import fan_out, make_subscription, record_try
from workers.models import LoopRun, WorkerSession
from workers.services import RunRecorder, session_start, session_stop

ROOT = Path(__file__).resolve().parents[2]
# The apps whose admins apply the tenant scoping (tenants.admin.TenantScopedAdmin) or hold no
# tenant data; every other registered admin is operator tooling, for superusers only.
PRODUCT_APPS = {
    "tenants",
    "orchestration",
    "timer",
    "execution",
    "outbox",
    "delivery",
    "schedules",
    "workers",
    "eventservice",
}
REGISTERED = sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)
PRODUCT_ADMINS = [(model, model_admin) for model, model_admin in REGISTERED if model._meta.app_label in PRODUCT_APPS]
OTHER_ADMINS = [(model, model_admin) for model, model_admin in REGISTERED if model._meta.app_label not in PRODUCT_APPS]
# Where a worker error can carry a tenant's id: PostgreSQL puts the key values in its message.
WORKER_ERROR = "duplicate key value violates unique constraint; Key (tenant_id, idempotency_key)=(acme, k-1)"


def _label(item) -> str:
    return item[0]._meta.label


def _url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _rows(model) -> list:
    return list(model._default_manager.order_by("pk")[:100])


def _without_echoes(html: str, echoes: tuple[str, ...] = ()) -> str:
    # CSRF tokens and CSP nonces are random letters: they could spell "acme" by chance. The
    # visitor's own input comes back too, and is no leak: a search term in the search box and the
    # filter links, an id from the URL in "… with ID “acme” doesn't exist" (the same words as for
    # an id that exists nowhere).
    html = re.sub(r'(csrfmiddlewaretoken" value="|nonce=")[^"]*', r"\1", html)
    for echo in echoes:
        for template in ('value="{}"', "q={}", "q%3D{}", "“{}”"):
            html = html.replace(template.format(echo), "")
    return html


class AcmeData:
    """Rows of tenant acme in every registered model, and the strings that would betray them."""

    def __init__(self, world):
        # Subscriptions first (each receives the events made after it): acme's, globex's, and an
        # operator-wide one, which receives acme's events too and is superusers' only.
        make_subscription("acme", name="acme-zq hook", url="http://127.0.0.1:9/acme-zq")
        make_subscription("globex", name="globex-zq hook", url="http://127.0.0.1:9/globex-zq")
        make_subscription(None, name="operator-zq hook", url="http://127.0.0.1:9/operator-zq")
        acme_calls = [
            make_succeeded_call("acme", name="acme-zq done", tags=["acme-zq-tag"]),
            make_failed_call("acme", name="acme-zq broken"),
            make_call("acme", name="acme-zq later", tags=["acme-zq-tag"], due_in=HOUR),
        ]
        # globex's own rows, so that its pages have something to show.
        globex_calls = [
            make_succeeded_call("globex", name="globex-zq done", tags=["globex-zq-tag"]),
            make_failed_call("globex", name="globex-zq broken"),
            make_call("globex", name="globex-zq later", tags=["globex-zq-tag"], due_in=HOUR),
        ]
        # Recurring schedules, each with its first call made ahead.
        make_schedule("acme", name="acme-zq nightly", url="http://127.0.0.1:9/acme-zq-schedule", tags=["acme-zq-tag"])
        make_schedule("globex", name="globex-zq nightly", url="http://127.0.0.1:9/globex-zq-schedule")
        make_member("acme-zq-user", "acme", password="pw-acme-zq-123")
        make_flow_control("acme", parallelism=2, hosts={"acme-zq-host.example.com": {"ratePerSecond": 1}})
        make_flow_control("globex", parallelism=3)
        Group.objects.create(name="acme-zq-operators")
        for call in acme_calls + globex_calls:
            for notification in fan_out(call.pk):
                record_try(notification, succeeded=False, status_code=503, error="The endpoint answered 503.")
        acme_key = ApiKey.objects.get(tenant_id="acme")
        # The product's own django-q2 task carries (tenant_id, call id): orchestration enqueues it.
        async_task("workers.tasks.run_due_call", "acme", str(acme_calls[0].pk))
        Task.objects.create(
            id=uuid.uuid4().hex,
            name="acme-zq-task",
            func="workers.tasks.run_due_call",
            args=("acme", str(acme_calls[0].pk)),
            started=acme_calls[0].submitted_at,
            stopped=acme_calls[0].submitted_at,
            success=True,
        )
        Task.objects.create(
            id=uuid.uuid4().hex,
            name="acme-zq-failure",
            func="workers.tasks.run_due_call",
            args=("acme", str(acme_calls[1].pk)),
            result="acme-zq failed",
            started=acme_calls[1].submitted_at,
            stopped=acme_calls[1].submitted_at,
            success=False,
        )
        Schedule.objects.create(name="acme-zq-schedule", func="workers.tasks.run_due_call", args="'acme'")
        session = session_start()
        recorder = RunRecorder(session_id=session.id)
        recorder.record("dispatch", started=time.monotonic(), items=1, error=RuntimeError(WORKER_ERROR))
        recorder.flush(force=True)
        session_stop(session_id=session.id, error=RuntimeError(WORKER_ERROR))
        AccessAttempt.objects.create(
            username="acme-zq-user",
            ip_address="127.0.0.1",
            user_agent="test",
            get_data="",
            post_data="",
            http_accept="",
            path_info="/login/",
            failures_since_start=1,
        )
        # The tenant's id and name, its users, calls and key, and the operator-wide subscription
        # (superusers' only): none may reach globex's staff.
        self.call_ids = [str(call.pk) for call in acme_calls]
        self.markers = ["acme", "Acme", acme_key.prefix, *self.call_ids, "operator-zq"]

    def assert_absent(self, response, where: str, *, echoes: tuple[str, ...] = ()) -> None:
        html = _without_echoes(response.content.decode(), echoes)
        shown = [marker for marker in self.markers if marker in html]
        assert not shown, f"{where} shows acme's {shown}"


@pytest.fixture
def acme_data(world) -> AcmeData:
    return AcmeData(world)


@pytest.fixture
def scoped_staff(client, world):
    """staffglobex holding every permission there is, still not a superuser."""
    world.staff_globex.user_permissions.set(Permission.objects.all())
    client.force_login(world.staff_globex)
    return client


def test_the_generated_lists_cover_the_admins_this_test_is_about():
    labels = {model._meta.label for model, _ in REGISTERED}
    assert {"tenants.Membership", "orchestration.ServiceCall", "auth.User", "auth.Group"} <= labels
    assert {"django_q.Schedule", "django_q.Success", "django_q.Failure"} <= labels


@pytest.mark.parametrize("registered", PRODUCT_ADMINS, ids=_label)
def test_no_product_admin_page_shows_another_tenants_data(registered, scoped_staff, acme_data):
    model, _ = registered
    for url in (_url(model, "changelist"), _url(model, "add")):
        response = scoped_staff.get(url)
        assert response.status_code in (200, 403), f"{url}: {response.status_code}"
        acme_data.assert_absent(response, url)
    # Every row's pages, acme's included: another tenant's row is answered like a missing one.
    for row in _rows(model):
        for view in ("change", "history", "delete"):
            url = _url(model, view, row.pk)
            response = scoped_staff.get(url, follow=True)
            assert response.status_code in (200, 403), f"{url}: {response.status_code}"
            acme_data.assert_absent(response, url, echoes=(str(row.pk),))
    # Search runs on the scoped rows too: acme's id, name and call ids find nothing.
    for term in ("acme", "Acme", *acme_data.call_ids):
        url = f"{_url(model, 'changelist')}?q={term}"
        response = scoped_staff.get(url)
        assert response.status_code in (200, 403), f"{url}: {response.status_code}"
        acme_data.assert_absent(response, url, echoes=(term,))


@pytest.mark.parametrize("registered", PRODUCT_ADMINS, ids=_label)
def test_no_filter_or_raw_id_lookup_offers_another_tenants_rows(registered, scoped_staff, acme_data):
    model, _ = registered
    changelist = _url(model, "changelist")
    response = scoped_staff.get(changelist)
    assert response.status_code == 200
    for list_filter in response.context["cl"].filter_specs:
        for choice in list_filter.choices(response.context["cl"]):
            assert "acme" not in str(choice.get("display")), f"{changelist}: filter {list_filter.title}"
    # A raw-id widget opens the changelist as a popup, with the field it selects by.
    targets = {
        field.target_field.name
        for other, _ in REGISTERED
        for field in other._meta.fields
        if field.is_relation and field.related_model is model
    }
    for to_field in targets:
        url = f"{changelist}?_popup=1&_to_field={to_field}"
        popup = scoped_staff.get(url)
        assert popup.status_code in (200, 403), f"{url}: {popup.status_code}"
        acme_data.assert_absent(popup, url)


def _snapshot() -> dict[str, list[dict]]:
    return {model._meta.label: list(model._default_manager.order_by("pk").values()) for model, _ in PRODUCT_ADMINS}


@pytest.mark.parametrize("registered", PRODUCT_ADMINS, ids=_label)
def test_no_action_reaches_another_tenants_rows(registered, scoped_staff, acme_data):
    model, _ = registered
    changelist = _url(model, "changelist")
    response = scoped_staff.get(changelist)
    assert response.status_code == 200
    visible = set(response.context["cl"].queryset.values_list("pk", flat=True))
    hidden = [str(pk) for pk in model._default_manager.values_list("pk", flat=True) if pk not in visible]
    form = response.context["action_form"]
    offered = [name for name, _ in form.fields["action"].choices if name] if form else []
    actions = sorted({"delete_selected", *offered})
    before = _snapshot()
    for action in actions:
        # "post" confirms delete_selected; the others do not read it.
        scoped_staff.post(changelist, {"action": action, "_selected_action": hidden, "post": "yes"})
    assert _snapshot() == before, f"{changelist}: {actions} changed rows it does not show"


def _relations():
    for model, _ in REGISTERED:
        for field in model._meta.get_fields():
            if (
                (field.many_to_one or field.many_to_many)
                and not field.auto_created
                and field.related_model in admin.site._registry
            ):
                yield model, field


@pytest.mark.parametrize("relation", list(_relations()), ids=lambda r: f"{r[0]._meta.label}.{r[1].name}")
def test_no_autocomplete_answers_with_another_tenants_rows(relation, scoped_staff, acme_data):
    model, field = relation
    for term in ("", "acme", "zq"):
        url = (
            f"/admin/autocomplete/?app_label={model._meta.app_label}&model_name={model._meta.model_name}"
            f"&field_name={field.name}&term={term}"
        )
        response = scoped_staff.get(url)
        assert response.status_code in (200, 403), f"{url}: {response.status_code}"
        acme_data.assert_absent(response, url)


@pytest.mark.parametrize("registered", OTHER_ADMINS, ids=_label)
def test_operator_tooling_admins_are_refused_to_scoped_staff(registered, scoped_staff, acme_data):
    model, _ = registered
    urls = [_url(model, "changelist"), _url(model, "add")]
    for row in _rows(model):
        urls += [_url(model, "change", row.pk), _url(model, "history", row.pk), _url(model, "delete", row.pk)]
    for url in urls:
        response = scoped_staff.get(url)
        assert response.status_code in (403, 404), f"{url}: {response.status_code}"
        acme_data.assert_absent(response, url)


def test_the_admin_index_lists_only_the_products_apps_to_scoped_staff(scoped_staff, acme_data):
    response = scoped_staff.get("/admin/")
    assert response.status_code == 200
    assert {app["app_label"] for app in response.context["app_list"]} <= PRODUCT_APPS
    html = response.content.decode()
    assert "/admin/django_q/" not in html and "/admin/auth/" not in html and "/admin/axes/" not in html
    acme_data.assert_absent(response, "/admin/")


def test_scoped_staff_cannot_add_a_schedule_that_runs_a_command(scoped_staff, world):
    response = scoped_staff.post(
        _url(Schedule, "add"),
        {
            "name": "pwn",
            "func": "subprocess.check_call",
            "args": "['touch', '/tmp/pwned']",
            "schedule_type": Schedule.ONCE,
            "repeats": "-1",
        },
    )
    assert response.status_code == 403
    assert not Schedule.objects.filter(func="subprocess.check_call").exists()


def test_scoped_staff_cannot_change_a_schedule_or_resubmit_a_task(scoped_staff, acme_data):
    schedule = Schedule.objects.get(name="acme-zq-schedule")
    response = scoped_staff.post(
        _url(Schedule, "change", schedule.pk),
        {"name": "acme-zq-schedule", "func": "subprocess.check_call", "schedule_type": Schedule.ONCE},
    )
    assert response.status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).func == "workers.tasks.run_due_call"
    queued = OrmQ.objects.count()
    failure = Task.objects.get(name="acme-zq-failure")
    response = scoped_staff.post(
        reverse("admin:django_q_failure_changelist"), {"action": "resubmit_task", "_selected_action": [failure.pk]}
    )
    assert response.status_code == 403
    assert OrmQ.objects.count() == queued


def test_scoped_staff_cannot_make_themselves_superuser_or_grant_permissions(scoped_staff, world):
    staff = world.staff_globex
    response = scoped_staff.post(
        _url(get_user_model(), "change", staff.pk),
        {
            "username": staff.username,
            "is_active": "on",
            "is_staff": "on",
            "is_superuser": "on",
            "date_joined_0": "2024-01-01",
            "date_joined_1": "00:00:00",
        },
    )
    assert response.status_code == 403
    assert scoped_staff.get(_url(get_user_model(), "password_change", staff.pk)).status_code == 403
    assert scoped_staff.post(_url(Group, "add"), {"name": "escalate"}).status_code == 403
    staff.refresh_from_db()
    assert not staff.is_superuser
    assert not Group.objects.filter(name="escalate").exists()


def test_membership_user_choices_are_the_people_of_the_staffs_own_tenants(scoped_staff, acme_data):
    form = scoped_staff.get(_url(Membership, "add")).context["adminform"].form
    assert sorted(form.fields["user"].queryset.values_list("username", flat=True)) == ["outsider", "staffglobex"]
    assert sorted(form.fields["tenant"].queryset.values_list("id", flat=True)) == ["globex"]
    acme_user = get_user_model().objects.get(username="acme-zq-user")
    response = scoped_staff.post(_url(Membership, "add"), {"user": acme_user.pk, "tenant": "globex", "role": "owner"})
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Membership.objects.filter(user=acme_user, tenant_id="globex").exists()


def test_a_superuser_reads_django_q_but_nobody_adds_changes_or_resubmits(admin_client, acme_data):
    schedule = Schedule.objects.get(name="acme-zq-schedule")
    assert "django_q" in {app["app_label"] for app in admin_client.get("/admin/").context["app_list"]}
    for model in (Schedule, Success, Failure, OrmQ):
        response = admin_client.get(_url(model, "changelist"))
        assert response.status_code == 200
        assert "resubmit_task" not in response.content.decode()
    assert "acme-zq-schedule" in admin_client.get(_url(Schedule, "changelist")).content.decode()
    assert admin_client.get(_url(Schedule, "add")).status_code == 403
    page = admin_client.get(_url(Schedule, "change", schedule.pk))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    response = admin_client.post(
        _url(Schedule, "change", schedule.pk),
        {"name": "acme-zq-schedule", "func": "subprocess.check_call", "schedule_type": Schedule.ONCE},
    )
    assert response.status_code == 403
    assert Schedule.objects.get(pk=schedule.pk).func == "workers.tasks.run_due_call"
    # Deleting stops something from running and runs nothing: a foreign schedule can be removed.
    assert admin_client.post(_url(Schedule, "delete", schedule.pk), {"post": "yes"}).status_code == 302
    assert not Schedule.objects.filter(pk=schedule.pk).exists()


def test_worker_error_texts_are_shown_to_superusers_only(admin_client, scoped_staff, acme_data):
    run = LoopRun.objects.get(errors__gt=0)
    session = WorkerSession.objects.get(pk=run.session_id)
    for url in (
        _url(LoopRun, "changelist"),
        _url(LoopRun, "change", run.pk),
        _url(WorkerSession, "change", session.pk),
    ):
        assert "(acme, k-1)" in admin_client.get(url).content.decode(), url
        staff_page = scoped_staff.get(url)
        assert staff_page.status_code == 200 and "(acme, k-1)" not in staff_page.content.decode(), url


@pytest.mark.parametrize("first", [["django_q", "axes", "django.contrib.auth"], []], ids=["theirs-first", "as-set"])
def test_the_lockdown_holds_whatever_the_order_of_installed_apps(first, tmp_path):
    # A real django.setup() in a child process, with django-q2, axes and auth listed before our
    # apps or after them: either way their admins answer no to staff holding every permission.
    (tmp_path / "reordered_settings.py").write_text(
        "from eventservice.settings_test import *  # noqa\n"
        f"FIRST = {first!r}\n"
        "INSTALLED_APPS = FIRST + [app for app in INSTALLED_APPS if app not in FIRST]\n"
    )
    script = """
import django
django.setup()
from django.contrib import admin
from django.test import RequestFactory

class StaffWithEveryPermission:
    is_active = is_staff = is_authenticated = True
    is_superuser = False
    def has_perm(self, perm, obj=None):
        return True
    def has_module_perms(self, app_label):
        return True

request = RequestFactory().get("/admin/")
request.user = StaffWithEveryPermission()
request._admin_tenant_ids = {"globex"}  # what tenants.admin.visible_tenant_ids remembers: no database here
for model, model_admin in admin.site._registry.items():
    answers = [model_admin.has_module_permission(request), model_admin.has_view_permission(request),
               model_admin.has_add_permission(request), model_admin.has_change_permission(request),
               model_admin.has_delete_permission(request)]
    print(model._meta.label, any(answers))
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "reordered_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    answers = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
    assert set(answers) == {model._meta.label for model, _ in REGISTERED}
    assert {label for label, anything in answers.items() if anything == "True"} == {
        model._meta.label for model, _ in PRODUCT_ADMINS
    }
