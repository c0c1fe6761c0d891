"""Concurrent submissions of one process share a transaction (core.db.group_commit), and each
still gets what it would have got alone: its own call, its own error, nothing of a write that
failed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from core import db
from core.db import GROUP_COMMIT_MAX, group_commit
from orchestration.models import ServiceCall, ServiceCallTag
from orchestration.services import service_call_submit
from outbox.models import OutboxEvent
from tenants.models import ApiKey, Tenant
from tests.support.factories import make_submission, make_tenant
from timer.models import TimerSchedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.also_postgres]


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """The size of every transaction the writes shared (a spy: the real _commit runs)."""
    sizes: list[int] = []
    real = db._GroupCommit._commit

    def spy(batch):
        sizes.append(len(batch))
        return real(batch)

    monkeypatch.setattr(db._GroupCommit, "_commit", staticmethod(spy))
    return sizes


def _queued(count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(db._group_commit._queue) < count:
        assert time.monotonic() < deadline, "the writes never queued"
        time.sleep(0.001)


def _concurrently(monkeypatch, calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call in its own thread. The first one's write holds its transaction open until the
    others have all queued their writes behind it: they then share the transactions after it."""
    results: list[Any] = [None] * len(calls)
    entered, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    real_run = db._group_commit.run

    def run(work: Callable[[], Any]) -> Any:
        if threading.current_thread() is not threads[0]:
            return real_run(work)

        def held() -> Any:
            entered.set()
            release.wait(10)
            return work()

        return real_run(held)

    def call(index: int) -> None:
        try:
            results[index] = calls[index]()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[index] = exc
        finally:
            connection.close()

    monkeypatch.setattr(db._group_commit, "run", run)
    threads.extend(threading.Thread(target=call, args=(i,)) for i in range(len(calls)))
    threads[0].start()
    assert entered.wait(10)
    for thread in threads[1:]:
        thread.start()
    _queued(len(calls) - 1)
    release.set()
    for thread in threads:
        thread.join(20)
    return results


def _tenant(slug: str) -> Callable[[], str]:
    """A call that writes one tenant through group_commit."""

    def work() -> str:
        Tenant.objects.create(id=slug, name=slug)
        return slug

    return lambda: group_commit(work)


def test_submissions_of_many_threads_share_transactions_and_each_gets_its_own_call(monkeypatch, batches):
    make_tenant("acme")
    count = 12
    submissions = [make_submission(name=f"call-{i}", tags=[f"t{i}"]) for i in range(count)]

    def submit(index: int) -> Callable[[], Any]:
        return lambda: service_call_submit(
            tenant_id="acme", submission=submissions[index], correlation_id=f"corr-{index}"
        )

    results = _concurrently(monkeypatch, [submit(i) for i in range(count)])

    assert not [r for r in results if isinstance(r, Exception)], results
    for index, (call, created) in enumerate(results):
        assert created is True
        stored = ServiceCall.objects.get(pk=call.service_call_id)
        assert (stored.name, stored.correlation_id) == (f"call-{index}", f"corr-{index}")
        tags = ServiceCallTag.objects.filter(service_call_id=call.service_call_id).values_list("tag", flat=True)
        assert list(tags) == [f"t{index}"]
        assert OutboxEvent.objects.filter(aggregate_id=call.service_call_id).count() == 2
        assert TimerSchedule.objects.filter(service_call_id=call.service_call_id).count() == 1
    assert ServiceCall.objects.count() == count
    assert batches == [1, GROUP_COMMIT_MAX, count - 1 - GROUP_COMMIT_MAX]


def test_a_write_that_fails_gets_its_error_and_the_others_of_its_transaction_are_written(monkeypatch, batches):
    Tenant.objects.create(id="taken", name="taken")
    results = _concurrently(monkeypatch, [_tenant("first"), _tenant("second"), _tenant("taken"), _tenant("fourth")])
    assert results[0] == "first"
    assert results[1] == "second"
    assert isinstance(results[2], IntegrityError)
    assert results[3] == "fourth"
    assert set(Tenant.objects.values_list("id", flat=True)) == {"taken", "first", "second", "fourth"}
    # The three behind the first shared one transaction, made again without the one at fault.
    assert batches == [1, 3]


def test_a_commit_that_fails_is_made_again_write_by_write_and_only_the_one_at_fault_fails(monkeypatch, batches):
    Tenant.objects.create(id="acme", name="acme")

    def orphan_key() -> None:
        # Foreign keys are checked at the commit (deferred): this write breaks the commit.
        ApiKey.objects.create(tenant_id="nobody", label="orphan", prefix="orphan", key_hash="x" * 64)

    results = _concurrently(
        monkeypatch, [_tenant("first"), _tenant("second"), lambda: group_commit(orphan_key), _tenant("fourth")]
    )
    assert results[0] == "first"
    assert results[1] == "second"
    assert isinstance(results[2], IntegrityError)
    assert results[3] == "fourth"
    assert set(Tenant.objects.values_list("id", flat=True)) == {"acme", "first", "second", "fourth"}
    assert not ApiKey.objects.filter(label="orphan").exists()


def test_inside_a_transaction_the_write_is_part_of_it():
    with pytest.raises(RuntimeError), transaction.atomic():
        assert _tenant("inner")() == "inner"
        assert Tenant.objects.filter(id="inner").exists()
        raise RuntimeError("the caller's transaction rolls back")
    assert not Tenant.objects.filter(id="inner").exists()


def test_more_writers_than_one_transaction_takes_all_get_written(monkeypatch, batches):
    count = 3 * GROUP_COMMIT_MAX
    results = _concurrently(monkeypatch, [_tenant(f"t{i}") for i in range(count)])
    assert results == [f"t{i}" for i in range(count)]
    assert Tenant.objects.count() == count
    assert batches == [1, GROUP_COMMIT_MAX, GROUP_COMMIT_MAX, GROUP_COMMIT_MAX - 1]
    assert not db._group_commit._queue and not db._group_commit._leading
