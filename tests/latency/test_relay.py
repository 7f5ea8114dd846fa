"""The decode relay over the node lines both releases send: batched lines, the first token
alone, an EOS first token with `n` 0, and a `done` with no token line at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.latency.relay import DecodeRelay, RelayEnd
from router.parsers import ParsedDelta
from router.telemetry.metrics import Metrics
from router.tokens.tokenizer import LoadedTokenizer, load_tokenizer
from router.upstream.tilert import DoneLine, NodeLine, TokenLine
from router.upstream.vllm import Prefilled
from tests.throughput.support import routed


@pytest.fixture(scope="module")
def tokenizer() -> LoadedTokenizer:
    return load_tokenizer("deepseek", base_dir=Path("."))


class Lines:
    """A node session that plays back scripted lines."""

    def __init__(self, lines: list[NodeLine]) -> None:
        self._lines = list(lines)
        self.closed = False

    async def next_line(self) -> NodeLine | None:
        return self._lines.pop(0) if self._lines else None

    def close(self, *, stopped: bool = False) -> None:
        self.closed = True


async def relay(
    tokenizer: LoadedTokenizer, lines: list[NodeLine], *, first: int, finish: str = "length"
) -> tuple[str, RelayEnd]:
    request = routed({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    prefilled = Prefilled("chatcmpl-1", 1, first, 5, finish, None)
    decode = DecodeRelay(
        request,
        prefilled,
        tokenizer=tokenizer,
        output_parser="none",
        metrics=Metrics(),
        started=0.0,
    )
    session: Any = Lines(lines)
    text, end = "", None
    async for event in decode.events(session):
        if isinstance(event, ParsedDelta):
            text += event.content
        else:
            end = event
    assert session.closed and end is not None
    return text, end


def ids(tokenizer: LoadedTokenizer, text: str) -> list[int]:
    return list(tokenizer.tokenizer.encode(text, add_special_tokens=False).ids)


async def test_batched_lines_after_a_first_token_alone(tokenizer: LoadedTokenizer) -> None:
    tokens = ids(tokenizer, "Batched lines arrive every two hundred milliseconds.")
    lines: list[NodeLine] = [TokenLine(tokens[:1]), TokenLine(tokens[1:6]), TokenLine(tokens[6:])]
    text, end = await relay(tokenizer, [*lines, DoneLine(len(tokens), "stop")], first=tokens[0])
    assert text == "Batched lines arrive every two hundred milliseconds."
    assert (end.finish_reason, end.completion_tokens) == ("stop", len(tokens) + 1)  # + EOS


async def test_an_eos_first_token_ends_the_answer_empty(tokenizer: LoadedTokenizer) -> None:
    eos = tokenizer.tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    text, end = await relay(
        tokenizer, [TokenLine([eos]), DoneLine(0, "stop")], first=eos, finish="stop"
    )
    assert (text, end.finish_reason, end.completion_tokens) == ("", "stop", 1)


async def test_a_done_alone_still_carries_the_first_token(tokenizer: LoadedTokenizer) -> None:
    """A node whose budget left room for the first token only (0.1.5 and 0.1.6 alike)."""
    (hello,) = ids(tokenizer, "Hello")
    text, end = await relay(tokenizer, [DoneLine(1, "length")], first=hello)
    assert (text, end.finish_reason, end.completion_tokens) == ("Hello", "length", 1)


async def test_a_cancelled_empty_decode_adds_nothing(tokenizer: LoadedTokenizer) -> None:
    (hello,) = ids(tokenizer, "Hello")
    text, end = await relay(tokenizer, [DoneLine(0, "cancelled")], first=hello)
    assert text == "" and end.completion_tokens == 1
