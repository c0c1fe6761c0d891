"""delivery/nats.py: subject templates (pure), and the JetStream publisher against a real NATS.

The server tests (marker `nats`) skip where no NATS with JetStream answers at NATS_TEST_URL.
Each one works on a stream of its own (SA_TEST_<hex>, subjects satest<hex>.>) and deletes it,
so no real stream is ever touched.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from core.ids import new_id, utcnow
from delivery.nats import (
    DEFAULT_STREAM_SUBJECTS,
    DEFAULT_SUBJECT_TEMPLATE,
    JetStreamError,
    JetStreamPublisher,
    PublishAck,
    subject_covers,
    subject_for,
    validate_stream_subjects,
    validate_subject_template,
)
from tests.support.agent_process import ROOT, agent_env
from tests.support.nats import NATS_TEST_URL, pulled, run_js
from tests.support.waiting import wait_for

ENVELOPE = {
    "id": "0190c2a4-7b1e-7cc0-8a4e-000000000001",
    "type": "ServiceCallSucceeded",
    "tenantId": "acme-eu",
    "aggregateId": "0190c2a4-7b1e-7cc0-8a4e-3f1d2b9c0d11",
    "payload": {},
}


# --- subject templates (no server) ---------------------------------------------------------


def test_the_default_template_gives_tenant_and_type():
    assert subject_for(DEFAULT_SUBJECT_TEMPLATE, ENVELOPE) == "serviceagent.acme-eu.ServiceCallSucceeded"


def test_it_fills_the_aggregate_id():
    subject = subject_for("serviceagent.calls.{aggregateId}.{type}", ENVELOPE)
    assert subject == "serviceagent.calls.0190c2a4-7b1e-7cc0-8a4e-3f1d2b9c0d11.ServiceCallSucceeded"


def test_it_makes_each_value_one_safe_token():
    envelope = {**ENVELOPE, "tenantId": "a.b *>", "type": ""}
    assert subject_for(DEFAULT_SUBJECT_TEMPLATE, envelope) == "serviceagent.a_b___._"
    assert subject_for(DEFAULT_SUBJECT_TEMPLATE, {"type": "X"}) == "serviceagent._.X"


def test_it_refuses_an_unknown_placeholder():
    with pytest.raises(ValueError, match=r"unknown placeholder \{tenant\}"):
        subject_for("serviceagent.{tenant}", ENVELOPE)
    with pytest.raises(ValueError, match="unknown placeholder"):
        subject_for("serviceagent.{type.__class__}", ENVELOPE)


def test_it_refuses_unbalanced_braces():
    with pytest.raises(ValueError, match="unbalanced"):
        subject_for("serviceagent.{type", ENVELOPE)


@pytest.mark.parametrize(
    "template",
    [
        DEFAULT_SUBJECT_TEMPLATE,
        "serviceagent.{type}",
        "serviceagent.prod.{tenantId}.{type}.{aggregateId}",
        "serviceagent.t-{tenantId}",
    ],
)
def test_it_accepts_templates_under_the_stream(template):
    assert validate_subject_template(template, stream_subjects=DEFAULT_STREAM_SUBJECTS) is None


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("", "1 to 200 characters"),
        ("serviceagent." + "x" * 200, "1 to 200 characters"),
        ("serviceagent.{tenant}", "unknown placeholder {tenant}"),
        ("serviceagent.{type", "unbalanced"),
        ("serviceagent..{type}", "invalid"),
        ("serviceagent.{type}.", "invalid"),
        ("serviceagent.*", "invalid"),
        ("serviceagent.>", "invalid"),
        ("serviceagent.my events", "invalid"),
        ("serviceagent", "outside the stream's subjects (serviceagent.>)"),
        ("other.{tenantId}.{type}", "outside the stream's subjects"),
        ("{tenantId}.{type}", "outside the stream's subjects"),
    ],
)
def test_it_refuses_bad_templates(template, message):
    assert message in validate_subject_template(template, stream_subjects=DEFAULT_STREAM_SUBJECTS)


def test_it_checks_templates_against_other_stream_subjects():
    assert validate_subject_template("events.{type}", stream_subjects=["events.>"]) is None
    assert validate_subject_template("a.{tenantId}.{type}", stream_subjects=["b.>", "a.*.*"]) is None
    assert "outside" in validate_subject_template(DEFAULT_SUBJECT_TEMPLATE, stream_subjects=["events.>"])


@pytest.mark.parametrize(
    ("template", "subjects"),
    [
        # acme's events would fit; another tenant's, or another type's, would not.
        ("events.{tenantId}.{type}", ["events.acme.>"]),
        ("events.t-{tenantId}.{type}", ["events.t-acme.>"]),
        ("events.acme.{type}", ["events.acme.ServiceCallSucceeded"]),
        ("events.{tenantId}.{type}", ["events.*"]),
    ],
)
def test_a_template_must_fit_the_stream_whatever_the_events_values(template, subjects):
    assert "outside the stream's subjects" in validate_subject_template(template, stream_subjects=subjects)


@pytest.mark.parametrize(
    "subjects",
    [["serviceagent.>"], ["serviceagent"], ["agent-eu.events.>", "agent-eu.audit"], ["a.*.b", "a.*.c.>"], [">"]],
)
def test_it_accepts_stream_subjects(subjects):
    assert validate_stream_subjects(subjects) is None


@pytest.mark.parametrize(
    ("subjects", "message"),
    [
        ([], "name at least one subject"),
        ([""], "'' is not a subject"),
        (["a..b"], "'a..b' is not a subject"),
        (["a.>.b"], "'a.>.b' is not a subject"),
        (["a.b>"], "'a.b>' is not a subject"),
        (["$JS.>"], "'$JS.>' is not a subject"),
        (["a b.>"], "'a b.>' is not a subject"),
        (["a.>", "a.b"], "'a.b' is already covered by 'a.>'"),
        (["a.*", "a.b"], "'a.b' is already covered by 'a.*'"),
        (["a.>", "a.>"], "'a.>' is already covered by 'a.>'"),
    ],
)
def test_it_refuses_bad_stream_subjects(subjects, message):
    assert message in validate_stream_subjects(subjects)


@pytest.mark.parametrize(
    ("pattern", "subject", "covered"),
    [
        ("serviceagent.>", "serviceagent.>", True),
        ("serviceagent.>", "serviceagent.acme.*", True),
        ("serviceagent.>", "serviceagent", False),
        (">", "serviceagent.>", True),
        ("serviceagent.*", "serviceagent.acme", True),
        ("serviceagent.*", "serviceagent.>", False),
        ("serviceagent.*", "serviceagent.acme.Type", False),
        ("serviceagent.acme.>", "serviceagent.>", False),
        ("serviceagent.acme", "serviceagent.acme", True),
    ],
)
def test_subject_covers(pattern, subject, covered):
    assert subject_covers(pattern, subject) is covered


# --- the publisher against a real NATS -----------------------------------------------------


@dataclass(frozen=True)
class Stream:
    name: str
    prefix: str


def stream_messages(stream: str) -> list:
    """Every message in the stream, read once through an ephemeral pull consumer."""

    async def read(js: JetStreamContext) -> list:
        info = await js.stream_info(stream)
        sub = await js.pull_subscribe(">", stream=stream)
        messages = []
        while len(messages) < info.state.messages:
            for msg in await sub.fetch(batch=100, timeout=2):
                await msg.ack()
                messages.append(msg)
        try:
            extra = await sub.fetch(batch=1, timeout=0.3)
        except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either when none comes
            extra = []
        return messages + extra

    return run_js(read)


@pytest.fixture
def stream() -> Iterator[Stream]:
    suffix = secrets.token_hex(4)
    yield Stream(name=f"SA_TEST_{suffix.upper()}", prefix=f"satest{suffix}")

    async def delete(js: JetStreamContext) -> None:
        try:
            await js.delete_stream(f"SA_TEST_{suffix.upper()}")
        except nats.js.errors.NotFoundError:
            pass

    run_js(delete)


@pytest.fixture
def publisher(stream: Stream) -> Iterator[JetStreamPublisher]:
    running = JetStreamPublisher(url=NATS_TEST_URL, stream=stream.name, subjects=[f"{stream.prefix}.>"])
    yield running
    running.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.nats
def test_ensure_stream_creates_it_with_the_duplicate_window_and_twice_is_harmless(publisher, stream):
    assert publisher.ensure_stream() == "created"
    assert publisher.ensure_stream() == "exists"

    info = run_js(lambda js: js.stream_info(stream.name))
    assert info.config.subjects == [f"{stream.prefix}.>"]
    assert info.config.duplicate_window == 600


@pytest.mark.nats
def test_ensure_stream_adds_our_subjects_to_an_existing_stream_and_keeps_its_settings(stream):
    run_js(lambda js: js.add_stream(name=stream.name, subjects=[f"{stream.prefix}.other"], max_msgs=1000))
    publisher = JetStreamPublisher(url=NATS_TEST_URL, stream=stream.name, subjects=[f"{stream.prefix}.events.>"])
    try:
        assert publisher.ensure_stream() == "updated"
        assert publisher.ensure_stream() == "exists"
    finally:
        publisher.close()

    info = run_js(lambda js: js.stream_info(stream.name))
    assert info.config.subjects == [f"{stream.prefix}.other", f"{stream.prefix}.events.>"]
    assert info.config.max_msgs == 1000


@pytest.mark.nats
def test_ensure_stream_leaves_a_stream_whose_subjects_cover_ours_alone(stream):
    run_js(lambda js: js.add_stream(name=stream.name, subjects=[f"{stream.prefix}.>"], duplicate_window=900))
    publisher = JetStreamPublisher(url=NATS_TEST_URL, stream=stream.name, subjects=[f"{stream.prefix}.a.*"])
    try:
        assert publisher.ensure_stream() == "exists"
    finally:
        publisher.close()

    info = run_js(lambda js: js.stream_info(stream.name))
    assert info.config.subjects == [f"{stream.prefix}.>"]
    assert info.config.duplicate_window == 900


@pytest.mark.nats
def test_publish_returns_an_ack_with_increasing_seq(publisher, stream):
    publisher.ensure_stream()
    acks = [
        publisher.publish(subject=f"{stream.prefix}.acme.Type", payload=b"{}", msg_id=f"event-{n}") for n in range(3)
    ]
    assert [(ack.stream, ack.seq, ack.duplicate) for ack in acks] == [
        (stream.name, 1, False),
        (stream.name, 2, False),
        (stream.name, 3, False),
    ]


@pytest.mark.nats
def test_the_same_msg_id_is_stored_once(publisher, stream):
    publisher.ensure_stream()
    subject = f"{stream.prefix}.acme.Type"
    first = publisher.publish(subject=subject, payload=b"one", msg_id="event-1")
    again = publisher.publish(subject=subject, payload=b"one", msg_id="event-1")

    assert (first.seq, first.duplicate) == (1, False)
    assert (again.seq, again.duplicate) == (1, True)
    assert len(stream_messages(stream.name)) == 1


@pytest.mark.nats
def test_a_consumer_sees_each_message_once_with_its_msg_id_and_exact_payload(publisher, stream):
    publisher.ensure_stream()
    sent = {f"event-{n}": f'{{"n":{n},"text":"caf\u00e9 \u2603"}}'.encode() + bytes([0, 255, n]) for n in range(5)}
    for msg_id, payload in sent.items():
        publisher.publish(subject=f"{stream.prefix}.acme.Type", payload=payload, msg_id=msg_id)
    publisher.publish(subject=f"{stream.prefix}.acme.Type", payload=sent["event-2"], msg_id="event-2")

    received = stream_messages(stream.name)
    assert [(msg.headers["Nats-Msg-Id"], msg.data) for msg in received] == list(sent.items())
    assert {msg.subject for msg in received} == {f"{stream.prefix}.acme.Type"}


@pytest.mark.nats
def test_eight_threads_publishing_at_once_all_get_acks(publisher, stream):
    publisher.ensure_stream()
    acks, errors, lock = [], [], threading.Lock()

    def work(thread: int) -> None:
        for n in range(25):
            try:
                ack = publisher.publish(
                    subject=f"{stream.prefix}.t{thread}.Type", payload=f"{thread}:{n}".encode(), msg_id=f"{thread}-{n}"
                )
            except Exception as error:
                with lock:
                    errors.append(error)
            else:
                with lock:
                    acks.append(ack)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert len(acks) == 200
    assert sorted(ack.seq for ack in acks) == list(range(1, 201))
    assert not any(ack.duplicate for ack in acks)
    received = stream_messages(stream.name)
    assert sorted(msg.headers["Nats-Msg-Id"] for msg in received) == sorted(
        f"{t}-{n}" for t in range(8) for n in range(25)
    )


@pytest.mark.nats
def test_a_batch_gets_an_ack_or_an_error_for_each_message_and_one_bad_one_fails_alone(publisher, stream):
    """publish_many, the delivery loop's way of trying NATS notifications together: each
    message its own answer, in the order given, stored once per msg_id."""
    publisher.ensure_stream()
    subject = f"{stream.prefix}.acme.Type"
    sent = [(subject, f'{{"n":{n}}}'.encode() + bytes([0, 255]), f"event-{n}") for n in range(40)]
    batch = sent[:20] + [("elsewhere.acme.Type", b"{}", "event-x")] + sent[20:] + [sent[3]]

    answers = publisher.publish_many(batch)

    assert len(answers) == len(batch)
    refused = answers[20]
    assert isinstance(refused, JetStreamError) and "no stream takes subject 'elsewhere.acme.Type'" in str(refused)
    acks = answers[:20] + answers[21:-1]
    assert all(isinstance(ack, PublishAck) and not ack.duplicate for ack in acks)
    assert sorted(ack.seq for ack in acks) == list(range(1, 41))
    assert isinstance(answers[-1], PublishAck) and answers[-1].duplicate and answers[-1].seq == answers[3].seq
    received = stream_messages(stream.name)
    assert sorted((msg.headers["Nats-Msg-Id"], msg.data) for msg in received) == sorted(
        (msg_id, payload) for _, payload, msg_id in sent
    )
    assert publisher.publish_many([]) == []
    with pytest.raises(ValueError, match="invalid msg_id"):
        publisher.publish_many([(subject, b"{}", "ok"), (subject, b"{}", "two words")])


@contextmanager
def silent_responder(subject: str) -> Iterator[None]:
    """A core NATS subscriber on `subject` that never answers: a message published there has
    a responder (so no "no responders" refusal) and never an ack."""
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), None

    async def ignore(msg: object) -> None:
        pass

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        nc = await nats.connect(NATS_TEST_URL, allow_reconnect=False, connect_timeout=5)
        try:
            await nc.subscribe(subject, cb=ignore)
            await nc.flush()
            ready.set()
            await stop.wait()
        finally:
            await nc.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the silent subscriber did not start"
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


@pytest.mark.nats
def test_in_a_batch_a_lost_ack_fails_its_message_alone_within_the_timeout(stream):
    """publish_many waits for each ack within the publisher's timeout: a message nobody acks
    fails on its own, the others of its batch are acked, and the publisher goes on."""
    publisher = JetStreamPublisher(
        url=NATS_TEST_URL, stream=stream.name, subjects=[f"{stream.prefix}.>"], timeout_s=0.5
    )
    try:
        publisher.ensure_stream()
        stored = f"{stream.prefix}.acme.Type"
        silent = f"silent{stream.prefix}.acme.Type"
        with silent_responder(silent):
            started = time.monotonic()
            answers = publisher.publish_many([(stored, b"{}", "a"), (silent, b"{}", "b"), (stored, b"{}", "c")])
            took = time.monotonic() - started
        assert [type(answer) for answer in answers] == [PublishAck, JetStreamError, PublishAck]
        assert "no ack from NATS" in str(answers[1]) and "within 0.5s" in str(answers[1])
        assert 0.4 < took < 2
        again = publisher.publish_many([(stored, b"{}", "d")])
        assert isinstance(again[0], PublishAck) and again[0].seq == 3
        assert publisher._acks is not None and publisher._acks._waiting == {}  # nothing left behind
    finally:
        publisher.close()


@pytest.mark.nats
def test_in_a_batch_a_message_over_the_servers_max_payload_fails_alone(publisher, stream):
    """Over the limit by its payload, or by its payload and header together (nats-py checks the
    payload alone; the server would close the connection, and every message out on it would
    wait for its ack in vain): the message fails at once, the others go through."""
    publisher.ensure_stream()
    assert publisher._nc is not None
    limit = publisher._nc.max_payload
    subject = f"{stream.prefix}.acme.Type"
    batch = [
        (subject, b"{}", "a"),
        (subject, b"x" * (2 * limit), "b"),
        (subject, b"x" * (limit - 10), "c"),
        (subject, b"{}", "d"),
    ]
    started = time.monotonic()
    answers = publisher.publish_many(batch)
    assert time.monotonic() - started < 2
    assert [type(answer) for answer in answers] == [PublishAck, JetStreamError, JetStreamError, PublishAck]
    assert all("maximum payload" in str(answer) for answer in answers[1:3])
    assert [ack.seq for ack in (answers[0], answers[3])] == [1, 2]
    assert publisher._acks is not None and publisher._acks._waiting == {}
    with pytest.raises(JetStreamError, match="maximum payload"):
        publisher.publish(subject=subject, payload=b"x" * (limit - 10), msg_id="e")
    assert publisher.publish(subject=subject, payload=b"{}", msg_id="f").seq == 3


@pytest.mark.nats
def test_in_a_batch_a_message_the_stream_refuses_fails_alone_at_once(stream):
    """The stream's own refusal (a message over its max_msg_size) comes back as the message's
    error when the server answers, not as a lost ack after the timeout."""

    async def create(js: JetStreamContext) -> None:
        await js.add_stream(StreamConfig(name=stream.name, subjects=[f"{stream.prefix}.>"], max_msg_size=100))

    run_js(create)
    publisher = JetStreamPublisher(url=NATS_TEST_URL, stream=stream.name, subjects=[f"{stream.prefix}.>"], timeout_s=3)
    try:
        subject = f"{stream.prefix}.acme.Type"
        started = time.monotonic()
        answers = publisher.publish_many([(subject, b"{}", "a"), (subject, b"x" * 500, "b"), (subject, b"{}", "c")])
        took = time.monotonic() - started
        assert [type(answer) for answer in answers] == [PublishAck, JetStreamError, PublishAck]
        assert f"the stream refused the message on {subject!r}" in str(answers[1]) and "err_code 10054" in str(
            answers[1]
        )
        assert took < 1.5
    finally:
        publisher.close()


@pytest.mark.nats
def test_it_refuses_a_subject_outside_the_stream(publisher, stream):
    publisher.ensure_stream()
    started = time.monotonic()
    with pytest.raises(JetStreamError, match=r"no stream takes subject 'elsewhere\.acme\.Type'.*no responders"):
        publisher.publish(subject="elsewhere.acme.Type", payload=b"{}", msg_id="event-1")
    assert time.monotonic() - started < 2


@pytest.mark.nats
def test_it_raises_within_the_timeout_when_nats_is_unreachable(stream):
    publisher = JetStreamPublisher(url=f"nats://127.0.0.1:{free_port()}", stream=stream.name, timeout_s=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(JetStreamError, match=r"no answer from NATS at nats://127\.0\.0\.1:\d+ within 1\.0s"):
            publisher.publish(subject="serviceagent.acme.Type", payload=b"{}", msg_id="event-1")
        assert time.monotonic() - started < 2.5
        with pytest.raises(JetStreamError, match="no answer"):
            publisher.ensure_stream()
        started = time.monotonic()
        with pytest.raises(JetStreamError, match=r"no answer from NATS .* within 2\.0s"):
            publisher.publish_many([("serviceagent.acme.Type", b"{}", f"event-{n}") for n in range(3)])
        assert time.monotonic() - started < 4
    finally:
        started = time.monotonic()
        publisher.close()
        assert time.monotonic() - started < 2.5


@pytest.mark.nats
def test_it_refuses_calls_after_close(publisher, stream):
    publisher.ensure_stream()
    publisher.close()
    with pytest.raises(JetStreamError, match="closed"):
        publisher.publish(subject=f"{stream.prefix}.acme.Type", payload=b"{}", msg_id="event-1")


EVENTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"
# Publishes one event as the agent does at start: its settings checked, its stream ensured.
PUBLISH_ONE = """
from django.conf import settings
from delivery.channels.nats import nats_publisher
from delivery.nats_subjects import subject_for
subject = subject_for(settings.NATS_SUBJECT_TEMPLATE, {"tenantId": "acme", "type": "ServiceAgentPing"})
ack = nats_publisher().publish(subject=subject, payload=b"{}", msg_id="docs-example-1")
print(ack.stream, subject)
nats_publisher().close()
"""


def _documented_agent(suffix: str) -> dict[str, str]:
    """docs/events.md's settings for an agent sharing its NATS server, named for this test
    (AGENT_EU, agent-eu: SA_TEST_<hex>, satest<hex>) so that runs side by side never meet."""
    [block] = re.findall(r"<!-- example: second agent -->\n((?:    NATS_\w+=\S+\n)+)", EVENTS_DOC.read_text())
    text = block.replace("AGENT_EU", f"SA_TEST_{suffix.upper()}").replace("agent-eu", f"satest{suffix}")
    return dict(line.strip().split("=", 1) for line in text.splitlines())


@pytest.mark.nats
def test_agents_sharing_a_server_as_documented_each_publish_to_a_stream_of_their_own(tmp_path):
    agents = [_documented_agent(secrets.token_hex(4)) for _ in range(2)]
    # A stream name and a template: the stream's subjects follow the template (its first token and '>').
    assert {tuple(sorted(agent)) for agent in agents} == {("NATS_STREAM", "NATS_SUBJECT_TEMPLATE")}
    for agent in agents:
        agent["NATS_STREAM_SUBJECTS"] = agent["NATS_SUBJECT_TEMPLATE"].split(".", 1)[0] + ".>"
    try:
        running = [
            subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "shell", "--no-imports", "-c", PUBLISH_ONE],
                cwd=ROOT,
                env={
                    key: value
                    for key, value in agent_env(tmp_path / str(n), NATS_URL=NATS_TEST_URL, **agent).items()
                    if key != "NATS_STREAM_SUBJECTS"  # what the agent derives from its template is under test
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n, agent in enumerate(agents)
        ]
        for agent, proc in zip(agents, running, strict=True):
            out, err = proc.communicate(timeout=60)
            prefix = agent["NATS_STREAM_SUBJECTS"].removesuffix(".>")
            assert (proc.returncode, out) == (0, f"{agent['NATS_STREAM']} {prefix}.acme.ServiceAgentPing\n"), err
            info = run_js(lambda js, agent=agent: js.stream_info(agent["NATS_STREAM"]))
            assert (info.config.subjects, info.state.messages) == ([agent["NATS_STREAM_SUBJECTS"]], 1)

        # A third agent on the first one's subjects, under another stream name, is refused by
        # the server with the reason: a subject belongs to one stream at a time.
        taken = JetStreamPublisher(
            url=NATS_TEST_URL, stream=f"{agents[0]['NATS_STREAM']}_B", subjects=[agents[0]["NATS_STREAM_SUBJECTS"]]
        )
        try:
            with pytest.raises(JetStreamError, match="could not create JetStream stream .*overlap"):
                taken.ensure_stream()
        finally:
            taken.close()
    finally:
        for agent in agents:
            run_js(lambda js, agent=agent: _delete_stream(js, agent["NATS_STREAM"]))


async def _delete_stream(js: JetStreamContext, name: str) -> None:
    try:
        await js.delete_stream(name)
    except nats.js.errors.NotFoundError:
        pass


def test_it_refuses_a_short_duplicate_window_and_a_bad_stream_name():
    with pytest.raises(ValueError, match="at least 600s"):
        JetStreamPublisher(url=NATS_TEST_URL, duplicate_window_s=60)
    with pytest.raises(ValueError, match="invalid stream name"):
        JetStreamPublisher(url=NATS_TEST_URL, stream="SERVICE.AGENT")


NATS_SERVER = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")


class PrivateNats:
    """A nats-server of this test's own on a free port, to stop and start at will."""

    def __init__(self, store: str, *, max_payload: int | None = None) -> None:
        self.port, self.store = free_port(), store
        self.max_payload = max_payload
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.store]
        if self.max_payload is not None:  # no command-line flag for it: a config file
            config = f"{self.store}/nats.conf"
            with open(config, "w") as file:
                file.write(f"max_payload: {self.max_payload}\n")
            command += ["-c", config]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _listening(self.port), timeout=10)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(NATS_SERVER is None, reason="needs the nats-server binary (Debian package nats-server)")
def test_it_connects_when_nats_comes_up_and_reconnects_after_a_restart(tmp_path):
    server = PrivateNats(str(tmp_path))
    publisher = JetStreamPublisher(url=f"nats://127.0.0.1:{server.port}", timeout_s=1.0)

    def publish(msg_id: str):
        try:
            return publisher.publish(subject="serviceagent.acme.Type", payload=b"{}", msg_id=msg_id)
        except JetStreamError:
            return None

    try:
        assert publish("event-1") is None  # nothing listens yet
        server.start()
        wait_for(lambda: _ensured(publisher), timeout=10)
        assert publish("event-1").seq == 1

        server.stop()
        started = time.monotonic()
        assert publish("event-2") is None
        assert time.monotonic() - started < 2.5

        server.start()  # the same store: the stream and its message survive
        ack = wait_for(lambda: publish("event-3"), timeout=10)
        # After event-1, which the store kept (a retry of event-3 whose first ack was lost on a
        # busy machine answers "duplicate": it is stored once all the same).
        assert ack.stream == publisher.stream and ack.seq > 1
    finally:
        publisher.close()
        server.stop()


def _ensured(publisher: JetStreamPublisher) -> bool:
    try:
        return publisher.ensure_stream() in ("created", "exists")
    except JetStreamError:
        return False


# --- the delivery loop's NATS tries ---------------------------------------------------------


@pytest.fixture
def own_publisher(monkeypatch):
    """The process's publisher made afresh for this test's settings, closed after it."""
    from delivery.channels import nats as senders

    monkeypatch.setattr(senders, "_publisher", None)
    yield
    if senders._publisher is not None:
        senders._publisher.close()


def _agent_settings(settings, stream: Stream) -> str:
    """The agent's NATS settings on this test's own stream and subjects (NATS_STREAM_SUBJECTS),
    as a deployment sharing the server with others sets them; returns the subject template."""
    settings.NATS_URL, settings.NATS_STREAM = NATS_TEST_URL, stream.name
    settings.NATS_STREAM_SUBJECTS = [f"{stream.prefix}.>"]
    settings.NATS_SUBJECT_TEMPLATE = f"{stream.prefix}.{{tenantId}}.{{type}}"
    return settings.NATS_SUBJECT_TEMPLATE


@pytest.mark.nats
def test_the_loop_publishes_a_claims_nats_notifications_together_each_recorded(
    transactional_db, world, settings, stream, own_publisher, monkeypatch
):
    """A claim's NATS notifications go out as one batch: each is stored once with its event's
    id as Nats-Msg-Id and its envelope as payload, each recorded with its own try's result."""
    from delivery.channels.nats import nats_publisher
    from delivery.envelopes import event_body
    from delivery.models import DeliveryAttempt, Notification, Subscription
    from delivery.runner import Deliverer
    from delivery.services import subscription_create, subscription_send_test
    from delivery.validation import SubscriptionInput

    template = _agent_settings(settings, stream)
    subscription, _ = subscription_create(
        tenant_id="acme", data=SubscriptionInput(kind="nats", name="n", subject_template=template)
    )
    nats_publisher()  # the agent's stream, as at start
    assert run_js(lambda js: js.stream_info(stream.name)).config.subjects == [f"{stream.prefix}.>"]
    # A subscription whose subject no stream takes (set behind the validation's back): its tries
    # fail in the same batches, each on its own.
    stray, _ = subscription_create(
        tenant_id="acme", data=SubscriptionInput(kind="nats", name="s", subject_template=template)
    )
    Subscription.objects.filter(pk=stray.pk).update(subject_template="elsewhere.{tenantId}.{type}")
    for n in range(16):
        subscription_send_test(tenant_id="acme", subscription_id=(stray if n % 4 == 0 else subscription).pk)
    publisher = nats_publisher()
    batches = []
    publish_many = publisher.publish_many
    monkeypatch.setattr(
        publisher, "publish_many", lambda messages: batches.append(len(messages)) or publish_many(messages)
    )
    deliverer = Deliverer(concurrency=32, batch_size=32, per_subscription=16)
    try:
        deliverer.step()  # one claim, one batch of both subscriptions' tries
        wait_for(lambda: deliverer.results.qsize() == 16, timeout=10)
        deliverer.record_ready()
    finally:
        deliverer.stop(timeout=5)
    assert batches == [16]  # one publish batch for the claim's 16 NATS tries

    strays = list(Notification.objects.filter(subscription=stray))
    assert len(strays) == 4
    for n in strays:
        assert (n.state, n.attempts) == (Notification.State.FAILED, 1)
        assert "no stream takes subject 'elsewhere.acme.ServiceAgentPing'" in n.last_error
    notifications = list(Notification.objects.filter(subscription=subscription))
    assert len(notifications) == 12
    assert {n.state for n in notifications} == {Notification.State.SUCCEEDED}
    assert DeliveryAttempt.objects.filter(notification__subscription=subscription, n=1, error="").count() == 12
    received = run_js(lambda js: pulled(js, stream.name, f"{stream.prefix}.>"))
    assert sorted((msg.headers["Nats-Msg-Id"], msg.data) for msg in received) == sorted(
        (n.envelope["id"], event_body(n.envelope).encode()) for n in notifications
    )


def test_without_nats_url_each_nats_try_of_a_batch_fails_on_its_own_and_is_recorded(transactional_db, world, settings):
    from delivery.models import Notification, Subscription
    from delivery.runner import Deliverer
    from delivery.services import subscription_send_test

    settings.NATS_URL = ""
    now = utcnow()
    subscription = Subscription.objects.create(
        subscription_id=new_id(),
        tenant_id="acme",
        kind=Subscription.Kind.NATS,
        name="n",
        created_at=now,
        updated_at=now,
    )
    for _ in range(3):
        subscription_send_test(tenant_id="acme", subscription_id=subscription.pk)
    deliverer = Deliverer(concurrency=8, batch_size=8)
    try:
        deliverer.step()
        wait_for(lambda: deliverer.results.qsize() == 3, timeout=10)
        deliverer.record_ready()
    finally:
        deliverer.stop(timeout=5)
    tried = list(Notification.objects.filter(subscription=subscription))
    assert [(n.state, n.attempts, n.last_error) for n in tried] == [
        (Notification.State.FAILED, 1, "NATS_URL is not set")
    ] * 3


def test_a_publisher_whose_stream_cannot_be_ensured_is_closed_not_left_behind(settings, own_publisher):
    """NATS down at the first delivery: the try fails, and the publisher made for it goes with
    its loop thread and its reconnecting connection (each later try makes a new one)."""
    from delivery.channels import nats as senders

    settings.NATS_URL, settings.NATS_PUBLISH_TIMEOUT_MS = f"nats://127.0.0.1:{free_port()}", 300
    before = {t for t in threading.enumerate() if t.name == "nats-publisher"}
    for _ in range(2):
        with pytest.raises(JetStreamError, match="no answer"):
            senders.nats_publisher()
    assert senders._publisher is None
    wait_for(
        lambda: {t for t in threading.enumerate() if t.name == "nats-publisher" and t.is_alive()} <= before, timeout=5
    )


def _call_events_through_the_loop(subscription, *, headers: dict[str, str]):
    """A call with these headers, its Submitted and Scheduled events tried by the delivery loop
    (the second waits behind the first); (the call, its notifications re-read)."""
    from delivery.models import Notification
    from delivery.runner import Deliverer
    from outbox.dispatcher import dispatch_batch
    from tests.support.factories import make_call

    call = make_call("acme", headers=headers, due_in=3600)
    dispatch_batch()
    deliverer = Deliverer(concurrency=8, batch_size=8, per_subscription=8)
    try:
        for _ in range(2):
            deliverer.step()
            wait_for(lambda: deliverer.results.qsize() >= 1, timeout=10)
            deliverer.record_ready()
    finally:
        deliverer.stop(timeout=5)
    return call, list(Notification.objects.filter(subscription=subscription).order_by("event_seq"))


def _delivered_both(rows) -> bool:
    from delivery.models import Notification

    return [(n.event_type, n.state) for n in rows] == [
        ("ServiceCallSubmitted", Notification.State.SUCCEEDED),
        ("ServiceCallScheduled", Notification.State.SUCCEEDED),
    ]


@pytest.mark.nats
def test_an_event_of_accented_header_values_goes_to_nats_whole_as_utf8(
    transactional_db, world, settings, stream, own_publisher
):
    """31 header values of 8 KiB of "é": 0.5 MB as UTF-8, 1.5 MB ASCII-escaped, which was over
    NATS's max_payload and held back the call's later events for the whole retry schedule."""
    from delivery.channels.nats import nats_publisher
    from delivery.services import subscription_create
    from delivery.validation import SubscriptionInput

    template = _agent_settings(settings, stream)
    subscription, _ = subscription_create(
        tenant_id="acme", data=SubscriptionInput(kind="nats", name="n", subject_template=template)
    )
    nats_publisher()
    headers = {f"X-Accented-{n}": "é" * 8192 for n in range(31)}
    _, rows = _call_events_through_the_loop(subscription, headers=headers)

    assert _delivered_both(rows), [(n.event_type, n.state, n.last_error) for n in rows]
    received = run_js(lambda js: pulled(js, stream.name, f"{stream.prefix}.>"))
    submitted = next(msg for msg in received if msg.subject.endswith(".ServiceCallSubmitted"))
    assert "é" * 8192 in submitted.data.decode()  # UTF-8, not \u00e9 escapes
    envelope = json.loads(submitted.data)
    assert "payloadTruncated" not in envelope
    assert envelope["payload"]["requestSpec"]["headers"] == headers


@pytest.mark.skipif(NATS_SERVER is None, reason="needs the nats-server binary (Debian package nats-server)")
def test_an_event_over_the_servers_max_payload_is_delivered_cut_and_the_calls_later_events_follow(
    transactional_db, world, settings, tmp_path, own_publisher
):
    """On a server whose max_payload is 256 KiB, the same call's ServiceCallSubmitted is still
    delivered: its payload cut to fit, marked, with the call's API URL to read the rest; the
    call's later event, which waits behind it, follows."""
    from delivery.channels.nats import nats_publisher
    from delivery.services import subscription_create
    from delivery.validation import SubscriptionInput

    server = PrivateNats(str(tmp_path), max_payload=256 * 1024)
    server.start()
    try:
        settings.NATS_URL = f"nats://127.0.0.1:{server.port}"
        settings.AGENT_BASE_URL = "http://agent.example"
        subscription, _ = subscription_create(tenant_id="acme", data=SubscriptionInput(kind="nats", name="n"))
        headers = {f"X-Accented-{n}": "é" * 8192 for n in range(31)}
        call, rows = _call_events_through_the_loop(subscription, headers=headers)

        assert _delivered_both(rows), [(n.event_type, n.state, n.last_error) for n in rows]
        assert nats_publisher()._nc.max_payload == 256 * 1024
        received = run_js(
            lambda js: pulled(js, settings.NATS_STREAM, "serviceagent.acme.>"), url=settings.NATS_URL, timeout=20
        )
    finally:
        server.stop()
    by_type = {msg.subject.rsplit(".", 1)[1]: msg for msg in received}
    submitted = by_type["ServiceCallSubmitted"]
    assert len(submitted.data) <= 256 * 1024
    envelope = json.loads(submitted.data)
    assert envelope["payloadTruncated"] is True
    assert envelope["callUrl"] == f"http://agent.example/api/tenants/acme/service-calls/{call.pk}"
    assert envelope["payload"]["serviceCallId"] == str(call.pk)
    cut = envelope["payload"]["requestSpec"]["headers"]
    assert set(cut) == set(headers)  # its shape is kept, its values cut
    assert all(0 < len(value) < 8192 and set(value) == {"é"} for value in cut.values())
    assert "payloadTruncated" not in json.loads(by_type["ServiceCallScheduled"].data)
