"""What carries a request to an upstream and its answer back, in the client's own words:
the `Transport` interface (one `Pool` per upstream base URL, one `RawReply` per exchange),
the `Limits` a pool keeps, the `Waits` a call allows, and the failures a transport raises.

Two transports implement it: `http1.Http1Transport`, the gateway's own keep-alive pool,
and `httpx_transport.HttpxTransport`, httpx's. Whatever a transport's library raises is
translated into these failures inside it; `failures.transport_failure` turns them into
gateway errors. The failures, by how far the request got:

    TransportFailure
     ├── Unreachable   nothing was sent (refused, no route, connect or pool timeout, a
     │                 request that could not be written)
     ├── TimedOut      sent, but the answer did not come in time            (in doubt)
     └── Broken        sent, then the connection broke off or the answer broke a rule
                       of HTTP or a cap of `Limits`                          (in doubt)
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol
from urllib.parse import urlsplit

RawHeaders = list[tuple[bytes, bytes]]


class TransportFailure(Exception):
    """A request that did not get its whole answer; `kind` says how far it got."""

    kind: ClassVar[Literal["unreachable", "timeout", "broken"]]
    in_doubt: ClassVar[bool]
    """The upstream may have acted on the request all the same."""


class Unreachable(TransportFailure):
    kind = "unreachable"
    in_doubt = False


class TimedOut(TransportFailure):
    kind = "timeout"
    in_doubt = True


class Broken(TransportFailure):
    kind = "broken"
    in_doubt = True


@dataclass(frozen=True, slots=True)
class Limits:
    """What a pool holds to, per upstream base URL."""

    max_connections: int
    """Open at once; a request waits for one up to its pool wait."""
    max_idle_connections: int
    """Kept open between exchanges; any more are closed when their exchange ends."""
    idle_expiry_s: float
    """An idle connection is closed after this long (below the server's own idle timeout)."""
    max_header_bytes: int
    """An answer's status line and headers, interim answers included."""
    max_header_count: int
    """An answer's header fields, interim answers' included."""
    max_body_bytes: int
    """A body read whole (`Reply.read`); a streamed body is read as it comes, unbounded."""


@dataclass(slots=True)  # not frozen: made per call, and a frozen one is slower to make
class Waits:
    """How long one exchange may wait at each step, in seconds (None: as long as it takes)."""

    pool_s: float | None
    """For a free connection when the pool is full."""
    connect_s: float | None
    write_s: float | None
    """For the request to leave, while the socket is full."""
    read_s: float | None
    """For the answer's whole head, then for each wait for more body."""
    deadline: float | None = None
    """The event loop's time by which the whole answer must have arrived, if it must."""


_DEFAULT_PORTS = {"http": 80, "https": 443}


class BaseURL:
    """An upstream base URL, parsed once: where it is, the path its requests go under, and
    the headers every request to it carries (its Host first)."""

    __slots__ = ("headers", "host", "port", "prefix", "scheme", "url")

    def __init__(self, url: str, headers: Sequence[tuple[bytes, bytes]]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self.prefix = parts.path.rstrip("/")
        authority = parts.netloc.rpartition("@")[2].encode("ascii")
        self.headers: tuple[tuple[bytes, bytes], ...] = ((b"host", authority), *headers)


class RawReply(Protocol):
    """One exchange's answer, once its head has arrived: `status`, raw `headers`, and the
    body read by `receive`. Closed (`aclose`) on every path; its connection serves again
    only if its body was read to the end."""

    status: int
    headers: RawHeaders

    async def receive(self, timeout_s: float | None) -> bytes:
        """The body's next bytes, as many as have arrived; b"" once it has ended (and on
        every later call). TimeoutError if none arrive within `timeout_s`: a timeout or a
        cancelled caller loses nothing. A failure is a `TransportFailure`, raised again to
        every later call."""
        ...

    async def aclose(self) -> None: ...


class Pool(Protocol):
    """The connections to one upstream base URL."""

    async def send(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        content: bytes | None,
        waits: Waits,
    ) -> RawReply:
        """Send a request (`path` under the base URL's own; `headers` besides the base
        URL's; `content` framed by its length) and return once its answer's head has
        arrived."""
        ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    """Makes the pool of each upstream base URL."""

    def pool(self, base: BaseURL, limits: Limits) -> Pool: ...

    async def aclose(self) -> None:
        """After every pool it made is closed: whatever the transport itself holds."""
        ...


def tls_context() -> ssl.SSLContext:
    """Verification against SSL_CERT_FILE or SSL_CERT_DIR when set, else certifi's
    authorities (as httpx verifies); no client certificate."""
    if cafile := os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=cafile)
    if capath := os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def header_bytes(headers: RawHeaders) -> int:
    """The size of `headers` as lines on the wire."""
    return sum(len(name) + len(value) + 4 for name, value in headers)
