"""SIGTERM: in-flight streams finish within the grace period; past it they are cut off,
and either way every node ends idle (cancelled, never left decoding) before the exit."""

from __future__ import annotations

import json
import signal
import time
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    directive,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

TEXT = " ".join(f"word{i}" for i in range(60))


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    return sim_stacks.get(
        nodes=1, prefills=1, model="ds", node_args=["--step-ms", "40", "--tokens-per-step", "2"]
    )


def gateway(
    stack: SimStack, tmp: pytest.TempPathFactory, **server: Any
) -> AbstractContextManager[GatewayProcess]:
    models = [latency_model(stack, "ds")]
    return start_gateway(
        tmp, models, log_level="info", server=server, timeouts={"decode_stall_s": 60}
    )


def access_line(gw: GatewayProcess) -> dict[str, str]:
    """The one access line in the gateway's log, as its `key=value` fields."""
    (line,) = [line for line in gw.log_path.read_text().splitlines() if "pd_gateway.access" in line]
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def wait_for_draining(gw: GatewayProcess) -> httpx.Response:
    """/ready once the signal has been handled (it arrives asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        ready = plain().get(gw.url + "/ready", timeout=5)
        if ready.status_code == 503 or time.monotonic() > deadline:
            return ready
        time.sleep(0.02)


def stream_after_sigterm(gw: GatewayProcess, *, responses: bool = False) -> list[str]:
    path, body = "/chat/completions", {"messages": [{"role": "user", "content": directive(TEXT)}]}
    if responses:
        path, body = "/responses", {"input": directive(TEXT)}
    body = {"model": "ds", **body, "stream": True}
    lines = []
    with plain().stream("POST", gw.base_url + path, json=body, timeout=60) as r:
        events = r.iter_lines()
        lines.append(next(events))
        assert plain().get(gw.url + "/ready", timeout=5).json() == {"status": "ready"}
        gw.signal(signal.SIGTERM)
        # The listener stays open while the answer runs: readiness answers, and says no.
        ready = wait_for_draining(gw)
        assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
        try:
            lines.extend(events)
        except httpx.HTTPError:
            lines.append("<connection closed>")
    return [line for line in lines if line]


def test_in_flight_stream_finishes_after_sigterm(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with gateway(stack, tmp_path_factory, shutdown_grace_s=30) as gw:
        lines = stream_after_sigterm(gw)
        assert lines[-1] == "data: [DONE]"
        assert gw.wait_exit() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
        assert "Traceback" not in gw.log_path.read_text()
        access = access_line(gw)
    (decode,) = request_decodes(sim_get(stack.nodes[0].url, "/sim/records")["decodes"])
    assert decode["finish_reason"] == "stop"
    assert (access["status"], access["finish_reason"], access["stream"]) == ("200", "stop", "True")
    assert access["client"] == "127.0.0.1" and "error_code" not in access
    assert int(access["prompt_tokens"]) > 0 and int(access["completion_tokens"]) >= 60
    assert sim_get(stack.nodes[0].url, "/decode_status")["status"] == "idle"


def test_stream_past_the_grace_period_is_cut_and_the_node_cancelled(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sim_post(stack.nodes[0].url, "/sim/faults", {"stall_after": 4, "count": 1})
    with gateway(stack, tmp_path_factory, shutdown_grace_s=0.5) as gw:
        lines = stream_after_sigterm(gw)
        # Cut, but properly: an error event, then the end of the stream.
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert (error["code"], error["type"]) == ("shutting_down", "service_unavailable")
        assert gw.wait_exit() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
        assert "Traceback" not in gw.log_path.read_text()
        # Logged as it ended, not as a complete answer.
        access = access_line(gw)
        assert (access["status"], access["error_code"]) == ("503", "shutting_down")
        assert "finish_reason" not in access
    (decode,) = request_decodes(sim_get(stack.nodes[0].url, "/sim/records")["decodes"])
    assert decode["finish_reason"] == "cancelled"
    assert sim_get(stack.nodes[0].url, "/decode_status")["status"] == "idle"


def test_a_responses_stream_past_the_grace_period_ends_with_its_own_error_event(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sim_post(stack.nodes[0].url, "/sim/faults", {"stall_after": 4, "count": 1})
    with gateway(stack, tmp_path_factory, shutdown_grace_s=0.5) as gw:
        lines = stream_after_sigterm(gw, responses=True)
        assert gw.wait_exit() in (0, -signal.SIGTERM)
    # The API's own error event, and no `[DONE]` (this API has none).
    assert lines[-2:-1] == ["event: error"]
    error = json.loads(lines[-1].removeprefix("data: "))
    assert (error["type"], error["code"]) == ("error", "shutting_down")
    assert sim_get(stack.nodes[0].url, "/decode_status")["status"] == "idle"


def test_a_second_signal_ends_the_wait(
    stack: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sim_post(stack.nodes[0].url, "/sim/faults", {"stall_after": 4, "count": 1})
    body = {"model": "ds", "messages": [{"role": "user", "content": directive(TEXT)}]}
    body["stream"] = True
    with (
        gateway(stack, tmp_path_factory, shutdown_grace_s=120) as gw,
        plain().stream("POST", gw.base_url + "/chat/completions", json=body, timeout=60) as r,
    ):
        events = r.iter_lines()  # kept: a discarded iterator closes the stream
        next(events)
        gw.signal(signal.SIGTERM)
        wait_for_draining(gw)
        started = time.monotonic()
        gw.signal(signal.SIGTERM)
        gw.wait_exit()
    assert time.monotonic() - started < 30, "not the 120 s grace period"
