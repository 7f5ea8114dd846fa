"""Turns a decode node's token ids into message deltas: stop token ids, incremental
detokenization, stop strings, then the model family's reasoning/tool-call parser.

Work per call is proportional to the ids passed in (plus bounded hold-back), so the cost
per token stays flat however long the output grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tokenizers

from router.detokenize.detokenizer import ByteLevelVocab, IncrementalDetokenizer
from router.detokenize.stops import StopMatcher
from router.parsers import OutputParser, ParsedDelta, make_output_parser, needs_special_tokens


@dataclass(slots=True)
class RelayStep:
    delta: ParsedDelta
    stopped: bool  # a stop string or stop token id matched: stop the node


class TextPipeline:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        parser_name: str,
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any] | None,
        stop: Sequence[str],
        stop_token_ids: Sequence[int],
        vocab: ByteLevelVocab | None = None,
    ) -> None:
        self.parser: OutputParser = make_output_parser(
            parser_name, tools=tools, chat_template_kwargs=chat_template_kwargs
        )
        self._detok = IncrementalDetokenizer(
            tokenizer, skip_special_tokens=not needs_special_tokens(parser_name), vocab=vocab
        )
        self._stops = StopMatcher(stop) if stop else None
        self._stop_ids = frozenset(stop_token_ids)
        self.completion_tokens = 0
        self.stopped = False
        self.stop_reason: str | int | None = None  # the stop string or token id that matched
        self._finished = False

    def feed(self, ids: Sequence[int]) -> RelayStep:
        """Process the next ids from the node. After a stop, further ids are ignored."""
        if self._finished:
            return RelayStep(ParsedDelta(), self.stopped)
        if not self._stop_ids and self._stops is None:
            self.completion_tokens += len(ids)
            return RelayStep(self._text(self._detok.push(ids), final=False), False)
        # With stops, a node's batch is taken a token at a time: vLLM counts the tokens up
        # to the one that ends the output, not the rest of the batch.
        delta = ParsedDelta()
        for token in ids:
            self.completion_tokens += 1
            if token in self._stop_ids:
                # Counted as generated but never shown, as vLLM does.
                self.stopped = True
                self.stop_reason = token
                _merge(delta, self._text(self._last_text(), final=True))
                return RelayStep(delta, True)
            _merge(delta, self._text(self._detok.push([token]), final=False))
            if self.stopped:  # this token's text completed a stop string
                return RelayStep(delta, True)
        return RelayStep(delta, False)

    def count(self, ids: Sequence[int]) -> None:
        """Count ids the client is not shown (the node's output after an EOS first token)."""
        self.completion_tokens += len(ids)

    def count_suppressed_eos(self) -> None:
        """The node ended on EOS without sending it: vLLM counts it as generated."""
        self.completion_tokens += 1

    def finish(self) -> ParsedDelta:
        """End of output (node done, or after a stop): flush everything held back."""
        if self._finished:
            return ParsedDelta()
        return self._text(self._last_text(), final=True)

    def _last_text(self) -> str:
        """What the detokenizer still holds, at the end of the output. An output cut inside
        a character (by max_tokens) ends before it: vLLM never emits the U+FFFD a whole
        decode would show there."""
        return self._detok.flush().removesuffix("\ufffd")

    def _text(self, text: str, *, final: bool) -> ParsedDelta:
        if self._stops is not None:
            result = self._stops.feed(text)
            text = result.emit
            if result.stopped:
                self.stopped = True
                self.stop_reason = result.matched
                final = True
            elif final:
                text += self._stops.flush()
                # flushing may settle a match a longer candidate stop kept undecided
                self.stopped = self._stops.stopped
                self.stop_reason = self._stops.matched
        delta = self.parser.feed(text) if text else ParsedDelta()
        if final:
            self._finished = True
            _merge(delta, self.parser.finish())
        return delta


def _merge(into: ParsedDelta, more: ParsedDelta) -> None:
    into.reasoning += more.reasoning
    into.content += more.content
    into.tool_calls.extend(more.tool_calls)
