"""What one delivered notification, or one POST of a service call, costs: counted in
instructions.

The drain's CPU per call and the POST's rate move by a tenth between runs on a shared machine,
more than most changes to those paths are worth. This drives one path in one process, on a
fresh SQLite database, and counts what it costs:

- `delivery`: the dispatcher's batches fan events out (handing the heads of their queues over
  to the delivery loop, as in the engine), the `Deliverer` claims the rest, signs each webhook,
  sends it on the process's asyncio loop to the receivers (bench/receiver.py, a process each)
  and records every result, until every notification is delivered; with `--kind nats`, one
  NATS JetStream subscription instead (a throwaway stream on BENCH_NATS_URL, on subjects of its
  own, published in batches and acknowledged by the server);
- `call`: calls due now, drained as the engine drains them but in one thread: started and
  claimed in batches (`workers.pipeline.start_and_claim_overdue`), each attempt sent to the
  bench's target (bench/target.py, its own process) and the batch's outcomes recorded
  (`record`), the calls' events published by the dispatcher's batches (no subscriptions), until
  every call is terminal and every event published;
- `post`: POST /api/tenants/<t>/service-calls with the load client's body (bench/load_client.py),
  through the project's WSGI handler, middleware and API-key authentication, as gunicorn calls
  it; `floor`: the same POSTs to the floor view (bench/floor.py), which prices the stack
  itself; `batch`: the same calls a hundred to a POST of .../service-calls/batch, priced per call
  beside `post`'s.

    python bench/cost.py delivery --count 300              # CPU seconds, per notification
    python bench/cost.py delivery --kind nats --callgrind  # instructions per NATS notification
    python bench/cost.py call --count 300 --callgrind      # instructions per drained call
    python bench/cost.py post --count 500 --callgrind      # instructions per POST and floor
    python bench/cost.py batch --count 500                 # CPU per call, a hundred to a POST

With `--callgrind` it runs itself under `valgrind --tool=callgrind` (Debian's `valgrind`),
counting only the measured part (not the setup, the warm-up or, for `delivery`, the events'
own insertion; for `call`, the calls' submission and the publication of its events). An instruction count is the same for the same work whatever else the machine
is doing: two runs of the same code agree within a fraction of a percent, where clock-based
figures move by a fifth. It leaves out the kernel's work (system calls), which the bench's CPU
figures include.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import NATS_URL, Children, agent_env, log  # noqa: E402

TENANT = "bench-cost"
EVENTS_PER_CALL = 2  # Running, then Succeeded: as a drained call's
BATCH_CALLS = 100  # calls whose events are appended in one transaction
WARMUP_CALLS = 20
WARMUP_POSTS = 50
# Calls per POST of the `batch` subject: the API's most.
BATCH = 100
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


def measure_delivery(calls: int, receivers: int, children: Children, *, nats: bool = False) -> dict:
    from django.conf import settings

    from bench.agent import ensure_tenant
    from delivery.models import Notification
    from delivery.runner import Deliverer
    from delivery.services import subscription_create
    from delivery.validation import validate_subscription

    ensure_tenant(TENANT)
    if nats:  # one subscription: a second would publish the same event ids, stored once
        receivers = 1
        data = validate_subscription({"kind": "nats", "name": "cost NATS"}, operator=True)
        subscription_create(tenant_id=TENANT, data=data)
    for n in range(0 if nats else receivers):
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
        # The fan-out, its writes and the loop's steps share this thread's connection, whose own
        # commits do not move its data_version: every look reads (core.db.ChangeWatch).
        due_recheck=0,
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
    return {"count": calls * EVENTS_PER_CALL * receivers, "cpu_s": cpu, "wall_s": wall}


def _nats_stream(url: str) -> dict[str, str]:
    """A throwaway stream on the NATS server at `url`, on subjects of its own (`cost<hex>.>`,
    so runs and other agents on that server never meet), or SystemExit with the reason there is
    none. Returns the agent's settings for it: NATS_STREAM, NATS_STREAM_SUBJECTS and
    NATS_SUBJECT_TEMPLATE."""
    import secrets

    import nats.js.errors
    from nats.js.api import StreamConfig

    from bench.agent import _on_nats, nats_unreachable_reason
    from delivery.nats import MIN_DUPLICATE_WINDOW_S

    reason = nats_unreachable_reason(url)
    if reason:
        raise SystemExit(f"--kind nats: {reason}")
    suffix = secrets.token_hex(4)
    name, subjects = f"COST_{suffix.upper()}", f"cost{suffix}.>"

    async def create(js) -> str | None:
        config = StreamConfig(name=name, subjects=[subjects], duplicate_window=MIN_DUPLICATE_WINDOW_S)
        try:
            await js.add_stream(config)
        except nats.js.errors.APIError as exc:
            return exc.description
        return None

    problem = _on_nats(url, create)
    if problem:
        raise SystemExit(f"--kind nats: the stream could not be made on {url}: {problem}")
    log(f"NATS stream {name} made on {url}, subjects {subjects}")
    return {
        "NATS_STREAM": name,
        "NATS_STREAM_SUBJECTS": subjects,
        "NATS_SUBJECT_TEMPLATE": f"cost{suffix}.{{tenantId}}.{{type}}",
    }


def _nats_stream_delete(url: str, name: str) -> None:
    from bench.agent import _on_nats

    async def delete(js) -> None:
        await js.delete_stream(name)

    _on_nats(url, delete)


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


def measure_call(calls: int, children: Children) -> dict:
    """`calls` calls due now, each started, sent to the bench's target, recorded and its events
    published, in the engine's batches (workers/loops/) but one thread: the work of a drained
    call without subscribers, what the engine's threads and the asyncio of nothing else add left
    out. Every call must end Succeeded."""
    from bench.agent import ensure_tenant
    from orchestration.models import ServiceCall
    from orchestration.services import service_call_submit
    from orchestration.validation import validate_submission
    from outbox.models import OutboxEvent

    ensure_tenant(TENANT)
    target = children.start(
        "target", [sys.executable, str(ROOT / "bench" / "target.py")], env=dict(os.environ), stdout_pipe=True
    )
    url = f"http://127.0.0.1:{int(target.proc.stdout.readline())}/work"

    def submit(count: int, prefix: str) -> None:
        for index in range(count):
            data = {"name": f"{prefix}-{index}", "requestSpec": {"method": "GET", "url": url}, "tags": ["bench"]}
            service_call_submit(
                tenant_id=TENANT, submission=validate_submission(data), correlation_id=f"{prefix}-{index}"
            )

    # A warm-up, not counted: the connection pool, the statements.
    submit(WARMUP_CALLS, "warm-up")
    _drain()
    submit(calls, "call")  # their submission: not counted,
    _publish_all()  # nor the publication of its events (Submitted, Scheduled), before the burst
    _instrumentation(True)
    cpu, wall = time.process_time(), time.monotonic()
    _drain()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    _instrumentation(False)
    succeeded = ServiceCall.objects.filter(tenant_id=TENANT, status=ServiceCall.Status.SUCCEEDED).count()
    if succeeded != WARMUP_CALLS + calls:
        raise SystemExit(f"{succeeded} of {WARMUP_CALLS + calls} calls succeeded")
    if OutboxEvent.objects.filter(published_at__isnull=True).exists():
        raise SystemExit("events left unpublished")
    return {"count": calls, "cpu_s": cpu, "wall_s": wall}


def _publish() -> int:
    """One batch of the outbox published as the engine's dispatcher publishes it (its batch
    size, the configured sinks); how many events it published."""
    from django.conf import settings

    from outbox.dispatcher import dispatch_batch
    from outbox.sinks import configured_sinks
    from workers.loops.dispatch import DISPATCH_CHUNK

    return dispatch_batch(limit=min(settings.OUTBOX_BATCH_SIZE, DISPATCH_CHUNK), sinks=configured_sinks())


def _publish_all() -> None:
    while _publish():
        pass


def _drain() -> None:
    """Start, send, record and publish until no call is due and no event unpublished. Started
    in batches of the engine's room (EXECUTION_CONCURRENCY), each batch's outcomes recorded
    together (the engine records what finishes within a few milliseconds, up to 100, together:
    in a burst, about a start batch's)."""
    from django.conf import settings

    from core.ids import utcnow
    from workers.pipeline import record, run_attempt, start_and_claim_overdue

    deadline = time.monotonic() + DELIVER_WITHIN_SECONDS
    while True:
        attempts = start_and_claim_overdue(
            due_before=utcnow(), limit=settings.EXECUTION_CONCURRENCY, worker_id="bench-cost"
        )
        if attempts:
            record([(attempt, run_attempt(attempt)) for attempt in attempts])
        published = _publish()
        if not (attempts or published):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"not drained within {DELIVER_WITHIN_SECONDS} s")


def measure_post(count: int, *, floor: bool, batch: int = 0) -> dict:
    """`count` POSTs of a service call (or, with `floor`, to the floor view) through the WSGI
    handler, each with the load client's body; every one must answer 202. With `batch`, the same
    calls in POSTs of `batch` calls each to .../service-calls/batch, every item answering 202
    (`count` rounded up to whole batches)."""
    import io
    import warnings

    from django.core.handlers.wsgi import WSGIHandler

    from bench import floor as floor_view
    from bench.load_client import body
    from bench.submission import API_PATH, FLOOR_PATH, SUBMIT_TENANT, api_key

    floor_view.create_table()
    warnings.filterwarnings("ignore", message="No directory at")  # WhiteNoise: no collectstatic here
    authorization = f"Bearer {api_key()}"
    handler = WSGIHandler()
    path = FLOOR_PATH if floor else API_PATH + ("/batch" if batch else "")
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    answers: list[str] = []

    def post(index: int) -> None:
        data = body(index, due, "http://127.0.0.1:9/target")
        if batch:
            calls = [json.loads(body(index * batch + n, due, "http://127.0.0.1:9/target")) for n in range(batch)]
            data = json.dumps({"calls": calls}).encode()
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(data)),
            "HTTP_HOST": "127.0.0.1:8000",
            "HTTP_AUTHORIZATION": authorization,
            "wsgi.input": io.BytesIO(data),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
        }
        response = handler(environ, lambda status, _headers, exc_info=None: answers.append(status))
        content = b"".join(response)
        response.close()
        if batch and answers[-1].startswith("200"):  # a batch's answer: each item's own status
            answers[-1:] = [str(item["status"]) for item in json.loads(content)["results"]]

    posts = -(-count // batch) if batch else count
    warmup = max(1, WARMUP_POSTS // batch) if batch else WARMUP_POSTS
    for index in range(warmup):
        post(-1 - index)
    _instrumentation(True)
    cpu, wall = time.process_time(), time.monotonic()
    for index in range(posts):
        post(index)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    _instrumentation(False)
    count = posts * batch if batch else count
    refused = [status for status in answers if not status.startswith("202")]
    if refused:
        raise SystemExit(f"{len(refused)} of {len(answers)} POSTs were not accepted: {refused[:3]}")
    if floor and floor_view.rows(SUBMIT_TENANT) != WARMUP_POSTS + count:
        raise SystemExit("the floor did not insert a row for every POST")
    return {"count": count, "cpu_s": cpu, "wall_s": wall}


def _callgrind(subject: str, count: int, receivers: int, kind: str = "webhook") -> int:
    """The instructions the measured part of one run of `subject` took, under callgrind."""
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
            subject,
            "--count",
            str(count),
            "--receivers",
            str(receivers),
            "--kind",
            kind,
        ],
        env={**os.environ, "BENCH_CALLGRIND": "1"},
        capture_output=True,
        text=True,
    )
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode or not found:
        raise SystemExit(f"{subject} under valgrind failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    log(f"{subject}: {int(found.group(1)):,} instructions ({time.monotonic() - started:.0f} s under valgrind)")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("subject", choices=["delivery", "call", "post", "floor", "batch"])
    parser.add_argument(
        "--count",
        type=int,
        default=300,
        help="delivery: calls, two events each; call: calls; post, floor: POSTs; batch: calls",
    )
    parser.add_argument("--receivers", type=int, default=2, help="delivery: webhook subscriptions (default 2)")
    parser.add_argument(
        "--kind",
        choices=["webhook", "nats"],
        default="webhook",
        help="delivery: webhooks to the receivers, or one NATS subscription (BENCH_NATS_URL)",
    )
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind")
    args = parser.parse_args()
    if args.count < 1 or not 1 <= args.receivers <= 8:
        parser.error("--count must be at least 1 and --receivers 1 to 8")
    if args.callgrind:
        if args.subject == "delivery":
            receivers = 1 if args.kind == "nats" else args.receivers
            per = _callgrind("delivery", args.count, args.receivers, args.kind) / (
                args.count * EVENTS_PER_CALL * receivers
            )
            print(f"instructions per delivered notification ({args.kind}): {per:,.0f}")
        elif args.subject == "call":
            per = _callgrind("call", args.count, args.receivers) / args.count
            print(f"instructions per drained call (no subscribers): {per:,.0f}")
        elif args.subject == "batch":  # per call, beside the single POST's
            batch = _callgrind("batch", args.count, args.receivers) / args.count
            post = _callgrind("post", args.count, args.receivers) / args.count
            print(f"instructions per call: in batches of {BATCH}: {batch:,.0f}; one POST each: {post:,.0f}")
        else:  # the POST and its floor, in two runs: their ratio is what the bench's target prices
            post = _callgrind("post", args.count, args.receivers) / args.count
            floor = _callgrind("floor", args.count, args.receivers) / args.count
            print(f"instructions per POST: {post:,.0f}; floor: {floor:,.0f}; floor / POST: {floor / post:.0%}")
        return
    stream = None
    if args.subject == "delivery" and args.kind == "nats":
        nats_settings = _nats_stream(NATS_URL)
        stream = nats_settings["NATS_STREAM"]
        os.environ.update({"NATS_URL": NATS_URL, **nats_settings})
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as data_dir:
        # The floor's settings: the project's, with the floor view in the URLconf (bench/floor.py).
        # No submissions ceiling: the POSTs come one after another as fast as the handler answers.
        os.environ.update(
            agent_env(
                Path(data_dir), DJANGO_SETTINGS_MODULE="bench.floor_settings", CEILING_SUBMISSIONS_PER_SECOND="100000"
            )
        )
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        children = Children(Path(data_dir))
        try:
            if args.subject == "delivery":
                result = measure_delivery(args.count, args.receivers, children, nats=args.kind == "nats")
                unit = "notification"
            elif args.subject == "call":
                result = measure_call(args.count, children)
                unit = "call"
            elif args.subject == "batch":
                result = measure_post(args.count, floor=False, batch=BATCH)
                unit = "call"
            else:
                result = measure_post(args.count, floor=args.subject == "floor")
                unit = "POST"
        finally:
            children.stop_all()
            if stream:
                _nats_stream_delete(NATS_URL, stream)
    per_ms = result["cpu_s"] / result["count"] * 1000
    print(
        f"{result['count']} {unit}s in {result['wall_s']:.2f} s: {result['cpu_s']:.2f} s of CPU, "
        f"{per_ms:.3f} ms per {unit}"
    )


if __name__ == "__main__":
    main()
