"""Builds gateway configurations for a running simulated stack (tests only)."""

from __future__ import annotations

from typing import Any

from sim.stack import NodeInfo, SimStack
from tests.support.http import plain


def node_entry(node: NodeInfo) -> dict[str, Any]:
    return {"host": node.host, "ctrl_port": node.ctrl_port, "http_port": node.http_port}


TILERT_VERSIONS = ("0.1.5", "0.1.6")
"""The TileRT releases the latency suites run against."""


def version_args(version: str) -> dict[str, list[str]]:
    """SimStack arguments for nodes and prefill servers of one TileRT release (0.1.6's
    stream batching is shortened from its 200 ms: same lines, quicker tests)."""
    node = ["--protocol", version]
    if version == "0.1.6":
        node += ["--stream-interval-ms", "20", "--refusal-drain-s", "2"]
    return {"node_args": node, "prefill_args": ["--tilert-protocol", version]}


def latency_section(
    stack: SimStack,
    *,
    nodes: list[NodeInfo] | None = None,
    max_seq_len: int = 131072,
    tilert: str = "0.1.6",
) -> dict[str, Any]:
    return {
        "tilert": tilert,
        "prefill": [p.url for p in stack.prefills],
        "nodes": [node_entry(n) for n in (stack.nodes if nodes is None else nodes)],
        "max_seq_len": max_seq_len,
    }


def latency_model(
    stack: SimStack,
    name: str,
    *,
    nodes: list[NodeInfo] | None = None,
    tokenizer: str = "deepseek",
    tilert: str = "0.1.6",
    continuations: int | None = None,
    **entry: Any,
) -> dict[str, Any]:
    """A model entry served on the latency path by `nodes` (all of `stack`'s by default),
    of TileRT release `tilert`; `entry` adds to it (`output_parser`, `throughput`)."""
    latency = latency_section(stack, nodes=nodes, tilert=tilert)
    if continuations is not None:
        latency["continuations"] = continuations
    return {"name": name, "tokenizer": tokenizer, "latency": latency, **entry}


def gateway_config(
    models: list[dict[str, Any]],
    *,
    server: dict[str, Any] | None = None,
    gate: dict[str, Any] | None = None,
    timeouts: dict[str, Any] | None = None,
    classification: dict[str, Any] | None = None,
    admin: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    upstreams: dict[str, Any] | None = None,
    tenants: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A router.yaml document listening on a free port, with short test timeouts."""
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0, **(server or {})},
        # Nodes a test trips out of service come back as soon as they are idle again.
        "gate": {
            "max_queue": 64,
            "max_queue_wait_ms": 20_000,
            "node_cooldown_s": 0,
            "probe_interval_s": 0.05,
            **(gate or {}),
        },
        "timeouts": {
            "kv_transfer_s": 3,
            "decode_stall_s": 2,
            "cancel_s": 2,
            "prefill_s": 30,
            **(timeouts or {}),
        },
        "models": models,
    }
    if classification is not None:
        config["classification"] = classification
    if admin is not None:
        config["admin"] = admin
    if auth is not None:
        config["auth"] = auth
    if upstreams is not None:
        config["upstreams"] = upstreams
    if tenants is not None:
        config["tenants"] = tenants
    return config


def sim_post(url: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    response = plain().post(url + path, json=payload or {}, timeout=10)
    response.raise_for_status()
    return response.json()


def sim_get(url: str, path: str) -> Any:
    response = plain().get(url + path, timeout=10)
    response.raise_for_status()
    return response.json()


def simulator_urls(stack: SimStack) -> list[str]:
    """Every simulator of the stack: nodes, prefill and decode servers, the proxy stand-in."""
    urls = [n.url for n in stack.nodes] + [s.url for s in (*stack.prefills, *stack.decodes)]
    return urls + ([stack.proxy.url] if stack.proxy is not None else [])


def reset(stack: SimStack) -> None:
    """Clear faults and records on every simulator of the stack."""
    for url in simulator_urls(stack):
        plain().delete(url + "/sim/faults", timeout=10).raise_for_status()
        sim_post(url, "/sim/reset")


def corruptions(stack: SimStack) -> list[dict[str, Any]]:
    """Every write into a node's receive buffer that spoiled another transfer (none may
    ever happen: it is silent wrong output on a real node)."""
    return [c for node in stack.nodes for c in sim_get(node.url, "/sim/records")["corruptions"]]


FLUSH_RID_PREFIX = "pdgwflush"


def request_decodes(decodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A node's decode records without the gateway's flushes (start-up, readmission)."""
    return [d for d in decodes if not d["rid"].startswith(FLUSH_RID_PREFIX)]


def directive(text: str) -> str:
    """A prompt making the simulated model generate exactly `text`."""
    return f"[[sim-output]]{text}[[/sim-output]]"


# Priority tiers chosen by the `x-tier` header, as the concurrency tests use them.
PRIORITY = {"high": 10, "mid": 5, "low": 0}


def tier_rules(*more: dict[str, Any]) -> dict[str, Any]:
    """Rules giving `x-tier: high` and `mid` their priority (low by default), then `more`."""
    tiers = [
        {
            "name": tier,
            "path": "latency",
            "priority": PRIORITY[tier],
            "match": {"headers": {"x-tier": tier}},
        }
        for tier in ("high", "mid")
    ]
    return {
        "rules": [*tiers, *more],
        "default": {"name": "low", "path": "latency", "priority": PRIORITY["low"]},
    }
