"""The delivery loop's step: claim due notifications, start their tries (webhooks on the
process's asyncio loop, NATS batches on a thread; no transaction is open while a request is
out), record the results as they come back. A slow or dead subscriber holds at most its share
of the tries out at once, never the others' deliveries (docs/events.md)."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction

from core.db import ChangeWatch
from core.db.wakeups import Channel
from core.fairness import ShareRule
from core.ids import utcnow
from delivery.channels import channel_for, send
from delivery.offers import HandOver, Offer
from delivery.selectors import notifications_next_due
from delivery.services import (
    ClaimedNotification,
    SendResult,
    longest_try_ms,
    notifications_claim,
    notifications_record,
    notifications_release,
)
from delivery.shares import Held, Waiting, place, places

logger = logging.getLogger("serviceagent.delivery")

# Tries at recording one batch of results before its notifications are left to their lease.
RECORD_TRIES = 3
# How often a loop that waits for its worker's heartbeat says so, at most.
UNSURE_LOG_SECONDS = 10.0
# With no notification due and nothing committed since, the loop's looks are skipped until the
# next retry falls due by the clock (each look says when); one reads at least this often, and
# while the wake-ups listen (PostgreSQL), at least the second.
DUE_QUIET_RECHECK_SECONDS = 0.5
DUE_LISTENING_RECHECK_SECONDS = 5.0


class Deliverer(HandOver):
    """Claims with a lease, has up to `concurrency` tries out at once, records in batches.

    A webhook try is handed to the process's asyncio loop (execution/aio.py) and its result
    comes back by callback: no thread waits for it. A claim's NATS notifications are one
    publish batch, which a thread of its own waits for (delivery/channels/).

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
        self._tenant_share = None if per_tenant is None else ShareRule.of(size=concurrency, per_tenant=per_tenant)
        self._tenant_claim_share = (
            None
            if per_tenant is None
            else ShareRule.of(size=self.claim_ahead * concurrency, per_tenant=self.claim_ahead * per_tenant)
        )
        # Claimed and not recorded yet (waiting to start, being tried, or back and waiting to be
        # recorded): at most `claim_ahead` times `concurrency`, and per subscription and per
        # tenant its share.
        self.in_flight = 0
        self._claimed = Held()
        self._lock = threading.Lock()
        # Claimed and not started: each entry one try (a webhook) or one publish batch (a
        # claim's NATS notifications), started in claim order as their subscriptions have room.
        self._waiting = Waiting()
        # Tries out per subscription and per tenant now (a NATS batch counts once for each of its
        # subscriptions).
        self._sending = Held()
        self._tenant_of: dict[uuid.UUID, str | None] = {}  # of the subscriptions met
        self._trying = 0  # tries out now
        self._send_threads: ThreadPoolExecutor | None = None  # made on the first NATS batch
        self._stopping = False
        # Offers made to the fan-out and not yet settled (offers_done).
        self._offers: list[Offer] = []
        # Set when a try comes back, so an idle loop wakes for it at once instead of polling.
        self._came_back = threading.Event()
        # Notifications are made due by commits, and by the clock (a retry, a lease): a skipped
        # look (core.db.ChangeWatch) is made up within `due_recheck` seconds. The delivery loop's
        # own writes make none due at once: a recorded failure is due later, and the next event
        # of a queue is due from its fan-out on (it waits only for the claim's order). A caller
        # that fans out on the loop's own connection passes 0: every look reads.
        self._due_watch = ChangeWatch(
            recheck=due_recheck,
            channel=Channel.DELIVERY,
            listening_recheck=max(due_recheck, DUE_LISTENING_RECHECK_SECONDS),
        )
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
        claim = session is not None and self.may_claim() and self._due_now()
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

    def _due_now(self) -> bool:
        """Whether notifications are due now: skipped while none has been made due since a look
        found none (core.db.ChangeWatch), which also says when the next retry falls due."""
        if self.in_flight:  # tries out: busy, it looks at each step (a wake may trail a commit)
            self._due_watch.forget()
        mark = self._due_watch.mark()
        if mark is None:
            return False
        now = utcnow()
        next_at = notifications_next_due(now=now)
        due = next_at is not None and next_at <= now
        self._due_watch.done(mark, found=due)
        if next_at is not None and not due:
            self._due_watch.due_in((next_at - now).total_seconds())
        return due

    def _wait_for_start(self, claimed: list[ClaimedNotification]) -> None:
        """Queue claimed notifications for their tries (lock held): one try each, but a claim's
        notifications of a `batched` channel (NATS) are one try, one publish batch, queued first
        (delivery/channels/)."""
        batched: dict[str, list[ClaimedNotification]] = {}
        for notification in claimed:
            self._tenant_of[notification.subscription_id] = notification.subscription.tenant_id
            if channel_for(notification.subscription.kind).batched:
                batched.setdefault(notification.subscription.kind, []).append(notification)
        for batch in batched.values():
            self._waiting.add(batch)
        for notification in claimed:
            if not channel_for(notification.subscription.kind).batched:
                self._waiting.add([notification])

    def _hold_room(self, ready: list[tuple[ClaimedNotification, SendResult]]) -> tuple[int, Held, int]:
        """How many to claim now, what each subscription and tenant has claimed (less `ready`,
        which is being recorded), and the room to claim in (the tenants' shares are reckoned in
        it): the room is held until the claim is made, so that an offer to the fan-out meanwhile
        sees it taken."""
        with self._lock:
            room = self.claim_ahead * self.concurrency - self.in_flight + len(ready)  # the recorded make room
            limit = min(room, self.batch_size) if room > 0 else 0
            self.in_flight += limit
            busy = self._claimed.copy()
        busy.remove(place(n) for n, _ in ready)
        return limit, busy, max(0, room)

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
                    (sub, self._tenant_of.get(sub)),
                    per_subscription=self.per_subscription,
                    tenant_share=self._tenant_share,
                    free=self.concurrency - self._trying,
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
        self._claimed.remove(place(n) for n in batch)

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
                    self._sending.add(places(batch))
                    batches.append(batch)
            if not batches:
                return
            by_channel: dict[str, list[list[ClaimedNotification]]] = {}
            for batch in batches:
                by_channel.setdefault(batch[0].subscription.kind, []).append(batch)
            ended = 0
            for kind, its_batches in by_channel.items():
                # Each channel's own transport: webhooks on the asyncio sender, NATS batches on a
                # thread (send_threads); a try that cannot start ends at once.
                ended += channel_for(kind).start(its_batches, self)
            if not ended:  # those that ended at once made room for more
                return

    def _note_unsure(self) -> None:
        """Logged at most every UNSURE_LOG_SECONDS: deliveries wait for the heartbeat."""
        now = time.monotonic()
        if now - self._unsure_logged_at >= UNSURE_LOG_SECONDS:
            self._unsure_logged_at = now
            logger.warning("the worker's heartbeat is late: no delivery is claimed or started until it is written")

    def try_ended(self, batch: list[ClaimedNotification], results: list[SendResult]) -> None:
        """A try that ended without going out (delivery.channels.Tries)."""
        self._came_back_with(batch, results)

    def try_back(self, batch: list[ClaimedNotification], results: list[SendResult]) -> None:
        """A try came back (on the asyncio loop's thread, or a send thread): its results left for
        the loop, and the next tries started (delivery.channels.Tries)."""
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
                self._sending.remove(places(batch))
            self._came_back.set()

    def send_threads(self) -> ThreadPoolExecutor:
        """The threads of channels whose tries block (a NATS batch waits for its acks), made on
        the first such try (delivery.channels.Tries)."""
        with self._lock:  # tries start from the loop's thread, the asyncio loop's and these
            if self._send_threads is None:
                self._send_threads = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="delivery_nats"
                )
            return self._send_threads

    def wait(self, timeout: float) -> None:
        """Sleep until a try comes back or `timeout` passes; with none out and nothing waiting,
        until notifications are made due (core/db/wakeups.py, the delivery channel) or the next
        retry falls due by the clock."""
        if self.idle() and not self._waiting:
            self._due_watch.sleep(timeout)
            return
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
            self._claimed.remove(place(n) for n, _ in ready)

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
                    limit, busy, free = self._hold_room(ready) if claim else (0, Held(), 0)
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
                                    tenant_share=self._tenant_claim_share,
                                    free=free,
                                    claimed_by=session,
                                )
                        claimed = made if limit else []
                    finally:
                        with self._lock:  # the held room now holds what was claimed
                            self.in_flight += len(claimed) - limit
                            self._claimed.add(place(n) for n in claimed)
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
            self._claimed.remove(place(n) for n in cancelled)
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
        if self._send_threads is not None:
            self._send_threads.shutdown(wait=False)


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
