"""The configuration: the TOML file's schema, defaults and validation, and the exporter's web config."""
