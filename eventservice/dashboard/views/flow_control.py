"""The flow-control settings page: the current tenant's limits, shown and edited, with how many
of its calls wait for them now and the operator's ceilings they stay under (docs/flow-control.md). Thin: orchestration.flow checks the
limits exactly as for the API, orchestration.admission stores them.

Host rows are plain numbered inputs (no script): the page offers the saved hosts and a few
empty rows, and a save with more hosts comes back with more empty rows.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from core.errors import ValidationFailed
from eventservice.dashboard.tenancy import tenant_required
from orchestration.admission import flow_control_set, flow_limits_effective, flow_limits_get, held_count
from orchestration.flow import MAX_HOSTS, MAX_PARALLELISM, MAX_RATE, MIN_RATE, FlowLimits, validate_flow_control
from tenants.selectors import tenant_ceilings_get

EMPTY_HOST_ROWS = 3
# A host's row in the wire errors: hosts["api.example.com"] or hosts["api.example.com"].parallelism
_HOST_ERROR = re.compile(r'hosts\["(?P<host>[^"]*)"\](\.(?P<field>\w+))?\Z')


def _number(raw: str) -> Any:
    """A form's text as the API would get it: blank is no limit, a number is a number, anything
    else stays text, for the validation to name."""
    text = raw.strip()
    if not text:
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return text


def _rows(limits: FlowLimits) -> list[dict[str, Any]]:
    rows = [
        {"host": host, "parallelism": limit.parallelism, "rate": limit.rate, "errors": []}
        for host, limit in sorted(limits.hosts.items())
    ]
    return rows + [{"host": "", "parallelism": None, "rate": None, "errors": []} for _ in range(EMPTY_HOST_ROWS)]


def _posted(request: HttpRequest) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The wire object from the form, its host rows as entered, and problems of rows that name
    no host."""
    try:
        count = min(int(request.POST.get("host-count", "0")), MAX_HOSTS + EMPTY_HOST_ROWS + 10)
    except ValueError:
        count = 0
    rows, hosts, problems = [], {}, []
    for n in range(max(0, count)):
        host = request.POST.get(f"host-{n}-name", "").strip()
        parallelism = request.POST.get(f"host-{n}-parallelism", "")
        rate = request.POST.get(f"host-{n}-rate", "")
        if not host and not parallelism.strip() and not rate.strip():
            continue
        row = {"host": host, "parallelism": parallelism, "rate": rate, "errors": []}
        rows.append(row)
        if not host:
            row["errors"].append("Name the host these limits are for.")
            problems.append(f"Row {n + 1}: no host")
            continue
        hosts[host] = {"parallelism": _number(parallelism), "ratePerSecond": _number(rate)}
    wire = {
        "parallelism": _number(request.POST.get("parallelism", "")),
        "ratePerSecond": _number(request.POST.get("rate", "")),
        "hosts": hosts,
    }
    return wire, rows, problems


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def flow_control_page(request: HttpRequest) -> HttpResponse:
    tenant_id = request.tenant.id
    context: dict[str, Any] = {
        "held": held_count(tenant_id=tenant_id),
        "max_parallelism": MAX_PARALLELISM,
        "min_rate": MIN_RATE,
        "max_rate": MAX_RATE,
        "max_hosts": MAX_HOSTS,
        "errors": {},
        "host_errors": [],
        # The operator's, shown read-only so the tenant sees why a limit holds (docs/flow-control.md).
        "ceilings": tenant_ceilings_get(tenant_id=tenant_id),
        "effective": flow_limits_effective(tenant_id=tenant_id).tenant,
    }
    if request.method == "GET":
        limits = flow_limits_get(tenant_id=tenant_id)
        context.update(
            parallelism=limits.tenant.parallelism, rate=limits.tenant.rate, rows=_rows(limits), limits=limits
        )
        return render(request, "dashboard/flow_control.html", context)

    wire, rows, problems = _posted(request)
    try:
        limits = validate_flow_control(wire)
        if problems:
            raise ValidationFailed({"hosts": problems})
        # Refuses limits past the operator's ceilings, naming the field, and stores nothing.
        flow_control_set(tenant_id=tenant_id, limits=limits)
    except ValidationFailed as exc:
        by_host = {row["host"].lower(): row for row in rows}
        for name, found in exc.errors.items():
            match = _HOST_ERROR.match(name)
            row = by_host.get(match.group("host").lower()) if match else None
            if row is not None:
                row["errors"].extend(found)
            elif name in ("parallelism", "ratePerSecond"):
                context["errors"].setdefault(name, []).extend(found)
            elif not problems or name != "hosts":
                context["host_errors"].extend(found)
        context.update(
            parallelism=request.POST.get("parallelism", ""),
            rate=request.POST.get("rate", ""),
            rows=rows + [{"host": "", "parallelism": "", "rate": "", "errors": []} for _ in range(EMPTY_HOST_ROWS)],
            limits=flow_limits_get(tenant_id=tenant_id),
            invalid=True,
        )
        return render(request, "dashboard/flow_control.html", context, status=400)
    messages.success(request, "Flow-control limits saved." if limits.limited else "Flow control is off: no limits.")
    return HttpResponseRedirect(reverse("dashboard:flow-control"))
