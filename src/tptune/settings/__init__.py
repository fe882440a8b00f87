"""The run config: schema, defaults, resolved settings."""
