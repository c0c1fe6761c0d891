"""Tags: a call's tag set replaced, and the star (the reserved tag `favorite`)."""

from __future__ import annotations

import uuid

from django.db import transaction

from core.errors import NotFound
from core.ids import utcnow
from orchestration.models import FAVORITE_TAG, ServiceCall, ServiceCallTag
from orchestration.services.calls import call_event, call_get
from orchestration.validation import validate_tags
from outbox.models import OutboxEvent
from outbox.services import outbox_append


def service_call_tags_set(
    *,
    tenant_id: str,
    service_call_id: uuid.UUID | str,
    tags: list[str],
    keep_favorite: bool = False,
    correlation_id: str | None = None,
) -> ServiceCall:
    """Replace the tag set; appends ServiceCallTagged when anything changed. With
    `keep_favorite` the star (tag `favorite`) stays as it is, whatever `tags` holds: the
    dashboard's tag editor shows the star apart from the other tags."""
    if keep_favorite:
        tags = [tag for tag in tags if tag != FAVORITE_TAG]
    tags = validate_tags(tags)
    with transaction.atomic():
        call = call_get(tenant_id, service_call_id)
        current = set(
            ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=call).values_list("tag", flat=True)
        )
        if keep_favorite and FAVORITE_TAG in current:
            tags = validate_tags([*tags, FAVORITE_TAG])  # the star counts toward the limit
        added = [tag for tag in tags if tag not in current]
        removed = sorted(current - set(tags))
        if not added and not removed:
            return call
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call=call, tag__in=removed).delete()
        ServiceCallTag.objects.bulk_create(
            [ServiceCallTag(tenant_id=tenant_id, service_call=call, tag=tag) for tag in added]
        )
        now = utcnow()
        outbox_append(
            events=[
                call_event(
                    call,
                    OutboxEvent.Type.TAGGED,
                    {"tags": tags, "added": added, "removed": removed},
                    now,
                    causation_id=correlation_id,
                ),
            ]
        )
    return call


def service_call_favorite_set(
    *, tenant_id: str, service_call_id: uuid.UUID | str, favorite: bool, correlation_id: str | None = None
) -> ServiceCall:
    """Star or unstar: the star is the reserved tag `favorite`."""
    current = list(
        ServiceCallTag.objects.filter(tenant_id=tenant_id, service_call_id=service_call_id)
        .order_by("id")
        .values_list("tag", flat=True)
    )
    if not ServiceCall.objects.filter(tenant_id=tenant_id, pk=service_call_id).exists():
        raise NotFound(f"Service call {service_call_id} not found.")
    tags = [tag for tag in current if tag != FAVORITE_TAG] + ([FAVORITE_TAG] if favorite else [])
    return service_call_tags_set(
        tenant_id=tenant_id, service_call_id=service_call_id, tags=tags, correlation_id=correlation_id
    )
