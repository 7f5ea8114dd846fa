"""Turn planned output ids into engine steps: one token per step, its text delta, the finish.

Like vLLM: the EOS token counts as generated but adds no text; stop strings end the
output at the match (text held back while it could still become one); ``max_tokens``
ends it with "length".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers.decoders import DecodeStream

from sim.tokenizers import Vocab


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token and what the client sees of it."""

    token_id: int
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None


def _find_stop(text: str, start: int, stops: Sequence[str]) -> tuple[int, str] | None:
    hits = [(text.find(s, start), s) for s in stops]
    hits = [(pos, s) for pos, s in hits if pos >= 0]
    return min(hits) if hits else None


def generate(
    vocab: Vocab,
    output_ids: Sequence[int],
    max_tokens: int | None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
) -> list[Step]:
    """The steps of one generation, in order; the last carries the finish reason."""
    decoder = DecodeStream(skip_special_tokens=True)
    hold = max((len(s) for s in stop), default=1) - 1
    steps: list[Step] = []
    text, sent = "", 0  # all text so far; how much of it was handed out
    for count, token in enumerate(output_ids, start=1):
        if token in vocab.eos_ids:
            steps.append(Step(token, text[sent:], "stop"))
            return steps
        if token in stop_token_ids:
            steps.append(Step(token, text[sent:], "stop", token))
            return steps
        text += decoder.step(vocab.tokenizer, token) or ""
        match = _find_stop(text, max(sent - hold, 0), stop) if stop else None
        if match is not None:
            position, stop_string = match
            steps.append(Step(token, text[sent:position], "stop", stop_string))
            return steps
        if max_tokens is not None and count >= max_tokens:
            steps.append(Step(token, text[sent:], "length"))
            return steps
        safe = max(len(text) - hold, sent)
        steps.append(Step(token, text[sent:safe]))
        sent = safe
    # A plan always ends with EOS; an exhausted one (a truncated pull) ends like EOS.
    if steps:
        last = steps[-1]
        steps[-1] = Step(last.token_id, last.text + text[sent:], "stop")
    return steps
