"""The retry rules of docs/retries.md, decision by decision: which failures are tried again,
after how long, and which policies are refused."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from execution.outcomes import ErrorKind, Outcome
from orchestration.retries import RetryOn, RetryPolicy, backoff_ms, policy_errors, retry_after_ms, should_retry

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
EVERYTHING = RetryPolicy(max_attempts=5, retry_interrupted=True)


def http(status: int, **headers: str) -> Outcome:
    return Outcome(succeeded=False, status=status, headers=headers, error_kind=ErrorKind.HTTP_ERROR, error_message="x")


@pytest.mark.parametrize(
    ("outcome", "retried"),
    [
        (http(500), True),
        (http(503), True),
        (http(429), True),
        (http(400), False),
        (http(404), False),
        (http(409), False),
        (Outcome.failure(ErrorKind.TIMEOUT, "t"), True),
        (Outcome.failure(ErrorKind.NETWORK_ERROR, "refused"), True),
        (Outcome.failure(ErrorKind.EGRESS_DENIED, "private"), False),
        (Outcome.failure(ErrorKind.TLS_ERROR, "bad cert"), False),
        (Outcome.failure(ErrorKind.INTERNAL_ERROR, "sealed"), False),
        (Outcome(succeeded=True, status=200), False),
    ],
    ids=lambda v: getattr(v, "error_kind", None) or str(v),
)
def test_which_failures_are_tried_again(outcome, retried):
    assert should_retry(EVERYTHING, outcome, attempt=1) is retried


def test_interrupted_only_with_retry_interrupted_and_nothing_past_max_attempts():
    interrupted = Outcome.failure(ErrorKind.INTERRUPTED, "worker died")
    assert should_retry(RetryPolicy(max_attempts=3), interrupted, attempt=1) is False
    assert should_retry(RetryPolicy(max_attempts=3, retry_interrupted=True), interrupted, attempt=1) is True
    assert should_retry(RetryPolicy(max_attempts=3), http(500), attempt=2) is True
    assert should_retry(RetryPolicy(max_attempts=3), http(500), attempt=3) is False
    assert should_retry(RetryPolicy(), http(500), attempt=1) is False  # the default: one attempt


def test_retry_on_narrows_what_is_retried():
    only_429 = RetryPolicy(max_attempts=3, retry_on=(RetryOn.HTTP_429,))
    assert should_retry(only_429, http(429), attempt=1)
    assert not should_retry(only_429, http(503), attempt=1)
    assert not should_retry(only_429, Outcome.failure(ErrorKind.TIMEOUT, "t"), attempt=1)


def test_backoff_doubles_from_min_to_max_with_ten_percent_jitter():
    policy = RetryPolicy(max_attempts=20, min_backoff_ms=1000, max_backoff_ms=30_000)
    rng = random.Random(7)
    for attempt, base in [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (5, 16000)]:
        delays = [backoff_ms(policy, http(503), attempt=attempt, now=NOW, rng=rng) for _ in range(200)]
        assert base * 0.9 <= min(delays) and max(delays) <= base * 1.1, attempt
        assert max(delays) - min(delays) > base * 0.05  # the jitter is there
        assert min(delays) >= 1000  # never below minBackoffMs, jitter included
    late = [backoff_ms(policy, http(503), attempt=n, now=NOW, rng=rng) for n in range(6, 20) for _ in range(20)]
    assert min(late) >= 27_000 and max(late) == 30_000  # clamped to maxBackoffMs


def test_retry_after_is_honoured_up_to_max_backoff():
    policy = RetryPolicy(max_attempts=5, min_backoff_ms=500, max_backoff_ms=10_000)
    assert backoff_ms(policy, http(429, **{"Retry-After": "3"}), attempt=1, now=NOW) == 3000
    assert backoff_ms(policy, http(429, **{"retry-after": "3600"}), attempt=1, now=NOW) == 10_000
    assert backoff_ms(policy, http(503, **{"Retry-After": "0"}), attempt=1, now=NOW) == 500
    date = format_datetime(NOW + timedelta(seconds=7), usegmt=True)
    assert backoff_ms(policy, http(503, **{"Retry-After": date}), attempt=1, now=NOW) == 7000
    # Unreadable: the computed backoff.
    assert 450 <= backoff_ms(policy, http(503, **{"Retry-After": "soon"}), attempt=1, now=NOW) <= 550
    assert retry_after_ms(http(503), now=NOW) is None


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"maxAttempts": 0}, "retryPolicy.maxAttempts"),
        ({"maxAttempts": 21}, "retryPolicy.maxAttempts"),
        ({"maxAttempts": True}, "retryPolicy.maxAttempts"),
        ({"maxAttempts": "3"}, "retryPolicy.maxAttempts"),
        ({"minBackoffMs": 5000, "maxBackoffMs": 1000}, "retryPolicy.minBackoffMs"),
        ({"minBackoffMs": 99}, "retryPolicy.minBackoffMs"),
        ({"maxBackoffMs": 86_400_001}, "retryPolicy.maxBackoffMs"),
        ({"retryOn": ["HttpError4xx"]}, "retryPolicy.retryOn"),
        ({"retryOn": "Timeout"}, "retryPolicy.retryOn"),
        ({"retryInterrupted": "yes"}, "retryPolicy.retryInterrupted"),
        ({"maxAttempt": 3}, "retryPolicy"),
        ([3], "retryPolicy"),
    ],
)
def test_bad_policies_name_the_field(raw, field):
    policy, errors = policy_errors(raw)
    assert policy is None and field in errors, errors


def test_a_good_policy_round_trips_and_orders_retry_on():
    policy, errors = policy_errors({"maxAttempts": 4, "retryOn": ["Timeout", "Http429"], "minBackoffMs": 200})
    assert errors == {}
    assert policy.as_wire() == {
        "maxAttempts": 4,
        "minBackoffMs": 200,
        "maxBackoffMs": 60_000,
        "retryOn": ["Http429", "Timeout"],
        "retryInterrupted": False,
    }
    assert RetryPolicy.from_wire(policy.as_wire()) == policy
    assert policy_errors(None) == (None, {})


@pytest.mark.parametrize(
    "value",
    ["\u00b2", "9" * 5000, "\u0661\u0662", "1e3", "-5", " ", "Wed, 31 Dec 99999 23:59:59 GMT", "x" * 10_000],
    ids=["superscript-two", "5000-digits", "arabic-indic", "exponent", "negative", "blank", "year-99999", "long"],
)
def test_a_hostile_retry_after_falls_back_to_the_computed_backoff(value):
    """A target chooses this header: nothing it sends may raise (it would sink the recording of
    other calls' outcomes in the same transaction)."""
    policy = RetryPolicy(max_attempts=3, min_backoff_ms=1000, max_backoff_ms=8000)
    delay = backoff_ms(policy, http(503, **{"Retry-After": value}), attempt=1, now=NOW)
    assert 1000 <= delay <= 1100
