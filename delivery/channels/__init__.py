"""The subscription kinds: one channel module each (`webhook`, `nats`), and this registry, the one
place that maps a stored kind to its channel. Subscription.Kind, its check constraint and every
edge take the kinds from here (docs/architecture.md, "Adding a channel").

`channel_for(kind)`, `kinds()`, `channels()`; `register(channel)` adds one (the built-in ones
below; a test adds its own)."""

from __future__ import annotations

from core.ids import utcnow
from delivery.channels.base import Channel, ChannelField, NewSubscription, Tries
from delivery.channels.nats import NATS
from delivery.channels.webhook import WEBHOOK
from delivery.tries import ClaimedNotification, SendResult, failed_result

__all__ = [
    "DEFAULT_KIND",
    "Channel",
    "ChannelField",
    "NewSubscription",
    "Tries",
    "channel_for",
    "channels",
    "kinds",
    "register",
    "send",
    "tenant_kinds",
]

_CHANNELS: dict[str, Channel] = {}


def register(channel: Channel) -> Channel:
    """Add `channel` under its kind (in this order on pages, in errors and in metrics)."""
    if channel.kind in _CHANNELS:
        raise ValueError(f"a channel for {channel.kind!r} is registered already")
    _CHANNELS[channel.kind] = channel
    return channel


def channel_for(kind: str) -> Channel:
    """The channel of a stored kind; KeyError for none."""
    return _CHANNELS[kind]


def channels() -> tuple[Channel, ...]:
    return tuple(_CHANNELS.values())


def kinds() -> tuple[str, ...]:
    return tuple(_CHANNELS)


def tenant_kinds() -> tuple[str, ...]:
    """The kinds a tenant may make (the API, the dashboard); an operator may make every kind."""
    return tuple(channel.kind for channel in _CHANNELS.values() if not channel.operator_only)


def send(notification: ClaimedNotification) -> SendResult:
    """Try one notification once on its kind's channel and wait for the result (commands, tests);
    never raises (a failure is a result). The delivery loop starts its tries without waiting for
    them (delivery/runner.py)."""
    started = utcnow()
    try:
        return channel_for(notification.subscription.kind).send([notification])[0]
    except Exception as exc:  # a bug or an unreachable dependency is a failed try, not a dead loop
        return failed_result(started, exc)


register(WEBHOOK)
register(NATS)

# A subscription made without a kind is a webhook (the API, the dashboard, the commands).
DEFAULT_KIND = WEBHOOK.kind
