"""The system page's delivery backlog per sink kind: pending, failing, the oldest pending one's
wait; non-superuser staff count only their tenants' events."""

from tests.support.factories import HOUR, make_call, make_user
from tests.support.subscriptions import fan_out, make_subscription, record_try


def _backlog(response) -> dict[str, tuple[int, int, bool]]:
    return {
        row["label"]: (row["pending"], row["failing"], row["oldest_ms"] is not None)
        for row in response.context["delivery"]
    }


def test_a_superuser_sees_every_tenants_backlog_per_kind(client, world, settings):
    settings.NATS_URL = "nats://127.0.0.1:4222"  # configured: its row shows, empty
    acme_hook, _ = make_subscription("acme")
    make_subscription("globex")
    fan_out(make_call("acme", name="a", due_in=HOUR).pk)
    fan_out(make_call("globex", name="g", due_in=HOUR).pk)
    record_try(acme_hook.notifications.first(), succeeded=False, status_code=500)
    client.force_login(make_user("root", superuser=True))

    response = client.get("/system/")

    assert _backlog(response) == {"Webhook": (3, 1, True), "NATS JetStream": (0, 0, False)}
    html = response.content.decode()
    assert "Event delivery to subscribers" in html and "nothing waiting" in html


def test_non_superuser_staff_count_only_their_tenants_events(client, world):
    make_subscription("acme")
    make_subscription("globex")
    fan_out(make_call("acme", name="a", due_in=HOUR).pk)
    fan_out(make_call("globex", name="g", due_in=HOUR).pk)
    client.force_login(world.staff_globex)
    assert _backlog(client.get("/system/"))["Webhook"] == (2, 0, True)


def test_without_nats_the_page_has_no_nats_row(client, world, settings):
    settings.NATS_URL = ""
    client.force_login(make_user("root", superuser=True))
    response = client.get("/system/")
    assert set(_backlog(response)) == {"Webhook"}
    html = response.content.decode()
    assert "NATS" not in html
    assert 'id="loop-errors-h"' in html  # a card of its own, not inside Recent failures
