"""Flower entry point for the ServerApp (see ``fairvfl_flwr.server``)."""

from fairvfl_flwr.server import app

__all__ = ["app"]
