"""System checks of execution's configuration (run by `manage.py check` and at start-up)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from execution.egress import parse_allow_rule


@register()
def egress_allowlist_check(app_configs, **kwargs):
    errors = []
    for entry in settings.EGRESS_ALLOWLIST:
        try:
            parse_allow_rule(entry)
        except ValueError as exc:
            errors.append(Error(f"EGRESS_ALLOWLIST entry {entry!r} is invalid: {exc}", id="serviceagent.E001"))
    return errors
