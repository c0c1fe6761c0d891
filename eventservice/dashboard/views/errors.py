"""The site's error pages (handler400, handler404, handler403 and handler500 in
eventservice/urls.py).

The dashboard's extend the site's base page: its navigation and a way back. Paths under /api/
keep answering problem+json (docs/api.md, 'Errors') even for an error raised outside the API's
views, and paths under /admin/ keep the admin's own look. The 500 page reads nothing from the
database (the failure may be the database): it is rendered without the request's context.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.views import defaults

from eventservice.api.errors import PROBLEM_CONTENT_TYPE, problem_body
from eventservice.dashboard.tenancy import resolve_tenant


def _under(request: HttpRequest, prefix: str) -> bool:
    path = request.path_info
    return path == prefix or path.startswith(prefix + "/")


def _problem(request: HttpRequest, *, status: int, slug: str, title: str, detail: str) -> JsonResponse:
    body = problem_body(
        slug=slug,
        title=title,
        status_code=status,
        detail=detail,
        correlation_id=getattr(request, "correlation_id", None),
    )
    return JsonResponse(body, status=status, content_type=PROBLEM_CONTENT_TYPE)


def _admin_page(request: HttpRequest, template: str, *, status: int) -> HttpResponse:
    return render(request, template, admin.site.each_context(request), status=status)


def _site_page(request: HttpRequest, template: str, *, status: int) -> HttpResponse:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and not hasattr(request, "tenants"):
        resolve_tenant(request)  # the header's tenant name and switcher, as on every page
    return render(request, template, status=status)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """A request Django refuses before any view (a Host header it does not allow, a suspicious
    operation): problem+json under /api/, Django's own page elsewhere. Nothing of the request
    is read: its host is what may be wrong."""
    if _under(request, "/api"):
        # The type the API's own views give a SuspiciousOperation (eventservice/api/errors.py).
        return _problem(
            request,
            status=400,
            slug="malformed-request",
            title="Malformed request",
            detail="The request was refused as malformed.",
        )
    return defaults.bad_request(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _under(request, "/api"):
        return _problem(
            request, status=404, slug="not-found", title="Not found", detail="There is no API resource at this path."
        )
    if _under(request, "/admin"):
        return _admin_page(request, "admin/404.html", status=404)
    return _site_page(request, "404.html", status=404)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _under(request, "/api"):
        return _problem(
            request, status=403, slug="forbidden", title="Forbidden", detail="You may not perform this action."
        )
    if _under(request, "/admin"):
        return _admin_page(request, "admin/403.html", status=403)
    return _site_page(request, "403.html", status=403)


def server_error(request: HttpRequest) -> HttpResponse:
    if _under(request, "/api"):
        return _problem(
            request,
            status=500,
            slug="internal-error",
            title="Internal server error",
            detail="An unexpected error occurred; quote the correlation id when reporting it.",
        )
    # No request context: its processors would read the session and the user from the database.
    return HttpResponseServerError(
        loader.get_template("500.html").render({"correlation_id": getattr(request, "correlation_id", "")})
    )
