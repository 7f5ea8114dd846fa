"""A streamed completions answer of a native-path server read as a node's lines: ids as
they come whatever the chunking, the EOS that ended the output left out (the relay counts
it, as for a node), a stop token id kept, and every way the stream can go wrong a
DecodeError the relay can continue from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson
import pytest

from router.errors import DecodeError, UpstreamError
from router.upstream.native_decode import NativeDecode
from router.upstream.tilert import DoneLine, NodeLine, TokenLine


class Streamed:
    """A reply whose body arrives in the chunks given (an exception is raised)."""

    def __init__(self, chunks: list[bytes | Exception]) -> None:
        self._chunks = chunks
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1

    async def chunks(self, *, by_lines: bool = False) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk


def event(ids: list[int], finish: str | None = None, stop_reason: Any = None) -> bytes:
    choice = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": stop_reason}
    data = {"object": "text_completion", "choices": [{**choice, "token_ids": ids}]}
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


SPAWNED: list[asyncio.Task[None]] = []


def spawned(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    SPAWNED.append(task := asyncio.ensure_future(coroutine))
    return task


async def lines_of(chunks: list[bytes | Exception]) -> list[NodeLine]:
    decode = NativeDecode(Streamed(chunks), spawned)  # type: ignore[arg-type]
    out = []
    while (line := await decode.next_line()) is not None:
        out.append(line)
    return out


async def test_closing_ends_the_answer_once() -> None:
    reply = Streamed([event([5]), event([6], "length"), DONE])
    decode = NativeDecode(reply, spawned)  # type: ignore[arg-type]
    assert await decode.next_line() == TokenLine([5])
    SPAWNED.clear()
    decode.close(stopped=True)
    decode.close()
    await asyncio.gather(*SPAWNED)
    assert reply.closed == 1


def cut_everywhere(body: bytes) -> list[list[bytes | Exception]]:
    return [[body[:i], body[i:]] for i in range(1, len(body))]


async def test_ids_in_order_and_the_eos_left_out_however_the_bytes_are_cut() -> None:
    body = event([5]) + event([6, 7]) + event([8, 2], "stop") + DONE
    want = [TokenLine([5]), TokenLine([6, 7]), TokenLine([8]), DoneLine(4, "stop")]
    assert await lines_of([body]) == want
    for chunks in cut_everywhere(body):
        assert await lines_of(chunks) == want


async def test_a_stop_token_id_stays_and_a_length_end_keeps_its_last_id() -> None:
    stopped = await lines_of([event([5]) + event([9], "stop", stop_reason=9) + DONE])
    assert stopped == [TokenLine([5]), TokenLine([9]), DoneLine(2, "stop")]
    ended = await lines_of([event([5]) + event([6], "length") + DONE])
    assert ended == [TokenLine([5]), TokenLine([6]), DoneLine(2, "length")]


async def test_an_eos_alone_ends_the_output_with_no_ids() -> None:
    assert await lines_of([event([2], "stop") + DONE]) == [DoneLine(0, "stop")]


@pytest.mark.parametrize(
    ("chunks", "code"),
    [
        ([event([5])], "decode_truncated"),  # cut before its end
        ([event([5]) + DONE], "decode_truncated"),  # ended with no finish reason
        ([b'data: {"error": {"message": "engine dead", "code": 500}}\n\n'], "decode_failed"),
        ([b"data: not json\n\n"], "decode_bad_line"),
        ([b'data: {"choices": [{"token_ids": ["a"]}]}\n\n'], "decode_bad_line"),
        ([b"data: " + b"x" * (2 << 20)], "decode_bad_line"),  # an event without bound
        (
            [event([5]), UpstreamError("no line's end within 30 s", code="decode_timeout")],
            "decode_stalled",
        ),
        ([UpstreamError("connection reset", code="decode_broken")], "decode_failed"),
    ],
    ids=["cut", "no-finish", "error-event", "garbage", "not-ids", "endless", "stall", "broken"],
)
async def test_a_stream_gone_wrong_is_a_decode_error(
    chunks: list[bytes | Exception], code: str
) -> None:
    with pytest.raises(DecodeError) as failure:
        await lines_of(chunks)
    assert failure.value.code == code
