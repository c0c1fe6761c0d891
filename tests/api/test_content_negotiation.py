"""The API's content negotiation: the common Accept headers are answered without DRF's parsing of
them (eventservice.api.base.TenantApiView), with exactly DRF's answer; the rest go to DRF."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from rest_framework.negotiation import DefaultContentNegotiation

from eventservice.api.service_calls import ServiceCallsApi
from tests.support.api import calls_url, valid_payload

ACCEPTS = [
    None,
    "*/*",
    "application/json",
    "application/json; indent=4",
    "application/*",
    "text/html",
    "text/html, */*;q=0.1",
    "application/xml",
    "",
]


def _answer(negotiate):
    try:
        renderer, media_type = negotiate()
    except Exception as exc:  # noqa: BLE001 - the refusal is part of the answer compared
        return type(exc)
    return type(renderer), media_type


@pytest.mark.parametrize("query", ["", "?format=json", "?format=html", "?limit=5"])
@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_api_answers_as_drfs_negotiation(accept, query):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    view = ServiceCallsApi()
    request = view.initialize_request(RequestFactory().get(calls_url() + query, **headers))
    view.format_kwarg = None

    drf = _answer(lambda: DefaultContentNegotiation().select_renderer(request, view.get_renderers(), None))
    ours = _answer(lambda: view.perform_content_negotiation(request))

    assert ours == drf


def test_an_unacceptable_accept_header_is_still_refused_with_406(acme_api):
    response = acme_api.post(calls_url(), valid_payload(), headers={"Accept": "text/html"})

    assert response.status_code == 406
    assert response["Content-Type"] == "application/problem+json"
