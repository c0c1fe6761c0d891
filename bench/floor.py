"""The POST floor: the least a POST on the product's stack costs, served beside its API.

A plain Django view behind the product's settings and middleware (bench/floor_settings.py
changes only ROOT_URLCONF, to this module: the project's URLs plus this view), under the same
gunicorn command line as the product's API. It authenticates the caller exactly as the API
does (tenants.authentication.ApiKeyAuthentication and eventservice.api.base.caller_may_act_for,
the same classes and functions, keys remembered per process the same way), parses the JSON
body, inserts one row into `bench_floor` (a table the bench makes with raw SQL in its scratch
database) in one transaction, and answers 202 with a tiny JSON body. No validation, no
service-call model, no events, no timer, no DRF request/response handling: what the API's
POST does beyond this is what its ratio to the floor prices.
"""

from __future__ import annotations

import json
import time

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from rest_framework import exceptions

from core.ids import new_id
from eventservice.api.base import caller_may_act_for
from eventservice.urls import handler403, handler404, handler500  # noqa: F401 (this URLconf's error pages)
from eventservice.urls import urlpatterns as project_urlpatterns
from tenants.authentication import ApiKeyAuthentication

TABLE = "bench_floor"
PATH = "bench/floor/tenants/<str:tenant_id>/service-calls"

_authentication = ApiKeyAuthentication()


def create_table() -> None:
    """The floor's table in the bench's database (SQLite or PostgreSQL: the same SQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} ("
            "id varchar(32) PRIMARY KEY, tenant_id varchar(100) NOT NULL, "
            "body text NOT NULL, created_at double precision NOT NULL)"
        )


def rows(tenant_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE tenant_id = %s", [tenant_id])
        return cursor.fetchone()[0]


def _problem(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"status": status, "detail": detail}, status=status, content_type="application/problem+json")


@csrf_exempt  # as DRF's APIView: an API key is no browser session
@require_POST
def floor(request: HttpRequest, tenant_id: str) -> JsonResponse:
    try:
        found = _authentication.authenticate(request)
    except exceptions.APIException as exc:
        return _problem(exc.status_code, str(exc.detail))
    if found is None:
        return _problem(401, "Authentication credentials were not provided.")
    if not caller_may_act_for(found[0], tenant_id):
        return _problem(404, f"Tenant {tenant_id!r} not found.")
    try:
        body = json.loads(request.body)
    except ValueError:
        return _problem(400, "The body is not JSON.")
    if not isinstance(body, dict):
        return _problem(400, "The body must be a JSON object.")
    row_id = new_id().hex
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (id, tenant_id, body, created_at) VALUES (%s, %s, %s, %s)",
            [row_id, tenant_id, request.body.decode(), time.time()],
        )
    return JsonResponse({"id": row_id, "status": "accepted"}, status=202)


urlpatterns = [path(PATH, floor, name="bench-floor"), *project_urlpatterns]
