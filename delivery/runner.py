"""The delivery loop's step: claim due notifications, start their tries (webhooks on the
process's asyncio loop, NATS batches on a thread; no transaction is open while a request is
out), record the results as they come back. A slow or dead subscriber holds at most its share
of the tries out at once, never the others' deliveries (docs/events.md)."""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction

from core.db import ChangeWatch
from core.ids import utcnow
from delivery.models import Subscription
from delivery.selectors import notifications_due_exist
from delivery.senders import send, send_nats_many, webhook_request, webhook_result
from delivery.services import (
    ClaimedNotification,
    ClaimOffer,
    SendResult,
    longest_try_ms,
    notifications_claim,
    notifications_record,
    notifications_release,
)
from execution.aio import sender
from execution.http import HttpRequest
from execution.outcomes import Outcome

logger = logging.getLogger("serviceagent.delivery")

# Tries at recording one batch of results before its notifications are left to their lease.
RECORD_TRIES = 3
# How often a loop that waits for its worker's heartbeat says so, at most.
UNSURE_LOG_SECONDS = 10.0
# With no notification due and nothing committed since, the loop's looks are skipped; one reads
# at least this often (a retry falls due by the clock; the shortest step is 5 s, ±10 %).
DUE_QUIET_RECHECK_SECONDS = 0.5


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


class Deliverer:
    """Claims with a lease, has up to `concurrency` tries out at once, records in batches.

    A webhook try is handed to the process's asyncio loop (execution/aio.py) and its result
    comes back by callback: no thread waits for it. A claim's NATS notifications are one
    publish batch, which a thread of its own waits for (delivery/senders.py).

    It claims ahead of its tries: up to DELIVERY_CLAIM_AHEAD times `concurrency` notifications
    (and that many times `per_subscription` of one subscription) are claimed and not yet
    recorded, so a try that comes back starts the next one at once rather than wait for the
    loop's next write, which during a burst waits its turn behind the calls' and the
    dispatcher's writes.
    What is out at once stays bounded: `concurrency` tries, `per_subscription` of one
    subscription (a slow or dead receiver holds that many, never all of them).

    `session` names the worker session it claims for (the watchdog gives back a dead session's
    claims, delivery.services.notifications_release_dead_claims), or None while the process
    cannot be sure it is still alive (its heartbeat late): then it neither claims nor starts a
    try, and a try claimed under a session that is no longer its own is never started (the
    watchdog gave it back)."""

    def __init__(
        self,
        *,
        concurrency: int,
        batch_size: int,
        per_subscription: int | None = None,
        per_tenant: int | None = None,
        write_guard: Callable[[], AbstractContextManager[None]] = nullcontext,
        may_claim: Callable[[], bool] | None = None,
        session: Callable[[], str | None] = lambda: "",
        due_recheck: float = DUE_QUIET_RECHECK_SECONDS,
    ) -> None:
        self.concurrency = concurrency
        # Read once. The lease (delivery.services.lease_length) is long enough for this depth
        # while the setting stays; a try that could no longer end within its lease is never
        # started (_next_try).
        self.claim_ahead = settings.DELIVERY_CLAIM_AHEAD
        # Asked before each claim: False leaves the due notifications to the other loops for now
        # (the engine's way of putting its own work first); results are still recorded.
        self.may_claim = may_claim or (lambda: True)
        self.session = session
        self.batch_size = batch_size
        self.write_guard = write_guard
        self.results: queue.Queue[tuple[ClaimedNotification, SendResult]] = queue.Queue()
        self.per_subscription = per_subscription
        self._claim_cap = None if per_subscription is None else self.claim_ahead * per_subscription
        # A tenant's subscriptions together (docs/events.md, "Fair shares"): eight slow receivers
        # of one tenant hold its share, never every thread.
        self.per_tenant = per_tenant
        self._tenant_claim_cap = None if per_tenant is None else self.claim_ahead * per_tenant
        # Claimed and not recorded yet (waiting to start, being tried, or back and waiting to be
        # recorded): at most `claim_ahead` times `concurrency`, and per subscription and per
        # tenant its share.
        self.in_flight = 0
        self._claimed = _Held()
        self._lock = threading.Lock()
        # Claimed and not started: each entry one try (a webhook) or one publish batch (a
        # claim's NATS notifications), started in claim order as their subscriptions have room.
        self._waiting = _Waiting()
        # Tries out per subscription and per tenant now (a NATS batch counts once for each of its
        # subscriptions).
        self._sending = _Held()
        self._tenant_of: dict[uuid.UUID, str | None] = {}  # of the subscriptions met
        self._trying = 0  # tries out now
        self._nats_threads: ThreadPoolExecutor | None = None  # made on the first NATS batch
        self._stopping = False
        # Offers made to the fan-out and not yet settled (offers_done).
        self._offers: list[_Offer] = []
        # Set when a try comes back, so an idle loop wakes for it at once instead of polling.
        self._came_back = threading.Event()
        # Notifications are made due by commits, and by the clock (a retry, a lease): a skipped
        # look (core.db.ChangeWatch) is made up within `due_recheck` seconds. The delivery loop's
        # own writes make none due at once: a recorded failure is due later, and the next event
        # of a queue is due from its fan-out on (it waits only for the claim's order). A caller
        # that fans out on the loop's own connection passes 0: every look reads.
        self._due_watch = ChangeWatch(recheck=due_recheck)
        self._unsure_logged_at = -UNSURE_LOG_SECONDS

    @property
    def in_flight_by_subscription(self) -> Counter[uuid.UUID]:
        return self._claimed.by_subscription

    @property
    def in_flight_by_tenant(self) -> Counter[str]:
        return self._claimed.by_tenant

    @property
    def sending_by_subscription(self) -> Counter[uuid.UUID]:
        return self._sending.by_subscription

    @property
    def sending_by_tenant(self) -> Counter[str]:
        return self._sending.by_tenant

    def step(self) -> int:
        """Record what came back and claim what is due and fits, in one write transaction, then
        hand the claimed to the threads; returns how many notifications it moved (0: idle)."""
        # Asked before the results are taken: a failing look (the database gone) loses none.
        session = self.session()
        if session is None:
            self._note_unsure()
        claim = session is not None and self.may_claim() and self._due_watch.read(notifications_due_exist, empty=False)
        ready = self._take_ready()
        claimed: list[ClaimedNotification] = []
        try:
            if ready or claim:
                claimed = self._write(ready, claim=claim, session=session or "")
        finally:
            self._release(ready)
        if self._waiting:  # claimed now, or left waiting while the session was unsure
            self._start_tries()
        return len(ready) + len(claimed)

    def _wait_for_start(self, claimed: list[ClaimedNotification]) -> None:
        """Queue claimed notifications for their tries (lock held): webhooks one try each, a
        claim's NATS notifications one publish batch (delivery/senders.py)."""
        for notification in claimed:
            self._tenant_of[notification.subscription_id] = notification.subscription.tenant_id
        nats = [n for n in claimed if n.subscription.kind == Subscription.Kind.NATS]
        if nats:
            self._waiting.add(nats)
        for notification in claimed:
            if notification.subscription.kind != Subscription.Kind.NATS:
                self._waiting.add([notification])

    def _hold_room(self, ready: list[tuple[ClaimedNotification, SendResult]]) -> tuple[int, _Held]:
        """How many to claim now, and what each subscription and tenant has claimed (less
        `ready`, which is being recorded): the room is held until the claim is made, so that an
        offer to the fan-out meanwhile sees it taken."""
        with self._lock:
            room = self.claim_ahead * self.concurrency - self.in_flight + len(ready)  # the recorded make room
            limit = min(room, self.batch_size) if room > 0 else 0
            self.in_flight += limit
            busy = self._claimed.copy()
        busy.remove(_place(n) for n, _ in ready)
        return limit, busy

    def offer(self) -> ClaimOffer | None:
        """Room for the notifications a fan-out in this process makes (delivery.services
        .notifications_fan_out): the heads it reserves are made claimed for this loop's session
        and taken when the fan-out commits; `offers_done` gives back what was not taken and
        starts the taken. None while the session is unsure, the loop stopping, or its room all
        taken (during a burst, most of the time): the fan-out then looks for no heads at all."""
        session = self.session()
        if session is None or self._stopping:
            return None
        offer = _Offer(self, session)
        with self._lock:
            if self.in_flight >= self.claim_ahead * self.concurrency:
                return None
            self._offers.append(offer)
        return offer

    def _reserve(self, offer: _Offer, subscription: Subscription) -> bool:
        place = (subscription.subscription_id, subscription.tenant_id)
        with self._lock:
            if self._stopping or offer.settled or self.in_flight >= self.claim_ahead * self.concurrency:
                return False
            if self._claimed.at_cap(place, per_subscription=self._claim_cap, per_tenant=self._tenant_claim_cap):
                return False
            self.in_flight += 1
            self._claimed.add([place])
            offer.reserved[place] += 1
            return True

    def _take(self, offer: _Offer, claimed: list[ClaimedNotification]) -> None:
        """On the fan-out's commit: its reserved room now holds these claims (or, should the
        commit come after offers_done gave the room back, they are counted again). A loop that
        stopped meanwhile gives them back at the next offers_done or, the engine's dispatch
        having ended, leaves them to the watchdog once its session ends, as any claim."""
        with self._lock:
            if offer.settled:
                self.in_flight += len(claimed)
                self._claimed.add(_place(n) for n in claimed)
            else:
                offer.reserved.subtract(_place(n) for n in claimed)
            self._wait_for_start(claimed)

    def offers_done(self) -> None:
        """After the dispatch that asked for offers (committed or not): the room reserved and not
        taken is given back, and the taken tries start (or, should the loop be stopping, are given
        back untried)."""
        with self._lock:
            for offer in self._offers:
                offer.settled = True
                left = +offer.reserved
                self.in_flight -= left.total()
                self._claimed.remove(left.elements())
            self._offers.clear()
        if self._stopping:
            self._give_back_waiting()
        elif self._waiting:
            self._start_tries()

    def _next_try(self, session: str, latest_start: datetime) -> list[ClaimedNotification] | None:
        """The first waiting try in claim order whose subscriptions have a thread to spare (lock
        held). A try that could no longer finish within its lease (not started by
        `latest_start`), or claimed under another session than `session` (the watchdog found
        that one dead and gave its claims back), is dropped: another loop may claim it, and two
        sends of it (the later one after the call's next event) are what the lease is there to
        prevent; it is due again when its lease ends."""

        def stale(batch: list[ClaimedNotification]) -> bool:
            return any(n.lease_until <= latest_start or n.claimed_by != session for n in batch)

        def has_room(subscriptions: tuple[uuid.UUID, ...]) -> bool:
            return not any(
                self._sending.at_cap(
                    (sub, self._tenant_of.get(sub)), per_subscription=self.per_subscription, per_tenant=self.per_tenant
                )
                for sub in subscriptions
            )

        return self._waiting.take_first(has_room, stale=stale, drop=self._drop)

    def _drop(self, batch: list[ClaimedNotification]) -> None:
        """A claimed try left untried (lock held): to its lease, or to the watchdog, which gave it
        back already when its session was found dead."""
        logger.warning(
            "%d delivery tries waited too long to start, or were claimed under a session found dead since; "
            "they are tried again after their lease, or as the watchdog gave them back",
            len(batch),
        )
        self.in_flight -= len(batch)
        self._claimed.remove(_place(n) for n in batch)

    def _start_tries(self) -> None:
        """Start every waiting try that may start now: within `concurrency` and its
        subscriptions' share, in claim order. Called after a claim and whenever a try comes
        back."""
        while True:
            session = self.session()
            if session is None:  # the heartbeat is late: the claims may be given back any moment
                self._note_unsure()
                return
            latest_start = utcnow() + timedelta(milliseconds=longest_try_ms())
            with self._lock:
                batches = []
                while not self._stopping and self._trying < self.concurrency:
                    batch = self._next_try(session, latest_start)
                    if batch is None:
                        break
                    self._trying += 1
                    self._sending.add(_places(batch))
                    batches.append(batch)
            if not batches:
                return
            webhooks: list[tuple[ClaimedNotification, datetime, HttpRequest]] = []
            ended = 0
            for batch in batches:
                started = utcnow()
                try:
                    if batch[0].subscription.kind == Subscription.Kind.NATS:
                        self._nats_pool().submit(self._try_nats, batch)
                        continue
                    request = webhook_request(batch[0], started)
                except Exception as exc:  # a bug, or the pool gone: a failed try, never a lost one
                    logger.exception("starting %d delivery tries failed", len(batch))
                    request = SendResult(succeeded=False, started_at=started, error=_error(exc))
                if isinstance(request, SendResult):
                    self._came_back_with(batch, [request] * len(batch))
                    ended += 1
                else:
                    webhooks.append((batch[0], started, request))
            try:
                sender().submit(
                    [(request, functools.partial(self._webhook_back, n, started)) for n, started, request in webhooks]
                )
            except Exception as exc:
                logger.exception("handing %d webhook tries to the sender failed", len(webhooks))
                for notification, started, _ in webhooks:
                    failed = SendResult(succeeded=False, started_at=started, error=_error(exc))
                    self._came_back_with([notification], [failed])
                    ended += 1
            if not ended:  # those that ended at once made room for more
                return

    def _note_unsure(self) -> None:
        """Logged at most every UNSURE_LOG_SECONDS: deliveries wait for the heartbeat."""
        now = time.monotonic()
        if now - self._unsure_logged_at >= UNSURE_LOG_SECONDS:
            self._unsure_logged_at = now
            logger.warning("the worker's heartbeat is late: no delivery is claimed or started until it is written")

    def _webhook_back(self, notification: ClaimedNotification, started: datetime, outcome: Outcome) -> None:
        """A webhook try's response (on the asyncio loop's thread): its result left for the
        loop, and the next tries started."""
        try:
            result = webhook_result(outcome, started)
        except Exception as exc:
            logger.exception("reading a webhook try's response failed")
            result = SendResult(succeeded=False, started_at=started, error=_error(exc))
        self._came_back_with([notification], [result])
        self._start_tries()

    def _try_nats(self, batch: list[ClaimedNotification]) -> None:
        """Publish a NATS batch and wait for its acks (on a thread of the deliverer's); never
        raises."""
        started = utcnow()
        try:
            results = send_nats_many(batch)
        except Exception as exc:
            logger.exception("trying %d deliveries failed", len(batch))
            results = [SendResult(succeeded=False, started_at=started, error=_error(exc)) for _ in batch]
        self._came_back_with(batch, results)
        self._start_tries()

    def _came_back_with(self, batch: list[ClaimedNotification], results: list[SendResult]) -> None:
        """A try is over: each result left for the loop, its place free for the next (whatever
        happens to the results: a place never leaks)."""
        try:
            if len(results) != len(batch):  # a bug in a sender: each notification failed
                started = utcnow()
                error = f"{len(results)} results for {len(batch)} tries"
                logger.error("a delivery try gave %s", error)
                results = [SendResult(succeeded=False, started_at=started, error=error) for _ in batch]
            for notification, result in zip(batch, results, strict=True):
                self.results.put((notification, result))
        finally:
            with self._lock:
                self._trying -= 1
                self._sending.remove(_places(batch))
            self._came_back.set()

    def _nats_pool(self) -> ThreadPoolExecutor:
        with self._lock:  # tries start from the loop's thread, the asyncio loop's and these
            if self._nats_threads is None:
                self._nats_threads = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="delivery_nats"
                )
            return self._nats_threads

    def wait(self, timeout: float) -> None:
        """Sleep until a try comes back or `timeout` passes (new notifications are polled for)."""
        self._came_back.wait(timeout)
        self._came_back.clear()

    def gather(self, timeout: float) -> None:
        """After a step that moved something, while tries are out: wait up to `timeout` for a
        quarter of them to come back, so that one claim and one recording serve many
        notifications (each costs about the same for one notification as for fifty)."""
        with self._lock:
            want = self.in_flight // 4
        deadline = time.monotonic() + timeout
        while want and self.results.qsize() < want:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._came_back.wait(left)
            self._came_back.clear()

    def record_ready(self) -> int:
        """Record what came back (and claim nothing)."""
        ready = self._take_ready()
        try:
            if ready:
                self._write(ready, claim=False, session="")
        finally:
            self._release(ready)
        return len(ready)

    def _take_ready(self) -> list[tuple[ClaimedNotification, SendResult]]:
        ready = []
        while True:
            try:
                ready.append(self.results.get_nowait())
            except queue.Empty:
                return ready

    def _release(self, ready: list[tuple[ClaimedNotification, SendResult]]) -> None:
        """Whatever recording did, these tries are over: their threads are free again (an
        unrecorded try is sent again when its lease ends, or sooner once its worker is found dead:
        at least once)."""
        with self._lock:
            self.in_flight -= len(ready)
            self._claimed.remove(_place(n) for n, _ in ready)

    def _write(
        self, ready: list[tuple[ClaimedNotification, SendResult]], *, claim: bool, session: str
    ) -> list[ClaimedNotification]:
        """Record `ready` and, with `claim`, claim what is due and fits in one write transaction:
        every write a transaction, its turn and SQLite's lock, is paid once for both (a busy loop
        recorded and claimed many times a second). Should the claim fail, the results are still
        recorded, on their own, before the failure goes up: an unrecorded try would be sent again
        after its lease."""
        try:
            return self._write_once(ready, claim=claim, session=session)
        except Exception:
            if not (ready and claim):
                raise
            self._write_once(ready, claim=False, session=session)
            raise

    def _write_once(
        self, ready: list[tuple[ClaimedNotification, SendResult]], *, claim: bool, session: str
    ) -> list[ClaimedNotification]:
        """`_write`'s transaction, tried again after a transient failure (a deadlock another
        cluster's transaction broke, a busy database). The claim's room is reckoned and held once
        the write's turn came (the write guard): the fan-out of this process's dispatcher, which
        takes room too (offer), writes in turn with it, so the two never take the same room."""
        for attempt in range(RECORD_TRIES):
            try:
                with self.write_guard():
                    limit, busy = self._hold_room(ready) if claim else (0, _Held())
                    if not (ready or limit):
                        return []  # no room: nothing to write
                    claimed: list[ClaimedNotification] = []
                    try:
                        with transaction.atomic():
                            notifications_record(results=ready)
                            if limit:
                                made = notifications_claim(
                                    limit=limit,
                                    in_flight=busy.by_subscription,
                                    per_subscription=self._claim_cap,
                                    tenant_in_flight=busy.by_tenant,
                                    per_tenant=self._tenant_claim_cap,
                                    claimed_by=session,
                                )
                        claimed = made if limit else []
                    finally:
                        with self._lock:  # the held room now holds what was claimed
                            self.in_flight += len(claimed) - limit
                            self._claimed.add(_place(n) for n in claimed)
                            self._wait_for_start(claimed)
                    return claimed
            except DatabaseError:
                if attempt == RECORD_TRIES - 1:
                    raise
                logger.warning("recording %d delivery tries failed; trying again", len(ready), exc_info=True)
                close_old_connections()
                time.sleep(0.05 * (attempt + 1))
        return []  # not reached: the last try returns or raises

    def _give_back_waiting(self) -> None:
        """The claimed tries no thread started yet, given back (due again at once, for another
        loop)."""
        with self._lock:
            cancelled = [notification for batch in self._waiting.clear() for notification in batch]
            self.in_flight -= len(cancelled)
            self._claimed.remove(_place(n) for n in cancelled)
        if cancelled:
            try:
                with self.write_guard():
                    notifications_release(notifications=cancelled)
            except Exception:  # left to their lease; the tries out are still waited for
                logger.exception("giving back %d untried deliveries failed", len(cancelled))

    @property
    def stopping(self) -> bool:
        return self._stopping

    def idle(self) -> bool:
        with self._lock:
            return self.in_flight == 0

    def stop(self, *, timeout: float | None = None) -> None:
        """Start no new tries; give back the claimed ones no thread started yet (due again at
        once, for another loop); wait up to `timeout` (None: for as long as they take) for the
        tries out to come back, and record them. A try still out then is sent again (at least
        once, docs/events.md): the watchdog gives it back once the stopped session's tries are
        surely over, or its lease ends."""
        with self._lock:
            self._stopping = True
        self._give_back_waiting()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                self.record_ready()
            except Exception:  # these are left to their lease; the others are still recorded
                logger.exception("recording delivery tries at stop failed")
            left = None if deadline is None else deadline - time.monotonic()
            if self.idle() or (left is not None and left <= 0):
                break
            self._came_back.wait(0.05 if left is None else min(0.05, left))
            self._came_back.clear()
        if not self.idle():
            with self._lock:
                out = self.in_flight
            logger.warning(
                "stopped with %d delivery tries out; they are tried again once the watchdog gives them back", out
            )
        if self._nats_threads is not None:
            self._nats_threads.shutdown(wait=False)


Place = tuple[uuid.UUID, "str | None"]  # a subscription, and its tenant (None: operator-wide)


def _place(notification: ClaimedNotification) -> Place:
    return notification.subscription_id, notification.subscription.tenant_id


def _places(batch: list[ClaimedNotification]) -> set[Place]:
    """A batch's subscriptions, each once (a NATS batch counts once for each of them)."""
    return {_place(n) for n in batch}


class _Held:
    """What each subscription holds (claims, or tries out), and each tenant's subscriptions
    together; operator-wide subscriptions belong to no tenant's share."""

    def __init__(self) -> None:
        self.by_subscription: Counter[uuid.UUID] = Counter()
        self.by_tenant: Counter[str] = Counter()

    def copy(self) -> _Held:
        held = _Held()
        held.by_subscription, held.by_tenant = Counter(self.by_subscription), Counter(self.by_tenant)
        return held

    def add(self, places: Iterable[Place]) -> None:
        for subscription_id, tenant_id in places:
            self.by_subscription[subscription_id] += 1
            if tenant_id is not None:
                self.by_tenant[tenant_id] += 1

    def remove(self, places: Iterable[Place]) -> None:
        for subscription_id, tenant_id in places:
            _decrement(self.by_subscription, subscription_id)
            if tenant_id is not None:
                _decrement(self.by_tenant, tenant_id)

    def at_cap(self, place: Place, *, per_subscription: int | None, per_tenant: int | None) -> bool:
        subscription_id, tenant_id = place
        if per_subscription is not None and self.by_subscription[subscription_id] >= per_subscription:
            return True
        return tenant_id is not None and per_tenant is not None and self.by_tenant[tenant_id] >= per_tenant


def _decrement(counter: Counter, key: Any) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class _Waiting:
    """The claimed tries not started yet, a queue per subscription (a NATS batch's under its
    subscriptions together), each entry numbered in claim order. Taking the next try looks at
    each queue's head, not at every waiting try: during a burst most of them wait for their
    subscription's share, and a try that came back looked past all of them to start the next
    (bench/README.md, item 22)."""

    def __init__(self) -> None:
        self._queues: dict[tuple[uuid.UUID, ...], deque[tuple[int, list[ClaimedNotification]]]] = {}
        self._numbers = itertools.count()
        self._count = 0

    def add(self, batch: list[ClaimedNotification]) -> None:
        key = tuple(sorted({n.subscription_id for n in batch}))
        self._queues.setdefault(key, deque()).append((next(self._numbers), batch))
        self._count += 1

    def take_first(
        self,
        has_room: Callable[[tuple[uuid.UUID, ...]], bool],
        *,
        stale: Callable[[list[ClaimedNotification]], bool],
        drop: Callable[[list[ClaimedNotification]], None],
    ) -> list[ClaimedNotification] | None:
        """The earliest claimed head among the queues with room, taken; stale heads met on the
        way, and the taken one's stale successors, are dropped (a stale try behind a good one
        keeps its room until it heads its queue: within a queue the leases end in claim order,
        so that is rare)."""
        first: tuple[int, tuple[uuid.UUID, ...]] | None = None
        for key in list(self._queues):
            entries = self._drop_stale_heads(key, stale, drop)
            if entries and (first is None or entries[0][0] < first[0]) and has_room(key):
                first = (entries[0][0], key)
        if first is None:
            return None
        _, batch = self._queues[first[1]].popleft()
        self._count -= 1
        self._drop_stale_heads(first[1], stale, drop)  # the next head, should it be stale, goes now
        return batch

    def _drop_stale_heads(
        self,
        key: tuple[uuid.UUID, ...],
        stale: Callable[[list[ClaimedNotification]], bool],
        drop: Callable[[list[ClaimedNotification]], None],
    ) -> deque[tuple[int, list[ClaimedNotification]]] | None:
        """Queue `key` without its stale heads; None (and the queue gone) once it is empty."""
        entries = self._queues[key]
        while entries and stale(entries[0][1]):
            drop(entries.popleft()[1])
            self._count -= 1
        if not entries:
            del self._queues[key]
            return None
        return entries

    def clear(self) -> list[list[ClaimedNotification]]:
        """Every waiting try, in claim order, taken."""
        batches = list(self)
        self._queues.clear()
        self._count = 0
        return batches

    def __iter__(self) -> Iterator[list[ClaimedNotification]]:
        entries = sorted(entry for queue in self._queues.values() for entry in queue)  # numbers are unique
        return iter([batch for _, batch in entries])

    def __len__(self) -> int:
        return self._count


class _Offer:
    """One fan-out's room in a Deliverer (Deliverer.offer; delivery.services.ClaimOffer)."""

    def __init__(self, deliverer: Deliverer, session: str) -> None:
        self.deliverer = deliverer
        self.session = session
        # Held and not yet taken, by (subscription, its tenant).
        self.reserved: Counter[tuple[uuid.UUID, str | None]] = Counter()
        self.settled = False  # offers_done gave back what was not taken

    def reserve(self, subscription: Subscription) -> bool:
        return self.deliverer._reserve(self, subscription)

    def take(self, claimed: list[ClaimedNotification]) -> None:
        self.deliverer._take(self, claimed)


def deliver_now(*, limit: int = 100) -> int:
    """Claim, try and record one batch in this thread (commands and tests)."""
    claimed = notifications_claim(limit=limit)
    try:
        results = [(notification, send(notification)) for notification in claimed]
    except BaseException:
        notifications_release(notifications=claimed)
        raise
    notifications_record(results=results)
    return len(claimed)
