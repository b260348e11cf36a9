"""The Flower runtime every algorithm and feature builds on: protocol, exchange, server base, hooks, party."""
