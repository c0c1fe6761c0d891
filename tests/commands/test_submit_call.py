"""manage.py submit_call"""

import json
import uuid
from datetime import UTC, datetime, time, timedelta

import pytest
from django.core.management.base import CommandError

from core.secrets import unseal_headers
from execution.targets import url_error
from orchestration.management.commands.submit_call import parse_in
from orchestration.models import ServiceCall, ServiceCallTag
from outbox.models import OutboxEvent
from tests.commands.cli import call, run_manage
from timer.models import TimerSchedule

BASE = ("--tenant", "acme", "--name", "Ping", "--method", "GET", "--url", "https://example.test/ping")


def nothing_stored():
    return not (ServiceCall.objects.exists() or OutboxEvent.objects.exists() or TimerSchedule.objects.exists())


def test_it_stores_the_call_and_prints_only_its_id(world):
    result = call(
        "submit_call",
        "--tenant",
        "acme",
        "--name",
        "Create order",
        "--method",
        "post",
        "--url",
        "https://example.test/orders",
        "--header",
        "Accept: application/json",
        "--header",
        "Authorization:Bearer s3cret",
        "--body",
        '{"id": 7}',
        "--json-body",
        "--tag",
        "billing",
        "--tag",
        "nightly",
        "--timeout-ms",
        "5000",
        "--idempotency-key",
        "order-7",
    )
    assert result.code == 0
    assert result.err == ""
    call_id = uuid.UUID(result.out.strip())
    stored = ServiceCall.objects.get(pk=call_id)
    assert stored.tenant_id == "acme"
    assert stored.name == "Create order"
    assert stored.status == ServiceCall.Status.SCHEDULED
    assert stored.idempotency_key == "order-7"
    spec = stored.request_spec
    assert (spec["method"], spec["url"], spec["body"], spec["timeoutMs"]) == (
        "POST",
        "https://example.test/orders",
        {"id": 7},
        5000,
    )
    assert spec["headers"]["Accept"] == "application/json"
    assert "s3cret" not in json.dumps(spec)  # sealed at rest
    assert unseal_headers(spec["headers"])["Authorization"] == "Bearer s3cret"
    assert list(ServiceCallTag.objects.filter(service_call=stored).order_by("id").values_list("tag", flat=True)) == [
        "billing",
        "nightly",
    ]
    assert TimerSchedule.objects.filter(service_call=stored).count() == 1


def test_without_json_body_the_body_is_sent_as_a_string(world):
    call_id = call("submit_call", *BASE, "--body", '{"id": 7}').out.strip()
    assert ServiceCall.objects.get(pk=call_id).request_spec["body"] == '{"id": 7}'


def test_without_due_it_is_due_now(world):
    before = datetime.now(UTC)
    call_id = call("submit_call", *BASE).out.strip()
    stored = ServiceCall.objects.get(pk=call_id)
    assert before <= stored.due_at <= datetime.now(UTC)
    assert stored.due_at == stored.submitted_at


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("0s", timedelta(0)),
    ],
)
def test_in_sets_the_due_time_that_far_ahead(world, text, delta):
    before = datetime.now(UTC)
    call_id = call("submit_call", *BASE, "--in", text).out.strip()
    after = datetime.now(UTC)
    due = ServiceCall.objects.get(pk=call_id).due_at
    # The wire format keeps milliseconds, so the due time may lie up to 1 ms before `before`.
    assert before + delta - timedelta(milliseconds=1) <= due <= after + delta


@pytest.mark.parametrize("text", ["5x", "m", "-5m", "1.5h", "5 minutes", "", "367d"])
def test_in_refuses_what_is_not_a_delay(text):
    with pytest.raises(CommandError):
        parse_in(text)


def test_in_refuses_a_bad_delay_and_stores_nothing(world):
    result = call("submit_call", *BASE, "--in", "5x")
    assert result.code == 1
    assert "--in '5x' is not a delay" in result.err
    assert "30s, 5m, 2h, 1d" in result.err
    assert nothing_stored()


def test_in_refuses_more_than_a_year(world):
    result = call("submit_call", *BASE, "--in", "400d")
    assert result.code == 1
    assert "at most one year ahead" in result.err
    assert nothing_stored()


def test_due_takes_an_iso_time_with_a_zone(world):
    day = datetime.now(UTC).date() + timedelta(days=30)
    call_id = call("submit_call", *BASE, "--due", f"{day.isoformat()}T10:00:00+01:00").out.strip()
    assert ServiceCall.objects.get(pk=call_id).due_at == datetime.combine(day, time(9, 0), tzinfo=UTC)


def test_a_due_time_in_the_past_means_now(world):
    call_id = call("submit_call", *BASE, "--due", "2020-01-01T00:00:00Z").out.strip()
    stored = ServiceCall.objects.get(pk=call_id)
    assert stored.due_at == stored.submitted_at


@pytest.mark.parametrize(
    ("due", "message"),
    [
        ("2030-01-31T10:00:00", "--due/--in: dueAt must carry a time zone"),
        ("tomorrow", "--due/--in: dueAt is not a valid ISO 8601 date-time"),
        ("2099-01-01T00:00:00Z", "--due/--in: dueAt must be at most one year ahead."),
    ],
)
def test_due_refuses_a_bad_time_and_stores_nothing(world, due, message):
    result = call("submit_call", *BASE, "--due", due)
    assert result.code == 1
    assert message in result.err
    assert nothing_stored()


def test_due_and_in_together_are_refused(world):
    result = call("submit_call", *BASE, "--due", "2030-01-01T00:00:00Z", "--in", "5m")
    assert result.code == 1
    assert "argument --in: not allowed with argument --due" in result.err
    assert nothing_stored()


def test_it_refuses_an_unknown_tenant_and_stores_nothing(world):
    result = call("submit_call", "--tenant", "nope", *BASE[2:])
    assert result.code == 1
    assert "Tenant 'nope' does not exist" in result.err
    assert nothing_stored()


def test_it_lists_every_invalid_field_by_its_option_and_stores_nothing(world):
    result = call(
        "submit_call",
        "--tenant",
        "acme",
        "--name",
        " ",
        "--method",
        "TRACE",
        "--url",
        "ftp://example.test/",
        "--header",
        "Bad Header: 1",
        "--tag",
        "has space",
        "--timeout-ms",
        "0",
    )
    assert result.code == 1
    assert result.out == ""
    lines = result.err.splitlines()
    assert lines[0] == "Invalid input:"
    assert "  --name: A name is required." in lines
    assert "  --method: method must be one of GET, POST, PUT, PATCH, DELETE." in lines
    assert "  --url: The URL must be absolute and use http or https." in lines
    assert "  --header: Header name 'Bad Header' is not a valid token." in lines
    assert "  --tag: Tag 'has space' must be 1-64 characters without whitespace." in lines
    assert "  --timeout-ms: timeoutMs must be an integer from 1 to 120000." in lines
    assert nothing_stored()


def test_it_refuses_headers_the_agent_sets_itself(world):
    result = call("submit_call", *BASE, "--header", "Host: evil.test")
    assert result.code == 1
    assert "--header: Header 'Host' is set by the agent and cannot be given." in result.err
    assert nothing_stored()


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("no-colon", "--header 'no-colon' must look like NAME:VALUE"),
        (":value", "--header ':value' must look like NAME:VALUE"),
    ],
)
def test_it_refuses_a_header_that_is_not_name_value(world, header, message):
    result = call("submit_call", *BASE, "--header", header)
    assert result.code == 1
    assert message in result.err
    assert nothing_stored()


def test_it_refuses_the_same_header_twice(world):
    result = call("submit_call", *BASE, "--header", "X-A: 1", "--header", "X-A: 2")
    assert result.code == 1
    assert "--header 'X-A' is given twice." in result.err
    assert nothing_stored()


def test_json_body_refuses_invalid_json(world):
    result = call("submit_call", *BASE, "--body", "{nope", "--json-body")
    assert result.code == 1
    assert "--body is not valid JSON" in result.err
    assert nothing_stored()


def test_json_body_needs_a_body(world):
    result = call("submit_call", *BASE, "--json-body")
    assert result.code == 1
    assert "--json-body needs --body." in result.err


def test_it_refuses_a_body_over_256_kib(world):
    result = call("submit_call", *BASE, "--body", "x" * (256 * 1024 + 1))
    assert result.code == 1
    assert "--body: The body is larger than 256 KiB." in result.err
    assert nothing_stored()


def test_a_missing_required_option_is_named(world):
    result = call("submit_call", "--name", "x", "--method", "GET", "--url", "https://example.test/")
    assert result.code == 1
    assert "the following arguments are required: --tenant" in result.err


def test_the_same_idempotency_key_and_call_prints_the_existing_id(world):
    first = call("submit_call", *BASE, "--idempotency-key", "k-1")
    second = call("submit_call", *BASE, "--idempotency-key", "k-1")
    assert second.code == 0
    assert second.out == first.out
    assert "nothing new was stored" in second.err
    assert ServiceCall.objects.count() == 1


def test_the_same_idempotency_key_with_another_call_is_refused(world):
    first = call("submit_call", *BASE, "--idempotency-key", "k-1").out.strip()
    result = call("submit_call", *BASE, "--tag", "other", "--idempotency-key", "k-1")
    assert result.code == 1
    assert f"Idempotency key 'k-1' was already used with a different payload (service call {first})" in result.err
    assert list(ServiceCall.objects.values_list("pk", flat=True)) == [uuid.UUID(first)]


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_a_bad_input_exits_1_with_the_errors_on_stderr(world):
    result = run_manage("submit_call", "--tenant", "acme", "--name", "x", "--method", "GET", "--url", "nope")
    assert result.code == 1
    assert result.out == ""
    assert "CommandError: Invalid input:\n  --url: The URL must be absolute and use http or https." in result.err
    assert nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_due_with_in_is_a_usage_error(world):
    result = run_manage("submit_call", *BASE, "--due", "2030-01-01T00:00:00Z", "--in", "5m")
    assert result.code == 2
    assert "usage: manage.py submit_call" in result.err
    assert nothing_stored()


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_stdout_is_only_the_id(world):
    result = run_manage("submit_call", *BASE, "--in", "1h")
    assert result.code == 0
    assert result.out == f"{ServiceCall.objects.get().pk}\n"


def test_its_help_lists_the_options():
    result = run_manage("submit_call", "--help")
    assert result.code == 0
    for option in (
        "--header NAME:VALUE",
        "--json-body",
        "--due ISO",
        "--in DELAY",
        "--timeout-ms N",
        "--idempotency-key KEY",
        "30s, 5m, 2h or 1d",
    ):
        assert option in result.out


@pytest.fixture
def default_agent_base_url(settings):
    """A second shell: no EGRESS_ALLOWLIST and AGENT_BASE_URL left at its default, while the
    agent (started by scripts/start with PORT=18751) serves its mock target on another port."""
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://127.0.0.1:8000"


def test_a_refused_url_of_the_agents_mock_target_says_how_to_allow_it(world, default_agent_base_url):
    result = call("submit_call", *BASE[:-1], "http://127.0.0.1:18751/mock/echo")
    assert result.code == 1
    assert (
        "  --url: The URL is refused by the egress policy: the URL points to a loopback "
        "address, not in EGRESS_ALLOWLIST. This agent's mock target is http://127.0.0.1:8000/mock/ "
        "(AGENT_BASE_URL: the address scripts/start serves, or as set); for an agent at "
        "http://127.0.0.1:18751, export AGENT_BASE_URL=http://127.0.0.1:18751."
    ) in result.err.splitlines()
    assert nothing_stored()


def test_with_the_agents_address_in_agent_base_url_its_mock_target_is_accepted(world, default_agent_base_url, settings):
    settings.AGENT_BASE_URL = "http://127.0.0.1:18751"
    result = call("submit_call", *BASE[:-1], "http://127.0.0.1:18751/mock/echo")
    assert result.code == 0
    assert ServiceCall.objects.get().request_spec["url"] == "http://127.0.0.1:18751/mock/echo"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:18751/admin/",  # the agent's origin, but not its mock target
        "http://127.0.0.1:18751/mock/../admin/",  # not a plain path under /mock/
        "http://10.0.0.8/api/",
    ],
)
def test_other_refused_urls_get_no_hint(world, default_agent_base_url, url):
    result = call("submit_call", *BASE[:-1], url)
    assert result.code == 1
    assert "--url: The URL is refused by the egress policy" in result.err
    assert "AGENT_BASE_URL" not in result.err


def test_the_hint_is_the_commands_only(default_agent_base_url):
    """The API's user cannot set the agent's environment: shared validation gives no hint."""
    message = url_error("http://127.0.0.1:18751/mock/echo")
    assert message.startswith("The URL is refused by the egress policy")
    assert "AGENT_BASE_URL" not in message


def test_retry_options_become_the_calls_policy(world):
    from orchestration.models import ServiceCall
    from tests.commands.cli import call as run

    result = run(
        "submit_call",
        *("--tenant", "acme", "--name", "with retries", "--method", "GET", "--url", "https://api.example.com/x"),
        *("--max-attempts", "4", "--min-backoff-ms", "500", "--retry-on", "Timeout", "--retry-on", "Http429"),
        "--retry-interrupted",
    )
    assert result.code == 0, result.err
    assert ServiceCall.objects.get(pk=result.out.strip()).retry_policy == {
        "maxAttempts": 4,
        "minBackoffMs": 500,
        "maxBackoffMs": 60_000,
        "retryOn": ["Http429", "Timeout"],
        "retryInterrupted": True,
    }


def test_bad_retry_options_name_the_option_and_store_nothing(world):
    from orchestration.models import ServiceCall
    from tests.commands.cli import call as run

    base = ("--tenant", "acme", "--name", "x", "--method", "GET", "--url", "https://api.example.com/x")
    result = run("submit_call", *base, "--max-attempts", "21", "--retry-on", "HttpError4xx")
    assert result.code == 1
    assert "--max-attempts: maxAttempts must be an integer from 1 to 20." in result.err
    assert "--retry-on: Unknown values 'HttpError4xx'" in result.err
    result = run("submit_call", *base, "--max-attempts", "3", "--min-backoff-ms", "5000", "--max-backoff-ms", "100")
    assert "--min-backoff-ms: minBackoffMs must not be greater than maxBackoffMs." in result.err
    assert ServiceCall.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_from_another_shell_the_address_scripts_start_serves_is_the_agents_own(world, tmp_path):
    """scripts/start records the address it serves in DATA_DIR/agent_base_url: a command from a
    shell without AGENT_BASE_URL judges the mock target as the agent's workers do, so the default
    port's mock URL is refused at once (the workers would refuse it too) and the served one taken."""
    from tests.support.agent_process import agent_env, manage
    from tests.workers.cluster import database_url

    (tmp_path / "agent_base_url").write_text("http://127.0.0.1:8102\n")
    env = agent_env(tmp_path, DATABASE_URL=database_url(), SECRET_KEY="x" * 50)
    env.pop("AGENT_BASE_URL", None)
    env.pop("EGRESS_ALLOWLIST", None)
    argv = ["submit_call", "--tenant=acme", "--name=ping", "--method=GET"]
    refused = manage(env, *argv, "--url=http://127.0.0.1:8000/mock/echo")
    assert refused.returncode == 1, refused.stderr
    assert "This agent's mock target is http://127.0.0.1:8102/mock/" in refused.stderr
    assert not ServiceCall.objects.exists()
    taken = manage(env, *argv, "--url=http://127.0.0.1:8102/mock/echo")
    assert taken.returncode == 0, taken.stderr
    assert ServiceCall.objects.get().request_spec["url"] == "http://127.0.0.1:8102/mock/echo"


def test_the_recorded_address_counts_only_when_it_is_a_readable_loopback_url(tmp_path):
    """What scripts/start records is a default for the commands, never a way to widen the
    egress policy: another host, credentials, unreadable bytes all count as no file."""
    from core.env import served_base_url

    path = tmp_path / "agent_base_url"
    assert served_base_url(path) == ""  # no file
    for text, taken in (
        ("http://127.0.0.1:8102\n", "http://127.0.0.1:8102"),
        ("http://localhost:8102", "http://localhost:8102"),
        ("http://[::1]:8102", "http://[::1]:8102"),
        ("http://10.0.0.5:80", ""),
        ("https://agent.example.com", ""),
        ("http://user:pw@127.0.0.1:8102", ""),
        ("", ""),
    ):
        path.write_text(text)
        assert served_base_url(path) == taken, text
    path.write_bytes(b"\xff\xfe")
    assert served_base_url(path) == ""


@pytest.mark.django_db(transaction=True)
def test_a_set_agent_base_url_wins_over_the_file_whatever_it_holds(world, tmp_path):
    from tests.support.agent_process import agent_env, manage
    from tests.workers.cluster import database_url

    (tmp_path / "agent_base_url").write_bytes(b"\xff\xfe not utf-8")
    env = agent_env(tmp_path, DATABASE_URL=database_url(), SECRET_KEY="x" * 50, AGENT_BASE_URL="http://127.0.0.1:8102")
    env.pop("EGRESS_ALLOWLIST", None)
    ran = manage(
        env, "submit_call", "--tenant=acme", "--name=ping", "--method=GET", "--url=http://127.0.0.1:8102/mock/echo"
    )
    assert ran.returncode == 0, ran.stderr


def test_the_hint_names_no_credentials_and_no_address_off_this_machine(world, default_agent_base_url):
    result = call("submit_call", *BASE[:-1], "http://user:secret@127.0.0.1:18751/mock/echo")
    assert (
        result.code == 1 and "secret" not in result.err and "export AGENT_BASE_URL=http://127.0.0.1:18751" in result.err
    )
    result = call("submit_call", *BASE[:-1], "http://10.1.2.3/mock/echo")
    assert result.code == 1 and "AGENT_BASE_URL" not in result.err
