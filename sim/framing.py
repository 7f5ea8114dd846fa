"""Length-prefixed JSON frames, the TileRT control plane's wire format (docs/protocols.md §1.3).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON
holding one object. The simulated data plane and the simulated NIXL side channel reuse it.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The peer broke the framing: oversized, truncated or non-object frame."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """Serialise one message to its wire bytes (header included)."""
    body = orjson.dumps(message)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse a frame body; anything but a JSON object is a protocol error."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"frame is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise FrameError("frame does not hold a JSON object")
    return message


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Read one message; None on a clean end of stream between frames."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("stream ended inside a frame header") from exc
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError("stream ended inside a frame body") from exc
    return decode_body(body)


async def write_frame(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    """Write one message and wait until the transport has taken it."""
    writer.write(encode_frame(message))
    await writer.drain()


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    """Close a stream, ignoring a peer that already went away."""
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
