"""Logged-in test clients for the dashboard pages (the `world` fixture's users)."""

from __future__ import annotations

import pytest


@pytest.fixture
def owner_client(client, world):
    client.force_login(world.owner)
    return client


@pytest.fixture
def outsider_client(client, world):
    client.force_login(world.outsider)
    return client
