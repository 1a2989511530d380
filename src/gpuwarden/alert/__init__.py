"""Alerts: storm control, message text and runbooks, the durable outbox, delivery through channels (apprise,
Alertmanager)."""
