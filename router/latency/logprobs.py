"""Logprobs on the latency path: the first token's from the prefill's answer, the rest from
the node's `lp`/`tp` lines (TileRT 0.1.6, docs/protocols.md §1.6), token strings through the
model's tokenizer; after a continuation, its first token's from its own prefill. Work per
token is O(top candidates)."""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

from router.openai.render import TokenLogprob
from router.upstream.tilert import TokenLine
from router.upstream.vllm import Prefilled

UNAVAILABLE = -9999.0
"""A logprob the node did not report (what vLLM and TileRT put for -inf)."""


class LogprobTrack:
    """Logprob entries for the tokens the relay counted, taken a chunk at a time."""

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, prefilled: Prefilled, top_n: int, *, keep: bool
    ) -> None:
        self._tokenizer = tokenizer
        self._top_n = top_n
        self._first = (prefilled.first_token_id, prefilled.first_logprob, prefilled.first_top)
        self._first_due = True  # the prefill's token, whose logprobs the prefill reported
        self._pending: list[TokenLogprob] = []
        self._keep = keep
        self.all: list[TokenLogprob] = []
        """Every entry (non-streaming answers only: `keep`)."""

    def add(self, line: TokenLine, count: int) -> None:
        """The entries of the first `count` ids of `line` (those the relay counted)."""
        for i in range(min(count, len(line.ids))):
            token_id = line.ids[i]
            top: Sequence[tuple[int, float | None]]
            if self._first_due and token_id == self._first[0]:
                logprob, top = self._first[1], self._first[2]
            else:
                logprob = line.lp[i] if line.lp is not None else None
                top = _pairs(line.tp[i]) if line.tp is not None else ()
            self._first_due = False
            entry = TokenLogprob(
                self._text(token_id),
                _finite(logprob),
                tuple((self._text(t), _finite(lp)) for t, lp in top[: self._top_n]),
            )
            self._pending.append(entry)
            if self._keep:
                self.all.append(entry)

    def resumed(self, prefilled: Prefilled) -> None:
        """The output goes on from another node, whose prefill sampled its next token."""
        self._first = (prefilled.first_token_id, prefilled.first_logprob, prefilled.first_top)
        self._first_due = True

    def take(self) -> list[TokenLogprob]:
        """The entries added since the last take."""
        pending, self._pending = self._pending, []
        return pending

    def _text(self, token_id: int) -> str:
        text: str = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def _pairs(candidates: list[list[object]]) -> list[tuple[int, float | None]]:
    out: list[tuple[int, float | None]] = []
    for pair in candidates:
        if isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int:
            logprob = pair[1]
            out.append((pair[0], float(logprob) if isinstance(logprob, int | float) else None))
    return out


def _finite(value: float | None) -> float:
    if value is None or value == float("-inf"):
        return UNAVAILABLE
    return float(value)
