"""Engine watch: profiles, scraping, stall detection, discovery, and the stuck-engine killer's targets."""
