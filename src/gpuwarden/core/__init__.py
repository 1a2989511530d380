"""The vocabulary, pure: events and their kinds, conditions, incidents, the policy, the metric families and
the registry of the daemon's own metrics. No I/O, no thread, no clock but what callers hand in."""
