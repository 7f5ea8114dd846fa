"""Simulated TileRT decode node: control plane, simulated data plane and the /pd HTTP API."""
