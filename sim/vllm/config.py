"""The vLLM simulator's settings and fault names, from the command line."""

from __future__ import annotations

import argparse
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from sim.faults import FaultValue
from sim.vllm.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, ParserConfig

Role = Literal["prefill", "decode", "both"]
TransferOrder = Literal["response-first", "transfer-first", "race"]
TilertProtocol = Literal["0.1.5", "0.1.6"]

# Fault name -> value type; the same names serve as CLI flags (dashes) and JSON keys.
FAULTS: dict[str, type[FaultValue]] = {
    "http_status": int,
    "text_logprobs": bool,
    "transfer_no_done": bool,
    "slow_transfer_ms": float,
    "stall": bool,
    "die_after": int,
    "pull_fail": bool,
    "health_503": bool,
    "slow_ms": float,
    "queued_ms": float,
}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything one simulated vLLM server is configured with."""

    role: Role = "both"
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ("sim-model",)
    tokenizer: str = "deepseek"
    engine_id: str = "sim-engine"
    side_channel_port: int = 0
    prefill_ms_per_token: float = 0.02
    cached_prefill_ms_per_token: float = 0.0
    serial_prefill: bool = False
    max_num_seqs: int | None = None
    block_size: int = 16
    num_gpu_blocks: int = 4096
    enable_prefix_caching: bool = False
    kv_events_endpoint: str | None = None  # publish KV-cache events when set
    kv_events_topic: str = ""
    itl_ms: float = 5.0
    itl_ms_per_running: float = 0.0
    default_output_tokens: int = 48
    sender_ranks: tuple[int, ...] = (0,)
    layout_version: int = 1
    transport: str = "mooncake"
    tilert_protocol: TilertProtocol = "0.1.6"
    tilert_attempts: int = 5
    tilert_backoff_scale: float = 1.0
    transfer_ms_base: float = 2.0
    transfer_ms_per_token: float = 0.001
    transfer_order: TransferOrder = "race"
    kv_expiry_s: float = 480.0
    remote_prefill_timeout_s: float = 60.0
    max_model_len: int = 131072
    prompt_tokens_details: bool = False
    refuse_unparsed_tool_choice: bool = False
    parsers: ParserConfig = field(default_factory=ParserConfig)
    faults: dict[str, FaultValue] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        """The name responses report (the first served name)."""
        return self.served_model_names[0]


def _ranks(text: str) -> tuple[int, ...]:
    ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    if not ranks or ranks[0] < 0:
        raise argparse.ArgumentTypeError("sender ranks are non-negative integers, e.g. 0,1,2,3")
    return ranks


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _kv_events_config(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object, e.g. '{\"enable_kv_cache_events\": true}'")
    if value.get("publisher") not in (None, "zmq", "null"):
        raise argparse.ArgumentTypeError("publisher is zmq or null")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sim.vllm`` command line."""
    parser = argparse.ArgumentParser(
        prog="python -m sim.vllm", description="Simulated vLLM OpenAI server."
    )
    add = parser.add_argument
    add("--role", choices=["prefill", "decode", "both"], default="both")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8000, help="HTTP port (0 = free port)")
    add("--served-model-name", action="append", dest="served_model_names", metavar="NAME")
    add("--tokenizer", default="deepseek", help="deepseek, glm or a tokenizer.json path")
    add("--engine-id", default=None, help="NIXL engine id (default: random)")
    add("--side-channel-port", type=int, default=0, help="NIXL side channel (0 = free port)")
    add("--prefill-ms-per-token", type=float, default=0.02, help="per uncached prompt token")
    add("--cached-prefill-ms-per-token", type=float, default=0.0, help="per cached prompt token")
    add(
        "--serial-prefill",
        action="store_true",
        help="prefill one request at a time, in arrival order (a compute-bound GPU); "
        "default: every prefill takes its own time whatever else runs",
    )
    add("--max-num-seqs", type=_positive, help="requests run at once (default: unlimited)")
    add("--block-size", type=_positive, default=16, help="tokens per KV block (prefix cache)")
    add("--num-gpu-blocks", type=_positive, default=4096, help="KV blocks (prefix cache size)")
    add(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="cache prompt blocks (on in vLLM; off here unless asked, so answers repeat)",
    )
    add(
        "--kv-events-config",
        type=_kv_events_config,
        help="vLLM's JSON: enable_kv_cache_events, publisher, endpoint, topic",
    )
    add("--itl-ms", type=float, default=5.0, help="time per output token")
    add(
        "--itl-ms-per-running",
        type=float,
        default=0.0,
        help="added to each output token's time per other request running (a larger batch "
        "makes a slower engine step); default: the time per token ignores the load",
    )
    add("--default-output-tokens", type=int, default=48)
    add("--sender-ranks", type=_ranks, default=(0,), help="TileRT connector ranks, e.g. 0,1")
    add("--layout-version", type=int, default=1, help="TileRT layout version expected")
    add("--transport", default="mooncake", choices=["mooncake", "nixl"])
    add("--tilert-protocol", choices=["0.1.5", "0.1.6"], default="0.1.6", help="connector version")
    add("--tilert-senders", type=int, help="0.1.6: sender ranks 0..N-1 (default 1, as the node's)")
    add("--tilert-attempts", type=int, default=5, help="0.1.6: admission attempts")
    add("--tilert-backoff-scale", type=float, default=1.0, help="0.1.6: retry backoff factor")
    add("--transfer-ms-base", type=float, default=2.0)
    add("--transfer-ms-per-token", type=float, default=0.001)
    add("--transfer-order", choices=["response-first", "transfer-first", "race"], default="race")
    add("--kv-expiry-s", type=float, default=480.0, help="NIXL producer state lifetime")
    add("--remote-prefill-timeout-s", type=float, default=60.0, help="push-mode wait")
    add("--max-model-len", type=int, default=131072)
    add(
        "--enable-prompt-tokens-details",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="usage.prompt_tokens_details.cached_tokens in answers (vLLM's flag)",
    )
    add("--reasoning-parser", choices=REASONING_PARSERS, help="split reasoning from content")
    add("--tool-call-parser", choices=TOOL_CALL_PARSERS, help="parse tool calls (with the next)")
    add("--enable-auto-tool-choice", action="store_true", help="parse tool calls for auto choice")
    add(
        "--refuse-unparsed-tool-choice",
        action="store_true",
        help="refuse tools with a tool_choice the parser flags cannot serve, as vLLM does",
    )
    faults = parser.add_argument_group("faults (also settable at POST /sim/faults)")
    faults.add_argument("--http-status", type=int, help="answer completions with this status")
    faults.add_argument("--text-logprobs", action="store_true", help="logprobs as plain text")
    faults.add_argument("--transfer-no-done", action="store_true", help="TileRT: never send done")
    faults.add_argument("--slow-transfer-ms", type=float, help="TileRT: extra transfer time")
    faults.add_argument("--stall", action="store_true", help="never answer")
    faults.add_argument("--die-after", type=int, help="drop a stream after N events")
    faults.add_argument("--pull-fail", action="store_true", help="NIXL side channel fails")
    faults.add_argument("--health-503", action="store_true", help="/health and /v1/ answer 503")
    faults.add_argument("--slow-ms", type=float, help="delay every answer by MS")
    faults.add_argument(
        "--queued-ms", type=float, help="hold a completion MS after recording its arrival"
    )
    return parser


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    """Parse the command line into a :class:`ServerConfig`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        parser.error("--enable-auto-tool-choice requires --tool-call-parser")
    faults = {name: getattr(args, name) for name in FAULTS}
    events = args.kv_events_config or {}
    events_on = bool(events.get("enable_kv_cache_events")) and events.get("publisher") != "null"
    return ServerConfig(
        role=args.role,
        host=args.host,
        port=args.port,
        served_model_names=tuple(args.served_model_names or ["sim-model"]),
        tokenizer=args.tokenizer,
        engine_id=args.engine_id or f"sim-{secrets.token_hex(6)}",
        side_channel_port=args.side_channel_port,
        prefill_ms_per_token=args.prefill_ms_per_token,
        cached_prefill_ms_per_token=args.cached_prefill_ms_per_token,
        serial_prefill=args.serial_prefill,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        kv_events_endpoint=str(events.get("endpoint", "tcp://*:5557")) if events_on else None,
        kv_events_topic=str(events.get("topic", "")),
        itl_ms=args.itl_ms,
        itl_ms_per_running=args.itl_ms_per_running,
        default_output_tokens=args.default_output_tokens,
        sender_ranks=(
            tuple(range(args.tilert_senders))
            if args.tilert_senders is not None
            else args.sender_ranks
        ),
        layout_version=args.layout_version,
        transport=args.transport,
        tilert_protocol=args.tilert_protocol,
        tilert_attempts=args.tilert_attempts,
        tilert_backoff_scale=args.tilert_backoff_scale,
        transfer_ms_base=args.transfer_ms_base,
        transfer_ms_per_token=args.transfer_ms_per_token,
        transfer_order=args.transfer_order,
        kv_expiry_s=args.kv_expiry_s,
        remote_prefill_timeout_s=args.remote_prefill_timeout_s,
        max_model_len=args.max_model_len,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        refuse_unparsed_tool_choice=args.refuse_unparsed_tool_choice,
        parsers=ParserConfig(
            args.reasoning_parser, args.tool_call_parser, args.enable_auto_tool_choice
        ),
        faults={k: v for k, v in faults.items() if v not in (None, False)},
    )
