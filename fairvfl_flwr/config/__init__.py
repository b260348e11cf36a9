"""The run configuration (:class:`RunConfig`), its sections and presets; a party's node configuration (config/node.py)."""

from fairvfl_flwr.config.run import ConfigError, RunConfig

__all__ = ["ConfigError", "RunConfig"]
