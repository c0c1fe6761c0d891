from django.contrib import admin
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's, the API's JSON)."""
    return HttpResponsePermanentRedirect(static("img/favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("admin/", admin.site.urls),
    path("mock/", include("eventservice.mock.urls")),
    path("", include("eventservice.api.urls")),
    path("", include("eventservice.dashboard.urls")),
]

# The dashboard's error pages; /api/ keeps problem+json and /admin/ the admin's look
# (eventservice/dashboard/views/errors.py).
handler400 = "eventservice.dashboard.views.errors.bad_request"
handler404 = "eventservice.dashboard.views.errors.page_not_found"
handler403 = "eventservice.dashboard.views.errors.permission_denied"
handler500 = "eventservice.dashboard.views.errors.server_error"
