"""The batch page (docs/api.md, "Batches"): pasted or uploaded `{"calls": [...]}`, each item
accepted or refused on its own, a line per item in order; a body that is no batch is said and
stores nothing; the calls are the current tenant's."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from orchestration.models import ServiceCall


@pytest.fixture
def owner(client, world):
    client.force_login(world.owner)
    return client


def _item(name: str, **extra) -> dict:
    return {"name": name, "requestSpec": {"method": "POST", "url": "https://api.example.com/x"}, **extra}


def test_a_pasted_batch_with_good_and_bad_items_answers_each_in_order(owner, world):
    batch = {"calls": [_item("one"), _item("two", dueAt="not a date"), _item("three", tags=["b"])]}
    page = owner.post("/calls/batch/", {"batch": json.dumps(batch)})
    text = page.content.decode()
    assert page.status_code == 200
    assert "<strong>2</strong> accepted, <strong>1</strong> refused, of 3." in text
    assert text.index("one") < text.index("dueAt:") < text.index("three")
    assert sorted(ServiceCall.objects.filter(tenant_id="acme").values_list("name", flat=True)) == ["one", "three"]


def test_an_uploaded_file_is_taken_and_a_non_batch_stores_nothing(owner, world):
    upload = SimpleUploadedFile("calls.json", json.dumps({"calls": [_item("filed")]}).encode(), "application/json")
    assert "<strong>1</strong> accepted" in owner.post("/calls/batch/", {"file": upload}).content.decode()
    for body in ("not json", json.dumps({"calls": []}), json.dumps({"calls": [_item("x")] * 101}), "[" * 5000):
        page = owner.post("/calls/batch/", {"batch": body})
        assert page.status_code == 400 and "Nothing was submitted" in page.content.decode()
    assert ServiceCall.objects.count() == 1
