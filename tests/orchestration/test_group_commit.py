"""Concurrent submissions of one process share a transaction (core.db.group_commit), and each
still gets what it would have got alone: its own call, its own error, nothing of a write that
failed."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from core.db import GROUP_COMMIT_MAX, group_commit
from core.db import transactions as db
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
    others have all queued their writes behind it, in the calls' order: they then share the
    transactions after it."""
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
        except BaseException as exc:  # noqa: BLE001 - reported to the test (KeyboardInterrupt too)
            results[index] = exc
        finally:
            connection.close()

    monkeypatch.setattr(db._group_commit, "run", run)
    threads.extend(threading.Thread(target=call, args=(i,)) for i in range(len(calls)))
    threads[0].start()
    assert entered.wait(10)
    for queued, thread in enumerate(threads[1:], start=1):
        thread.start()
        _queued(queued)  # one after the other: the queue's order is the calls' order
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
    # The three behind the first shared one transaction, made again without the one at fault,
    # which was then made alone (its error is the one it meets alone).
    assert batches == [1, 3, 1]


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


def _leader_held(monkeypatch) -> tuple[threading.Thread, threading.Event]:
    """A thread leading an empty-handed transaction, held before it begins (so it holds no lock
    of the database) until the returned event is set."""
    entered, release = threading.Event(), threading.Event()
    real = db._GroupCommit._commit

    def held(batch):
        if threading.current_thread() is leader:
            entered.set()
            release.wait(10)
        return real(batch)

    monkeypatch.setattr(db._GroupCommit, "_commit", staticmethod(held))

    def lead() -> None:
        try:
            group_commit(lambda: None)
        except Exception:  # noqa: BLE001, S110 - its own outcome is not what the tests look at
            pass
        finally:
            connection.close()

    leader = threading.Thread(target=lead)
    leader.start()
    assert entered.wait(10)
    return leader, release


def test_a_write_inside_the_callers_transaction_never_waits_for_another_threads_group(monkeypatch):
    leader, release = _leader_held(monkeypatch)
    done = []

    def caller():
        try:
            with transaction.atomic():
                done.append(_tenant("inner")())
        finally:
            connection.close()

    thread = threading.Thread(target=caller)
    thread.start()
    thread.join(3)
    finished = not thread.is_alive()
    release.set()
    thread.join(10)
    leader.join(10)
    assert finished, "a write inside its caller's transaction queued behind another thread's group"
    assert done == ["inner"]


def test_on_commit_hooks_run_once_for_each_write_committed_and_never_for_one_that_failed(monkeypatch):
    Tenant.objects.create(id="taken", name="taken")
    hooks: list[str] = []

    def with_hook(slug: str) -> Callable[[], str]:
        def work() -> str:
            Tenant.objects.create(id=slug, name=slug)
            transaction.on_commit(lambda: hooks.append(slug))
            return slug

        return lambda: group_commit(work)

    results = _concurrently(
        monkeypatch, [with_hook("alpha"), with_hook("bravo"), with_hook("taken"), with_hook("delta")]
    )
    assert results[:2] == ["alpha", "bravo"] and results[3] == "delta"
    assert isinstance(results[2], IntegrityError)
    assert sorted(hooks) == ["alpha", "bravo", "delta"]


def test_a_hook_that_fails_after_the_commit_does_not_make_the_writes_fail_or_run_again(monkeypatch, batches):
    runs: list[str] = []

    def work(slug: str, *, failing_hook: bool) -> Callable[[], str]:
        def write() -> str:
            runs.append(slug)
            Tenant.objects.create(id=slug, name=slug)
            if failing_hook:
                transaction.on_commit(lambda: 1 / 0)
            return slug

        return lambda: group_commit(write)

    results = _concurrently(
        monkeypatch,
        [work("alpha", failing_hook=False), work("bravo", failing_hook=True), work("charlie", failing_hook=False)],
    )
    assert results == ["alpha", "bravo", "charlie"]
    assert sorted(runs) == ["alpha", "bravo", "charlie"]  # none made twice
    assert set(Tenant.objects.values_list("id", flat=True)) == {"alpha", "bravo", "charlie"}


def test_a_write_that_catches_a_database_error_fails_alone_and_the_others_are_written(monkeypatch):
    Tenant.objects.create(id="taken", name="taken")

    def swallowing() -> str:
        try:
            with transaction.atomic(savepoint=False):
                Tenant.objects.create(id="taken", name="again")
        except IntegrityError:
            pass  # the transaction it shares cannot commit now
        return "swallowed"

    results = _concurrently(monkeypatch, [_tenant("alpha"), lambda: group_commit(swallowing), _tenant("charlie")])
    assert results[0] == "alpha" and results[2] == "charlie"
    assert isinstance(results[1], Exception)
    assert set(Tenant.objects.values_list("id", flat=True)) == {"taken", "alpha", "charlie"}


def test_a_leader_that_stops_gives_its_followers_an_error_of_their_own_and_the_next_write_leads(monkeypatch):
    def stopping() -> str:
        raise KeyboardInterrupt  # in the thread that leads its transaction

    calls = [_tenant("alpha"), _tenant("bravo"), lambda: group_commit(stopping), _tenant("delta")]
    results = _concurrently(monkeypatch, calls)
    assert results[0] == "alpha"
    # "bravo" leads the transaction after the first: the interrupt is raised in its thread only.
    assert isinstance(results[1], KeyboardInterrupt)
    assert isinstance(results[2], OperationalError) and isinstance(results[3], OperationalError)
    assert list(Tenant.objects.values_list("id", flat=True)) == ["alpha"]
    assert not db._group_commit._queue and not db._group_commit._leading
    assert group_commit(_tenant_work("after")) == "after"


def _tenant_work(slug: str) -> Callable[[], str]:
    def work() -> str:
        Tenant.objects.create(id=slug, name=slug)
        return slug

    return work


class _InterruptibleEvent(threading.Event):
    """An event whose wait raises KeyboardInterrupt once `interrupt` is set."""

    def __init__(self, interrupt: threading.Event) -> None:
        super().__init__()
        self._interrupt = interrupt

    def wait(self, timeout: float | None = None) -> bool:
        while not super().wait(0.005):
            if self._interrupt.is_set():
                raise KeyboardInterrupt
        return True


def test_a_follower_interrupted_while_it_waits_leaves_the_queue_and_the_next_one_leads(monkeypatch):
    leader, release = _leader_held(monkeypatch)
    interrupt = threading.Event()
    made = []
    real_write = db._GroupedWrite

    def write(work):
        made.append(work)
        return real_write(work, done=_InterruptibleEvent(interrupt)) if len(made) == 1 else real_write(work)

    monkeypatch.setattr(db, "_GroupedWrite", write)
    outcomes: list[Any] = []

    def call(slug: str) -> None:
        try:
            outcomes.append(_tenant(slug)())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            outcomes.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=call, args=("never",))
    first.start()
    _queued(1)
    second = threading.Thread(target=call, args=("later",))
    second.start()
    _queued(2)
    interrupt.set()  # the first follower's wait raises
    first.join(10)
    release.set()
    for thread in (leader, second):
        thread.join(10)
    assert isinstance(outcomes[0], KeyboardInterrupt)
    assert outcomes[1] == "later"
    assert list(Tenant.objects.values_list("id", flat=True)) == ["later"]
    assert not db._group_commit._queue and not db._group_commit._leading


def test_when_begin_fails_no_write_of_the_group_is_made_and_each_caller_gets_its_own_error(monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("holds SQLite's write lock from another connection")
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "timeout", 0.3)
    leader, release = _leader_held(monkeypatch)
    results: list[Any] = [None, None]

    def call(index: int, slug: str) -> None:
        try:
            results[index] = _tenant(slug)()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[index] = exc
        finally:
            connection.close()

    followers = [threading.Thread(target=call, args=(i, slug)) for i, slug in enumerate(["alpha", "bravo"])]
    for thread in followers:
        thread.start()
    _queued(2)
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, until the group has given up
    try:
        release.set()
        for thread in [leader, *followers]:
            thread.join(10)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert all(isinstance(result, OperationalError) for result in results), results
    assert results[0] is not results[1]  # each raised in its own thread, with its own traceback
    assert not Tenant.objects.exists()
    assert not db._group_commit._queue and not db._group_commit._leading
