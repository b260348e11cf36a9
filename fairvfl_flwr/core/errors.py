"""Errors the core raises for bad settings (the config layer reports them by key)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A run-config value is out of range, of the wrong kind, unknown, or refused in combination."""
