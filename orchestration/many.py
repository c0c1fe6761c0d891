"""The input of the requests about many calls at once (docs/api.md, "Batches" and "Bulk actions"):
a batch's items, each then checked as a single submission is (orchestration.validation), and a
bulk action's action, filter and tags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import QueryDict

from core.errors import ValidationFailed
from orchestration.validation import Submission, _Errors, clean_tags, validate_submission

# Calls in one batch submission, at most.
BATCH_MAX = 100
# A bulk action's actions (orchestration/services/bulk.py).
BULK_ACTIONS = ("cancel", "rerun", "addTags", "removeTags")
# What a bulk action's filter may hold: the list's filters (orchestration.filters), by wire name.
BULK_FILTERS = ("status", "tag", "q", "submittedFrom", "submittedTo", "dueFrom", "dueTo", "favorite", "scheduleId")


@dataclass(frozen=True)
class BulkRequest:
    action: str
    filter: QueryDict
    tags: list[str]
    dry_run: bool


def validate_bulk(data: Any) -> BulkRequest:
    """A bulk action (docs/api.md, "Bulk actions"): `{action, filter, tags?, dryRun?}`, the filter
    as the list's query (lists for `status` and `tag`). Raises ValidationFailed naming each field."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["The request body must be a JSON object: {action, filter, tags?, dryRun?}."]})
    errors = _Errors()
    for name in sorted(set(data) - {"action", "filter", "tags", "dryRun"}):
        errors.add(name, "Unknown field.")
    action = data.get("action")
    if action not in BULK_ACTIONS:
        errors.add("action", f"action must be one of: {', '.join(BULK_ACTIONS)}.")
    dry_run = data.get("dryRun", False)
    if not isinstance(dry_run, bool):
        errors.add("dryRun", "dryRun is true or false.")
    tags: list[str] = []
    if action in ("addTags", "removeTags"):
        tags = clean_tags(data.get("tags"), errors)
        if not tags and "tags" not in errors.errors:
            errors.add("tags", "At least one tag is required for this action.")
    elif data.get("tags") is not None:
        errors.add("tags", "Only addTags and removeTags take tags.")
    query = QueryDict(mutable=True)
    given = data.get("filter")
    if not isinstance(given, dict):
        errors.add("filter", "A filter object is required ({} matches every call): the list's filters by name.")
    else:
        for name, value in given.items():
            if name not in BULK_FILTERS:
                errors.add(f"filter.{name}", f"Unknown filter; known: {', '.join(BULK_FILTERS)}.")
            elif name in ("status", "tag"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    errors.add(f"filter.{name}", f"filter.{name} is a list of strings.")
                else:
                    query.setlist(name, value)
            elif isinstance(value, bool) and name == "favorite":
                query[name] = "true" if value else "false"
            elif isinstance(value, str):
                query[name] = value
            else:
                errors.add(f"filter.{name}", f"filter.{name} is a string.")
    if errors.errors:
        raise ValidationFailed(errors.errors)
    return BulkRequest(action=action, filter=query, tags=tags, dry_run=dry_run)


def validate_batch(data: Any) -> list[Submission | ValidationFailed]:
    """A batch's items (docs/api.md, "Batches"): `{calls: [1 to BATCH_MAX items]}`, each checked
    on its own by `validate_submission`: the submission, or the error that refuses it. Raises
    ValidationFailed for any other body."""
    if not isinstance(data, dict):
        raise ValidationFailed({"body": ["The request body must be a JSON object: {calls: [...]}."]})
    unknown = sorted(set(data) - {"calls"})
    if unknown:
        raise ValidationFailed({name: ["Unknown field."] for name in unknown})
    calls = data.get("calls")
    if not isinstance(calls, list) or not calls:
        raise ValidationFailed({"calls": [f"A list of 1 to {BATCH_MAX} calls is required."]})
    if len(calls) > BATCH_MAX:
        raise ValidationFailed({"calls": [f"At most {BATCH_MAX} calls a batch; this one has {len(calls)}."]})
    checked: list[Submission | ValidationFailed] = []
    for item in calls:
        try:
            checked.append(validate_submission(item))
        except ValidationFailed as exc:
            checked.append(exc)
    return checked
