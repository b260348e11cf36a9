"""Flower entry point for the ClientApp (see ``fairvfl_flwr.app.client``)."""

from fairvfl_flwr.app.client import app

__all__ = ["app"]
