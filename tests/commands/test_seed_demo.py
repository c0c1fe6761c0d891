"""manage.py seed_demo"""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from eventservice.management.commands.seed_demo import DEMO_PASSWORD
from orchestration.models import ServiceCall, ServiceCallTag
from tenants.models import ApiKey, Membership, Tenant
from tenants.selectors import api_key_lookup
from tests.commands.cli import call, run_manage
from tests.support.factories import make_call, make_tenant, make_user
from tests.support.waiting import wait_for

User = get_user_model()
ROOT = Path(__file__).resolve().parents[2]


def login_password(out, username):
    match = re.search(rf"^  {re.escape(username)} / (\S+)   ", out, re.MULTILINE)
    return match.group(1) if match else None


def printed_key(out):
    lines = out.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("API key for tenant demo (shown once"):
            return lines[index + 1].strip()
    return None


def tags(call_row):
    return set(ServiceCallTag.objects.filter(service_call=call_row).values_list("tag", flat=True))


@pytest.mark.django_db
def test_it_creates_the_demo_tenants_logins_key_and_calls(settings):
    settings.AGENT_BASE_URL = "http://127.0.0.1:8123/"
    result = call("seed_demo")
    assert result.code == 0
    out = result.out

    assert set(Tenant.objects.values_list("id", flat=True)) == {"demo", "demo-ops"}
    demo = User.objects.get(username="demo")
    assert not demo.is_superuser and not demo.is_staff
    assert login_password(out, "demo") == DEMO_PASSWORD
    assert demo.check_password(DEMO_PASSWORD)
    assert dict(Membership.objects.filter(user=demo).values_list("tenant_id", "role")) == {
        "demo": Membership.Role.OWNER,
        "demo-ops": Membership.Role.MEMBER,
    }
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password(login_password(out, "admin"))
    assert api_key_lookup(raw_key=printed_key(out)).tenant_id == "demo"

    assert "  Dashboard:    http://127.0.0.1:8123/" in out
    assert "  Admin:        http://127.0.0.1:8123/admin/" in out
    assert "  Mock target:  http://127.0.0.1:8123/mock/" in out
    assert "Calls: submitted 12 to demo." in out and "Calls: submitted 2 to demo-ops." in out

    calls = list(ServiceCall.objects.filter(tenant_id="demo"))
    assert len(calls) == 12
    assert ServiceCall.objects.filter(tenant_id="demo-ops").count() == 2
    assert all(c.request_spec["url"].startswith("http://127.0.0.1:8123/mock/") for c in calls)
    assert all(c.status == ServiceCall.Status.SCHEDULED for c in calls)
    urls = {c.request_spec["url"].removeprefix("http://127.0.0.1:8123/mock") for c in calls}
    assert {"/echo", "/json", "/status/404", "/status/500", "/delay/1500", "/delay/5000"} <= urls
    timing_out = next(c for c in calls if c.request_spec["url"].endswith("/delay/5000"))
    assert timing_out.request_spec["timeoutMs"] == 1000
    scheduled = [c for c in calls if c.due_at - c.submitted_at >= timedelta(minutes=1)]
    assert len(scheduled) == 3
    assert all(c.due_at - c.submitted_at <= timedelta(minutes=10) for c in scheduled)
    all_tags = [tags(c) for c in calls]
    assert sum("favorite" in t for t in all_tags) == 1
    assert sum("billing" in t for t in all_tags) >= 3 and sum("nightly" in t for t in all_tags) >= 3
    # A secret demo header is sealed at rest like any other.
    invoice = next(c for c in calls if c.name == "Create invoice (201)")
    assert "demo-secret-token" not in str(invoice.request_spec)


@pytest.mark.django_db
def test_running_it_again_adds_nothing_and_changes_no_password():
    first = call("seed_demo").out
    second = call("seed_demo")
    assert second.code == 0
    assert ServiceCall.objects.filter(tenant_id="demo").count() == 12
    assert ServiceCall.objects.filter(tenant_id="demo-ops").count() == 2
    assert ApiKey.objects.count() == 1
    assert User.objects.count() == 2
    assert Membership.objects.count() == 2
    assert User.objects.get(username="demo").check_password(DEMO_PASSWORD)
    assert User.objects.get(username="admin").check_password(login_password(first, "admin"))
    # The known demo login is printed at every run (scripts/start runs this at each start).
    assert login_password(second.out, "demo") == DEMO_PASSWORD
    assert "admin / (exists; unchanged; reset: manage.py changepassword admin)" in second.out
    assert "API key for tenant demo: created earlier" in second.out
    assert "Calls: demo already has calls; none added." in second.out
    assert "sa_" not in second.out


@pytest.mark.django_db
def test_password_sets_the_demo_password_now_and_on_a_later_run():
    result = call("seed_demo", "--username", "dana", "--password", "first-pass-123")
    assert login_password(result.out, "dana") == "first-pass-123"
    assert User.objects.get(username="dana").check_password("first-pass-123")
    assert "documented default" not in result.out
    call("seed_demo", "--username", "dana", "--password", "second-pass-456")
    assert User.objects.get(username="dana").check_password("second-pass-456")
    # Later runs without --password neither print nor change a password set that way.
    later = call("seed_demo", "--username", "dana")
    assert "dana / (changed earlier; pass --password to set a new one)" in later.out
    assert "second-pass-456" not in later.out
    assert User.objects.get(username="dana").check_password("second-pass-456")


@pytest.mark.django_db
def test_it_leaves_an_existing_admin_alone():
    make_user("admin", password="my-own-admin-pw", superuser=True)
    result = call("seed_demo")
    assert "admin / (exists; unchanged; reset: manage.py changepassword admin)" in result.out
    assert User.objects.get(username="admin").check_password("my-own-admin-pw")


@pytest.mark.django_db
def test_it_adds_calls_only_to_a_demo_tenant_without_calls():
    make_tenant("demo", name="Mine")
    make_call("demo", name="my call")
    result = call("seed_demo")
    assert "Calls: demo already has calls; none added." in result.out
    assert list(ServiceCall.objects.filter(tenant_id="demo").values_list("name", flat=True)) == ["my call"]
    assert ServiceCall.objects.filter(tenant_id="demo-ops").count() == 2
    assert Tenant.objects.get(id="demo").name == "Mine"


@pytest.mark.django_db
def test_it_refuses_a_too_short_password_and_stores_nothing():
    result = call("seed_demo", "--password", "short")
    assert result.code == 1
    assert "--password: This password is too short." in result.err
    assert not Tenant.objects.exists() and not User.objects.exists() and not ServiceCall.objects.exists()


@pytest.mark.django_db
def test_it_refuses_admin_as_the_demo_username():
    result = call("seed_demo", "--username", "admin")
    assert result.code == 1
    assert "'admin' is the superuser" in result.err
    assert not User.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_it_exits_1_on_bad_input():
    result = run_manage("seed_demo", "--password", "short")
    assert result.code == 1
    assert result.out == ""
    assert "CommandError: --password: This password is too short." in result.err
    assert not User.objects.exists()


def test_its_help_describes_what_it_creates():
    result = run_manage("seed_demo", "--help")
    assert result.code == 0
    assert "safe to run again" in result.out
    assert "--password PASSWORD" in result.out


def _minutes_ahead_of_the_scheduled_calls() -> list[int]:
    ahead = [c.due_at - c.submitted_at for c in ServiceCall.objects.all()]
    return sorted({round(delta / timedelta(minutes=1)) for delta in ahead if delta >= timedelta(minutes=1)})


@pytest.mark.django_db
def test_its_output_help_and_docs_say_when_the_scheduled_calls_are_due_as_they_are():
    result = call("seed_demo")
    minutes = _minutes_ahead_of_the_scheduled_calls()
    due = f"{minutes[0]}-{minutes[-1]} minutes"
    assert f"some are due in {due}." in result.out
    assert f"some due {due} ahead" in " ".join(run_manage("seed_demo", "--help").out.split())
    docs = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    said = re.findall(r"(?:scheduled|due in) (\d+-\d+ minutes)", docs)
    assert said and set(said) == {due}, said


def _terminal(row):
    fresh = ServiceCall.objects.get(pk=row.pk)
    return fresh if fresh.is_terminal else None


def test_the_demo_calls_reach_their_varied_outcomes_against_the_mock_target(settings, live_server, engine):
    settings.AGENT_BASE_URL = live_server.url
    assert call("seed_demo").code == 0
    due_now = [c for c in ServiceCall.objects.all() if c.due_at == c.submitted_at]
    assert len(due_now) == 10
    done = {c.name: wait_for(lambda c=c: _terminal(c), timeout=20) for c in due_now}

    def result(name):
        row = done[name]
        if row.status == ServiceCall.Status.SUCCEEDED:
            return ("Succeeded", row.outcome_meta["responseMeta"]["status"])
        return ("Failed", row.error_kind, row.outcome_meta["errorMeta"].get("status"))

    assert result("Echo a new order") == ("Succeeded", 200)
    assert result("Fetch the order document") == ("Succeeded", 200)
    assert result("Create invoice (201)") == ("Succeeded", 201)
    assert result("Look up a missing customer (404)") == ("Failed", "HttpError", 404)
    assert result("Nightly export hits a server error (500)") == ("Failed", "HttpError", 500)
    assert result("Slow report (1.5 s)") == ("Succeeded", 200)
    assert result("Report that times out (5 s delay, 1 s timeout)") == ("Failed", "Timeout", None)
    assert result("Update settings") == ("Succeeded", 200)
    assert result("Delete a draft (200 ms)") == ("Succeeded", 200)
    assert result("Health probe") == ("Succeeded", 200)
    # The echo saw the sealed header in plaintext on the wire and answered it redacted.
    echoed = done["Create invoice (201)"].outcome_meta["responseMeta"]["bodySnippet"]
    assert '"Authorization": "***"' in echoed and "demo-secret-token" not in echoed
    assert ServiceCall.objects.filter(status=ServiceCall.Status.SCHEDULED).count() == 4
