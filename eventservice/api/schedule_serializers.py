"""Serializers that describe the schedule API's wire shapes in the OpenAPI schema.

Input is checked by schedules.validation (one validator for the API, the pages, the admin and
the commands) and output is built by schedules.representation; these classes document those
shapes for drf-spectacular, and tests/api/test_schedules_schema.py keeps them equal to what
the builders emit.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.text import hidden_class, name_pattern
from eventservice.api import service_call_serializers as s
from orchestration.models import OVERLAP_POLICIES
from schedules.cron import DST_REPEATED, DST_SKIPPED
from schedules.representation import State
from schedules.validation import MAX_PAUSED_NOTE

NAME_PATTERN = name_pattern()


@extend_schema_field({"type": "string", "pattern": rf"^[^{hidden_class()}]*$", "maxLength": MAX_PAUSED_NOTE})
class PausedNoteField(serializers.Field):
    """A note: empty, or text with no control or invisible character (schedules.validation)."""


CRON_HELP = (
    "Five fields, minute hour day-of-month month day-of-week (cron syntax, names and ranges allowed), "
    "evaluated in `timezone`. Six fields (seconds) are refused: the shortest interval is a minute."
)
OVERLAP_HELP = (
    "When an occurrence falls due while an earlier call of the schedule is still going (Running, or waiting for "
    "a retry): `skip` it (default), `bufferOne` (it runs once nothing is going; one waits at most, a second is "
    "skipped), `allowAll` (it runs beside), `cancelOther` (the earlier calls still Scheduled are cancelled; a "
    "Running one finishes its attempt)."
)
ZONE_HELP = "An IANA time zone name (`Europe/Berlin`); default `UTC`. DST follows Debian cron's rules."


class SchedulePoliciesSerializer(serializers.Serializer):
    """The policies a create and a PATCH take alike (docs/schedules.md)."""

    catchupWindow = serializers.RegexField(
        r"^[0-9]{1,7}[smhd]$",
        required=False,
        help_text="Missed occurrences no older than this run once each, oldest first; older ones are skipped "
        "(`90s`, `15m`, `6h`, `30d`; default `1m`, at most `30d`).",
    )
    pausedNote = PausedNoteField(required=False, allow_null=True, help_text="Why it is paused (with `paused: true`).")
    dstSkipped = serializers.ChoiceField(
        choices=DST_SKIPPED,
        required=False,
        help_text="A local time the spring-forward jump skips: run right after the jump (default) or skip it.",
    )
    dstRepeated = serializers.ChoiceField(
        choices=DST_REPEATED,
        required=False,
        help_text="A local time the fall-back repeats: run on its first pass (default) or on both.",
    )
    overlap = serializers.ChoiceField(choices=OVERLAP_POLICIES, required=False, help_text=OVERLAP_HELP)
    jitterMs = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=3_600_000,
        help_text="Each occurrence's call is due up to this much later, by an offset of its own, the same on every "
        "cluster (default 0).",
    )


class CreateScheduleSerializer(SchedulePoliciesSerializer):
    name = serializers.RegexField(NAME_PATTERN, max_length=200)
    cron = serializers.CharField(max_length=120, required=False, help_text=CRON_HELP + " Or give `every`.")
    every = serializers.RegexField(
        r"^[0-9]{1,7}[smhd]$",
        required=False,
        help_text="An interval schedule instead of a cron: `90s`, `15m`, `6h` (at least a minute), anchored at "
        "startAt (else the creation), in real time.",
    )
    timezone = serializers.CharField(required=False, max_length=64, help_text=ZONE_HELP)
    requestSpec = s.RequestSpecSerializer(help_text="The request every occurrence sends, as a call's.")
    tags = serializers.ListField(
        child=serializers.RegexField(s.TAG_PATTERN, max_length=64), required=False, max_length=20
    )
    retryPolicy = s.RetryPolicySerializer(required=False, allow_null=True)
    startAt = serializers.DateTimeField(
        required=False, allow_null=True, help_text="No occurrence before it (at most one year ahead)."
    )
    endAt = serializers.DateTimeField(
        required=False, allow_null=True, help_text="No occurrence after it; in the future, after startAt."
    )
    paused = serializers.BooleanField(required=False, help_text="Created paused: it makes no call until resumed.")


class UpdateScheduleSerializer(SchedulePoliciesSerializer):
    """What a PATCH may change; an absent field stays as it is, null clears startAt, endAt and
    retryPolicy."""

    name = serializers.RegexField(NAME_PATTERN, max_length=200, required=False)
    cron = serializers.CharField(max_length=120, required=False, help_text=CRON_HELP)
    every = serializers.RegexField(r"^[0-9]{1,7}[smhd]$", required=False, help_text="An interval instead of the cron.")
    timezone = serializers.CharField(required=False, max_length=64, help_text=ZONE_HELP)
    requestSpec = s.RequestSpecSerializer(required=False)
    tags = serializers.ListField(
        child=serializers.RegexField(s.TAG_PATTERN, max_length=64), required=False, max_length=20
    )
    retryPolicy = s.RetryPolicySerializer(required=False, allow_null=True)
    startAt = serializers.DateTimeField(required=False, allow_null=True)
    endAt = serializers.DateTimeField(required=False, allow_null=True)
    paused = serializers.BooleanField(
        required=False, help_text="true pauses (the call made ahead is cancelled); false resumes from now."
    )


class ScheduleRunSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The occurrence in UTC.")
    local = serializers.CharField(help_text="The same instant in the schedule's zone, with its offset.")
    zoneName = serializers.CharField(help_text="The zone's abbreviation then, as the zone database has it (`IST`).")
    dueAt = serializers.DateTimeField(
        required=False, help_text="When its call is due, when later than the occurrence (the schedule's jitter)."
    )


class ScheduleLinksSerializer(serializers.Serializer):
    self = serializers.URLField()


class ScheduleSerializer(serializers.Serializer):
    scheduleId = serializers.UUIDField()
    tenantId = serializers.CharField()
    name = serializers.CharField()
    cron = serializers.CharField(allow_null=True, help_text="The cron (null for an interval schedule).")
    every = serializers.CharField(allow_null=True, help_text="The interval (null for a cron schedule).")
    timezone = serializers.CharField()
    requestSpec = s.RequestSpecSerializer(help_text="Secret header values are `***`.")
    tags = serializers.ListField(child=serializers.CharField())
    retryPolicy = s.RetryPolicySerializer(allow_null=True)
    startAt = serializers.DateTimeField(allow_null=True)
    endAt = serializers.DateTimeField(allow_null=True)
    paused = serializers.BooleanField()
    # Not an enum: a second choice set for a field named `state` (beside a delivery's) would make
    # drf-spectacular invent hashed enum names.
    state = serializers.CharField(
        help_text=f"`{State.ACTIVE}`, `{State.PAUSED}` or `{State.ENDED}` (no occurrence is left)."
    )
    nextRun = ScheduleRunSerializer(allow_null=True, help_text="The next occurrence that runs (null: none).")
    lastOccurrenceAt = serializers.DateTimeField(
        allow_null=True,
        help_text="Its latest occurrence that has come and has its call (null until the first comes); the next "
        "one, made ahead, is nextRun.",
    )
    pausedNote = serializers.CharField(allow_null=True, help_text="Why it is paused (null: no note, or not paused).")
    catchupWindow = serializers.CharField(help_text="How old a missed occurrence may be and still run.")
    jitterMs = serializers.IntegerField(help_text="Each occurrence's call is due up to this much later.")
    dstSkipped = serializers.CharField(help_text="`afterJump` or `skip`.")
    dstRepeated = serializers.CharField(help_text="`once` or `twice`.")
    overlap = serializers.CharField(help_text="`skip`, `bufferOne`, `allowAll` or `cancelOther`.")
    skippedCount = serializers.IntegerField(help_text="Occurrences skipped and never run.")
    skippedByReason = serializers.DictField(
        child=serializers.IntegerField(), help_text="The same, by reason (`catchupWindow`, `dstSkipped`, `overlap`)."
    )
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    links = ScheduleLinksSerializer()


class ScheduleDetailSerializer(ScheduleSerializer):
    nextRuns = ScheduleRunSerializer(many=True, help_text="The next five occurrences (none while paused).")
    nextDstTransition = serializers.JSONField(
        allow_null=True,
        help_text="What each DST choice does on the zone's next transition: {at, kind, choice, runs} as the preview's "
        "(null: none within a year, no difference, or an interval schedule).",
    )
    recentCalls = s.ServiceCallSerializer(many=True, help_text="Its latest calls, latest occurrence first (20).")


class SchedulePageSerializer(serializers.Serializer):
    results = ScheduleSerializer(many=True)
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)


class DstTransitionSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="When the zone's offset changes.")
    kind = serializers.ChoiceField(choices=["springForward", "fallBack"])
    choice = serializers.ChoiceField(choices=["dstSkipped", "dstRepeated"], help_text="The choice it concerns.")
    runs = serializers.DictField(
        child=ScheduleRunSerializer(many=True), help_text="The runs within a day of it, under each value of the choice."
    )


class PreviewSerializer(serializers.Serializer):
    cron = serializers.CharField(help_text="The cron, normalised.")
    timezone = serializers.CharField()
    nextRuns = ScheduleRunSerializer(many=True)
    nextDstTransition = DstTransitionSerializer(
        allow_null=True, help_text="What each DST choice does on the zone's next transition (null: no difference)."
    )


# `from` is a Python keyword: the class is made with its fields named as on the wire.
BackfillInputSerializer = type(
    "BackfillInputSerializer",
    (serializers.Serializer,),
    {
        "from": serializers.DateTimeField(help_text="The range's first instant."),
        "to": serializers.DateTimeField(help_text="The range's last instant (not in the future)."),
        "overlap": serializers.ChoiceField(
            choices=OVERLAP_POLICIES,
            required=False,
            help_text="The overlap policy of the backfill's calls, instead of the schedule's.",
        ),
    },
)


class BackfillCallSerializer(serializers.Serializer):
    serviceCallId = serializers.UUIDField()
    occurrenceAt = serializers.DateTimeField()
    status = serializers.CharField()
    made = serializers.BooleanField(help_text="Made by this backfill (false: the occurrence had its live call).")


class BackfillSerializer(serializers.Serializer):
    made = serializers.IntegerField(help_text="Calls made now, due at once.")
    alreadyMade = serializers.IntegerField(help_text="Occurrences that had their live call already.")
    calls = BackfillCallSerializer(many=True, help_text="One per occurrence of the range, in order.")
