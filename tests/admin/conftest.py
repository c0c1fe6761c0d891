"""Admin clients: a superuser (pytest-django's admin_client) and staff of globex only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

# What an operator group would grant: view everything, add keys and memberships, run again,
# publish again.
OPERATOR_PERMISSIONS = [
    "view_tenant",
    "view_membership",
    "add_membership",
    "change_membership",
    "view_apikey",
    "add_apikey",
    "change_apikey",
    "view_servicecall",
    "add_servicecall",
    "view_servicecalltag",
    "view_timerschedule",
    "view_httpexecution",
    "view_outboxevent",
    "change_outboxevent",
    "view_workersession",
    "view_looprun",
]


@pytest.fixture
def staff_client(client, world):
    """staffglobex: staff, not superuser, member of globex, with the operator permissions."""
    world.staff_globex.user_permissions.set(Permission.objects.filter(codename__in=OPERATOR_PERMISSIONS))
    client.force_login(world.staff_globex)
    return client
