"""The decode relay over the node lines both releases send: batched lines, the first token
alone, an EOS first token with `n` 0, and a `done` with no token line at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.errors import DecodeError
from router.latency.relay import DecodeRelay, RelayEnd, Resume
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
    """A node session that plays back scripted lines (a DecodeError is raised)."""

    def __init__(self, lines: list[NodeLine | DecodeError]) -> None:
        self._lines = list(lines)
        self.closed = False

    async def next_line(self) -> NodeLine | None:
        line = self._lines.pop(0) if self._lines else None
        if isinstance(line, DecodeError):
            raise line
        return line

    def close(self, *, stopped: bool = False) -> None:
        self.closed = True


async def relay(
    tokenizer: LoadedTokenizer,
    lines: list[NodeLine | DecodeError],
    *,
    first: int,
    finish: str = "length",
    resume: Resume | None = None,
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
    async for event in decode.events(session, resume):
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


BROKEN = DecodeError("the decode node's stream ended without its last line", code="x")


class Resumer:
    """Continues a broken output with the sessions given, noting what it was asked."""

    def __init__(self, *sessions: tuple[list[NodeLine | DecodeError], int, str]) -> None:
        self._sessions = list(sessions)
        self.asked: list[list[int]] = []
        self.sessions: list[Lines] = []

    async def __call__(self, failure: DecodeError, output: list[int]) -> Any:
        self.asked.append(output)
        if not self._sessions:
            return None
        lines, first, finish = self._sessions.pop(0)
        self.sessions.append(Lines(lines))
        return self.sessions[-1], Prefilled("chatcmpl-2", 1, first, 9, finish, None)


async def test_a_broken_stream_goes_on_from_the_resumed_session(tokenizer: LoadedTokenizer) -> None:
    tokens = ids(tokenizer, "One answer, told by two nodes in turn, without a seam.")
    cut = 5
    rest = [TokenLine(tokens[cut:]), DoneLine(len(tokens) - cut, "stop")]
    resumer = Resumer((rest, tokens[cut], "length"))
    lines: list[NodeLine | DecodeError] = [TokenLine(tokens[:2]), TokenLine(tokens[2:cut]), BROKEN]
    text, end = await relay(tokenizer, lines, first=tokens[0], resume=resumer)
    assert text == "One answer, told by two nodes in turn, without a seam."
    assert resumer.asked == [tokens[:cut]]
    assert (end.finish_reason, end.completion_tokens) == ("stop", len(tokens) + 1)
    assert resumer.sessions[0].closed


async def test_a_resumed_session_whose_budget_held_one_token_still_gives_it(
    tokenizer: LoadedTokenizer,
) -> None:
    tokens = ids(tokenizer, "Hello there")
    resumer = Resumer(([DoneLine(1, "length")], tokens[-1], "length"))
    lines: list[NodeLine | DecodeError] = [TokenLine(tokens[:-1]), BROKEN]
    text, end = await relay(tokenizer, lines, first=tokens[0], resume=resumer)
    assert (text, end.finish_reason, end.completion_tokens) == ("Hello there", "length", 2)


async def test_a_resumed_session_whose_first_token_is_eos_ends_the_answer(
    tokenizer: LoadedTokenizer,
) -> None:
    eos = tokenizer.tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    tokens = ids(tokenizer, "Short")
    resumer = Resumer(([TokenLine([eos]), DoneLine(0, "stop")], eos, "stop"))
    lines: list[NodeLine | DecodeError] = [TokenLine(tokens), BROKEN]
    text, end = await relay(tokenizer, lines, first=tokens[0], resume=resumer)
    assert (text, end.finish_reason, end.completion_tokens) == ("Short", "stop", len(tokens) + 1)


async def test_a_failure_nobody_resumes_is_raised(tokenizer: LoadedTokenizer) -> None:
    tokens = ids(tokenizer, "Cut short")
    resumer = Resumer()
    with pytest.raises(DecodeError):
        await relay(tokenizer, [TokenLine(tokens), BROKEN], first=tokens[0], resume=resumer)
    assert resumer.asked == [tokens]
    with pytest.raises(DecodeError):  # nothing generated yet: nothing to continue
        await relay(tokenizer, [BROKEN], first=tokens[0], resume=Resumer())


async def test_a_broken_stream_goes_on_from_a_source_without_a_prefill(
    tokenizer: LoadedTokenizer,
) -> None:
    """A server of the native path goes on: its ids are the output's next, none sampled
    by a prefill of its own; an EOS first token of the broken node's prefill is no matter."""
    tokens = ids(tokenizer, "Told by a node, then by a server of the native path.")
    cut = 4
    native = Lines([TokenLine(tokens[cut:7]), TokenLine(tokens[7:]), DoneLine(9, "stop")])
    asked: list[list[int]] = []

    async def resume(failure: DecodeError, output: list[int]) -> Any:
        asked.append(output)
        return native, None

    lines: list[NodeLine | DecodeError] = [TokenLine(tokens[:cut]), BROKEN]
    text, end = await relay(tokenizer, lines, first=tokens[0], resume=resume)
    assert text == "Told by a node, then by a server of the native path."
    assert asked == [tokens[:cut]]
    assert (end.finish_reason, end.completion_tokens) == ("stop", len(tokens) + 1)
    assert native.closed
