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
    """A node's probe endpoints; records the paths asked and the decodes sent."""

    def __init__(self, *, capabilities: tuple[int, Any] = (200, CAPABILITIES)) -> None:
        self.capabilities = capabilities
        self.status = "idle"
        self.calls: list[str] = []
        self.decodes: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(path)
        if path == "/capabilities":
            status, body = self.capabilities
            return httpx.Response(status, content=orjson.dumps(body))
        if path == "/health":
            return httpx.Response(200, content=b'{"status": "ok"}')
        if path == "/decode_status":
            return httpx.Response(200, content=orjson.dumps({"status": self.status}))
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
