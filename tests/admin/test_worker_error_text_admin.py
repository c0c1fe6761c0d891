"""Worker sessions' and loop runs' error texts in the admin: shown to superusers only, and not
to be read back through the changelist's URL filters, search or ordering either
(docs/security.md §5)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Permission

from workers.models import LoopRun, WorkerSession
from workers.services import RunRecorder, session_start, session_stop

# A database error quotes the row it failed on: another tenant's id.
WORKER_ERROR = "duplicate key value violates unique constraint; Key (tenant_id, idempotency_key)=(acme, k-1)"
LOOKUPS = ("exact", "iexact", "startswith", "istartswith", "contains", "icontains", "regex", "iregex", "endswith")
PAGES = {
    "/admin/workers/looprun/": ("error_message", "session__error_message"),
    "/admin/workers/workersession/": ("error_message", "runs__error_message"),
}


@pytest.fixture
def failed_worker(db):
    session = session_start()
    recorder = RunRecorder(session_id=session.id)
    recorder.record("dispatch", started=time.monotonic(), items=1, error=RuntimeError(WORKER_ERROR))
    recorder.flush(force=True)
    session_stop(session_id=session.id, error=RuntimeError(WORKER_ERROR))
    assert LoopRun.objects.filter(error_message__contains="(acme, k-1)").exists()
    assert WorkerSession.objects.filter(error_message__contains="(acme, k-1)").exists()
    return session


@pytest.fixture
def scoped_staff(client, world):
    """staffglobex holding every permission there is, still not a superuser."""
    world.staff_globex.user_permissions.set(Permission.objects.all())
    client.force_login(world.staff_globex)
    return client


@pytest.mark.parametrize("page", PAGES)
def test_it_refuses_filters_on_the_error_text_to_scoped_staff(page, scoped_staff, failed_worker):
    for field in PAGES[page]:
        for lookup in LOOKUPS:
            # A right and a wrong guess answer alike: both refused.
            for guess in ("duplicate", "nothing-like-it"):
                url = f"{page}?{field}__{lookup}={guess}"
                assert scoped_staff.get(url).status_code == 400, url
        assert scoped_staff.get(f"{page}?{field}=x").status_code == 400


@pytest.mark.parametrize("page", PAGES)
def test_search_and_ordering_do_not_reach_the_error_text_for_scoped_staff(page, scoped_staff, failed_worker):
    # A right and a wrong guess find the same rows (none, or all where the list has no search).
    right, wrong = (scoped_staff.get(f"{page}?q={guess}") for guess in ("duplicate", "nothing-like-it"))
    assert right.status_code == wrong.status_code == 200
    assert right.context["cl"].result_count == wrong.context["cl"].result_count
    # Every column index the list offers, ascending and descending: none orders by the text.
    columns = len(scoped_staff.get(page).context["cl"].list_display)
    for index in range(columns + 2):
        for order in (str(index), f"-{index}"):
            response = scoped_staff.get(f"{page}?o={order}")
            assert response.status_code == 200
            ordering = response.context["cl"].queryset.query.order_by
            assert not any("error_message" in str(term) for term in ordering), (page, order, ordering)


@pytest.mark.parametrize("page", PAGES)
def test_a_superuser_still_filters_by_the_error_text(page, admin_client, failed_worker):
    found = admin_client.get(f"{page}?error_message__contains=(acme, k-1)")
    assert found.status_code == 200 and found.context["cl"].result_count == 1
    missed = admin_client.get(f"{page}?error_message__contains=nothing-like-it")
    assert missed.status_code == 200 and missed.context["cl"].result_count == 0
