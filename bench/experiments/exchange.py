"""What does one call to an upstream cost the gateway's HTTP client, in CPU?

In process: µs per exchange against a loopback server that answers from memory (a whole
JSON answer, and a chunked stream read with `Reply.receive`), on uvloop as the gateway
runs; CPU time is the figure to compare on a shared machine.

Run: python -m bench.experiments.exchange [--rounds N] [-n EXCHANGES] [--asyncio]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from router.config import UpstreamsConfig
from router.upstream import Upstreams
from router.upstream.failures import Target
from router.upstream.timeouts import Timeouts

TARGET = Target("bench", "the bench server")
WHOLE = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
)
CHUNKS = 32
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
)
STREAM_CHUNK = b'e\r\n{"t": [12345]}\r\n'


class Server(asyncio.Protocol):
    """Answers each request once its head and body have arrived (a body is a few bytes)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        if head.startswith(b"POST /stream"):
            self.transport.write(STREAM_HEAD)  # type: ignore[attr-defined]
            loop = asyncio.get_running_loop()
            for _ in range(CHUNKS):  # one chunk per loop turn, as a node writes tokens
                loop.call_soon(self.transport.write, STREAM_CHUNK)  # type: ignore[attr-defined]
            loop.call_soon(self.transport.write, b"0\r\n\r\n")  # type: ignore[attr-defined]
        else:
            self.transport.write(WHOLE)  # type: ignore[attr-defined]


async def run(rounds: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Server, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstreams = Upstreams(UpstreamsConfig(), Timeouts())
    body = {"prompt": "x" * 200, "max_tokens": 1}

    async def whole() -> None:
        reply = await upstreams.call(TARGET, "POST", url, "/whole", body=body, read_s=5)
        assert reply.status == 200 and reply.content == b'{"ok":true}'

    async def stream() -> None:
        reply = await upstreams.open(TARGET, "POST", url, "/stream", body=body, read_s=5)
        got = 0
        while data := await reply.receive(5):
            got += len(data)
        await reply.aclose()
        assert got == 14 * CHUNKS, got

    for name, exchange in (("whole", whole), ("stream", stream)):
        for _ in range(200):
            await exchange()
        cpu, wall = [], []
        for _ in range(rounds):
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                await exchange()
            cpu.append((time.process_time() - started_cpu) / n * 1e6)
            wall.append((time.perf_counter() - started) / n * 1e6)
        print(
            f"{name:7s} µs/exchange, CPU (client and server): min {min(cpu):6.1f} median "
            f"{statistics.median(cpu):6.1f}; wall: min {min(wall):6.1f}  ({rounds} x {n})"
        )
    await upstreams.aclose()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--asyncio", action="store_true", help="asyncio's own loop, not uvloop")
    args = parser.parse_args()
    if args.asyncio:
        asyncio.run(run(args.rounds, args.n))
    else:
        import uvloop  # the gateway's loop (router/server.py)

        uvloop.run(run(args.rounds, args.n))


if __name__ == "__main__":
    main()
