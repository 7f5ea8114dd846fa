"""The transports every suite of upstream tests on real sockets runs against."""

from __future__ import annotations

import pytest

from router.upstream.http1 import Http1Transport
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.transport import Transport


@pytest.fixture(params=["own", "httpx"])
def transport(request: pytest.FixtureRequest) -> Transport:
    """Each transport the upstreams can be reached through: the gateway's own pool and
    httpx's."""
    return Http1Transport() if request.param == "own" else HttpxTransport()
