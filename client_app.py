"""Flower entry point for the ClientApp (see ``fairvfl_flwr.client``)."""

from fairvfl_flwr.client import app

__all__ = ["app"]
