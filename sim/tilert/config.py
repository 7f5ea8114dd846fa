"""The decode node's settings and fault names, from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from sim.faults import FaultValue
from sim.tilert.slot import PROTOCOLS, Protocol

# Fault name -> value type; the same names serve as CLI flags (dashes) and JSON keys.
FAULTS: dict[str, type[FaultValue]] = {
    "refuse_transfers": bool,
    "stall_after": int,
    "die_after": int,
    "error_after": int,
    "decode_500": bool,
    "slow_start_ms": float,
    "hold_start": bool,
    "poses_as_015": bool,
}

# What GET /capabilities reports (0.1.6), as the production engines do; "grammar" is ours.
CAPABILITIES: dict[str, bool] = {
    "penalties": False,
    "ignore_eos": True,
    "logprobs": False,
    "grammar": False,
}


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything one simulated node is configured with."""

    host: str = "127.0.0.1"
    ctrl_port: int = 5556
    http_port: int = 5557
    data_port: int = 0
    tokenizer: str = "deepseek"
    max_seq_len: int = 131072
    sender_ranks: frozenset[int] = frozenset({0})
    layout_version: int = 1
    transport: str = "mooncake"
    data_plane: bool = True
    step_ms: float = 10.0
    tokens_per_step: float = 3.2
    default_output_tokens: int = 48
    request_timeout_s: float = 120.0
    protocol: Protocol = "0.1.6"
    capabilities: dict[str, bool] = field(default_factory=lambda: dict(CAPABILITIES))
    stream_interval_ms: float = 200.0
    refusal_drain_s: float = 30.0
    profile: str = "glm5"
    faults: dict[str, FaultValue] = field(default_factory=dict)


def _ranks(text: str) -> frozenset[int]:
    ranks = frozenset(int(part) for part in text.split(",") if part.strip())
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError("sender ranks are non-negative integers, e.g. 0,1,2,3")
    return ranks


def capabilities(text: str) -> dict[str, bool]:
    """``--capabilities '{"logprobs": true}'``: the defaults with these keys replaced."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(values, dict):
        raise argparse.ArgumentTypeError("capabilities are a JSON object")
    unknown = set(values) - set(CAPABILITIES)
    if unknown or not all(isinstance(v, bool) for v in values.values()):
        names = ", ".join(CAPABILITIES)
        raise argparse.ArgumentTypeError(f"capabilities are booleans named {names}")
    return {**CAPABILITIES, **values}


def _senders(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError("senders are 1 to 8")
    return value


def _tokens_per_step(text: str) -> float:
    value = float(text)
    if value < 1:
        raise argparse.ArgumentTypeError("tokens per step must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sim.tilert`` command line."""
    parser = argparse.ArgumentParser(
        prog="python -m sim.tilert", description="Simulated TileRT decode node."
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--ctrl-port", type=int, default=5556, help="control plane port (0 = free port)")
    add("--http-port", type=int, default=5557, help="HTTP API port (0 = free port)")
    add("--data-port", type=int, default=0, help="simulated data plane port (0 = free port)")
    add("--tokenizer", default="deepseek", help="deepseek, glm or a tokenizer.json path")
    add("--max-seq-len", type=int, default=131072)
    add("--sender-ranks", type=_ranks, default=frozenset({0}), help="e.g. 0 or 0,1,2,3")
    add("--layout-version", type=int, default=1)
    add("--transport", default="mooncake", choices=["mooncake", "nixl"])
    add("--no-data-plane", action="store_true", help="advertise no simulated data plane")
    add("--step-ms", type=float, default=10.0, help="time per decode step")
    add("--tokens-per-step", type=_tokens_per_step, default=3.2, help="mean tokens per step")
    add("--default-output-tokens", type=int, default=48, help="filler length without a plan")
    add("--request-timeout-s", type=float, default=120.0)
    add("--protocol", choices=PROTOCOLS, default="0.1.6", help="TileRT version to behave as")
    add("--senders", type=_senders, help="0.1.6: sender rank count (ranks 0..N-1); TileRT's is 8")
    add("--capabilities", type=capabilities, default=dict(CAPABILITIES), help="0.1.6, JSON")
    add("--stream-interval-ms", type=float, default=200.0, help="0.1.6 stream batching")
    add("--refusal-drain-s", type=float, default=30.0, help="0.1.6: drain before a refusal")
    add("--profile", default="glm5", help="0.1.6: profile named by /capabilities")
    faults = parser.add_argument_group("faults (also settable at POST /sim/faults)")
    faults.add_argument("--refuse-transfers", action="store_true", help="answer every request busy")
    faults.add_argument("--stall-after", type=int, help="stop emitting after N tokens")
    faults.add_argument("--die-after", type=int, help="drop the stream after N tokens")
    faults.add_argument("--error-after", type=int, help='send {"error": "decode stalled"} after N')
    faults.add_argument("--decode-500", action="store_true", help="answer /pd/decode with 500")
    faults.add_argument("--slow-start-ms", type=float, help="delay before the first token")
    faults.add_argument(
        "--hold-start", action="store_true", help="hold before the first token until released"
    )
    faults.add_argument(
        "--poses-as-015",
        action="store_true",
        help="answer /capabilities 404, as a node restarted on TileRT 0.1.5 would",
    )
    return parser


def parse_config(argv: list[str] | None = None) -> NodeConfig:
    """Parse the command line into a :class:`NodeConfig`."""
    args = build_parser().parse_args(argv)
    faults = {name: getattr(args, name) for name in FAULTS}
    return NodeConfig(
        host=args.host,
        ctrl_port=args.ctrl_port,
        http_port=args.http_port,
        data_port=args.data_port,
        tokenizer=args.tokenizer,
        max_seq_len=args.max_seq_len,
        sender_ranks=(
            frozenset(range(args.senders)) if args.senders is not None else args.sender_ranks
        ),
        layout_version=args.layout_version,
        transport=args.transport,
        data_plane=not args.no_data_plane,
        step_ms=args.step_ms,
        tokens_per_step=args.tokens_per_step,
        default_output_tokens=args.default_output_tokens,
        request_timeout_s=args.request_timeout_s,
        protocol=args.protocol,
        capabilities=args.capabilities,
        stream_interval_ms=args.stream_interval_ms,
        refusal_drain_s=args.refusal_drain_s,
        profile=args.profile,
        faults={k: v for k, v in faults.items() if v not in (None, False)},
    )
