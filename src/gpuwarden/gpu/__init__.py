"""GPU discovery and telemetry."""
