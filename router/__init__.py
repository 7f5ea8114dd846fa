"""pd-gateway: the OpenAI-compatible front door for prefill/decode disaggregated serving."""
