"""Bulk actions (docs/api.md, "Bulk actions"): cancel, run again, or add or remove tags on every
call a filter of the list matches, first counted (`dry_run`), then done, at most BULK_MAX calls
a request. Each change is the ordinary transition, with its event, one call at a time: a cancel
races the timer as a single cancel does (one winner per call)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import QuerySet

from core.errors import ApplicationError, ValidationFailed
from orchestration.filters import ServiceCallFilter, filter_errors
from orchestration.many import BulkRequest
from orchestration.models import FAVORITE_TAG, ServiceCall, ServiceCallTag
from orchestration.selectors import service_calls_for_tenant
from orchestration.services.cancel import service_call_cancel
from orchestration.services.rerun import service_call_rerun
from orchestration.services.tags import service_call_tags_set

BULK_MAX = 10_000
# Why a call's transition was refused, by action (the reasons' counts of a result).
SKIPPED = {"cancel": "not Scheduled (Running or finished)", "rerun": "its stored request is refused now"}


@dataclass
class BulkResult:
    """What a bulk action found and did: `matched` calls; `changed` (cancelled, run again, their
    tags changed), `unchanged` (already so) and `skipped` (the transition refused: a call no
    longer Scheduled, a stored request now refused), with the reasons skipped, counted."""

    matched: int
    changed: int = 0
    unchanged: int = 0
    skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def bulk_calls_matched(*, tenant_id: str, bulk: BulkRequest) -> QuerySet[ServiceCall]:
    """The tenant's calls `bulk`'s filter matches, as the list filters them; ValidationFailed
    naming `filter.<name>` for a filter the list refuses."""
    filterset = ServiceCallFilter(
        bulk.filter, queryset=service_calls_for_tenant(tenant_id=tenant_id), tenant_id=tenant_id
    )
    if not filterset.is_valid():
        raise ValidationFailed({f"filter.{name}": found for name, found in filter_errors(filterset).items()})
    return filterset.qs


def service_calls_bulk(
    *, tenant_id: str, calls: QuerySet[ServiceCall], action: str, tags: list[str], dry_run: bool, correlation_id: str
) -> BulkResult:
    """`action` on every call of `calls` (`bulk_calls_matched`), oldest first; with `dry_run`,
    only their count. More than BULK_MAX calls: ValidationFailed, nothing done (the count says by
    how much to narrow the filter)."""
    matched = calls.count()
    result = BulkResult(matched=matched)
    if dry_run:
        return result
    if matched > BULK_MAX:
        raise ValidationFailed(
            {
                "filter": [
                    f"{matched:,} calls match: at most {BULK_MAX:,} a request. Narrow the filter; nothing was done."
                ]
            }
        )
    rows = list(calls.order_by("pk").values_list("pk", "status")[:BULK_MAX])
    tag_sets = _tags_of(tenant_id, [pk for pk, _ in rows]) if action in ("addTags", "removeTags") else {}
    for pk, status in rows:
        try:
            if action == "cancel":
                if status == ServiceCall.Status.CANCELLED:
                    result.unchanged += 1
                    continue
                service_call_cancel(tenant_id=tenant_id, service_call_id=pk, correlation_id=correlation_id)
            elif action == "rerun":
                service_call_rerun(tenant_id=tenant_id, service_call_id=pk, correlation_id=correlation_id)
            else:
                now = tag_sets.get(pk, [])
                wanted = (
                    [*now, *(t for t in tags if t not in now)]
                    if action == "addTags"
                    else [t for t in now if t not in tags]
                )
                if wanted == now:
                    result.unchanged += 1
                    continue
                service_call_tags_set(
                    tenant_id=tenant_id,
                    service_call_id=pk,
                    tags=wanted,
                    keep_favorite=True,
                    correlation_id=correlation_id,
                )
        except ApplicationError as exc:
            result.skip(SKIPPED.get(action, exc.title))
            continue
        result.changed += 1
    return result


def _tags_of(tenant_id: str, keys: list) -> dict:
    """Each call's tags but the star, in the order they were given."""
    found: dict = {}
    rows = ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call_id__in=keys).exclude(tag=FAVORITE_TAG)
    for call_id, tag in rows.order_by("id").values_list("service_call_id", "tag"):
        found.setdefault(call_id, []).append(tag)
    return found
