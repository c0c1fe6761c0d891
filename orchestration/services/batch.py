"""Batch submission (docs/api.md, "Batches"): up to BATCH_MAX calls in one request (checked by
orchestration/many.py), each item accepted or refused on its own, in order, each with its own
idempotency key; the accepted ones stored together in one transaction, with one INSERT per
table (calls, tags, events, timers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from django.db import IntegrityError, transaction

from core.db import group_commit, insert_prepare, insert_rows_prepare
from core.errors import ApplicationError, Conflict
from execution.connections import connection_check
from orchestration.many import BATCH_MAX  # noqa: F401 (re-exported)
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.services.calls import enqueue_start
from orchestration.services.submit import (
    _fingerprint,
    _idempotent_match,
    _new_call,
    _NewCall,
    retry_policy_within_ceilings,
    service_call_submit,
)
from orchestration.validation import Submission
from outbox.services import outbox_append, outbox_prepare
from timer.services import timers_register


@dataclass
class BatchResult:
    """One item's answer: its call (stored now, `created`, or earlier under its idempotency key)
    or the error that refused it."""

    call: ServiceCall | None = None
    created: bool = False
    error: ApplicationError | None = None
    tags: list[str] = field(default_factory=list)


def service_calls_submit_batch(
    *, tenant_id: str, items: Sequence[Submission | ApplicationError], correlation_id: str
) -> list[BatchResult]:
    """Each item (a checked submission, or the error its check raised) accepted or refused on its
    own; the results in the items' order. An idempotency key already stored answers that call,
    as a single submission does; one given twice in the batch, the same call twice (a different
    payload: 409). The new calls commit together, or, should a key be stored by another request
    meanwhile, one by one as single submissions."""
    results = [BatchResult() for _ in items]
    new: list[tuple[int, _NewCall, list[str]]] = []
    keys: dict[str, tuple[int, str]] = {}  # idempotency key -> (first item, fingerprint)
    repeats: list[tuple[int, int]] = []  # (item, the earlier item with its key)
    for index, item in enumerate(items):
        try:
            if isinstance(item, ApplicationError):
                raise item
            submission = item
            if submission.retry_policy is not None:
                policy = retry_policy_within_ceilings(tenant_id=tenant_id, policy=submission.retry_policy)
                submission = replace(submission, retry_policy=policy)
            connection_check(
                tenant_id=tenant_id,
                name=submission.connection,
                header_names=submission.headers,
                field="requestSpec.connection",
            )
            fingerprint = _fingerprint(submission)
            key = submission.idempotency_key
            if key is not None and key in keys:
                first, first_fingerprint = keys[key]
                if first_fingerprint != fingerprint:
                    raise Conflict(f"Idempotency key {key!r} is given to item {first + 1} with a different payload.")
                repeats.append((index, first))
                continue
            if key is not None:
                keys[key] = (index, fingerprint)
                existing = _idempotent_match(tenant_id, key, fingerprint)
                if existing is not None:
                    results[index] = BatchResult(call=existing)
                    continue
            new.append(
                (
                    index,
                    _new_call(
                        tenant_id=tenant_id,
                        submission=submission,
                        correlation_id=correlation_id,
                        fingerprint=fingerprint,
                        rerun_of=None,
                        sealed_headers=None,
                        occurrence=None,
                    ),
                    submission.tags,
                )
            )
        except ApplicationError as exc:
            results[index] = BatchResult(error=exc)
    if new:
        _store(new, results, tenant_id=tenant_id, items=items, correlation_id=correlation_id)
    for index, first in repeats:
        results[index] = BatchResult(call=results[first].call, error=results[first].error, tags=results[first].tags)
    return results


def _store(
    new: list[tuple[int, _NewCall, list[str]]],
    results: list[BatchResult],
    *,
    tenant_id: str,
    items: Sequence[Submission | ApplicationError],
    correlation_id: str,
) -> None:
    try:
        group_commit(lambda: _insert_calls([made for _, made, _ in new]))
    except IntegrityError:
        # Another request stored one of these idempotency keys meanwhile: each item as a
        # single submission, which answers the call stored under its key.
        for index, _, tags in new:
            try:
                call, created = service_call_submit(
                    tenant_id=tenant_id, submission=items[index], correlation_id=correlation_id
                )
                results[index] = BatchResult(call=call, created=created, tags=tags)
            except ApplicationError as exc:
                results[index] = BatchResult(error=exc)
        return
    for index, made, tags in new:
        results[index] = BatchResult(call=made.call, created=True, tags=tags)


def _insert_calls(new: list[_NewCall]) -> None:
    """The batch's writes, inside its transaction: one INSERT per table (split only where the
    database's parameter limit asks)."""
    insert_prepare([made.call for made in new]).run()
    insert_rows_prepare(
        ServiceCallTag,
        fields=("tenant", "service_call", "tag"),
        rows=[row for made in new for row in made.tag_rows],
    ).run()
    outbox_append(prepared=outbox_prepare(events=[event for made in new for event in made.new_events]))
    timers_register(
        timers=[(made.call.tenant_id, made.call.service_call_id, made.call.due_at, made.correlation_id) for made in new]
    )
    due_now = [made.call for made in new if made.due_now]
    if due_now:
        # Past due: a worker starts them at once instead of waiting for the timer.
        transaction.on_commit(lambda: [enqueue_start(call.tenant_id, call.service_call_id) for call in due_now])
