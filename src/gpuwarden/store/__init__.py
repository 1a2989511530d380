"""What the daemon keeps on disk: the SQLite event store and the incident bundles (with their picture)."""
