"""A dead vLLM server next to a live one, through a running gateway: no client sees it.

The dead server is a port bound by nobody who listens (every connection refused). The
first request sent there is sent once more to the live server; after five refusals in a
row the dead one is ejected and the live one is chosen as the only healthy server.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import directive, latency_model
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.stacks import StackPool

MODEL = "sim-model"
RULES = {
    "default": {"name": "native", "path": "throughput"},
    "rules": [{"name": "fast", "match": {"headers": {"x-workload": "fast"}}, "path": "latency"}],
}


@pytest.fixture(scope="module")
def dead_url() -> Iterator[str]:
    """A URL whose every connection is refused: its port is held, never listened on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(nodes=1, prefills=1, decodes=1, model=[MODEL])


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, dead_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with dead_first(stack, dead_url, tmp_path_factory) as running:
        yield running


@pytest.fixture
def unprobed_gateway(
    stack: SimStack, dead_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway of the test's own that never probes: only the test's requests judge the
    dead server (a probe every 5 s ejects it by itself within about 25 s)."""
    with dead_first(
        stack, dead_url, tmp_path_factory, upstreams={"probe_interval_s": 0}
    ) as running:
        yield running


@contextmanager
def dead_first(
    stack: SimStack,
    dead_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    **options: Any,
) -> Iterator[GatewayProcess]:
    """A gateway whose every set of vLLM servers lists the dead server first."""
    live_prefill, live_decode = stack.prefills[0].url, stack.decodes[0].url
    model = latency_model(
        stack,
        MODEL,
        throughput={
            "mode": "pull",
            "prefill": [dead_url, live_prefill],
            "decode": [dead_url, live_decode],
        },
    )
    model["latency"]["prefill"] = [dead_url, live_prefill]
    with start_gateway(
        tmp_path_factory,
        [model],
        classification={"rules": RULES},
        server={"expose_upstream": True},
        admin={"api_key": "operator-secret"},
        **options,
    ) as running:
        yield running


def ask(text: str) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": directive(text)}],
        "max_tokens": 50,
    }


@pytest.mark.parametrize(
    ("workload", "route", "live"),
    [("fast", "latency", "prefills"), ("batch", "throughput", "decodes")],
)
async def test_twenty_of_twenty_succeed_with_a_dead_server_first(
    unprobed_gateway: GatewayProcess,
    stack: SimStack,
    dead_url: str,
    workload: str,
    route: str,
    live: str,
) -> None:
    live_url = getattr(stack, live)[0].url
    upstreams = []
    async with httpx.AsyncClient(base_url=unprobed_gateway.base_url, timeout=30) as http:
        for i in range(20):
            reply = await http.post(
                "/chat/completions", json=ask(f"answer {i}"), headers={"x-workload": workload}
            )
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-pd-route"] == route
            assert reply.json()["choices"][0]["message"]["content"] == f"answer {i}"
            upstreams.append(reply.headers["x-pd-upstream"])
    assert {value.split("; ")[0] for value in upstreams} == {live_url}
    assert dead_url not in "".join(upstreams)
    # A first choice of the dead server was sent again; once it was ejected, the live one
    # was the only healthy choice.
    assert f"{live_url}; reason=retry_only_other" in upstreams
    assert f"{live_url}; reason=only_healthy" in upstreams


async def test_the_admin_api_and_the_metrics_show_the_dead_server_ejected(
    gateway: GatewayProcess, stack: SimStack, dead_url: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        for workload in ("fast", "batch"):
            for i in range(20):  # as many as eject it in the test above
                reply = await http.post(
                    "/v1/chat/completions", json=ask(f"{i}"), headers={"x-workload": workload}
                )
                assert reply.status_code == 200, reply.text
        assert (await http.get("/admin/upstreams")).status_code == 401
        admin = await http.get(
            "/admin/upstreams", headers={"authorization": "Bearer operator-secret"}
        )
        metrics = (await http.get("/metrics")).text
    assert admin.status_code == 200, admin.text
    sets = admin.json()["models"][MODEL]
    assert sorted(sets) == ["latency:prefill:default", "pull:decode", "pull:prefill"]
    for servers in sets.values():
        # Out, or between two ejections (a back-off that ended a moment ago).
        assert servers[dead_url]["state"] in ("ejected", "probation")
        assert servers[dead_url]["ejections"] >= 1
        assert servers[dead_url]["last_failure"] in ("unreachable", "probe_failed")
        live = next(url for url in servers if url != dead_url)
        assert servers[live]["state"] == "healthy"
    dead = f'url="{dead_url}"'
    ejections = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("pd_gateway_upstream_ejections_total{") and dead in line
    ]
    assert len(ejections) == 3 and min(ejections) >= 1
    states = [
        line.split('state="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("pd_gateway_upstream_server_state{")
        and dead in line
        and line.endswith(" 1.0")
    ]
    assert len(states) == 3 and set(states) <= {"ejected", "probation"}
