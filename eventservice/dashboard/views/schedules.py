"""The Schedules pages: the current tenant's recurring schedules, a create page with a live
preview of the next runs in the chosen zone (static/js/schedules.js asks the API's preview as
the user types), and a detail page with the recent calls and pause, resume and delete.
Thin: schedules' validation, services and selectors do the work (docs/schedules.md).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import NotFound, ValidationFailed
from core.ids import utcnow
from eventservice.api.throttles import CountedSubmissionThrottle, page_over_ceiling
from eventservice.dashboard.forms import WIRE_FIELDS as REQUEST_WIRE_FIELDS
from eventservice.dashboard.forms import RequestForm, page_message
from eventservice.dashboard.tenancy import tenant_required
from execution.connections import connections_list
from orchestration.services import public_request_spec
from schedules.cron import CronError, dst_preview, jitter_of, next_occurrences, parse_cron, parse_zone, zone_names
from schedules.models import Schedule
from schedules.representation import NEXT_RUNS, next_runs, schedule_state
from schedules.selectors import schedule_calls, schedule_get, schedules_for_tenant, skipped_of
from schedules.services import backfill_plan, schedule_backfill, schedule_create, schedule_delete, schedule_update
from schedules.validation import duration_text, validate_backfill, validate_schedule

# Wire field names (schedules.validation) -> the control that shows the error.
WIRE_FIELDS = {
    **{wire: control for wire, control in REQUEST_WIRE_FIELDS.items() if wire != "dueAt"},
    "cron": "cron",
    "every": "every",
    "timezone": "timezone",
    "startAt": "start_local",
    "endAt": "end_local",
    "paused": "paused",
    "pausedNote": "paused_note",
    "catchupWindow": "catchup_window",
    "jitterMs": "jitter_ms",
    "dstSkipped": "dst_skipped",
    "dstRepeated": "dst_repeated",
    "overlap": "overlap",
}

# The overlap policies as the pages name them (docs/schedules.md, "Overlap").
OVERLAP_CHOICES = [
    ("skip", "skip it"),
    ("bufferOne", "run it when the earlier call ends (one waits at most)"),
    ("allowAll", "run it beside"),
    ("cancelOther", "cancel the earlier calls still waiting, and run it"),
]


class ScheduleForm(RequestForm):
    """The create page: the request page's request (header rows, body, tags) with a cron, a
    zone, an optional window given in that zone, and whether it starts paused."""

    cron = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "30 2 * * *", "spellcheck": "false", "autocomplete": "off"}),
        help_text="Five fields: minute hour day-of-month month day-of-week.",
    )
    every = forms.CharField(
        label="Or every",
        required=False,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "15m", "spellcheck": "false", "autocomplete": "off"}),
        help_text="An interval instead of a cron: 90s, 15m, 6h (at least a minute), from the start (or now).",
    )
    timezone = forms.CharField(
        label="Time zone",
        required=False,
        widget=forms.TextInput(attrs={"list": "zone-names", "spellcheck": "false", "autocomplete": "off"}),
        help_text="An IANA zone, e.g. Europe/Berlin; empty: UTC.",
    )
    start_local = forms.CharField(
        label="Start at",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Optional; in the schedule's zone.",
    )
    end_local = forms.CharField(
        label="End at",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Optional; in the schedule's zone.",
    )
    paused = forms.BooleanField(label="Create it paused", required=False)
    paused_note = forms.CharField(label="Why paused", required=False, max_length=500, strip=True)
    dst_skipped = forms.ChoiceField(
        label="A local time the spring-forward jump skips",
        choices=[("afterJump", "runs right after the jump"), ("skip", "is skipped")],
        initial="afterJump",
        required=False,
    )
    dst_repeated = forms.ChoiceField(
        label="A local time the fall-back repeats",
        choices=[("once", "runs once (its first pass)"), ("twice", "runs on both passes")],
        initial="once",
        required=False,
    )
    overlap = forms.ChoiceField(
        label="When an occurrence falls due while an earlier call is still going",
        choices=OVERLAP_CHOICES,
        initial="skip",
        required=False,
    )
    jitter_ms = forms.IntegerField(
        label="Jitter (ms)",
        required=False,
        min_value=0,
        widget=forms.NumberInput(attrs={"placeholder": "0"}),
        help_text="Each occurrence's call is due up to this much later, by an offset of its own (at most one hour).",
    )
    catchup_window = forms.CharField(
        label="Catch-up window",
        required=False,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "1m", "spellcheck": "false", "autocomplete": "off"}),
        help_text="After the workers were stopped, missed occurrences no older than this run once each; older "
        "ones are skipped. 90s, 15m, 6h or 30d; empty: 1m.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("when", "due_local", "due_at", "tz_offset", "idempotency_key"):
            self.fields.pop(name, None)

    def _instant(self, name: str, zone: str | None) -> str | None:
        """A datetime-local value read in the schedule's zone, as ISO 8601 with its offset."""
        local = (self.cleaned_data.get(name) or "").strip()
        if not local:
            return None
        try:
            naive = datetime.fromisoformat(local)
        except ValueError:
            self.add_error(name, "Give the date and time as YYYY-MM-DDTHH:MM.")
            return None
        if naive.tzinfo is not None or zone is None:
            return naive.isoformat()
        return naive.replace(tzinfo=ZoneInfo(zone)).isoformat()

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        try:
            zone = parse_zone(cleaned.get("timezone") or None)
        except CronError:
            zone = None  # validation names the zone's problem
        cleaned["start_iso"] = self._instant("start_local", zone)
        cleaned["end_iso"] = self._instant("end_local", zone)
        return cleaned

    def wire_data(self) -> dict[str, Any]:
        """The schedule in the API's wire shape, for schedules.validation."""
        data = super().wire_data()
        data.pop("dueAt", None)
        data.pop("idempotencyKey", None)
        cleaned = getattr(self, "cleaned_data", {})
        if cleaned.get("every") and not cleaned.get("cron"):
            data["every"] = cleaned["every"]
        else:
            data["cron"] = cleaned.get("cron") or ""
        if cleaned.get("timezone"):
            data["timezone"] = cleaned["timezone"]
        if cleaned.get("start_iso"):
            data["startAt"] = cleaned["start_iso"]
        if cleaned.get("end_iso"):
            data["endAt"] = cleaned["end_iso"]
        if cleaned.get("paused"):
            data["paused"] = True
        if cleaned.get("paused_note"):
            data["pausedNote"] = cleaned["paused_note"]
        if cleaned.get("catchup_window"):
            data["catchupWindow"] = cleaned["catchup_window"]
        if cleaned.get("jitter_ms") is not None:
            data["jitterMs"] = cleaned["jitter_ms"]
        for field, wire in (("dst_skipped", "dstSkipped"), ("dst_repeated", "dstRepeated"), ("overlap", "overlap")):
            if cleaned.get(field):
                data[wire] = cleaned[field]
        return data

    def add_wire_errors(self, errors: dict[str, list[str]]) -> None:
        for wire_name, field_messages in errors.items():
            field = WIRE_FIELDS.get(wire_name)
            for message in map(page_message, field_messages):
                if field is not None and message in self.errors.get(field, []):
                    continue
                self.add_error(field, message)


class PausedForm(forms.Form):
    paused = forms.TypedChoiceField(choices=[("true", "pause"), ("false", "resume")], coerce=lambda v: v == "true")


def run_rows(runs: list[datetime], zone: str) -> list[dict[str, Any]]:
    """Occurrences as the pages show them: in the schedule's zone (the `date` filter would show
    them in the server's), with the instant in UTC."""
    tz = ZoneInfo(zone)
    rows = []
    for at in runs:
        local = at.astimezone(tz)
        rows.append(
            {
                "at": at,
                "iso": local.isoformat(timespec="seconds"),
                "text": f"{local:%a} {local.day} {local:%b %Y, %H:%M} {local.tzname()}",
                "utc": f"{at:%Y-%m-%d %H:%M} UTC",
            }
        )
    return rows


STATE_BADGES = {"active": "badge-enabled", "paused": "badge-disabled", "ended": "badge-cancelled"}


def _schedule(request: HttpRequest, schedule_id: uuid.UUID) -> Schedule:
    """The current tenant's schedule, else 404 (another tenant's id looks like a missing one)."""
    try:
        return schedule_get(tenant_id=request.tenant.id, schedule_id=schedule_id)
    except NotFound:
        raise Http404("No such schedule.") from None


def _detail_url(schedule: Schedule) -> str:
    return reverse("dashboard:schedule-detail", kwargs={"schedule_id": schedule.schedule_id})


@tenant_required
@require_GET
def schedules_page(request: HttpRequest) -> HttpResponse:
    now = utcnow()
    rows = []
    for schedule in schedules_for_tenant(tenant_id=request.tenant.id):
        runs = next_runs(schedule, now=now, count=1)
        rows.append(
            {
                "schedule": schedule,
                "state": schedule_state(schedule, runs),
                "badge": STATE_BADGES[schedule_state(schedule, runs)],
                "next": run_rows(runs, schedule.timezone)[0] if runs else None,
                "skipped": skipped_of(schedule)[0],
            }
        )
    return render(request, "dashboard/schedules.html", {"rows": rows})


def _preview(form: ScheduleForm) -> list[dict[str, Any]]:
    """The next runs of what the form holds, for a page shown again without JavaScript."""
    data = getattr(form, "cleaned_data", {})
    try:
        cron, zone = parse_cron(data.get("cron")), parse_zone(data.get("timezone") or None)
    except CronError:
        return []
    return run_rows(next_occurrences(cron, zone, after=utcnow(), count=NEXT_RUNS), zone)


def _new_page(request: HttpRequest, form: ScheduleForm, *, status: int = 200) -> HttpResponse:
    context = {
        "form": form,
        "zone_names": sorted(zone_names()),
        "preview": _preview(form) if form.is_bound else [],
        "preview_url": reverse("api:schedule-preview", kwargs={"tenant_id": request.tenant.id}),
        "connection_names": [c.name for c in connections_list(tenant_id=request.tenant.id)],
    }
    return render(request, "dashboard/schedule_new.html", context, status=status)


@never_cache
@tenant_required
@require_http_methods(["GET", "POST"])
def schedule_new(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _new_page(request, ScheduleForm(initial={"method": "GET"}))
    form = ScheduleForm(request.POST, header_rows=ScheduleForm.rows_from(request.POST))
    parsed = form.is_valid()
    try:
        data = validate_schedule(form.wire_data())
    except ValidationFailed as exc:
        form.add_wire_errors(exc.errors)
        return _new_page(request, form, status=400)
    if not parsed:
        return _new_page(request, form, status=400)
    try:
        schedule = schedule_create(tenant_id=request.tenant.id, data=data, correlation_id=request.correlation_id)
    except ValidationFailed as exc:  # the tenant's limit of schedules
        form.add_wire_errors(exc.errors)
        return _new_page(request, form, status=400)
    messages.success(request, f"Schedule “{schedule.name}” created.")
    return HttpResponseRedirect(_detail_url(schedule))


@never_cache
@tenant_required
@require_GET
def schedule_detail(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    schedule = _schedule(request, schedule_id)
    runs = next_runs(schedule)
    context = {
        "schedule": schedule,
        "state": schedule_state(schedule, runs),
        "badge": STATE_BADGES[schedule_state(schedule, runs)],
        "runs": [
            {**row, "late_s": jitter_of(schedule.schedule_id, row["at"], schedule.jitter_ms).total_seconds()}
            for row in run_rows(runs, schedule.timezone)
        ],
        "last_occurrence": run_rows([schedule.last_occurrence_at], schedule.timezone)[0]
        if schedule.last_occurrence_at
        else None,
        "spec": public_request_spec(schedule.request_spec),
        "catchup_window": duration_text(schedule.catchup_window_s),
        "skipped": skipped_of(schedule),
        "overlap": dict(OVERLAP_CHOICES)[schedule.overlap],
        "overlap_choices": OVERLAP_CHOICES,
        "jitter_s": schedule.jitter_ms / 1000,
        "dst": None
        if schedule.every_s
        else dst_preview(
            schedule.cron, schedule.timezone, after=utcnow(), start_at=schedule.start_at, end_at=schedule.end_at
        ),
        # Each call with its occurrence as the schedule's zone shows it.
        "calls": [
            (call, run_rows([call.occurrence_at], schedule.timezone)[0]) for call in schedule_calls(schedule=schedule)
        ],
    }
    return render(request, "dashboard/schedule_detail.html", context)


@tenant_required
@require_POST
def schedule_paused(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    schedule = _schedule(request, schedule_id)
    form = PausedForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose to pause or to resume the schedule.")
        return HttpResponseRedirect(_detail_url(schedule))
    paused = form.cleaned_data["paused"]
    note = request.POST.get("note", "").strip() if paused else ""
    try:
        # The note is checked as the API checks pausedNote.
        data = validate_schedule({"paused": paused, **({"pausedNote": note} if note else {})}, partial=True)
        schedule_update(
            tenant_id=request.tenant.id,
            schedule_id=schedule.schedule_id,
            data=data,
            correlation_id=request.correlation_id,
        )
    except NotFound:
        raise Http404("No such schedule.") from None
    except ValidationFailed as exc:
        messages.error(request, "Not paused. " + " ".join(m for found in exc.errors.values() for m in found))
        return HttpResponseRedirect(_detail_url(schedule))
    if paused:
        messages.success(request, "Schedule paused: its next call was cancelled and no more are made.")
    else:
        messages.success(request, "Schedule resumed: its next run is planned from now.")
    return HttpResponseRedirect(_detail_url(schedule))


@tenant_required
@require_http_methods(["GET", "POST"])
def schedule_delete_view(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    """GET: the confirmation step; POST: delete it (its calls stay)."""
    schedule = _schedule(request, schedule_id)
    if request.method == "GET":
        return render(request, "dashboard/schedule_delete.html", {"schedule": schedule})
    try:
        schedule_delete(
            tenant_id=request.tenant.id, schedule_id=schedule.schedule_id, correlation_id=request.correlation_id
        )
    except NotFound:
        raise Http404("No such schedule.") from None
    messages.success(request, f"Schedule “{schedule.name}” deleted; the calls it made stay.")
    return HttpResponseRedirect(reverse("dashboard:schedules"))


@tenant_required
@require_POST
def schedule_backfill_view(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    """Run a past range of the schedule's occurrences again (docs/schedules.md, "Backfill"): the
    range typed in the schedule's zone, checked and made as for the API, charged alike."""
    schedule = _schedule(request, schedule_id)
    zone = ZoneInfo(schedule.timezone)
    instants = {}
    for name in ("from", "to"):
        try:
            instants[name] = datetime.fromisoformat(request.POST.get(name, "")).replace(tzinfo=zone).isoformat()
        except ValueError:
            messages.error(request, f"Nothing was run: give {name} as a date and time.")
            return HttpResponseRedirect(_detail_url(schedule))
    if request.POST.get("overlap"):
        instants["overlap"] = request.POST["overlap"]
    try:
        start, end, overlap = validate_backfill(instants)
        plan = backfill_plan(tenant_id=request.tenant.id, schedule_id=schedule.schedule_id, start=start, end=end)
    except ValidationFailed as exc:
        messages.error(request, "Nothing was run. " + " ".join(m for found in exc.errors.values() for m in found))
        return HttpResponseRedirect(_detail_url(schedule))
    over = page_over_ceiling(CountedSubmissionThrottle, request, request.tenant.id, count=len(plan))
    if over:
        messages.error(request, f"Nothing was run. {over}")
        return HttpResponseRedirect(_detail_url(schedule))
    done = schedule_backfill(
        tenant_id=request.tenant.id, schedule_id=schedule.schedule_id, instants=plan, overlap=overlap
    )
    messages.success(
        request,
        f"{len(done.made)} occurrence(s) of the range run now; {len(done.existing)} had their call already.",
    )
    return HttpResponseRedirect(_detail_url(schedule))
