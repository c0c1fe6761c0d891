from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("mock/", include("eventservice.mock.urls")),
    path("", include("eventservice.api.urls")),
    path("", include("eventservice.dashboard.urls")),
]
