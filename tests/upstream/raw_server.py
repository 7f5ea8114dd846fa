"""A loopback server that speaks raw bytes, per connection, as a test scripts it: for
answers no well-behaved framework would send."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running `handler` per connection (over TLS with `tls`); yields its
    URL and a list that gets one entry per connection accepted."""
    accepted: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except ConnectionError:
            pass  # the client went first
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://localhost:{port}", accepted
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def answer(body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(header + b"\r\n" for header in headers)
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)


async def serve_requests(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: list[bytes]
) -> None:
    """Answers each request on one connection with the next of `answers`."""
    for reply in answers:
        try:
            await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(reply)
        await writer.drain()
    await reader.read()  # until the client closes
