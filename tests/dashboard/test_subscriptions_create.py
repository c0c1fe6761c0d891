"""Creating a webhook subscription from the page: its secret is shown once, on the page after,
never in a URL; invalid input is shown on its field and nothing is stored."""

import base64
import re

from core.secrets import unseal_value
from delivery.models import Subscription
from delivery.validation import EVENT_TYPES
from tests.support.factories import make_user

SECRET = re.compile(r'<code class="secret-value" id="new-secret">(whsec_[A-Za-z0-9+/=]+)</code>')


def _form(**overrides):
    data = {
        "name": "Billing system",
        "url": "https://hooks.example.com/service-agent",
        "event_types": ["ServiceCallSucceeded", "ServiceCallFailed"],
        "enabled": "on",
    }
    data.update(overrides)
    return {name: value for name, value in data.items() if value is not None}


def test_the_form_offers_every_event_type_as_a_checkbox(owner_client, world):
    response = owner_client.get("/subscriptions/new/")
    assert response.status_code == 200
    html = response.content.decode()
    for event_type in EVENT_TYPES:
        assert f'type="checkbox" name="event_types" value="{event_type}"' in html
    assert 'name="enabled"' in html and "checked" in html.split('name="enabled"')[1].split(">")[0]
    assert 'name="csrfmiddlewaretoken"' in html


def test_it_stores_the_subscription_for_the_current_tenant(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form())

    subscription = Subscription.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/subscriptions/{subscription.pk}/"
    assert subscription.tenant_id == "acme" and subscription.kind == Subscription.Kind.WEBHOOK
    assert subscription.name == "Billing system"
    assert subscription.url == "https://hooks.example.com/service-agent"
    assert subscription.event_types == ["ServiceCallSucceeded", "ServiceCallFailed"]
    assert subscription.enabled is True


def test_its_secret_is_shown_once_on_the_next_page_then_never_again(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form())
    assert "whsec_" not in response["Location"]

    page = owner_client.get(response["Location"])

    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
    html = page.content.decode()
    [secret] = SECRET.findall(html)
    assert "Copy it now" in html
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    subscription = Subscription.objects.get()
    assert unseal_value(subscription.secret) == secret  # the one it signs with
    again = owner_client.get(response["Location"]).content.decode()
    assert secret not in again and 'id="new-secret"' not in again
    assert secret not in owner_client.get("/subscriptions/").content.decode()


def test_the_session_never_holds_the_secret_readable(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form())
    kept = owner_client.session["dashboard.new_secret"]
    secret = SECRET.findall(owner_client.get(response["Location"]).content.decode())[0]
    assert secret not in str(kept) and "$sealed" in str(kept)
    assert "dashboard.new_secret" not in owner_client.session


def test_unchecked_enabled_makes_it_disabled_and_no_type_means_every_event(owner_client, world):
    owner_client.post("/subscriptions/new/", _form(enabled=None, event_types=None))
    subscription = Subscription.objects.get()
    assert subscription.enabled is False and subscription.event_types == []


def test_invalid_input_is_shown_on_each_field_and_nothing_is_stored(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form(name="   ", url="ftp://files.example.com/x"))

    assert response.status_code == 400
    form = response.context["form"]
    assert form.errors["name"] == ["A name is required."]
    assert form.errors["url"] == ["The URL must be absolute and use http or https."]
    html = response.content.decode()
    assert "nothing was stored" in html
    assert '<ul class="field-errors" id="name-errors"><li>A name is required.</li></ul>' in html
    assert 'id="url-errors"' in html
    assert 'value="ftp://files.example.com/x"' in html  # kept to correct
    assert not Subscription.objects.exists()


def test_a_url_the_egress_policy_refuses_is_an_error_on_the_url(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form(url="http://169.254.169.254/latest/meta-data"))
    assert response.status_code == 400
    assert "egress policy" in response.context["form"].errors["url"][0]
    assert not Subscription.objects.exists()


def test_an_unknown_event_type_is_an_error_on_the_event_types(owner_client, world):
    response = owner_client.post("/subscriptions/new/", _form(event_types=["ServiceCallSucceeded", "Nope"]))
    assert response.status_code == 400
    assert response.context["form"].errors["event_types"]
    assert not Subscription.objects.exists()


def test_a_user_without_a_tenant_cannot_create_one(client, world):
    client.force_login(make_user("loner"))
    assert client.post("/subscriptions/new/", _form()).status_code == 403
    assert not Subscription.objects.exists()
