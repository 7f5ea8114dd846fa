"""The latency path: vLLM prefill with `max_tokens: 1`, then decode on a gated TileRT node."""
