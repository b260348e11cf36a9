"""Flower entry point for the ServerApp (see ``fairvfl_flwr.app.server``)."""

from fairvfl_flwr.app.server import app

__all__ = ["app"]
