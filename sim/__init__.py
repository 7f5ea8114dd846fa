"""Protocol-faithful simulators of vLLM and the TileRT decode node (test equipment)."""
