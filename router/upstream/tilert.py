"""The TileRT decode node's HTTP API (docs/protocols.md §1.4–1.6) as the gateway uses it.

`open_decode` returns once the node has answered 200 (the transfer arrived); its lines are
then read one at a time, each due within the stall timeout of the one before. Every node
failure becomes a DecodeError; a 0.1.6 node's typed refusal (an answer about the request)
becomes a NodeRefused.
The other calls (`cancel`, `consume_transfer`, `drain`, `flush`, `wait_idle`, `is_ready`,
`node_facts`) are cleanups and probes: they never raise.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from router.config import TileRTVersion
from router.errors import DecodeError, NodeRefused, UpstreamError
from router.node import Node
from router.upstream.client import Reply, Upstreams
from router.upstream.failures import Target

log = logging.getLogger("pd_gateway.upstream")

NODE = Target(
    "node",
    "the decode node",
    DecodeError,
    codes={"timeout": "decode_timeout", "broken": "node_unreachable", "failed": "decode_failed"},
)


@dataclass(frozen=True, slots=True)
class TokenLine:
    ids: list[int]
    lp: list[float | None] | None = None
    """With `top_logprobs` (0.1.6): each token's logprob (the first may be null)."""
    tp: list[list[list[Any]]] | None = None
    """With `top_logprobs` (0.1.6): each token's top candidates, `[token_id, logprob]` pairs."""


@dataclass(frozen=True, slots=True)
class DoneLine:
    n: int
    finish_reason: str


NodeLine = TokenLine | DoneLine


def decode_body(
    *,
    rid: str,
    first_token_id: int,
    max_tokens: int,
    sampling: dict[str, Any] | None,
    timeout_s: float,
    stream: bool = True,
    top_logprobs: int | None = None,
    grammar_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`top_logprobs` and `grammar_spec` exist on 0.1.6 nodes only; they are sent only when
    set (the guard sends such requests only to nodes that report the feature)."""
    body: dict[str, Any] = {
        "rid": rid,
        "first_token_id": first_token_id,
        "max_tokens": max_tokens,
        "sampling": sampling,
        "timeout_s": timeout_s,
        "stream": stream,
    }
    if top_logprobs is not None:
        body["top_logprobs"] = top_logprobs
    if grammar_spec is not None:
        body["grammar_spec"] = grammar_spec
    return body


MAX_LINE_BYTES = 1 << 20
"""A node line is a batch of token ids (with their logprobs on 0.1.6): kilobytes. A line
past this is a broken node, and is not kept in memory while it grows."""


class DecodeStream:
    """An open `/pd/decode` ndjson stream. Always `aclose()` it (idempotent).

    `next_line` reads the body as it needs lines, each line's end due within the stall
    timeout of the last one's (bytes trickling in without a line's end are no progress). A
    stall or a cancelled caller interrupts only the wait, never the read: the stream stays
    readable to its end (the node releases its lock only when its response has ended).
    """

    def __init__(
        self, reply: Reply, *, stall_s: float, max_line_bytes: int = MAX_LINE_BYTES
    ) -> None:
        self._reply = reply
        self._stall_s = stall_s
        self._max_line_bytes = max_line_bytes
        self._lines: deque[bytes] = deque()
        self._partial: list[bytes] = []  # a line whose end has not arrived yet, in pieces
        self._partial_bytes = 0
        self._skipping = False  # inside a line over the cap, already reported: until its end
        self._early_end: DecodeError | None = None  # the body ended early: why, until reported
        # One reader of the body at a time: a drain may start beside a relay being stopped,
        # and a connection wakes one waiter.
        self._reading = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._line_due = self._loop.time() + stall_s  # the next line's end, at the latest
        self.done_read = False  # the done line was read
        self.body_ended = False  # the body has ended (the node has released its lock)

    async def next_line(self) -> NodeLine | None:
        """The next line; None when the body has ended after the done line."""
        while not self._lines:
            if self.body_ended:
                early_end, self._early_end = self._early_end, None
                if early_end is not None:
                    raise early_end
                return None
            async with self._reading:
                if not self._lines and not self.body_ended:  # another reader may have read them
                    await self._receive()
        return self._parse(self._lines.popleft())

    async def _receive(self) -> None:
        try:
            chunk = await self._reply.receive(max(self._line_due - self._loop.time(), 0.0))
        except TimeoutError:
            # The next line is due a stall timeout later again: a drain can wait for it.
            self._line_due = self._loop.time() + self._stall_s
            raise DecodeError(
                f"the decode node sent no line for {self._stall_s:g} s",
                status=504,
                code="decode_stalled",
            ) from None
        except UpstreamError as exc:  # the stream is cut
            self._end(f" ({exc.message})")
            return
        if not chunk:
            if self._partial:
                self._lines.append(b"".join(self._partial))
            self._end("")
            return
        # Lines are split here, on bytes: no text decoding, and one wake-up per network read
        # however many lines it carries.
        if b"\n" not in chunk:
            if not self._skipping:
                self._partial.append(chunk)
                self._partial_bytes += len(chunk)
                if self._partial_bytes > self._max_line_bytes:
                    # Kept no further: the rest of the line is dropped as it comes, so the
                    # stream can still be drained to its end.
                    self._partial, self._partial_bytes, self._skipping = [], 0, True
                    raise self._oversized()
            return
        self._line_due = self._loop.time() + self._stall_s
        if self._partial:
            chunk = b"".join((*self._partial, chunk))
        lines = chunk.split(b"\n")
        rest = lines.pop()
        self._partial, self._partial_bytes = ([rest], len(rest)) if rest else ([], 0)
        if self._skipping:
            lines[0], self._skipping = b"", False
        self._lines.extend(line for line in lines if line and line != b"\r")

    def _oversized(self) -> DecodeError:
        return DecodeError(
            f"the decode node sent a line over {self._max_line_bytes} bytes",
            code="decode_bad_line",
        )

    def _end(self, cause: str) -> None:
        self.body_ended = True
        if cause or not self.done_read:
            self._early_end = DecodeError(
                f"the decode node's stream ended without its last line{cause}",
                code="decode_truncated",
            )

    def _parse(self, raw: bytes) -> NodeLine:
        if len(raw) > self._max_line_bytes:
            raise self._oversized()
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            line = None
        if not isinstance(line, dict):
            raise _bad_line(raw)
        if "t" in line:
            ids = line["t"]
            if not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise _bad_line(raw)
            lp, tp = line.get("lp"), line.get("tp")
            if lp is None:
                return TokenLine(ids)
            if not (
                isinstance(lp, list)
                and isinstance(tp, list)
                and len(lp) == len(ids) == len(tp)
                and all(x is None or isinstance(x, int | float) for x in lp)
                and all(isinstance(x, list) for x in tp)
            ):
                raise _bad_line(raw)
            return TokenLine(ids, lp, tp)
        if line.get("done") is True:
            n, finish = line.get("n", 0), line.get("finish_reason", "stop")
            if type(n) is not int or not isinstance(finish, str):
                raise _bad_line(raw)
            self.done_read = True
            return DoneLine(n, finish)
        error_type = line.get("error_type")
        message = f"the decode node failed: {line.get('error', 'unknown error')}"
        if error_type in _ABOUT_THE_REQUEST:  # e.g. the output broke the request's grammar
            raise NodeRefused(message, code=str(error_type), unsupported=False)
        raise DecodeError(message, code="decode_failed")

    async def aclose(self) -> None:
        await self._reply.aclose()


def _bad_line(raw: bytes) -> DecodeError:
    shown = raw[:80].decode("utf-8", "replace")
    return DecodeError(f"the decode node sent a malformed line: {shown!r}", code="decode_bad_line")


async def open_decode(
    upstreams: Upstreams, node: Node, body: dict[str, Any], *, stall_s: float
) -> DecodeStream:
    """POST /pd/decode (stream) and wait for the node's answer, at most the transfer timeout."""
    reply = await upstreams.open(
        NODE, "POST", node.url, "/pd/decode", body=body, read_s=body["timeout_s"] + stall_s
    )
    if reply.status != 200:
        try:
            detail = await reply.json()
        except UpstreamError:
            detail = None
        finally:
            await reply.aclose()
        raise _refusal(reply.status, detail if isinstance(detail, dict) else {})
    return DecodeStream(reply, stall_s=stall_s)


# A 0.1.6 node's typed refusals (docs/protocols.md §1.6): the request is wrong there (400) or
# needs what the node's engine lacks (501). Neither says anything about the node's health.
_ABOUT_THE_REQUEST = frozenset({"invalid_parameter", "invalid_grammar", "grammar_violation"})
_UNSUPPORTED = frozenset(
    {"capability_unavailable", "logprobs_unavailable", "grammar_unsupported", "invalid_logprobs"}
)


def _refusal(status: int, detail: dict[str, Any]) -> DecodeError:
    error = detail.get("error", "unknown error")
    error_type = detail.get("error_type")
    if error_type in _ABOUT_THE_REQUEST:
        return NodeRefused(
            f"the TileRT decode node refused the request: {error}",
            code=str(error_type),
            unsupported=False,
        )
    if error_type in _UNSUPPORTED or status == 501:
        return NodeRefused(
            f"the TileRT decode node cannot serve this request: {error}",
            code=str(error_type or "capability_unavailable"),
            unsupported=True,
        )
    if status == 499:  # 0.1.6: our own /pd/cancel during the KV wait
        return DecodeError("the decode was cancelled", status=499, code="decode_cancelled")
    if status == 429:
        return DecodeError(
            "the decode node is busy with another request", status=503, code="node_busy"
        )
    if status == 504:
        return DecodeError(
            "the KV transfer to the decode node did not complete in time",
            status=504,
            code="kv_transfer_timeout",
        )
    return DecodeError(f"the decode node answered {status}: {error}", code="decode_failed")


async def consume_transfer(
    upstreams: Upstreams, node: Node, *, rid: str, first_token_id: int, timeout_s: float
) -> None:
    """Consume a claimed transfer nobody will read (the client has gone): decode one token."""
    try:
        reply = await _one_token(
            upstreams, node, rid=rid, first_token_id=first_token_id, timeout_s=timeout_s
        )
    except UpstreamError as exc:
        log.warning("consuming transfer %s on node %s failed: %s", rid, node.id, exc.message)
        return
    if reply.status != 200:
        # The transfer may never have arrived (a prefill that failed before pushing it).
        log.info("consuming transfer %s on node %s: %s", rid, node.id, reply.status)


async def _one_token(
    upstreams: Upstreams, node: Node, *, rid: str, first_token_id: int, timeout_s: float
) -> Reply:
    """A one-token, non-streamed decode of `rid`'s transfer, waited for at most `timeout_s`
    (a 0.1.6 node that refuses first drains for up to 30 s more)."""
    body = decode_body(
        rid=rid,
        first_token_id=first_token_id,
        max_tokens=1,
        sampling=None,
        timeout_s=timeout_s,
        stream=False,
    )
    return await upstreams.call(
        NODE, "POST", node.url, "/pd/decode", body=body, read_s=timeout_s + 35.0
    )


async def cancel(upstreams: Upstreams, node: Node, rid: str) -> bool:
    """POST /pd/cancel; True if the node knew the rid."""
    try:
        reply = await upstreams.call(
            NODE,
            "POST",
            node.url,
            "/pd/cancel",
            body={"rid": rid},
            read_s=upstreams.timeouts.cancel_s,
        )
    except UpstreamError:
        return False
    return reply.status == 200


async def drain(stream: DecodeStream, *, limit_s: float) -> bool:
    """Read a stream to its end so the node releases its lock; bounded in time. The caller
    closes the stream (after the slot is released: nothing waits on the closing).

    True if the node's response body ended (its lock is then free)."""
    try:
        async with asyncio.timeout(limit_s):
            while not stream.body_ended:
                try:
                    await stream.next_line()
                except DecodeError as exc:
                    if exc.code not in ("decode_failed", "decode_bad_line", "decode_truncated"):
                        break  # stalled: the node is not ending its response
    except TimeoutError:
        pass
    return stream.body_ended


FLUSH_WAIT_S = 1.0
"""How long a flush's decode waits for a transfer that is not coming."""


FlushOutcome = Literal["clean", "not_run", "in_doubt"]
"""`clean`: flushed and idle. `not_run`: the node was busy, unreachable or not idle
afterwards, and nothing of the flush is left running on it. `in_doubt`: the flush's decode
may still reach the node or run on it."""


async def flush(
    upstreams: Upstreams, node: Node, *, idle_within_s: float, rid: str | None = None
) -> FlushOutcome:
    """Clear any transfer the node holds that no request will consume (an orphan: a gateway
    that died between prefill and decode, a consume that never arrived), then `clean` once
    the node is idle. Only while nobody may use the node (it is held or out of service).

    One decode for a rid that has no transfer does it on both releases: it drops every
    completed transfer of another rid, and when it ends (504 after `FLUSH_WAIT_S`) a 0.1.5
    node also frees its receive slot of whatever it holds (docs/protocols.md §1.5, §1.6).
    `rid`: the request whose lease expired on the node, if known: the decode consumes its
    transfer if it has landed, and a 0.1.6 node then refuses that rid's transfer for its
    request timeout, should it still arrive (a 0.1.5 node would take it).
    """
    try:
        reply = await _one_token(
            upstreams,
            node,
            rid=rid or f"pdgwflush{secrets.token_hex(8)}",
            first_token_id=0,
            timeout_s=FLUSH_WAIT_S,
        )
    except UpstreamError as exc:
        log.info("flushing node %s failed: %s", node.id, exc.message)
        return "in_doubt" if exc.in_doubt else "not_run"
    if reply.status == 429:  # a decode is running: not ours to disturb
        return "not_run"
    return "clean" if await wait_idle(upstreams, node, limit_s=idle_within_s) else "not_run"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a node says about itself: its TileRT release and what its engine can do."""

    version: TileRTVersion
    features: frozenset[str] = frozenset()
    engine: str | None = None


FEATURES = ("penalties", "ignore_eos", "logprobs", "grammar")
"""`/capabilities` flags the gateway reads; `grammar` is absent on TileRT's own engines,
which refuse grammars (absent means unsupported)."""

RELEASE_FEATURES: dict[TileRTVersion, frozenset[str]] = {
    "0.1.5": frozenset(),
    "0.1.6": frozenset({"ignore_eos"}),
}
"""What a node of each release reports, as its engines ship: 0.1.5 has no `/capabilities`
(`node_facts` gives it none); 0.1.6's engines report `ignore_eos` alone (docs/protocols.md
§1.6). What a node is assumed to report where none is asked (`pd-gateway classify`)."""


async def node_facts(upstreams: Upstreams, node: Node) -> NodeFacts | None:
    """`GET /capabilities`: 0.1.6 with its features, 404 means 0.1.5; None if unreachable."""
    reply = await _probe(upstreams, node, "/capabilities")
    if reply is None:
        return None
    if reply.status == 404:
        return NodeFacts("0.1.5")
    if reply.status != 200:
        return None
    data = await reply.json()
    caps = data.get("capabilities") if isinstance(data, dict) else None
    if not isinstance(caps, dict):
        return NodeFacts("0.1.6")
    features = frozenset(name for name in FEATURES if caps.get(name) is True)
    assert isinstance(data, dict)
    engine = data.get("engine")
    return NodeFacts("0.1.6", features, engine if isinstance(engine, str) else None)


async def _probe(upstreams: Upstreams, node: Node, path: str) -> Reply | None:
    try:
        return await upstreams.call(
            NODE, "GET", node.url, path, read_s=upstreams.timeouts.connect_s
        )
    except UpstreamError:
        return None


async def is_idle(upstreams: Upstreams, node: Node) -> bool:
    """/decode_status says idle (its lock is free)."""
    reply = await _probe(upstreams, node, "/decode_status")
    if reply is None or reply.status != 200:
        return False
    status = await reply.json()
    return isinstance(status, dict) and status.get("status") == "idle"


async def decoding(upstreams: Upstreams, node: Node, rid: str) -> bool:
    """/decode_status says the node is serving `rid`'s decode (busy with it from the moment
    it accepted the call, its wait for the KV transfer included)."""
    reply = await _probe(upstreams, node, "/decode_status")
    if reply is None or reply.status != 200:
        return False
    status = await reply.json()
    return isinstance(status, dict) and status.get("current_rid") == rid


async def is_ready(upstreams: Upstreams, node: Node) -> bool:
    """Healthy (`/health` answers 200) and idle."""
    health = await _probe(upstreams, node, "/health")
    return health is not None and health.status == 200 and await is_idle(upstreams, node)


async def wait_idle(
    upstreams: Upstreams, node: Node, *, limit_s: float, every_s: float = 0.1
) -> bool:
    """Poll /decode_status until the node is idle; False if it is not within `limit_s`."""
    try:
        async with asyncio.timeout(limit_s):
            while not await is_idle(upstreams, node):  # noqa: ASYNC110 (polling another process)
                await asyncio.sleep(every_s)
    except TimeoutError:
        return False
    return True
