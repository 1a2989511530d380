"""The exporter: the metrics exposition, the HTTP server, the status page."""
