"""GET /api/docs/: Swagger UI that works offline (every asset is our own static file)."""

from __future__ import annotations

import re

from django.contrib.staticfiles import finders
from django.test import Client


def test_the_docs_page_loads_only_local_static_assets(db):
    response = Client().get("/api/docs/")

    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert any(a.endswith("swagger-ui.css") for a in assets)
    for asset in assets:
        assert asset.startswith("/static/"), f"non-local asset {asset}"
        assert finders.find(asset.removeprefix("/static/")), f"missing static file {asset}"
    assert not re.search(r"https?://(?!testserver)", html.split("<script>")[0])
    assert "/api/schema/" in html


def test_the_swagger_assets_are_served(db, settings):
    settings.WHITENOISE_USE_FINDERS = True
    settings.WHITENOISE_AUTOREFRESH = True
    response = Client().get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert response.status_code == 200
    assert b"SwaggerUI" in b"".join(response.streaming_content)


def test_the_docs_without_a_slash_redirect_to_the_page(db):
    response = Client().get("/api/docs")
    assert response.status_code == 301 and response["Location"] == "/api/docs/"
