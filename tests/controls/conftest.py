"""Fixtures of the call-control tests (cancel and retries, docs/retries.md): API-key clients of
acme and globex, an anonymous client, and the flaky target of tests/support/flaky.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.api import ApiClient
from tests.support.flaky import FlakyTarget, flaky_target


@pytest.fixture
def acme_api(world) -> ApiClient:
    return ApiClient(world.acme_key)


@pytest.fixture
def globex_api(world) -> ApiClient:
    return ApiClient(world.globex_key)


@pytest.fixture
def anonymous_api(world) -> ApiClient:
    return ApiClient(None)


@pytest.fixture
def flaky() -> Iterator[FlakyTarget]:
    with flaky_target() as target:
        yield target
