"""Every route of the URLconf, with its parameters filled by real ids of tenant acme's objects.

Read from django.urls.get_resolver() (its reverse map: every pattern, named or not, with each
optional part spelled out), so a route added tomorrow is requested by the isolation matrix
and the secrets sweep without anyone listing it. A parameter the filler does not know makes
`fill` raise CannotFill: the test then fails and names the route, rather than skip it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.urls import Resolver404, get_resolver, resolve
from django.utils.regex_helper import normalize

from delivery.models import Notification, Subscription
from schedules.models import Schedule
from tenants.models import Tenant


class CannotFill(Exception):
    pass


@dataclass(frozen=True)
class Route:
    template: str  # "api/tenants/%(tenant_id)s/service-calls", as Django's reverse map spells it
    params: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return self.template.startswith("admin/")

    @property
    def is_api(self) -> bool:
        return self.template.startswith("api/")

    def admin_model(self):
        """The model of an admin route `admin/<app>/<model>/...`, or None."""
        parts = self.template.split("/")
        if not self.is_admin or len(parts) < 3:
            return None
        try:
            return apps.get_model(parts[1], parts[2])
        except (LookupError, ValueError):
            return None


def all_routes() -> list[Route]:
    seen: dict[str, Route] = {}
    _collect(get_resolver(), "", [], seen)
    return sorted(seen.values(), key=lambda route: route.template)


def _collect(resolver, prefix: str, prefix_params: list[str], seen: dict[str, Route]) -> None:
    """Walk a resolver's reverse map, then each namespaced include's (Django keeps those
    apart, under namespace_dict, with the regex prefix they are mounted at)."""
    for _key, entries in resolver.reverse_dict.lists():
        for possibilities, *_ in entries:
            for template, params in possibilities:
                full = prefix + template
                seen.setdefault(full, Route(template=full, params=tuple(prefix_params + list(params))))
    for _namespace, (pattern, sub) in resolver.namespace_dict.items():
        [(sub_prefix, sub_params)] = normalize(pattern)[:1] or [("", [])]
        _collect(sub, prefix + sub_prefix, prefix_params + list(sub_params), seen)


@dataclass
class AcmeObjects:
    """Ids of tenant acme's objects, substituted into routes. `call` appears in URLs;
    `other_call` never does, so its id showing up in a body is always a leak."""

    call: uuid.UUID
    other_call: uuid.UUID
    extra: dict[str, str] = field(default_factory=dict)

    def pk_for(self, model) -> str | None:
        user_model = get_user_model()
        if model is Tenant:
            return "acme"
        if model is user_model:
            return str(user_model.objects.get(username="owner").pk)
        if model._meta.label == "orchestration.ServiceCall":
            return str(self.call)
        if model is Schedule:  # acme may have none: then an id that does not exist
            return _acme_row(Schedule.objects.filter(tenant_id="acme"))
        if model._meta.pk.is_relation and model._meta.pk.related_model is Tenant:
            return "acme"  # one row per tenant, keyed by it (flow control), whether acme has it or not
        names = {f.name for f in model._meta.get_fields()}
        if "service_call" in names:
            row = model.objects.filter(service_call_id=self.call).order_by("pk").first()
            if row is not None:
                return str(row.pk)
        if "tenant" in names:
            row = model.objects.filter(tenant_id="acme").order_by("pk").first()
            if row is not None:
                return str(row.pk)
        if "aggregate_id" in names:
            row = model.objects.filter(aggregate_id=self.call).order_by("pk").first()
            if row is not None:
                return str(row.pk)
        return None


def fill(route: Route, acme: AcmeObjects) -> str:
    """The path of `route` with acme's ids; raises CannotFill."""
    values: dict[str, str] = {}
    for param in route.params:
        values[param] = _value(route, param, acme)
    path = "/" + route.template % values
    try:
        resolve(path)
    except Resolver404:
        raise CannotFill(f"{route.template}: the filled path {path} does not resolve") from None
    return path


# An id no row has: a route of a kind of object acme has none of yet still resolves (and answers 404).
NO_SUCH_ID = "0190a000-0000-7000-8000-000000000000"


def _acme_row(rows) -> str:
    """The id of acme's first such row, or an id that does not exist."""
    row = rows.order_by("pk").first()
    return str(row.pk) if row is not None else NO_SUCH_ID


def _value(route: Route, param: str, acme: AcmeObjects) -> str:
    if param in acme.extra:
        return acme.extra[param]
    if param == "tenant_id":
        return "acme"
    if param == "service_call_id":
        return str(acme.call)
    if param == "subscription_id":
        return _acme_row(Subscription.objects.filter(tenant_id="acme"))
    if param == "notification_id":
        return _acme_row(Notification.objects.filter(subscription__tenant_id="acme"))
    if param == "schedule_id":
        return _acme_row(Schedule.objects.filter(tenant_id="acme"))
    if route.template.startswith("admin/r/"):  # the admin's "view on site" shortcut
        if param == "content_type_id":
            return str(ContentType.objects.get(app_label="orchestration", model="servicecall").pk)
        if param == "object_id":
            return str(acme.call)
    if param == "object_id":
        model = route.admin_model()
        if model is None:
            raise CannotFill(f"{route.template}: no model for object_id")
        pk = acme.pk_for(model)
        if pk is not None:
            return pk
        if not any(f.name in ("tenant", "service_call", "aggregate_id") for f in model._meta.get_fields()):
            # Not tenant data (auth groups, django-q's own tables, worker sessions): the first
            # row if any, else an id that does not exist.
            row = model.objects.order_by("pk").first()
            return str(row.pk) if row is not None else "999999"
        raise CannotFill(f"{route.template}: acme has no {model._meta.label} to fill object_id")
    if param == "id" and route.template.startswith("admin/auth/user/"):
        return str(get_user_model().objects.get(username="owner").pk)
    if param == "app_label":
        return "orchestration"
    if param == "url" and route.template.startswith("admin/"):
        return f"orchestration/servicecall/{acme.call}/change"  # the admin's catch-all
    if route.template.startswith("mock/"):  # the mock target's own knobs
        mock_values = {"rest": "x", "code": "200", "ms": "0"}
        if param in mock_values:
            return mock_values[param]
    raise CannotFill(f"{route.template}: no value for the parameter {param!r}")
