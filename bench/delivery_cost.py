"""What one delivered notification costs, counted in instructions.

The drain's CPU per call moves by a tenth between runs on a shared machine, more than most
changes to the delivery path are worth. This drives that path in one process, on a fresh SQLite
database: the dispatcher's batches fan the events out (handing the heads of their queues over to
the delivery loop, as in the engine), the `Deliverer` claims the rest, signs each webhook, sends
it on the process's asyncio loop to two receivers (bench/receiver.py, a process each) and records
every result, until every notification is delivered.

    python bench/delivery_cost.py --calls 300            # CPU seconds, per notification
    python bench/delivery_cost.py --callgrind            # instructions per notification

With `--callgrind` it runs itself twice under `valgrind --tool=callgrind` (Debian's `valgrind`),
with `--calls` and three times as many, counting only the delivery (the setup and the events'
own insertion are left out), and prints the difference per notification: what one more
notification costs, whatever the process's fixed costs. An instruction count is the same for the
same work whatever else the machine is doing; the work itself still moves a little with timing
(how many notifications each claim or hand-over takes), so compare figures a few percent apart
only over two runs each.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Children, agent_env, log  # noqa: E402

TENANT = "bench-cost"
EVENTS_PER_CALL = 2  # Running, then Succeeded: as a drained call's
BATCH_CALLS = 100  # calls whose events are appended in one transaction
WARMUP_CALLS = 20
DELIVER_WITHIN_SECONDS = 600  # valgrind runs the process some fifty times slower


def _instrumentation(on: bool) -> None:
    """Under callgrind, count from here (on) or stop counting (off). callgrind_control waits for
    the process to answer, which it does only while it runs code: so it is not waited for."""
    if not os.environ.get("BENCH_CALLGRIND"):
        return
    control = subprocess.Popen(
        ["callgrind_control", "--instr=on" if on else "--instr=off", str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while control.poll() is None:
        time.sleep(0.005)


def measure(calls: int, receivers: int, data_dir: Path, children: Children) -> dict:
    os.environ.update(agent_env(data_dir))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from bench.agent import ensure_tenant
    from delivery.models import Notification
    from delivery.runner import Deliverer
    from delivery.services import subscription_create
    from delivery.validation import validate_subscription

    call_command("migrate", verbosity=0)
    ensure_tenant(TENANT)
    for n in range(receivers):
        child = children.start(
            f"receiver-{n}",
            [sys.executable, str(ROOT / "bench" / "receiver.py")],
            env=dict(os.environ),
            stdout_pipe=True,
        )
        port = int(child.proc.stdout.readline())
        data = validate_subscription({"name": f"cost receiver {n}", "url": f"http://127.0.0.1:{port}/hook"})
        subscription_create(tenant_id=TENANT, data=data)
    deliverer = Deliverer(
        concurrency=settings.DELIVERY_CONCURRENCY,
        batch_size=settings.DELIVERY_BATCH_SIZE,
        per_subscription=settings.DELIVERY_PER_SUBSCRIPTION,
    )
    # A warm-up, not counted: the sender's loop and connections, the statements, the signers.
    _append(WARMUP_CALLS)
    _deliver(deliverer)
    _append(calls)  # the calls' own writes: not counted either
    _instrumentation(True)
    cpu, wall = time.process_time(), time.monotonic()
    _deliver(deliverer)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    _instrumentation(False)
    deliverer.stop(timeout=5)
    expected = (WARMUP_CALLS + calls) * EVENTS_PER_CALL * receivers
    delivered = Notification.objects.filter(state=Notification.State.SUCCEEDED).count()
    if delivered != expected:
        raise SystemExit(f"{delivered} of {expected} notifications delivered")
    return {"notifications": calls * EVENTS_PER_CALL * receivers, "cpu_s": cpu, "wall_s": wall}


def _append(calls: int) -> None:
    """The outbox events of `calls` drained calls, appended as their own transactions do."""
    from django.db import transaction

    from core.ids import utcnow
    from outbox.models import OutboxEvent
    from outbox.services import NewEvent, outbox_append

    events = []
    for _ in range(calls):
        call_id, at = uuid.uuid4(), utcnow()
        for type_ in (OutboxEvent.Type.RUNNING, OutboxEvent.Type.SUCCEEDED)[:EVENTS_PER_CALL]:
            payload = {"serviceCallId": str(call_id), "attempt": 1}
            events.append(NewEvent(TENANT, call_id, type_, payload, correlation_id=str(call_id), at=at))
    step = BATCH_CALLS * EVENTS_PER_CALL
    for start in range(0, len(events), step):
        with transaction.atomic():
            outbox_append(events=events[start : start + step])


def _deliver(deliverer) -> None:
    """The dispatcher's batches and the delivery loop's steps in turn, as the engine's two
    threads take turns for the write lock, until no notification is open."""
    from delivery.fanout import NotificationSink
    from delivery.models import Notification
    from delivery.selectors import OPEN_STATES, notifications_due_exist
    from outbox.dispatcher import dispatch_batch

    deadline = time.monotonic() + DELIVER_WITHIN_SECONDS
    while True:
        try:
            published = dispatch_batch(limit=200, sinks=(NotificationSink(offer=deliverer.offer),))
        finally:
            deliverer.offers_done()
        moved = deliverer.step()
        # Every try out comes back before the next turn: each turn then takes the same
        # notifications whatever the timing (valgrind runs this process some fifty times slower
        # than the receivers), and no idle poll is counted.
        while deliverer._trying:
            deliverer.wait(1.0)
        if not (published or moved) and deliverer.idle() and not notifications_due_exist():
            return  # every notification recorded, none due again
        if time.monotonic() > deadline:
            open_left = Notification.objects.filter(state__in=OPEN_STATES).count()
            raise SystemExit(f"not delivered within {DELIVER_WITHIN_SECONDS} s: {open_left} still open")


def _callgrind(calls: int, receivers: int) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (Debian package valgrind)")
    started = time.monotonic()
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--calls",
            str(calls),
            "--receivers",
            str(receivers),
        ],
        env={**os.environ, "BENCH_CALLGRIND": "1"},
        capture_output=True,
        text=True,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or not found:
        raise SystemExit(f"the run under valgrind failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    notifications = calls * EVENTS_PER_CALL * receivers
    log(f"{notifications} notifications: {int(found.group(1)):,} instructions ({time.monotonic() - started:.0f} s)")
    print(f"instructions per delivered notification (webhook): {int(found.group(1)) / notifications:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls, two events each (default 300)")
    parser.add_argument("--receivers", type=int, default=2, help="webhook subscriptions, a receiver each (default 2)")
    parser.add_argument("--callgrind", action="store_true", help="count instructions (two runs under valgrind)")
    args = parser.parse_args()
    if args.calls < 1 or not 1 <= args.receivers <= 8:
        parser.error("--calls must be at least 1 and --receivers 1 to 8")
    if args.callgrind:
        _callgrind(args.calls, args.receivers)
        return
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as data_dir:
        children = Children(Path(data_dir))
        try:
            result = measure(args.calls, args.receivers, Path(data_dir), children)
        finally:
            children.stop_all()
    per_ms = result["cpu_s"] / result["notifications"] * 1000
    print(
        f"{result['notifications']} notifications delivered in {result['wall_s']:.2f} s: "
        f"{result['cpu_s']:.2f} s of CPU, {per_ms:.3f} ms per notification"
    )


if __name__ == "__main__":
    main()
