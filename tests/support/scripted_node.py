"""A TileRT node's probe endpoints, scripted: what the prober asks a node, answered from
fields a test sets."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from router.config import UpstreamsConfig
from router.upstream import Upstreams
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

CAPABILITIES = {"profile": "glm5", "engine": "Stub", "capabilities": {"logprobs": True}}


class ScriptedNode:
    """A node's probe endpoints; records the paths asked, the decodes sent and the rids
    cancelled. `running`: the rid of a decode the node runs (busy until it is cancelled)."""

    def __init__(
        self, *, capabilities: tuple[int, Any] = (200, CAPABILITIES), running: str | None = None
    ) -> None:
        self.capabilities = capabilities
        self.status = "busy" if running else "idle"
        self.running = running
        self.calls: list[str] = []
        self.decodes: list[dict[str, Any]] = []
        self.cancels: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(path)
        if path == "/capabilities":
            status, body = self.capabilities
            return httpx.Response(status, content=orjson.dumps(body))
        if path == "/health":
            return httpx.Response(200, content=b'{"status": "ok"}')
        if path == "/decode_status":
            status = {"status": self.status, "current_rid": self.running}
            return httpx.Response(200, content=orjson.dumps(status))
        if path == "/pd/cancel":
            rid = orjson.loads(request.content)["rid"]
            self.cancels.append(rid)
            if rid != self.running:
                return httpx.Response(404, content=b'{"error": "not in flight"}')
            self.status, self.running = "idle", None
            return httpx.Response(200, content=orjson.dumps({"cancelled": rid}))
        if path == "/pd/decode":
            self.decodes.append(orjson.loads(request.content))
            return httpx.Response(504, content=b'{"error": "kv_transfer_timeout"}')
        return httpx.Response(404)


def upstreams(node: ScriptedNode) -> Upstreams:
    return Upstreams(
        UpstreamsConfig(),
        Timeouts(connect_s=1),
        transport=HttpxTransport(httpx.MockTransport(node)),
    )
