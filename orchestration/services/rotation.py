"""Secrets at rest: every sealed header value of every call re-encrypted under the first key
(docs/security.md §4).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction

from core.secrets import RotationResult, SecretUnavailable, is_sealed, rotate_sealed
from orchestration.models import ServiceCall


def _batches(batch_size: int) -> Iterator[list[tuple[Any, dict]]]:
    last = None
    while True:
        rows = ServiceCall.objects.order_by("service_call_id")
        if last is not None:
            rows = rows.filter(service_call_id__gt=last)
        batch = list(rows.values_list("service_call_id", "request_spec")[:batch_size])
        if not batch:
            return
        last = batch[-1][0]
        yield batch


def sealed_values_rotate(*, batch_size: int = 500, dry_run: bool = False) -> RotationResult:
    """Re-encrypt every sealed header value of every call under the first key, in batches
    (each batch one transaction, each row a conditional update on its old spec). A row
    sealed under a key no longer configured is reported in `failed` and left as it is."""
    result = RotationResult(failed=[])
    for batch in _batches(batch_size):
        updates = []
        for service_call_id, spec in batch:
            result.examined += 1
            headers = (spec or {}).get("headers") or {}
            if not any(is_sealed(value) for value in headers.values()):
                continue
            try:
                rotated = rotate_sealed(headers)
            except SecretUnavailable:
                result.failed.append(str(service_call_id))  # type: ignore[union-attr]
                continue
            if rotated != headers:
                updates.append((service_call_id, spec, {**spec, "headers": rotated}))
        if dry_run or not updates:
            result.rotated += len(updates)
            continue
        with transaction.atomic():
            for service_call_id, old_spec, new_spec in updates:
                current = (
                    ServiceCall.objects.select_for_update()
                    .filter(pk=service_call_id)
                    .values_list("request_spec", flat=True)
                    .first()
                )
                if current != old_spec:  # changed meanwhile (a rerun copies, never edits): skip
                    continue
                result.rotated += ServiceCall.objects.filter(pk=service_call_id).update(request_spec=new_spec)
    return result
