"""The run configuration (:class:`RunConfig`), its sections and presets."""

from fairvfl_flwr.config.run import ConfigError, RunConfig

__all__ = ["ConfigError", "RunConfig"]
