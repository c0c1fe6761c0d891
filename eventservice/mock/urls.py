"""The mock target, mounted at /mock/ by eventservice/urls.py."""

from django.urls import path, re_path

from eventservice.mock import views

app_name = "mock"

urlpatterns = [
    path("", views.index, name="index"),
    # /mock/echo, /mock/echo/ and anything below it.
    re_path(r"^echo(?:/(?P<rest>.*))?$", views.echo, name="echo"),
    path("status/<int:code>", views.status, name="status"),
    path("delay/<int:ms>", views.delay, name="delay"),
    path("json", views.fixed_json, name="json"),
]
