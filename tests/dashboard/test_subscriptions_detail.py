"""A subscription's page: its fields, its figures, its delivery log (state filter, pager, each
delivery's attempts); another tenant's subscription is answered 404."""

import uuid

from delivery.models import Notification
from tests.support.factories import HOUR, make_call
from tests.support.subscriptions import fan_out, make_subscription, record_try


def _url(subscription, query: str = "") -> str:
    return f"/subscriptions/{subscription.pk}/{query}"


def test_it_shows_the_fields_and_figures(owner_client, world):
    subscription, _ = make_subscription("acme", name="Billing hook", event_types=["ServiceCallScheduled"])
    fan_out(make_call("acme", name="one", due_in=HOUR).pk)
    fan_out(make_call("acme", name="two", due_in=HOUR).pk)
    first, second = Notification.objects.filter(subscription=subscription).order_by("event_seq")
    record_try(first, succeeded=True, status_code=200)
    record_try(second, succeeded=False, status_code=503)

    response = owner_client.get(_url(subscription))

    assert response.status_code == 200
    figures = response.context["figures"]
    assert figures.pending == 1 and figures.lag_sample == 1 and figures.lag_p99_ms is not None
    html = response.content.decode()
    assert "<h1>Billing hook</h1>" in html and subscription.url in html
    assert '<span class="chip chip-small chip-type">ServiceCallScheduled</span>' in html
    assert "Lag p50 / p99" in html and "1 delivery in the last hour" in html
    assert "every try since then failed" in html  # failing since the second one's failure
    assert response.context["secret"] is None and 'id="new-secret"' not in html
    assert "$sealed" not in html


def test_the_delivery_log_lists_each_delivery_with_its_attempts(owner_client, world):
    subscription, _ = make_subscription("acme")
    call = make_call("acme", name="c", due_in=HOUR)
    fan_out(call.pk)
    submitted, scheduled = Notification.objects.filter(subscription=subscription).order_by("event_seq")
    record_try(submitted, succeeded=False, status_code=503, error="The endpoint answered 503.")
    record_try(submitted, succeeded=True, status_code=200)

    response = owner_client.get(_url(subscription))

    rows = list(response.context["page"].object_list)
    assert [n.event_type for n in rows] == ["ServiceCallScheduled", "ServiceCallSubmitted"]  # newest first
    html = response.content.decode()
    block = html.split(f'id="delivery-{submitted.pk}"')[1].split("</tbody>")[0]
    assert '<span class="badge badge-succeeded">SUCCEEDED</span>' in block
    assert "2 attempts" in block and "<details>" in block
    assert "The endpoint answered 503." in block and "<td>scheduled</td>" in block
    assert f'href="/calls/{call.pk}/"' in block
    assert f"/subscriptions/{subscription.pk}/deliveries/{submitted.pk}/resend" in block
    pending_block = html.split(f'id="delivery-{scheduled.pk}"')[1].split("</tbody>")[0]
    assert '<span class="badge badge-pending">PENDING</span>' in pending_block and "Not tried yet." in pending_block


def test_the_log_filters_by_state(owner_client, world):
    subscription, _ = make_subscription("acme")
    fan_out(make_call("acme", name="c", due_in=HOUR).pk)
    failed = Notification.objects.filter(subscription=subscription).order_by("event_seq").first()
    record_try(failed, succeeded=False, status_code=500)

    response = owner_client.get(_url(subscription, "?state=FAILED"))

    assert [n.pk for n in response.context["page"].object_list] == [failed.pk]
    assert '<option value="FAILED" selected>' in response.content.decode()
    assert list(owner_client.get(_url(subscription, "?state=EXPIRED")).context["page"].object_list) == []
    # An unknown state filters nothing out.
    assert len(owner_client.get(_url(subscription, "?state=bogus")).context["page"].object_list) == 2


def test_the_log_is_paged_newest_first(owner_client, world):
    subscription, _ = make_subscription("acme", event_types=["ServiceCallSubmitted"])
    for n in range(27):
        fan_out(make_call("acme", name=f"call {n}", due_in=HOUR).pk)
    newest_first = list(
        Notification.objects.filter(subscription=subscription)
        .order_by("-created_at", "-event_seq")
        .values_list("pk", flat=True)
    )

    first = owner_client.get(_url(subscription))
    second = owner_client.get(_url(subscription, "?page=2"))

    assert [n.pk for n in first.context["page"].object_list] == newest_first[:25]
    assert [n.pk for n in second.context["page"].object_list] == newest_first[25:]
    assert "1–25 of 27" in first.content.decode() and "26–27 of 27" in second.content.decode()
    assert '?page=2#delivery-log" rel="next"' in first.content.decode()


def test_another_tenants_subscription_is_not_found(outsider_client, world):
    acme_hook, _ = make_subscription("acme", name="acme-private-hook")
    response = outsider_client.get(_url(acme_hook))
    assert response.status_code == 404 and "acme-private-hook" not in response.content.decode()


def test_an_operator_wide_or_unknown_subscription_is_not_found(owner_client, world):
    operator_hook, _ = make_subscription(None, name="operator-hook")
    assert owner_client.get(_url(operator_hook)).status_code == 404
    assert owner_client.get(f"/subscriptions/{uuid.uuid4()}/").status_code == 404
    assert owner_client.get("/subscriptions/not-a-uuid/").status_code == 404
