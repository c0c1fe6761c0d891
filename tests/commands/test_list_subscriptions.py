"""manage.py list_subscriptions"""

from __future__ import annotations

import json

import pytest

from delivery.models import Subscription
from tests.commands.cli import call, run_manage
from tests.support.factories import make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try


@pytest.fixture
def hooks(world):
    """acme: a delivering hook, a disabled one; globex's and an operator-wide one."""
    billing, billing_secret = make_subscription("acme", name="billing", event_types=["ServiceCallFailed"])
    ops, ops_secret = make_subscription("acme", name="ops", url="https://ops.example.com/hook")
    [first, _] = [n for n in fan_out(make_call("acme").pk) if n.subscription_id == ops.pk]
    record_try(first, succeeded=True, status_code=200)
    Subscription.objects.filter(pk=billing.pk).update(enabled=False, disabled_reason="the endpoint answered 410 Gone")
    make_subscription("globex", name="globex-hook")
    make_subscription(None, name="operator-hook")
    return billing, ops, [billing_secret, ops_secret]


def test_it_lists_the_tenants_own_subscriptions_as_a_table(hooks):
    billing, ops, secrets = hooks

    result = call("list_subscriptions", "--tenant", "acme")

    assert result.code == 0, result.err
    lines = result.out.strip().splitlines()
    assert lines[0].split() == [
        "ID",
        "NAME",
        "KIND",
        "STATE",
        "PENDING",
        "LAST",
        "SUCCESS",
        "FAILING",
        "SINCE",
        "LAG",
        "EVENTS",
        "URL",
    ]
    assert lines[1].startswith(str(billing.pk)) and " disabled " in lines[1] and "ServiceCallFailed" in lines[1]
    assert lines[2].startswith(str(ops.pk)) and " enabled " in lines[2] and lines[2].endswith(ops.url)
    assert " 1 " in lines[2]  # the Scheduled event's delivery is still open
    assert f"{billing.pk} is disabled: the endpoint answered 410 Gone" in result.out
    assert lines[-1] == "2 subscriptions"
    assert "globex-hook" not in result.out and "operator-hook" not in result.out
    assert not any(secret in result.out for secret in secrets)


def test_json_prints_the_api_representation_without_secrets(hooks):
    billing, ops, secrets = hooks

    result = call("list_subscriptions", "--tenant", "acme", "--json")

    assert result.code == 0
    body = json.loads(result.out)
    assert [s["subscriptionId"] for s in body] == [str(billing.pk), str(ops.pk)]
    assert body[0]["enabled"] is False and body[0]["disabledReason"] == "the endpoint answered 410 Gone"
    assert body[1]["figures"]["pending"] == 1 and body[1]["figures"]["lagSample"] == 1
    assert body[1]["lastSuccessAt"].endswith("Z")
    assert body[1]["links"]["self"] == f"/api/tenants/acme/subscriptions/{ops.pk}"
    assert all("secret" not in s for s in body)
    assert not any(secret in result.out for secret in secrets)


def test_none_says_so(world):
    assert call("list_subscriptions", "--tenant", "globex").out.strip() == "No subscriptions."
    assert json.loads(call("list_subscriptions", "--tenant", "globex", "--json").out) == []


def test_it_refuses_an_unknown_tenant(world):
    result = call("list_subscriptions", "--tenant", "nope")
    assert result.code == 1
    assert "Tenant 'nope' does not exist" in result.err
    assert result.out == ""


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_a_missing_tenant_is_a_usage_error():
    result = run_manage("list_subscriptions")
    assert result.code == 2
    assert "usage: manage.py list_subscriptions" in result.err


def test_its_help_names_the_options():
    result = run_manage("list_subscriptions", "--help")
    assert result.code == 0
    for text in ("--tenant TENANT", "--json", "p50/p99"):
        assert text in result.out
