"""Subscription names follow the rule of call names (core.text): no control character (C0, DEL,
C1 such as NEL) and no invisible formatting character (a bidi override spoofs what is shown)."""

import pytest

from core.errors import ValidationFailed
from delivery.validation import validate_subscription
from orchestration.validation import validate_submission
from tests.support.factories import submission_data


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("evil\u202egnp.exe", "The name must not contain invisible formatting characters (U+202E)"),
        ("zero\u200bwidth", "The name must not contain invisible formatting characters (U+200B)"),
        ("nel\x85line", "The name must not contain control characters (U+0085)."),
        ("line\nbreak", "The name must not contain control characters (U+000A)."),
    ],
)
def test_a_subscription_name_is_refused_as_a_call_name_is(name, message):
    with pytest.raises(ValidationFailed) as subscription:
        validate_subscription({"name": name, "url": "https://hooks.example.com/x"})
    with pytest.raises(ValidationFailed) as call:
        validate_submission(submission_data(name=name))

    assert subscription.value.errors["name"][0].startswith(message)
    assert subscription.value.errors["name"] == call.value.errors["name"]


def test_a_lone_surrogate_is_refused():
    with pytest.raises(ValidationFailed) as refused:
        validate_subscription({"name": "a\ud800b", "url": "https://hooks.example.com/x"})
    assert "surrogate" in refused.value.errors["name"][0]
