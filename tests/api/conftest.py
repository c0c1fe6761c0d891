"""Fixtures of the API tests: API-key clients of acme and globex, and an anonymous client.
The helpers they use are in tests/support/api.py."""

from __future__ import annotations

import pytest

from tests.support.api import ApiClient


@pytest.fixture
def acme_api(world) -> ApiClient:
    return ApiClient(world.acme_key)


@pytest.fixture
def globex_api(world) -> ApiClient:
    return ApiClient(world.globex_key)


@pytest.fixture
def anonymous_api(world) -> ApiClient:
    return ApiClient(None)
