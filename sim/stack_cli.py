"""The ``python -m sim.stack`` command line and the usage text it prints."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from sim.stack import SimStack

_FIRST_TOKEN = (
    "python3 -c 'import json,sys; "
    'print(json.load(sys.stdin)["choices"][0]["logprobs"]["content"][0]["token"].split(":")[1])\''
)


class StackOptions(TypedDict):
    """The ``SimStack`` keyword arguments the command line sets."""

    nodes: int
    prefills: int
    decodes: int
    proxy: bool
    tokenizer: str
    model: list[str]
    host: str
    node_args: list[str]
    prefill_args: list[str]
    decode_args: list[str]
    proxy_args: list[str]


def parse_args(argv: list[str] | None = None) -> StackOptions:
    """Parse ``python -m sim.stack`` options into ``SimStack`` keyword arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m sim.stack", description="Run a simulated P/D deployment until Ctrl-C."
    )
    add = parser.add_argument
    add("--nodes", type=int, default=2, help="TileRT decode nodes")
    add("--prefills", type=int, default=1, help="vLLM prefill servers")
    add("--decodes", type=int, default=1, help="vLLM native decode servers")
    add("--no-proxy", action="store_true", help="no both-role server as proxy stand-in")
    add("--tokenizer", default="deepseek", help="deepseek, glm or a tokenizer.json path")
    add("--model", action="append", help="served model name (repeatable)")
    add("--host", default="127.0.0.1")
    add("--node-args", default="", help="extra sim.tilert arguments, one shell-quoted string")
    add("--prefill-args", default="", help="extra sim.vllm arguments for prefill servers")
    add("--decode-args", default="", help="extra sim.vllm arguments for decode servers")
    add("--proxy-args", default="", help="extra sim.vllm arguments for the proxy stand-in")
    args = parser.parse_args(argv)
    return {
        "nodes": args.nodes,
        "prefills": args.prefills,
        "decodes": args.decodes,
        "proxy": not args.no_proxy,
        "tokenizer": args.tokenizer,
        "model": args.model or ["sim-model"],
        "host": args.host,
        "node_args": shlex.split(args.node_args),
        "prefill_args": shlex.split(args.prefill_args),
        "decode_args": shlex.split(args.decode_args),
        "proxy_args": shlex.split(args.proxy_args),
    }


def describe(stack: SimStack) -> str:
    """Every endpoint of ``stack`` and a curl sequence that drives the latency path by hand."""
    lines = ["Simulated stack is up (Ctrl-C to stop)."]
    for i, node in enumerate(stack.nodes):
        lines.append(
            f"  tilert node {i}: {node.url}  ctrl {node.host}:{node.ctrl_port}"
            f"  data {node.data_port}"
        )
    for server in stack.prefills:
        lines.append(
            f"  prefill {server.engine_id}: {server.url}  side channel "
            f"{server.side_channel_host}:{server.side_channel_port}"
        )
    for server in stack.decodes:
        lines.append(f"  decode {server.engine_id}: {server.url}")
    if stack.proxy is not None:
        lines.append(f"  proxy stand-in: {stack.proxy.url}")
    if not stack.nodes or not stack.prefills:
        return "\n".join(lines)
    node, prefill = stack.nodes[0], stack.prefills[0]
    body = (
        '{"model": "sim-model", "messages": [{"role": "user", "content": "Hello"}], '
        '"max_tokens": 1, "logprobs": true, "top_logprobs": 1, "kv_transfer_params": '
        f'{{"tilert_host": "{node.host}", "tilert_ctrl_port": {node.ctrl_port}}}}}'
    )
    lines += [
        "",
        "Latency path by hand (prefill with kv_transfer_params, then /pd/decode):",
        "  RID=$(python3 -c 'import uuid; print(uuid.uuid4().hex)')",
        f"  FIRST=$(curl -s {prefill.url}/v1/chat/completions \\",
        "      -H 'Content-Type: application/json' -H \"X-Request-Id: $RID\" \\",
        f"      -d '{body}' | {_FIRST_TOKEN})",
        f"  curl -sN {node.url}/pd/decode -H 'Content-Type: application/json' \\",
        '      -d "{\\"rid\\": \\"$RID\\", \\"first_token_id\\": $FIRST, \\"max_tokens\\": 64, '
        '\\"stream\\": true}"',
        f"  curl -s {node.url}/sim/records",
    ]
    return "\n".join(lines)
