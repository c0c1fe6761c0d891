"""The one FilterSet of service calls, shared by the API, the dashboard and the admin.

Filters live in the URL (query parameters with the API's camelCase names):
`status` (repeatable, any letter case), `tag` (repeatable, all must match), `q` (name contains,
case-insensitive), `submittedFrom`, `submittedTo`, `dueFrom`, `dueTo` (ISO 8601 date-time
with a zone, or a date: a `...To` date covers that whole day, UTC), `favorite` (true|false).

Tags become `service_call_id IN (SELECT service_call_id FROM service_call_tags WHERE
tenant_id = ? AND tag = ? [INTERSECT SELECT ... AND tag = ?]...)`, each SELECT answered from
index service_call_tags_tag alone; never tag matching in Python.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import django_filters
from django import forms
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils.dateparse import parse_date, parse_datetime
from django_filters.fields import MultipleChoiceField

from core.errors import ValidationFailed
from orchestration.models import FAVORITE_TAG, ServiceCall, ServiceCallTag
from orchestration.validation import validate_tags

MAX_QUERY = 200
# A call's id is minted a moment after its submittedAt; this margin keeps the id-range hint
# of submittedTo safe (the exact bound is still checked on submitted_at).
_ID_CLOCK_MARGIN = timedelta(minutes=1)


class MultipleValueField(forms.Field):
    """A repeatable query parameter (`?tag=a&tag=b`) of free-form strings."""

    widget = forms.SelectMultiple

    def to_python(self, value: Any) -> list[str]:
        if value in (None, "", [], ()):
            return []
        if isinstance(value, str):
            value = [value]
        return [str(item) for item in value if str(item) != ""]


class TagsField(MultipleValueField):
    """Tags checked by the same rule as a submission's tags (orchestration.validation)."""

    def validate(self, value: list[str]) -> None:
        super().validate(value)
        try:
            validate_tags(value)
        except ValidationFailed as exc:
            raise forms.ValidationError([m for messages in exc.errors.values() for m in messages]) from None


class InstantField(forms.Field):
    """An ISO 8601 date-time with a zone, or a date (start or end of that day, UTC)."""

    def __init__(self, *args: Any, end_of_day: bool = False, **kwargs: Any) -> None:
        self.end_of_day = end_of_day
        super().__init__(*args, **kwargs)

    def to_python(self, value: Any) -> datetime | None:
        if value in (None, ""):
            return None
        text = str(value).strip()
        try:
            day = parse_date(text)
        except ValueError:
            day = None
        if day is not None:
            return _day_bound(day, end=self.end_of_day)
        try:
            parsed = parse_datetime(text.replace("z", "Z").replace(" ", "+"))
        except ValueError:
            parsed = None
        if parsed is None:
            raise forms.ValidationError("Give an ISO 8601 date-time (with a time zone) or a date.")
        if parsed.tzinfo is None:
            raise forms.ValidationError("The date-time must carry a time zone (for example 'Z').")
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is before the first representable instant
            raise forms.ValidationError("The date-time is out of range.") from None


def _day_bound(day: date, *, end: bool) -> datetime:
    # The end of a day is inclusive to the last microsecond of that day (time.max: no
    # arithmetic, so 9999-12-31 works too).
    return datetime.combine(day, time.max if end else time.min, tzinfo=UTC)


class BooleanWordField(forms.Field):
    """Only `true` or `false` (any case); anything else is an error, not silently ignored."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        lowered = str(value).strip().lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        raise forms.ValidationError("Give true or false.")


class StatusField(MultipleChoiceField):
    """Statuses in any letter case (`failed` is `Failed`, as list_calls' --status); an unknown
    one is refused with the valid ones named, not Django's bare "Select a valid choice"."""

    default_error_messages = {
        "invalid_choice": f"status must be one of: {', '.join(ServiceCall.Status.values)} (got %(value)r).",
    }

    def to_python(self, value: Any) -> list[str]:
        canonical = {status.lower(): status for status in ServiceCall.Status.values}
        return [canonical.get(item.strip().lower(), item) for item in super().to_python(value)]


class StatusFilter(django_filters.MultipleChoiceFilter):
    field_class = StatusField


class TagsFilter(django_filters.Filter):
    field_class = TagsField


class InstantFilter(django_filters.Filter):
    field_class = InstantField


class BooleanWordFilter(django_filters.Filter):
    field_class = BooleanWordField


def uuid7_floor(instant: datetime) -> uuid.UUID:
    """The smallest UUID v7 minted at `instant` (ms precision): ids sort by time."""
    ms = max(0, int(instant.timestamp() * 1000))
    return uuid.UUID(int=(ms << 80))


def uuid7_ceiling(instant: datetime) -> uuid.UUID:
    ms = max(0, int(instant.timestamp() * 1000))
    return uuid.UUID(int=(ms << 80) | ((1 << 80) - 1))


class ServiceCallFilter(django_filters.FilterSet):
    """Filters of the call list. Pass `tenant_id` for a tenant's list (the API, the pages):
    tag filters are then uncorrelated IN subqueries on service_call_tags_tag. Without it
    (the operator admin, across tenants) each tag is a correlated EXISTS on the unique
    (tenant_id, service_call_id, tag) index."""

    status = StatusFilter(choices=ServiceCall.Status.choices, method="filter_status")
    tag = TagsFilter(method="filter_tags")
    q = django_filters.CharFilter(method="filter_q", max_length=MAX_QUERY)
    submittedFrom = InstantFilter(method="filter_submitted_from")  # noqa: N815 (wire name)
    submittedTo = InstantFilter(method="filter_submitted_to", end_of_day=True)  # noqa: N815
    dueFrom = InstantFilter(field_name="due_at", lookup_expr="gte")  # noqa: N815
    dueTo = InstantFilter(field_name="due_at", lookup_expr="lte", end_of_day=True)  # noqa: N815
    favorite = BooleanWordFilter(method="filter_favorite")
    scheduleId = django_filters.UUIDFilter(field_name="schedule_id")  # noqa: N815 (wire name)

    class Meta:
        model = ServiceCall
        fields: list[str] = []

    def __init__(self, data=None, queryset=None, *, tenant_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(data, queryset, **kwargs)
        self.tenant_id = tenant_id

    # --- filters -------------------------------------------------------------------------
    def filter_status(self, queryset: QuerySet, name: str, value: list[str]) -> QuerySet:
        if not value:
            return queryset
        return queryset.filter(status__in=value)

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        queryset = super().filter_queryset(queryset)
        # `tag` and `favorite=true` together name the tags a call must all carry.
        required = list(self.form.cleaned_data.get("tag") or [])
        if self.form.cleaned_data.get("favorite") is True:
            required.append(FAVORITE_TAG)
        return self._with_all_tags(queryset, list(dict.fromkeys(required)))

    def filter_tags(self, queryset: QuerySet, name: str, value: list[str]) -> QuerySet:
        return queryset  # applied with favorite=true in filter_queryset

    def filter_favorite(self, queryset: QuerySet, name: str, value: bool | None) -> QuerySet:
        if value is False:
            return queryset.exclude(self._tag_condition(FAVORITE_TAG))
        return queryset  # true: applied with the tags in filter_queryset

    def filter_q(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        value = value.strip()
        return queryset.filter(name__icontains=value) if value else queryset

    def filter_submitted_from(self, queryset: QuerySet, name: str, value: datetime | None) -> QuerySet:
        if value is None:
            return queryset
        # The id bound lets the (tenant_id, service_call_id) index narrow the range; the
        # submitted_at bound is the exact condition.
        return queryset.filter(service_call_id__gte=uuid7_floor(value), submitted_at__gte=value)

    def filter_submitted_to(self, queryset: QuerySet, name: str, value: datetime | None) -> QuerySet:
        if value is None:
            return queryset
        try:
            ceiling = uuid7_ceiling(value + _ID_CLOCK_MARGIN)
        except OverflowError:  # the calendar's last minute: no id bound is needed
            return queryset.filter(submitted_at__lte=value)
        return queryset.filter(service_call_id__lte=ceiling, submitted_at__lte=value)

    def _with_all_tags(self, queryset: QuerySet, tags: list[str]) -> QuerySet:
        if not tags:
            return queryset
        if self.tenant_id is None:
            for tag in tags:
                queryset = queryset.filter(self._tag_condition(tag))
            return queryset
        # One id list for all the tags: the INTERSECT of one index-only SELECT per tag. SQLite
        # then walks that single sorted list newest first and reads only the calls that carry
        # every tag; with a separate IN per tag its planner (once ANALYZE has run) may walk a
        # common tag's whole list and read each of those calls first (measured at 1M calls).
        per_tag = [self._tag_ids(tag) for tag in tags]
        ids = per_tag[0].intersection(*per_tag[1:]) if len(per_tag) > 1 else per_tag[0]
        return queryset.filter(service_call_id__in=ids)

    def _tag_ids(self, tag: str) -> QuerySet:
        # SELECT service_call_id FROM service_call_tags WHERE tenant_id = ? AND tag = ?
        # (answered from index service_call_tags_tag alone).
        return ServiceCallTag.objects.filter(tenant_id=self.tenant_id, tag=tag).values("service_call_id")

    def _tag_condition(self, tag: str) -> Q:
        if self.tenant_id is not None:
            return Q(service_call_id__in=self._tag_ids(tag))
        # Across tenants (the admin): a lookup in the unique (tenant_id, service_call_id, tag).
        return Q(
            Exists(
                ServiceCallTag.objects.filter(
                    tenant_id=OuterRef("tenant_id"),
                    service_call_id=OuterRef("service_call_id"),
                    tag=tag,
                )
            )
        )


def filter_errors(filterset: django_filters.FilterSet) -> dict[str, list[str]]:
    """The FilterSet's form errors as the API's `errors` object."""
    return {name: [str(message) for message in messages] for name, messages in filterset.errors.items()}
