"""The agent's loops running in real django-q2 workers (`manage.py qcluster`)."""

import json

import pytest

from orchestration.models import ServiceCall
from outbox.models import OutboxEvent
from tests.support.factories import make_call
from tests.support.waiting import wait_for
from tests.workers.cluster import Cluster
from workers.models import WorkerSession

pytestmark = [pytest.mark.workers, pytest.mark.django_db(transaction=True)]


def fresh(call: ServiceCall) -> ServiceCall:
    return ServiceCall.objects.get(pk=call.pk)


@pytest.fixture
def cluster(tmp_path):
    running = []

    def make(**env):
        c = Cluster(tmp_path, name=f"c{len(running) + 1}", **env)
        running.append(c)
        return c.start()

    yield make
    for c in running:
        c.stop()


@pytest.mark.serial  # a lateness under a second, in a real qcluster
def test_a_call_due_in_3s_starts_within_a_second_of_its_due_time(world, http_target, cluster):
    cluster()
    call = make_call(url=http_target.url("/json"), due_in=3)
    done = wait_for(lambda: (c := fresh(call)).is_terminal and c, timeout=15)
    assert done.status == ServiceCall.Status.SUCCEEDED
    lateness = (done.started_at - done.due_at).total_seconds()
    assert 0 <= lateness < 1.0, lateness
    wait_for(lambda: not OutboxEvent.objects.filter(aggregate_id=call.pk, published_at__isnull=True).exists())
    assert list(
        OutboxEvent.objects.filter(aggregate_id=call.pk).order_by("id").values_list("event_type", flat=True)
    ) == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]


def test_a_past_due_call_is_started_by_a_django_q2_task_without_any_timer_loop(world, http_target, cluster):
    # No engine: only django-q2's own pusher and workers run. The call due now must still run,
    # through the task enqueued at submission (docs/architecture.md, "The path of one call", 1).
    cluster(ENGINE_ENABLED="false")
    call = make_call(url=http_target.url("/ok"))
    done = wait_for(lambda: (c := fresh(call)).is_terminal and c, timeout=15)
    assert done.status == ServiceCall.Status.SUCCEEDED
    assert http_target.count("/ok") == 1


def test_a_clean_stop_closes_the_worker_sessions(world, cluster, tmp_path):
    c = cluster()
    wait_for(lambda: WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).count() >= 2, timeout=10)
    c.stop()
    wait_for(lambda: not WorkerSession.objects.filter(status=WorkerSession.Status.RUNNING).exists(), timeout=10)
    assert WorkerSession.objects.filter(status=WorkerSession.Status.SUCCESS).count() >= 2


def test_a_call_submitted_through_the_api_succeeds_with_its_snippet_and_four_events(
    world, http_target, cluster, client
):
    # INFO logging on: every log line the workers write must be well-formed.
    cluster(LOG_LEVEL="INFO", EVENT_LOG_LEVEL="INFO")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {world.acme_key}"}
    response = client.post(
        "/api/tenants/acme/service-calls",
        data={"name": "via api", "requestSpec": {"method": "POST", "url": http_target.url("/echo"), "body": {"hi": 1}}},
        content_type="application/json",
        **auth,
    )
    assert response.status_code == 202, response.content
    location = response["Location"]

    def finished():
        body = client.get(location, **auth).json()
        published = all(e["publishedAt"] for e in body["events"])
        return body if body["status"] in ("Succeeded", "Failed") and len(body["events"]) == 4 and published else None

    body = wait_for(finished, timeout=15)
    assert body["status"] == "Succeeded"
    echoed = json.loads(body["outcome"]["responseMeta"]["bodySnippet"])
    assert echoed["method"] == "POST" and json.loads(echoed["body"]) == {"hi": 1}
    assert [e["type"] for e in body["events"]] == [
        "ServiceCallSubmitted",
        "ServiceCallScheduled",
        "ServiceCallRunning",
        "ServiceCallSucceeded",
    ]
    assert http_target.count("/echo") == 1
