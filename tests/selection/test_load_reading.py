"""A server's load figures, read from its `/metrics` through the upstream client."""

from __future__ import annotations

import httpx
import pytest

from router.config import UpstreamsConfig
from router.errors import UpstreamError
from router.selection import Load, parse_load
from router.upstream.client import Upstreams
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts
from router.upstream.vllm import MAX_METRICS_BYTES, metrics_text
from tests.selection.test_load import PAGE

URL = "http://vllm"


async def read_load(client: Upstreams, url: str) -> Load | None:
    """As the gateway's load scraper reads a server."""
    text = await metrics_text(client, url)
    return None if text is None else parse_load(text)


def upstreams(respond: httpx.Response | Exception) -> tuple[Upstreams, list[str]]:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if isinstance(respond, Exception):
            raise respond
        return respond

    transport = HttpxTransport(httpx.MockTransport(handler))
    return Upstreams(UpstreamsConfig(), Timeouts(), transport=transport), asked


async def test_the_figures_are_read_from_metrics() -> None:
    client, asked = upstreams(httpx.Response(200, text=PAGE))
    assert await read_load(client, URL) == Load(running=3, waiting=5, kv_cache_usage=0.25)
    assert asked == ["/metrics"]


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(404, json={"detail": "Not Found"}),  # a proxy without /metrics
        httpx.Response(200, text="# no vLLM figures here\n"),
        httpx.Response(200, text=PAGE + "#" * MAX_METRICS_BYTES),  # figures, then too much
    ],
    ids=["absent", "without_figures", "too_long"],
)
async def test_a_server_without_usable_figures_gives_none(answer: httpx.Response) -> None:
    client, _ = upstreams(answer)
    assert await read_load(client, URL) is None


async def test_a_server_that_does_not_answer_raises() -> None:
    client, _ = upstreams(httpx.ConnectError("refused"))
    with pytest.raises(UpstreamError):
        await read_load(client, URL)
