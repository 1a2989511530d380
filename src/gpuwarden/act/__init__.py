"""Actions on the host: killing stuck engines (and, later, the sysfs guard and cache quarantine)."""
