"""The exception handler: every API error is RFC 7807 problem+json with the correlation id."""

from __future__ import annotations

import pytest

from eventservice.api import service_calls
from tests.support.api import assert_problem, calls_url


def test_an_unexpected_error_is_a_500_problem_that_reveals_nothing(acme_api, monkeypatch, caplog):
    def broken(**kwargs):
        raise RuntimeError("db password is hunter2 at /srv/secret.py")

    monkeypatch.setattr(service_calls, "service_calls_for_tenant", broken)

    response = acme_api.get(calls_url(), headers={"X-Correlation-Id": "trace-500"})

    body = assert_problem(response, 500)
    assert body["correlationId"] == "trace-500"
    assert "hunter2" not in response.content.decode() and "secret.py" not in response.content.decode()
    assert "Traceback" not in response.content.decode()
    assert any("hunter2" in (record.exc_text or "") or record.exc_info for record in caplog.records)


def test_an_unknown_api_path_is_a_404_problem(acme_api):
    body = assert_problem(acme_api.get("/api/tenants/acme/nothing-here"), 404)
    assert body["type"].endswith("not-found")
    assert_problem(acme_api.get("/api/"), 404)


def test_a_method_the_resource_does_not_have_is_405(acme_api):
    response = acme_api.client.delete(calls_url(), headers={"Authorization": f"Bearer {acme_api.key}"})
    assert_problem(response, 405)


@pytest.mark.parametrize("incoming", [None, "abc-123", "x" * 65, "has space"])
def test_every_error_carries_the_correlation_id_header_and_body(anonymous_api, world, incoming):
    headers = {"X-Correlation-Id": incoming} if incoming else {}
    response = anonymous_api.get(calls_url(), headers=headers)

    body = assert_problem(response, 401)
    if incoming == "abc-123":
        assert response["X-Correlation-Id"] == "abc-123"
    else:
        assert response["X-Correlation-Id"] != incoming
    assert body["correlationId"] == response["X-Correlation-Id"]


def test_problem_type_title_and_detail_name_the_error(acme_api, world):
    body = assert_problem(acme_api.post(calls_url(), {"name": ""}), 400)
    assert body["type"] == "urn:service-agent:problem:validation-error"
    assert body["title"] == "Invalid input"
    assert set(body["errors"]) >= {"name", "requestSpec"}
