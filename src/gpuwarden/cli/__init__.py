"""The entry points: the `gpuwarden` command, its man page and completion, doctor, npd-check, install."""
