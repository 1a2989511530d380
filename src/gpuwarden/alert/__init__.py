"""Alerts: storm control, message text and runbooks, the durable outbox and apprise delivery."""
