"""Control-plane framing: round trips and every way a peer can break it."""

import asyncio
import struct

import pytest

from sim.framing import MAX_FRAME_BYTES, FrameError, decode_body, encode_frame, read_frame


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_round_trip_of_several_frames_then_clean_end() -> None:
    messages = [{"rid": "abc", "rank": 0}, {"text": "café 日本語 🙂"}, {}]
    reader = _reader(b"".join(encode_frame(m) for m in messages))
    assert [await read_frame(reader) for _ in messages] == messages
    assert await read_frame(reader) is None


def test_header_is_big_endian_length_of_utf8_body() -> None:
    frame = encode_frame({"k": "é"})
    (length,) = struct.unpack(">I", frame[:4])
    assert frame[4:] == '{"k":"é"}'.encode()
    assert length == len(frame) - 4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00", "header"),
        (struct.pack(">I", 10) + b"{}", "body"),
        (struct.pack(">I", MAX_FRAME_BYTES + 1), "exceeds"),
        (struct.pack(">I", 2) + b"[]", "object"),
        (struct.pack(">I", 3) + b"{x}", "JSON"),
    ],
)
async def test_broken_frames_are_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        await read_frame(_reader(data))


def test_refuses_to_encode_an_oversized_message() -> None:
    with pytest.raises(FrameError):
        encode_frame({"blob": "x" * MAX_FRAME_BYTES})


def test_invalid_utf8_is_a_protocol_error() -> None:
    with pytest.raises(FrameError):
        decode_body(b'{"a": "\xff"}')
