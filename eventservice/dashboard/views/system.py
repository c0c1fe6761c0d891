"""The system page for staff: workers, timer, outbox and delivery backlogs, recent failures.

Superusers see every tenant; other staff only their tenants' calls, timers and events.
Worker sessions carry no tenant data; loop-run error messages may, so only superusers read them.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from core.ids import utcnow
from delivery.models import Subscription
from delivery.selectors import delivery_backlog
from eventservice.api.health import database_server, nats_servers
from eventservice.dashboard.selectors import recent_failed_calls
from eventservice.dashboard.tenancy import resolve_tenant
from orchestration.selectors import status_counts
from outbox.selectors import outbox_backlog
from timer.selectors import timers_backlog
from workers.models import WorkerSession
from workers.selectors import WorkerRow, recent_loop_errors, worker_sessions


def worker_state(row: WorkerRow) -> str:
    """What the page calls a session: a clean stop is "stopped", not a "success" of something."""
    if row.stale:
        return "stale"
    if row.session.status == WorkerSession.Status.SUCCESS:
        return "stopped"
    return row.session.status


@login_required
@require_GET
def system_page(request: HttpRequest) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("The system page is for staff.")
    resolve_tenant(request)
    now = utcnow()
    scope = None if request.user.is_superuser else [tenant.id for tenant in request.tenants]
    context = {
        "now": now,
        "all_tenants": scope is None,
        "workers": [{"row": row, "state": worker_state(row)} for row in worker_sessions(now=now)],
        "timers": timers_backlog(now=now, tenant_ids=scope),
        "outbox": outbox_backlog(now=now, tenant_ids=scope, with_lag=True),
        "delivery": [
            {
                "label": Subscription.Kind(kind).label,
                "pending": backlog.pending,
                "failing": backlog.failing,
                "oldest_ms": None if backlog.oldest_pending_age_s is None else backlog.oldest_pending_age_s * 1000,
            }
            for kind, backlog in delivery_backlog(now=now, tenant_ids=scope).items()
            # NATS only where it is configured, or something still waits for it.
            if kind != Subscription.Kind.NATS or settings.NATS_URL or backlog.pending or backlog.failing
        ],
        "failed_calls": recent_failed_calls(tenant_ids=scope),
        "loop_errors": recent_loop_errors() if request.user.is_superuser else [],
        "database": database_server(),
        "nats_servers": nats_servers(),
        "tenant_counts": [(tenant, status_counts(tenant_id=tenant.id)) for tenant in request.tenants[:50]],
    }
    return render(request, "dashboard/system.html", context)
