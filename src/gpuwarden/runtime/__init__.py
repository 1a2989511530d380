"""Process plumbing: the named blocking pools, supervised components, the tick grid, sd_notify, logging,
reloads, and who owns a socket."""
