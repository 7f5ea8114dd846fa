"""The relay: turns a decode node's token-id stream into OpenAI text deltas."""
