"""Delivery of events to subscribers: subscriptions, one notification per (event, subscription)
with its own state and retries, webhooks signed per Standard Webhooks, NATS JetStream
(docs/events.md)."""
