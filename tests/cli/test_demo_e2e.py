"""`pd-gateway demo` as a real process: both paths answer an OpenAI SDK client, and SIGINT
stops every process the demo started and frees every port."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from openai import OpenAI

from router.process.server import READY_PREFIX
from tests.support.demo import (
    Demo,
    bindable,
    descendants,
    ports_of,
    running_demo,
)
from tests.support.processes import running

pytestmark = pytest.mark.e2e

CONFIG_PREFIX = "Gateway configuration: "
USAGE_END = "Ctrl-C stops the gateway and every simulator."
START_TIMEOUT_S = 90.0


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    with running_demo(tmp_path / "demo.err", ready=USAGE_END, timeout_s=START_TIMEOUT_S) as running:
        yield running


@pytest.mark.timeout(180)
def test_demo_serves_both_paths_and_stops_everything_on_sigint(demo: Demo) -> None:
    base_url = demo.announced(READY_PREFIX)
    assert demo.announced("Base URL: ") == base_url
    ports = ports_of(demo.announced(CONFIG_PREFIX), base_url)
    children = demo.children
    assert len(children) == 8  # 4 simulators for deepseek-v3.2, 3 for glm-5, the gateway
    assert not [port for port in ports if bindable(port)]  # all of them are listening

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Say hello"}]
    for model in ("deepseek-v3.2", "glm-5"):
        plain = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=16,  # type: ignore[arg-type]
        )
        assert plain.headers["x-pd-route"] == "latency"
        assert plain.parse().choices[0].finish_reason == "length"
        batch = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            extra_headers={"x-workload": "batch"},
        )
        assert (batch.headers["x-pd-route"], batch.headers["x-pd-rule"]) == ("throughput", "batch")
        message = batch.parse().choices[0].message
        # GLM thinks unless told not to: its filler output is all reasoning, on both paths.
        assert message.content or (message.model_extra or {}).get("reasoning_content")
    stream = client.chat.completions.create(
        model="deepseek-v3.2",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text

    demo.popen.send_signal(signal.SIGINT)
    assert demo.exit_code(60) == 0
    demo.read_until(re.escape("Stopping the gateway and the simulators."), 5)
    assert not [pid for pid in children if running(pid)]
    assert [port for port in ports if not bindable(port)] == []


def test_demo_fails_cleanly_when_a_configured_port_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.cli import main

    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        prefill_port = spare.getsockname()[1]  # free again once closed
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node_port = taken.getsockname()[1]
        node = {"host": "127.0.0.1", "ctrl_port": node_port, "http_port": node_port}
        latency = {"prefill": [f"http://127.0.0.1:{prefill_port}"], "nodes": [node]}
        config = {"models": [{"name": "m", "tokenizer": "deepseek", "latency": latency}]}
        path = tmp_path / "router.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        before = descendants(os.getpid())
        assert main(["demo", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: a simulator of m did not start (a port in use? try --port-offset")
    assert descendants(os.getpid()) <= before
