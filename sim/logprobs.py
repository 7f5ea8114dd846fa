"""Deterministic logprobs shared by both simulators.

The sampled token is always the most likely one (rank 0); its alternatives are the next
token ids, each 1.5 nats less likely than the one before. The prefill server and the
node use the same values, so a first token's logprob is the same on either side.
"""

from __future__ import annotations


def token_logprob(token_id: int, rank: int = 0) -> float:
    """The logprob of the ``rank``-th candidate when ``token_id`` is sampled."""
    return round(-0.01 * (token_id % 7) - 1.5 * rank, 4)


def top_candidates(token_id: int, count: int) -> list[tuple[int, float]]:
    """``count`` candidates for a step that sampled ``token_id``, best first."""
    return [(token_id + rank, token_logprob(token_id, rank)) for rank in range(max(count, 0))]
