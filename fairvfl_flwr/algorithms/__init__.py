"""The training algorithms, each a server on flower/server.py and its party handlers."""
