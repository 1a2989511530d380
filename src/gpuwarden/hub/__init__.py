"""The event path: the one queue, the hub that drains it (decide, record, alert, act), the daemon's own
health and the state snapshot the status page reads."""
