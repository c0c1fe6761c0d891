"""manage.py list_calls"""

import json
import uuid

import pytest

from execution.outcomes import ErrorKind, Outcome
from orchestration.models import ServiceCall
from orchestration.services import service_call_start
from tests.commands.cli import call, run_manage
from tests.support.api import ApiClient, calls_url
from tests.support.factories import make_call, make_finished_call


@pytest.fixture
def calls(world):
    """Five acme calls, oldest first, in every status, and one globex call."""
    ok = make_finished_call(
        "acme",
        name="ok-call",
        tags=["billing", "nightly"],
        headers={"Authorization": "Bearer s3cret"},
        outcome=Outcome(succeeded=True, status=200, latency_ms=12),
    )
    missing = make_finished_call(
        "acme",
        name="missing-call",
        tags=["billing"],
        outcome=Outcome.failure(ErrorKind.HTTP_ERROR, "HTTP 404", status=404, latency_ms=3),
    )
    slow = make_finished_call(
        "acme", name="slow-call", tags=["nightly"], outcome=Outcome.failure(ErrorKind.TIMEOUT, "timed out")
    )
    running = make_call("acme", name="running-call", tags=["billing", "favorite"])
    service_call_start(tenant_id="acme", service_call_id=running.pk)
    waiting = make_call("acme", name="waiting-call")
    make_call("globex", name="globex-call", tags=["billing"])
    return [ok, missing, slow, running, waiting]


def listed_names(out):
    return [line.split()[1] for line in out.strip().splitlines()[1:-1]]


def test_it_lists_the_tenants_calls_newest_first_as_a_table(calls):
    result = call("list_calls", "--tenant", "acme")
    assert result.code == 0
    lines = result.out.strip().splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "SUBMITTED", "DUE", "/", "STARTED", "RESULT", "TAGS"]
    assert listed_names(result.out) == ["waiting-call", "running-call", "slow-call", "missing-call", "ok-call"]
    assert [line.split()[0] for line in lines[1:-1]] == [str(c.pk)[-8:] for c in reversed(calls)]
    assert lines[-1] == "5 calls"
    by_name = {line.split()[1]: line for line in lines[1:-1]}
    assert " Succeeded " in by_name["ok-call"] and "200 in 12 ms" in by_name["ok-call"]
    assert by_name["ok-call"].endswith("billing,nightly")
    assert " Failed " in by_name["missing-call"] and "HttpError 404" in by_name["missing-call"]
    assert "Timeout" in by_name["slow-call"]
    assert " Running " in by_name["running-call"] and " started " in by_name["running-call"]
    assert " Scheduled " in by_name["waiting-call"] and " due " in by_name["waiting-call"]
    assert "globex-call" not in result.out


def test_status_filters_repeat_as_any_of(calls):
    result = call("list_calls", "--tenant", "acme", "--status", "failed", "--status", "Running")
    assert listed_names(result.out) == ["running-call", "slow-call", "missing-call"]


def test_tag_filters_must_all_match(calls):
    assert listed_names(call("list_calls", "--tenant", "acme", "--tag", "billing").out) == [
        "running-call",
        "missing-call",
        "ok-call",
    ]
    assert listed_names(call("list_calls", "--tenant", "acme", "--tag", "billing", "--tag", "nightly").out) == [
        "ok-call",
    ]


def test_favorite_and_text_filters(calls):
    assert listed_names(call("list_calls", "--tenant", "acme", "--favorite").out) == ["running-call"]
    assert listed_names(call("list_calls", "--tenant", "acme", "--q", "SLOW").out) == ["slow-call"]


def test_limit_keeps_the_newest(calls):
    result = call("list_calls", "--tenant", "acme", "--limit", "2")
    assert listed_names(result.out) == ["waiting-call", "running-call"]
    assert result.out.strip().splitlines()[-1] == "2 calls (the limit; use --limit for more)"


def test_no_match_says_so(calls):
    result = call("list_calls", "--tenant", "acme", "--tag", "nope")
    assert result.code == 0
    assert result.out.strip() == "No calls match."


def test_json_prints_the_api_representation(calls):
    result = call("list_calls", "--tenant", "acme", "--tag", "billing", "--json")
    assert result.code == 0
    body = json.loads(result.out)
    assert [item["name"] for item in body] == ["running-call", "missing-call", "ok-call"]
    ok = body[2]
    assert uuid.UUID(ok["serviceCallId"]) == calls[0].pk
    assert set(ok) >= {
        "serviceCallId",
        "tenantId",
        "name",
        "status",
        "submittedAt",
        "dueAt",
        "startedAt",
        "finishedAt",
        "requestSpec",
        "tags",
        "favorite",
        "outcome",
        "correlationId",
        "links",
    }
    assert ok["status"] == ServiceCall.Status.SUCCEEDED
    assert ok["tags"] == ["billing", "nightly"]
    assert ok["favorite"] is False and body[0]["favorite"] is True
    assert ok["requestSpec"]["headers"] == {"Authorization": "***"}
    assert "s3cret" not in result.out
    assert ok["outcome"]["responseMeta"]["status"] == 200
    assert body[1]["outcome"]["errorMeta"]["kind"] == "HttpError"
    assert ok["submittedAt"].endswith("Z")


def test_json_links_are_absolute_from_agent_base_url_as_the_apis(calls, world, settings):
    """The API builds its links from the request; the command from the agent's address."""
    settings.AGENT_BASE_URL = "http://testserver"
    printed = json.loads(call("list_calls", "--tenant", "acme", "--tag", "billing", "--json").out)
    listed = ApiClient(world.acme_key).get(calls_url("acme"), {"tag": "billing"}).json()["results"]
    assert printed == listed
    links = printed[2]["links"]
    assert links["self"] == f"http://testserver/api/tenants/acme/service-calls/{calls[0].pk}"
    assert links["events"] == "http://testserver/api/tenants/acme/events"
    assert all(link.startswith("http://testserver/api/tenants/acme/") for link in links.values())


def test_json_links_keep_the_path_of_agent_base_url(calls, settings):
    settings.AGENT_BASE_URL = "https://agent.example.test/agent/"
    printed = json.loads(call("list_calls", "--tenant", "acme", "--limit", "1", "--json").out)
    assert printed[0]["links"]["events"] == "https://agent.example.test/agent/api/tenants/acme/events"


def test_json_with_no_match_is_an_empty_array(calls):
    assert json.loads(call("list_calls", "--tenant", "globex", "--status", "Failed", "--json").out) == []


def test_it_refuses_an_unknown_tenant(world):
    result = call("list_calls", "--tenant", "nope")
    assert result.code == 1
    assert "Tenant 'nope' does not exist" in result.err
    assert result.out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--status", "Done"), "unknown status 'Done'; choose from Scheduled, Running, Succeeded, Failed"),
        (("--limit", "0"), "the limit must be a whole number from 1 to 200"),
        (("--limit", "201"), "the limit must be a whole number from 1 to 200"),
        (("--limit", "ten"), "the limit must be a whole number from 1 to 200"),
        (("--tag", "two words"), "--tag: Tag 'two words' must be 1-64 characters without whitespace."),
    ],
)
def test_it_refuses_bad_filters(calls, args, message):
    result = call("list_calls", "--tenant", "acme", *args)
    assert result.code == 1
    assert message in result.err
    assert result.out == ""


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_a_bad_status_is_a_usage_error(world):
    result = run_manage("list_calls", "--tenant", "acme", "--status", "Done")
    assert result.code == 2
    assert "usage: manage.py list_calls" in result.err
    assert "unknown status 'Done'" in result.err


def test_its_help_names_the_filters():
    result = run_manage("list_calls", "--help")
    assert result.code == 0
    for option in ("--status STATUS", "--tag TAG", "--limit LIMIT", "--json", "all must match"):
        assert option in result.out
