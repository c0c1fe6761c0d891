"""manage.py create_subscription"""

from __future__ import annotations

import base64

import pytest

from core.secrets import unseal_value
from delivery.models import Subscription
from tests.commands.cli import call, run_manage
from tests.support.factories import make_tenant

HOOK = "https://hooks.example.com/in"


@pytest.fixture
def acme(db):
    return make_tenant("acme")


def test_it_prints_the_id_and_the_secret_once(acme):
    result = call(
        "create_subscription",
        "--tenant",
        "acme",
        "--name",
        "billing",
        "--url",
        HOOK,
        "--event-type",
        "ServiceCallFailed",
        "--event-type",
        "ServiceCallSucceeded",
    )

    assert result.code == 0, result.err
    stored = Subscription.objects.get()
    first, second, secret = result.out.strip().splitlines()
    assert first == (
        f"Created webhook subscription {stored.pk} (billing) for tenant acme: "
        f"ServiceCallFailed, ServiceCallSucceeded to {HOOK}"
    )
    assert "shown this once" in second
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert unseal_value(stored.secret) == secret
    assert (stored.tenant_id, stored.kind, stored.name, stored.url, stored.enabled) == (
        "acme",
        "webhook",
        "billing",
        HOOK,
        True,
    )
    assert stored.event_types == ["ServiceCallFailed", "ServiceCallSucceeded"]


def test_without_event_types_it_receives_all_and_disabled_is_kept(acme):
    result = call("create_subscription", "--tenant", "acme", "--name", "all", "--url", HOOK, "--disabled")
    assert result.code == 0
    assert "all event types" in result.out and "(disabled)" in result.out
    stored = Subscription.objects.get()
    assert stored.event_types == [] and stored.enabled is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--name", "x", "--url", "http://10.0.0.1/hook"), "--url: The URL is refused by the egress policy"),
        (("--name", "x", "--url", "not a url"), "--url: "),
        (("--name", "", "--url", HOOK), "--name: A name is required."),
        (("--name", "n" * 201, "--url", HOOK), "--name: The name is longer than 200 characters."),
        (("--name", "x", "--url", HOOK, "--event-type", "Nope"), "--event-type: Unknown event type 'Nope'"),
    ],
)
def test_it_refuses_bad_input_and_stores_nothing(acme, args, message):
    result = call("create_subscription", "--tenant", "acme", *args)
    assert result.code == 1
    assert "Invalid input:" in result.err and message in result.err
    assert result.out == ""
    assert not Subscription.objects.exists()


@pytest.mark.django_db
def test_it_refuses_an_unknown_tenant():
    result = call("create_subscription", "--tenant", "nope", "--name", "x", "--url", HOOK)
    assert result.code == 1
    assert "Tenant 'nope' does not exist" in result.err
    assert not Subscription.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_on_the_command_line_it_exits_non_zero_with_the_error_on_stderr():
    make_tenant("acme")
    result = run_manage("create_subscription", "--tenant", "acme", "--name", "x", "--url", "http://10.0.0.1/")
    assert result.code == 1
    assert result.out == ""
    assert "CommandError: Invalid input:" in result.err and "--url:" in result.err
    missing = run_manage("create_subscription", "--tenant", "acme", "--name", "x")
    assert missing.code == 2 and "the following arguments are required: --url" in missing.err
    assert not Subscription.objects.exists()


def test_its_help_says_the_secret_is_shown_once():
    result = run_manage("create_subscription", "--help")
    assert result.code == 0
    for text in ("--tenant TENANT", "--name NAME", "--url URL", "--event-type TYPE", "shown this once"):
        assert text in result.out
