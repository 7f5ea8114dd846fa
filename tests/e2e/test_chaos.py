"""Nodes fail mid-answer again and again under load, and no client notices: 16 clients
stream greedy answers through the gateway (a real process) to 4 simulated nodes while a
chaos thread makes one node after another, one at a time, die (or stall) a few tokens into
its next answer. Every answer completes with the text, finish and usage of an uninterrupted run;
no node ever serves two requests at once; and the gateway's count of continued answers is
the nodes' own count of broken decodes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from sim.stack import SimStack
from tests.support.deployment import (
    directive,
    gateway_config,
    latency_model,
    request_decodes,
    sim_get,
    sim_post,
    version_args,
)
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.http import plain
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

CLIENTS = 16
ANSWERS_EACH = 3
CHAOS_EVERY_S = 0.2
# A broken decode's last words, as each node reports them.
BROKEN = {"died": "died", "stalled": "cancelled"}


@pytest.fixture(scope="module")
def stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    version = version_args(tilert_version)
    return sim_stacks.get(
        nodes=4,
        prefills=1,
        model="ds",
        node_args=["--step-ms", "4", *version["node_args"]],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0", *version["prefill_args"]],
    )


@pytest.fixture(scope="module")
def gateway(
    stack: SimStack, tilert_version: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    model = latency_model(stack, "ds", tilert=tilert_version, continuations=8)
    # A broken answer waits for a node among 16 clients' requests (ahead of those of its
    # priority that have not started).
    model["latency"]["continuation_wait_ms"] = 30_000
    config = gateway_config(
        [model],
        gate={"max_queue_wait_ms": 60_000},
        timeouts={"decode_stall_s": 1},  # a stalled node is given up a second after its last line
    )
    with start_gateway(tmp_path_factory, config["models"], **_options(config)) as running:
        yield running


def _options(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("gate", "timeouts")}


def answer_text(client: int) -> str:
    """Each client's own answer: some forty words, with characters of several bytes."""
    words = [f"c{client}w{i}" for i in range(36)]
    return " ".join(words) + " — naïve café 你好 🌍 done."


def stream(client: openai.OpenAI, text: str) -> tuple[str, str | None, tuple[int, int]]:
    """A streamed answer's text, finish and usage (prompt and completion tokens)."""
    chunks = list(
        client.chat.completions.create(
            model="ds",
            messages=[{"role": "user", "content": directive(text)}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert set(finishes[:-1]) <= {None}, finishes  # one finish, at the end
    usage = chunks[-1].usage
    return content, finishes[-1], (usage.prompt_tokens, usage.completion_tokens)


def continued(gateway: GatewayProcess) -> float:
    text = plain().get(gateway.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pd_gateway_continuations_total{") and 'outcome="continued"' in line
    )


@pytest.mark.parametrize("fault", ["died", "stalled"])
def test_every_answer_survives_nodes_failing_mid_stream_under_load(
    client: openai.OpenAI, gateway: GatewayProcess, stack: SimStack, fault: str
) -> None:
    texts = [answer_text(i) for i in range(CLIENTS)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        uninterrupted = list(pool.map(lambda t: stream(client, t), texts))
    for text, (content, finish, _) in zip(texts, uninterrupted, strict=True):
        assert (content, finish) == (text, "stop")
    continued_before = continued(gateway)
    broken_before = broken_decodes(stack, fault)

    done = threading.Event()
    armed = chaos(stack, fault, done)
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(
                pool.map(lambda t: [stream(client, t) for _ in range(ANSWERS_EACH)], texts)
            )
    finally:
        done.set()
        armed.join()
    for base, answers in zip(uninterrupted, results, strict=True):
        for content, finish, usage in answers:
            assert (content, finish, usage) == base

    gateway.wait_all_free()
    broken = broken_decodes(stack, fault) - broken_before
    assert broken >= 4, f"the chaos broke only {broken} decodes"
    # Every broken decode was continued, once: the gateway's count is the nodes'.
    assert continued(gateway) - continued_before == broken
    for node in stack.nodes:
        records = sim_get(node.url, "/sim/records")
        assert records["max_overlap"] <= 1, f"node {node.url} served two requests at once"


def chaos(stack: SimStack, fault: str, done: threading.Event) -> threading.Thread:
    """Every CHAOS_EVERY_S, unless a fault is still waiting on some node, one node is made
    to break its next decode a few tokens in: one node failing at a time, the others
    serving (a pool with every node out refuses at once)."""
    name = {"died": "die_after", "stalled": "stall_after"}[fault]
    rng = random.Random(7)

    def run() -> None:
        while not done.wait(CHAOS_EVERY_S):
            if not any(sim_get(n.url, "/sim/faults")["faults"] for n in stack.nodes):
                node = rng.choice(stack.nodes)
                sim_post(node.url, "/sim/faults", {name: rng.randint(2, 30), "count": 1})

    thread = threading.Thread(target=run, name="chaos", daemon=True)
    thread.start()
    return thread


def broken_decodes(stack: SimStack, fault: str) -> int:
    return sum(
        1
        for node in stack.nodes
        for record in request_decodes(sim_get(node.url, "/sim/records")["decodes"])
        if record["stream"] and record["finish_reason"] == BROKEN[fault]
    )
