"""The node protocol of one latency request, against scripted upstreams (httpx.MockTransport):
every unhappy path leaves the node as the protocol requires and releases the slot once,
with the right verdict on the node's health."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from router.config import UpstreamsConfig
from router.errors import DecodeError, NodeRefused, PrefillError
from router.gate import NodeFailure
from router.latency.protocol import LatencyDeps, NodeSession
from router.latency.sampling import SamplingDefaults, decode_options
from router.node import Node
from router.node_lifecycle.facts import NodeFactsBook
from router.serving import RoutedRequest
from router.telemetry.metrics import Metrics
from router.upstream import Upstreams
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.tilert import DoneLine, NodeFacts, TokenLine
from router.upstream.timeouts import Timeouts
from router.upstream.vllm import Prefilled
from tests.throughput.support import routed

NODE = Node(host="node", ctrl_port=5556, http_port=5557)
PREFILL_URL = "http://prefill:8000"
TIMEOUTS = Timeouts(connect_s=1, kv_transfer_s=0.5, decode_stall_s=0.5, cancel_s=0.5)
Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]

PREFILLED = {
    "id": "chatcmpl-1",
    "created": 7,
    "choices": [{"logprobs": {"content": [{"token": "token_id:42"}]}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 12},
}
DONE = {"done": True, "n": 3, "finish_reason": "stop"}


def json_reply(payload: Any, status: int = 200) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=orjson.dumps(payload))

    return handle


def failing(exc: Exception) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        raise exc

    return handle


class Lines(httpx.AsyncByteStream):
    """An ndjson body; with `hold`, it stops after its lines until the event is set."""

    def __init__(self, lines: list[Any], hold: asyncio.Event | None) -> None:
        self._lines = lines
        self._hold = hold

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self._lines:
            yield orjson.dumps(line) + b"\n"
        if self._hold is not None:
            await self._hold.wait()


def streaming(*lines: Any, hold: asyncio.Event | None = None) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Lines(list(lines), hold))

    return handle


@dataclass
class Node:
    """A scripted TileRT node and prefill server, recording every call."""

    prefill: Handler = field(default_factory=lambda: json_reply(PREFILLED))
    decode: Handler = field(default_factory=lambda: streaming({"t": [1, 2]}, DONE))
    consume: Handler = field(default_factory=lambda: json_reply({"done": True}))
    cancel: Handler = field(default_factory=lambda: json_reply({"status": "cancelled"}))
    status: Handler = field(default_factory=lambda: json_reply({"status": "idle"}))
    calls: list[tuple[str, Any]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        body = orjson.loads(content) if content else None
        path = request.url.path
        if path == "/pd/decode" and not body["stream"]:
            path = "consume"
        self.calls.append((path, body))
        if path == "/pd/cancel":
            self.cancelled.set()
        handler = {
            "/v1/chat/completions": self.prefill,
            "/pd/decode": self.decode,
            "consume": self.consume,
            "/pd/cancel": self.cancel,
            "/decode_status": self.status,
        }[path]
        return await handler(request)

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]


class RecordingLease:
    node = NODE

    def __init__(self) -> None:
        self.released = False
        self.lost = False  # the gate's state was unreachable past the lease's TTL
        self.landed = False
        self.outcomes: list[tuple[NodeFailure | None, bool]] = []

    async def release(
        self, failure: NodeFailure | None = None, *, reports_health: bool = True
    ) -> None:
        self.released = True
        self.outcomes.append((failure, reports_health))

    async def renew(self) -> bool:
        return self.valid()

    def valid(self) -> bool:
        return not self.released and not self.lost

    def transfer_landed(self) -> None:
        self.landed = True


@dataclass
class Run:
    session: NodeSession
    lease: RecordingLease
    metrics: Metrics
    tasks: list[asyncio.Task[None]]
    upstreams: Upstreams

    async def finished(self) -> tuple[NodeFailure | None, bool]:
        """Wait for the protocol's background cleanup; the one release's verdict."""
        await asyncio.gather(*self.tasks)
        await self.upstreams.aclose()
        (outcome,) = self.lease.outcomes
        return outcome

    async def start(self, req: RoutedRequest, *, max_seq_len: int) -> Prefilled:
        options = decode_options(req.parsed, req.body, SamplingDefaults())
        return await self.session.start(req, options, max_seq_len=max_seq_len)

    def cancellations(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "pd_gateway_cancellations_total", {"model": "m", "reason": reason}
        )
        return value or 0.0


def run(node: Node, timeouts: Timeouts = TIMEOUTS, lease: RecordingLease | None = None) -> Run:
    tasks: list[asyncio.Task[None]] = []

    def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        tasks.append(task)
        return task

    upstreams = Upstreams(
        UpstreamsConfig(), timeouts, transport=HttpxTransport(httpx.MockTransport(node))
    )
    metrics = Metrics()
    deps = LatencyDeps(
        upstreams=upstreams,
        timeouts=timeouts,
        spawn=spawn,
        metrics=metrics,
        facts=NodeFactsBook(),
    )
    lease = lease or RecordingLease()
    session = NodeSession(
        deps, lease, model="m", prefill_url=PREFILL_URL, on_released=lambda _: None
    )
    return Run(session, lease, metrics, tasks, upstreams)


def request(**extra: Any) -> RoutedRequest:
    return routed({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra})


async def read_all(session: NodeSession) -> list[Any]:
    lines = []
    while (line := await session.next_line()) is not None:
        lines.append(line)
    return lines


async def test_a_whole_decode_is_read_and_the_node_judged_healthy() -> None:
    node = Node()
    r = run(node)
    prefilled = await r.start(request(max_tokens=5), max_seq_len=100)
    assert prefilled.first_token_id == 42
    assert await read_all(r.session) == [TokenLine([1, 2]), DoneLine(3, "stop")]
    r.session.close()
    assert await r.finished() == (None, True)
    assert node.paths() == ["/v1/chat/completions", "/pd/decode"]
    prefill_body, decode_body = (body for _, body in node.calls)
    assert prefill_body["kv_transfer_params"] == {"tilert_host": "node", "tilert_ctrl_port": 5556}
    assert decode_body["first_token_id"] == 42
    assert decode_body["max_tokens"] == 5


async def test_the_node_budget_is_the_room_left_in_its_sequence() -> None:
    node = Node()
    r = run(node)
    await r.start(request(), max_seq_len=20)
    await read_all(r.session)
    r.session.close()
    await r.finished()
    assert node.calls[1][1]["max_tokens"] == 20 - 12


@pytest.mark.parametrize(
    ("handler", "code", "status", "consumed"),
    [
        (failing(httpx.ConnectError("refused")), "prefill_unreachable", 502, False),
        (failing(httpx.ReadTimeout("slow")), "prefill_timeout", 504, True),
        (failing(httpx.RemoteProtocolError("cut")), "prefill_failed", 502, True),
        (json_reply({"error": {"message": "boom"}}, 500), "prefill_failed", 502, False),
        (json_reply({"error": {"message": "bad"}}, 400), "prefill_failed", 400, False),
        (json_reply({**PREFILLED, "choices": [{"logprobs": None}]}), "prefill_unusable", 502, True),
    ],
)
async def test_a_failed_prefill_consumes_a_transfer_it_may_have_pushed(
    handler: Handler, code: str, status: int, consumed: bool
) -> None:
    node = Node(prefill=handler)
    r = run(node)
    with pytest.raises(PrefillError) as failed:
        await r.start(request(), max_seq_len=100)
    assert (failed.value.code, failed.value.status) == (code, status)
    assert await r.finished() == (None, False), "a prefill failure says nothing of the node"
    consume = ["consume", "/decode_status"]  # then idle again before the slot is freed
    expected = ["/v1/chat/completions", *(consume if consumed else [])]
    assert node.paths() == expected


@pytest.mark.parametrize(
    ("handler", "code", "failure"),
    [
        (
            json_reply({"error": "lock"}, 504),
            "kv_transfer_timeout",
            NodeFailure("kv_transfer_timeout", hard=False),
        ),
        (
            json_reply({"error": "boom"}, 500),
            "decode_failed",
            NodeFailure("decode_failed", hard=False),
        ),
        (
            failing(httpx.ConnectError("refused")),
            "node_unreachable",
            NodeFailure("node_unreachable", hard=True),
        ),
    ],
)
async def test_a_node_refusal_is_judged(handler: Handler, code: str, failure: NodeFailure) -> None:
    r = run(Node(decode=handler))
    with pytest.raises(DecodeError) as failed:
        await r.start(request(), max_seq_len=100)
    assert failed.value.code == code
    assert await r.finished() == (failure, True)


async def test_a_busy_node_still_gets_our_transfer_consumed_once_idle() -> None:
    node = Node(decode=json_reply({"error": "busy"}, 429))
    r = run(node)
    with pytest.raises(DecodeError) as failed:
        await r.start(request(), max_seq_len=100)
    assert (failed.value.code, failed.value.status) == ("node_busy", 503)
    assert await r.finished() == (NodeFailure("node_busy", hard=True), True)
    assert node.paths() == [
        "/v1/chat/completions",
        "/pd/decode",  # 429
        "/decode_status",  # idle: a race with the previous response's end?
        "/pd/decode",  # 429 again: taken
        "/decode_status",  # the cleanup waits for the node to be idle,
        "consume",  # consumes our transfer,
        "/decode_status",  # and sees the node idle before it frees the slot
    ]


async def test_a_429_from_a_node_finishing_its_previous_response_is_retried() -> None:
    answers = iter([json_reply({"error": "busy"}, 429), streaming({"t": [1]}, DONE)])

    async def busy_then_free(request: httpx.Request) -> httpx.Response:
        return await next(answers)(request)

    node = Node(decode=busy_then_free)
    r = run(node)
    await r.start(request(), max_seq_len=100)
    assert await read_all(r.session) == [TokenLine([1]), DoneLine(3, "stop")]
    r.session.close()
    assert await r.finished() == (None, True)
    assert node.paths() == ["/v1/chat/completions", "/pd/decode", "/decode_status", "/pd/decode"]


async def test_a_node_still_busy_after_a_consume_is_taken_out() -> None:
    node = Node(
        prefill=failing(httpx.ReadTimeout("slow")), status=json_reply({"status": "decoding"})
    )
    r = run(node)
    with pytest.raises(PrefillError):
        await r.start(request(), max_seq_len=100)
    assert await r.finished() == (NodeFailure("decode_unfinished", hard=True), True)


@pytest.mark.parametrize(("cancel_status", "hard"), [(200, False), (404, True)])
async def test_a_decode_that_never_answers_is_cancelled(cancel_status: int, hard: bool) -> None:
    node = Node(decode=failing(httpx.ReadTimeout("slow")), cancel=json_reply({}, cancel_status))
    r = run(node)
    with pytest.raises(DecodeError) as failed:
        await r.start(request(), max_seq_len=100)
    assert failed.value.code == "decode_timeout"
    failure, reports_health = await r.finished()
    assert reports_health and failure is not None and failure.hard is hard
    assert node.paths()[-1] == "/pd/cancel"


async def test_an_error_line_mid_stream_cancels_and_drains_the_node() -> None:
    node = Node(decode=streaming({"t": [1]}, {"error": "decode stalled"}))
    r = run(node)
    await r.start(request(), max_seq_len=100)
    assert await r.session.next_line() == TokenLine([1])
    with pytest.raises(DecodeError) as failed:
        await r.session.next_line()
    assert failed.value.code == "decode_failed"
    r.session.close()
    assert await r.finished() == (NodeFailure("decode_failed", hard=False), True)
    assert node.paths()[-1] == "/pd/cancel"
    assert r.cancellations("node_error") == 1


@pytest.mark.parametrize(("stopped", "reason"), [(False, "client_gone"), (True, "stop_sequence")])
async def test_ending_mid_stream_cancels_the_node_and_frees_the_slot(
    stopped: bool, reason: str
) -> None:
    """The client left, or the relay matched a stop: the node did nothing wrong."""
    hold = asyncio.Event()
    node = Node(decode=streaming({"t": [1]}, hold=hold))
    node.cancel = release_on_cancel(hold)
    r = run(node)
    await r.start(request(), max_seq_len=100)
    assert await r.session.next_line() == TokenLine([1])
    r.session.close(stopped=stopped)
    assert await r.finished() == (None, True)
    assert node.paths()[-1] == "/pd/cancel"
    assert r.cancellations(reason) == 1


async def test_a_node_that_never_ends_its_response_is_taken_out() -> None:
    hold = asyncio.Event()  # never set: the body never ends, even after the cancel
    r = run(Node(decode=streaming({"t": [1]}, hold=hold)))
    await r.start(request(), max_seq_len=100)
    await r.session.next_line()
    r.session.close()
    assert await r.finished() == (NodeFailure("decode_unfinished", hard=True), True)


async def test_a_client_gone_during_the_prefill_still_has_the_transfer_consumed() -> None:
    arrived, answer = asyncio.Event(), asyncio.Event()

    async def slow_prefill(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await answer.wait()
        return httpx.Response(200, content=orjson.dumps(PREFILLED))

    node = Node(prefill=slow_prefill)
    r = run(node)
    start = asyncio.ensure_future(r.start(request(), max_seq_len=100))
    await arrived.wait()
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert not r.lease.released, "the prefill is still running: the slot is not yet free"
    answer.set()
    assert await r.finished() == (None, False)
    assert node.paths() == ["/v1/chat/completions", "consume", "/decode_status"], "no decode"
    assert node.calls[1][1]["first_token_id"] == 42


def release_on_cancel(hold: asyncio.Event) -> Handler:
    """A cancel that lets the held decode body end (as the real node ends it)."""

    async def handle(request: httpx.Request) -> httpx.Response:
        hold.set()
        return httpx.Response(200, content=b"{}")

    return handle


async def test_a_lease_lost_before_the_prefill_sends_nothing_naming_the_node() -> None:
    node = Node()
    r = run(node)
    r.lease.lost = True
    with pytest.raises(DecodeError) as failed:
        await r.start(request(), max_seq_len=100)
    assert failed.value.code == "lease_lost"
    assert await r.finished() == (None, False)
    assert node.paths() == [], "no prefill pushing to a node no longer ours"


async def test_a_lease_lost_during_the_prefill_leaves_the_node_alone() -> None:
    """The replica's prefill was under way when its lease ran out (a pause, a partition): it
    neither decodes nor consumes the transfer it claimed, since the node may be another
    request's by now; the node's flush deals with whatever lands."""
    node = Node()
    r = run(node)
    answer = node.prefill

    async def prefill_outliving_the_lease(request: httpx.Request) -> httpx.Response:
        r.lease.lost = True
        return await answer(request)

    node.prefill = prefill_outliving_the_lease
    with pytest.raises(DecodeError) as failed:
        await r.start(request(), max_seq_len=100)
    assert failed.value.code == "lease_lost"
    await r.finished()
    assert node.paths() == ["/v1/chat/completions"], "neither a decode nor a consume"
    assert r.lease.landed is False


async def test_the_lease_learns_when_the_transfer_has_landed() -> None:
    node = Node()
    r = run(node)
    await r.start(request(), max_seq_len=100)
    assert r.lease.landed is True, "the node's first line proves the transfer arrived"
    await read_all(r.session)
    r.session.close()
    await r.finished()


async def test_a_lease_lost_mid_stream_stops_and_cancels_its_own_decode() -> None:
    """A cancel names the request: the node stops this decode, and would stop no other."""
    hold = asyncio.Event()
    node = Node(decode=streaming({"t": [1]}, hold=hold))
    node.cancel = release_on_cancel(hold)
    r = run(node)
    await r.start(request(), max_seq_len=100)
    assert await r.session.next_line() == TokenLine([1])
    r.lease.lost = True
    with pytest.raises(DecodeError) as failed:
        await r.session.next_line()
    assert failed.value.code == "lease_lost"
    r.session.close()
    await r.finished()
    assert node.paths() == ["/v1/chat/completions", "/pd/decode", "/pd/cancel"], "no consume"


@pytest.mark.parametrize(
    ("status", "error_type", "unsupported"),
    [
        (400, "invalid_parameter", False),
        (400, "invalid_grammar", False),
        (501, "capability_unavailable", True),
        (501, "logprobs_unavailable", True),
        (501, "grammar_unsupported", True),
    ],
)
async def test_a_typed_refusal_is_an_answer_about_the_request(
    status: int, error_type: str, unsupported: bool
) -> None:
    """0.1.6 (docs/protocols.md §1.6): the node drained our transfer before refusing, so
    nothing is consumed; the node is not judged; a lacking feature is believed at once."""
    node = Node(decode=json_reply({"error": "no", "error_type": error_type}, status))
    r = run(node)
    r.session._deps.facts.learn(NODE.id, NodeFacts("0.1.6", frozenset({"logprobs", "grammar"})))
    with pytest.raises(NodeRefused) as refused:
        await r.start(request(), max_seq_len=100)
    assert (refused.value.status, refused.value.code) == (400, error_type)
    assert refused.value.unsupported is unsupported
    assert await r.finished() == (None, False)
    assert node.paths() == ["/v1/chat/completions", "/pd/decode", "/decode_status"]
    lacking = {"logprobs_unavailable": "logprobs", "grammar_unsupported": "grammar"}
    expected = {"logprobs", "grammar"} - {lacking.get(error_type)}
    assert r.session._deps.facts.features([NODE.id]) == expected


async def test_a_refused_node_that_stays_busy_is_taken_out() -> None:
    node = Node(
        decode=json_reply({"error": "no", "error_type": "invalid_parameter"}, 400),
        status=json_reply({"status": "busy"}),
    )
    r = run(node)
    with pytest.raises(NodeRefused):
        await r.start(request(), max_seq_len=100)
    assert await r.finished() == (NodeFailure("decode_unfinished", hard=True), True)


async def test_both_legs_get_the_same_explicit_sampling() -> None:
    node = Node()
    r = run(node)
    await r.start(request(temperature=0.3, top_k=-1), max_seq_len=100)
    await read_all(r.session)
    r.session.close()
    await r.finished()
    prefill_body, decode_body = (body for _, body in node.calls)
    assert {k: prefill_body[k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 0.3,
        "top_p": 1.0,
        "top_k": -1,
    }
    assert decode_body["sampling"] == {"temperature": 0.3, "top_p": 1.0, "top_k": 256}
    assert "top_logprobs" not in decode_body and "grammar_spec" not in decode_body


async def test_logprobs_and_a_json_format_reach_the_node() -> None:
    node = Node()
    r = run(node)
    req = request(
        logprobs=True,
        top_logprobs=3,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
    )
    await r.start(req, max_seq_len=100)
    await read_all(r.session)
    r.session.close()
    await r.finished()
    prefill_body, decode_body = (body for _, body in node.calls)
    assert (prefill_body["logprobs"], prefill_body["top_logprobs"]) == (True, 3)
    assert decode_body["top_logprobs"] == 3
    assert decode_body["grammar_spec"] == {"type": "json_schema", "value": {}}


@pytest.mark.parametrize(("version", "hard"), [("0.1.5", True), ("0.1.6", False), (None, False)])
async def test_a_transfer_timeout_on_a_0_1_5_node_takes_it_out_to_be_flushed(
    version: str | None, hard: bool
) -> None:
    """0.1.5 admits a transfer that arrives after its 504: an orphan. 0.1.6 refuses it."""
    r = run(Node(decode=json_reply({"error": "kv_transfer_timeout"}, 504)))
    r.lease.node = dataclasses.replace(NODE, tilert=version)
    with pytest.raises(DecodeError):
        await r.start(request(), max_seq_len=100)
    assert await r.finished() == (NodeFailure("kv_transfer_timeout", hard=hard), True)


def waiting_for_a_transfer(node: Node, *, cancel_ends_it: bool) -> Handler:
    """A decode whose transfer never arrives: it ends when cancelled (0.1.6: 499), or at its
    own `timeout_s` (0.1.5, which answers a cancel during the KV wait with 404)."""

    async def handle(request: httpx.Request) -> httpx.Response:
        timeout_s = orjson.loads(await request.aread())["timeout_s"]
        if cancel_ends_it:
            await node.cancelled.wait()
            return httpx.Response(499, content=b'{"error": "request_cancelled"}')
        await asyncio.sleep(timeout_s)
        return httpx.Response(504, content=b'{"error": "kv_transfer_timeout"}')

    return handle


def decode_status(node: Node) -> Handler:
    """/decode_status as a node reports it: busy with the decode it took up, if any."""

    async def handle(request: httpx.Request) -> httpx.Response:
        rids = [body["rid"] for path, body in node.calls if path == "/pd/decode"]
        current = rids[-1] if rids else None
        return httpx.Response(
            200, json={"status": "busy" if current else "idle", "current_rid": current}
        )

    return handle


@pytest.mark.parametrize(("version", "cancel_status"), [("0.1.6", 200), ("0.1.5", 404)])
async def test_a_transfer_the_node_never_admits_is_node_busy_within_the_admission_wait(
    version: str, cancel_status: int
) -> None:
    node = Node(cancel=json_reply({}, cancel_status))
    node.decode = waiting_for_a_transfer(node, cancel_ends_it=version == "0.1.6")
    node.status = decode_status(node)
    timeouts = dataclasses.replace(TIMEOUTS, kv_transfer_s=1.5, kv_admission_s=0.2)
    r = run(node, timeouts)
    r.lease.node = dataclasses.replace(NODE, tilert=version)
    started = asyncio.get_running_loop().time()
    with pytest.raises(DecodeError) as refused:
        await r.start(request(), max_seq_len=100)
    assert refused.value.code == "node_busy" and refused.value.status == 503
    assert asyncio.get_running_loop().time() - started < 1.0, "answered before kv_transfer_s"
    assert not r.lease.released, "the node is kept until its decode has ended"
    assert await r.finished() == (NodeFailure("node_busy", hard=True), True)
    assert "/pd/cancel" in node.paths()
    assert "consume" not in node.paths(), "nothing to consume: the transfer never landed"


@pytest.mark.parametrize("status", [json_reply({"status": "idle", "current_rid": None}), None])
async def test_a_node_that_never_answers_its_decode_call_is_a_decode_timeout_in_doubt(
    status: Handler | None,
) -> None:
    """The call accepted, no status line: not a refused transfer (/decode_status does not
    show the decode waiting, or does not answer), but a call the node may have taken up."""
    node = Node(cancel=failing(httpx.ConnectError("no answer")))

    async def silent(request: httpx.Request) -> httpx.Response:
        # No status line: the call ends at the transport's head wait (`timeout_s` plus
        # `decode_stall_s`), as it does over a socket.
        await asyncio.sleep(orjson.loads(await request.aread())["timeout_s"] + 0.5)
        raise httpx.ReadTimeout("no status line")

    node.decode = silent
    node.status = status or failing(httpx.ReadTimeout("no answer"))
    timeouts = dataclasses.replace(TIMEOUTS, kv_transfer_s=0.3, kv_admission_s=0.2)
    r = run(node, timeouts)
    with pytest.raises(DecodeError) as unanswered:
        await r.start(request(), max_seq_len=100)
    error = unanswered.value
    assert (error.code, error.status, error.in_doubt) == ("decode_timeout", 504, True)
    assert error.message == "the decode node did not answer its decode call within 0.2 s"
    assert "/decode_status" in node.paths()
    # Out at once, until probed idle and flushed: it may be decoding, or take the transfer.
    assert await r.finished() == (NodeFailure("decode_timeout", hard=True), True)
    assert "consume" not in node.paths()


class LeaseLostWhilePaused(RecordingLease):
    """A lease that the replica loses while it waits for the node's next line, as when its
    process is paused (SIGSTOP, a starved host) past the lease: after `pause_soon`, valid
    for one more check (the read's start), lost from then on."""

    def __init__(self) -> None:
        super().__init__()
        self._checks_left: int | None = None

    def pause_soon(self) -> None:
        self._checks_left = 1

    def valid(self) -> bool:
        if self._checks_left is not None:
            if self._checks_left == 0:
                return False
            self._checks_left -= 1
        return super().valid()


async def test_a_replica_resumed_past_its_lease_reports_lease_lost_not_a_stall() -> None:
    hold = asyncio.Event()
    node = Node(decode=streaming({"t": [1]}, hold=hold))
    node.cancel = release_on_cancel(hold)
    lease = LeaseLostWhilePaused()
    r = run(node, lease=lease)
    await r.start(request(), max_seq_len=100)
    assert await r.session.next_line() == TokenLine([1])
    lease.pause_soon()
    with pytest.raises(DecodeError) as failed:
        await r.session.next_line()  # the stall timer (0.5 s) runs out during the pause
    assert failed.value.code == "lease_lost"
    r.session.close()
    failure, _ = await r.finished()
    assert failure is None, "the node is not blamed for the replica's pause"
    assert node.paths()[-1] == "/pd/cancel"
