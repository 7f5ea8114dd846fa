"""Simulated vLLM OpenAI server: plain serving, TileRT connector and NIXL producer/consumer."""
