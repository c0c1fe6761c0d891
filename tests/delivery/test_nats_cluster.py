"""JetStream on a NATS cluster (docs/deploy.md, "High availability"): three nats-server nodes on
127.0.0.1, the agent's publisher given all three (NATS_URL) and a stream of three replicas
(NATS_STREAM_REPLICAS=3). The stream's leader is killed mid-stream: publishing goes on through
the others, and every event is in the stream once."""

from __future__ import annotations

import time
from collections import Counter

import nats.errors
import pytest

from delivery.nats import JetStreamError, JetStreamPublisher
from tests.support.nats import pulled, run_js
from tests.support.nats_servers import NATS_SERVER, nats_cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(NATS_SERVER is None, reason="needs the nats-server binary (Debian package nats-server)")

EVENTS = 300
LOST_AFTER = 100
STREAM = "SA_CLUSTER_TEST"


def publish_until_acked(publisher: JetStreamPublisher, n: int, *, within: float = 30) -> int:
    """Event n published as the agent's delivery loop does: a failed try is made again with the
    same Msg-Id (the stream stores it once); returns the tries it took."""
    deadline = time.monotonic() + within
    tries = 0
    while True:
        tries += 1
        try:
            publisher.publish(subject=f"sacluster.acme.e{n}", payload=b'{"n": %d}' % n, msg_id=f"event-{n}")
            return tries
        except JetStreamError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def ensured(publisher: JetStreamPublisher) -> bool:
    try:
        return publisher.ensure_stream() in ("created", "exists")
    except JetStreamError:  # the cluster has no JetStream leader yet
        return False


def answered(action, url: str):
    """run_js(action), asked again while the cluster elects a leader (its requests time out)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return run_js(action, url=url, timeout=10)
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def stream_info(js):
    return await js.stream_info(STREAM)


async def stored(js) -> list:
    return await pulled(js, STREAM, "sacluster.>", quiet=2)


def test_a_stream_of_three_replicas_keeps_every_event_once_when_its_leader_is_lost(tmp_path):
    with nats_cluster(tmp_path, size=3) as cluster:
        publisher = JetStreamPublisher(
            url=cluster.url, stream=STREAM, subjects=["sacluster.>"], replicas=3, timeout_s=2.0
        )
        try:
            wait_for(lambda: ensured(publisher), timeout=30, interval=0.25)
            assert answered(stream_info, cluster.url).config.num_replicas == 3
            tries = [publish_until_acked(publisher, n) for n in range(LOST_AFTER)]

            lost = cluster.node(answered(stream_info, cluster.url).cluster.leader)
            lost.kill()
            started = time.monotonic()
            tries += [publish_until_acked(publisher, n) for n in range(LOST_AFTER, EVENTS)]
            after_loss = time.monotonic() - started
        finally:
            publisher.close()
        survivors = ",".join(node.url for node in cluster.nodes if node is not lost)
        # Read once the stream has a leader again, and says what it holds.
        info = wait_for(lambda: (i := answered(stream_info, survivors)).cluster.leader and i, timeout=30)
        messages = answered(stored, survivors)
        leader = info.cluster.leader

    ids = Counter(message.headers["Nats-Msg-Id"] for message in messages)
    print(
        f"\nstream leader {lost.name} killed after {LOST_AFTER} events; {EVENTS - LOST_AFTER} more published in "
        f"{after_loss:.1f} s ({sum(tries) - EVENTS} tries again), new leader {leader}; {len(messages)} stored"
    )
    assert leader != lost.name
    assert info.state.messages == EVENTS
    assert set(ids) == {f"event-{n}" for n in range(EVENTS)}  # every event
    assert set(ids.values()) == {1}  # once
