"""The systems under test: one simulated stack and the gateways in front of it.

The stack runs one TileRT node per latency stream at the highest level, a vLLM prefill
server for them, and a `both`-role vLLM server standing in for a native disaggregation
proxy. A second stack runs the TileRT 0.1.6 pool, whose nodes batch their lines (its
prefills go to the first stack's server). One gateway serves each latency pool size
(`BenchOptions.pools`, then `batched_pools`), and one serves the native path in proxy
mode; for the hand-off, gateways on the Redis gate (a local redis-server) share the pool
with one replica and with several; each is a model of its own, so the figures of a
gateway are those of one configured model. A vLLM decode server joins the prefill server
for NIXL pull, behind a gateway in pull mode and, where it is installed, behind the peer
(vllm-router). For the capacity curve, a second `both`-role vLLM answers at 20
tokens/s per stream behind one gateway per count of worker processes (more than one run
on the Redis gate, a local redis-server).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.options import BenchOptions
from bench.peers import VllmRouterChild, vllm_router_executable
from bench.processes import GatewayChild, StartFailure, stop_all
from demo.redis import LocalRedis
from router.process.lifeline import die_with_parent
from sim.stack import NodeInfo, SimStack

MODEL = "bench"
READY_TIMEOUT_S = 90.0
BASELINED = ("latency-", "batched-", "native", "pull")  # the gateways `--baseline` doubles
BASELINE_PREFIX = "baseline-"


@dataclass(slots=True)
class Deployment:
    stack: SimStack
    latency_gateways: dict[int, GatewayChild]  # by pool size
    native_gateway: GatewayChild
    pull_gateway: GatewayChild
    vllm_router: VllmRouterChild | None = None
    capacity_url: str = ""  # the slow native server, direct
    capacity_gateways: dict[int, GatewayChild] = field(default_factory=dict)  # by workers
    batched_stack: SimStack | None = None
    batched_gateways: dict[int, GatewayChild] = field(default_factory=dict)  # by pool size
    handoff_redis: dict[int, list[GatewayChild]] = field(default_factory=dict)  # by replicas
    baseline: dict[str, GatewayChild] = field(default_factory=dict)
    """`--baseline`'s checkout beside each gateway of the paths' levels, by the gateway's
    label (`latency-4`, `batched-4`, `native`, `pull`)."""

    @property
    def proxy_url(self) -> str:
        assert self.stack.proxy is not None
        return self.stack.proxy.url


class Child(Protocol):
    log_path: Path

    def wait_ready(self) -> str: ...


def all_ready(children: Sequence[Child]) -> None:
    """Return once every child is ready; the first that fails to start raises at once
    (the caller's clean-up stops the others, and with them their threads' waits)."""
    pool = ThreadPoolExecutor(len(children))
    try:
        futures = [pool.submit(child.wait_ready) for child in children]
        done, pending = wait(futures, timeout=READY_TIMEOUT_S, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()
        if pending:
            late = children[futures.index(next(iter(pending)))]
            raise StartFailure(f"not ready within {READY_TIMEOUT_S:.0f} s", late.log_path)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def latency_model(stack: SimStack, nodes: list[NodeInfo]) -> dict[str, Any]:
    """The model served by `stack`'s prefill server and `nodes`, of any stack (DeepSeek
    tokenizer)."""
    return {
        "name": MODEL,
        "tokenizer": "deepseek",
        "output_parser": "deepseek_v32",
        "latency": {
            "prefill": [p.url for p in stack.prefills],
            "nodes": [
                {"host": n.host, "ctrl_port": n.ctrl_port, "http_port": n.http_port} for n in nodes
            ],
        },
    }


def native_model(stack: SimStack) -> dict[str, Any]:
    assert stack.proxy is not None
    return {
        "name": MODEL,
        "tokenizer": "deepseek",
        "throughput": {"mode": "proxy", "urls": [stack.proxy.url]},
    }


def pull_model(stack: SimStack) -> dict[str, Any]:
    pull = {"mode": "pull", "prefill": [stack.prefills[0].url], "decode": [stack.decodes[0].url]}
    return {"name": MODEL, "tokenizer": "deepseek", "throughput": pull}


def capacity_config(
    model: dict[str, Any], workers: int, redis: LocalRedis | None
) -> dict[str, Any]:
    config = gateway_config(model)
    config["server"] = {"workers": workers}
    if workers > 1:
        assert redis is not None
        config["gate"] = {"backend": "redis", "redis": {"url": redis.url}}
    return config


def redis_gate_config(model: dict[str, Any], redis: LocalRedis, replicas: int) -> dict[str, Any]:
    """The pool's state on the Redis gate, under keys of this setup's own."""
    config = gateway_config(model)
    config["gate"] = {
        "backend": "redis",
        "redis": {"url": redis.url, "key_prefix": f"handoff{replicas}"},
    }
    return config


def gateway_config(model: dict[str, Any]) -> dict[str, Any]:
    """Every request of the model on its configured path, queueing for a node when the
    pool is full (only the hand-off sends more streams than the pool has nodes)."""
    path = "latency" if "latency" in model else "throughput"
    rule = {"name": "bench", "path": path, "on_saturation": "queue"}
    return {"models": [model], "classification": {"rules": {"default": rule}}}


@contextmanager
def deployed(options: BenchOptions) -> Iterator[Deployment]:
    """The stack and every gateway, ready; all stopped on the way out."""
    itl = str(options.native_itl_ms)
    peer = vllm_router_executable() if options.peers else None
    stack = SimStack(
        nodes=options.stack_nodes,
        prefills=1,
        decodes=1,
        proxy=True,
        model=MODEL,
        node_args=[
            "--step-ms",
            str(options.node_step_ms),
            "--tokens-per-step",
            str(options.node_tokens_per_step),
            # A line per decode step, as the gateway relays them, rather than 0.1.6's
            # 200 ms batches: the gaps between lines are what the gateway can add to.
            "--stream-interval-ms",
            str(options.node_step_ms),
        ],
        proxy_args=["--itl-ms", itl, "--prefill-ms-per-token", "0"],
        decode_args=["--itl-ms", itl, "--prefill-ms-per-token", "0"],
        preexec_fn=die_with_parent(),
        one_process=options.one_process,
    )
    work = options.out / "logs"  # each router's configuration and log, kept for a look after
    work.mkdir(parents=True, exist_ok=True)
    redis: LocalRedis | None = None
    with ExitStack() as cleanup:
        cleanup.enter_context(stack)
        pools = options.pools
        configs = {
            f"latency-{size}": gateway_config(latency_model(stack, stack.nodes[:size]))
            for size in pools
        }
        batched = None
        if options.batched:
            batched = cleanup.enter_context(batched_stack(options))
            for size in options.batched_pools:
                model = latency_model(stack, batched.nodes[:size])
                configs[f"batched-{size}"] = gateway_config(model)
        if options.handoff_clients and options.handoff_redis_replicas:
            redis = LocalRedis()
            redis.start()
            cleanup.callback(redis.close)
            model = latency_model(stack, stack.nodes[: options.nodes])
            for replicas in options.handoff_redis_replicas:
                config = redis_gate_config(model, redis, replicas)
                for index in range(replicas):
                    configs[f"handoff-redis-{replicas}x-{index}"] = config
        configs["native"] = gateway_config(native_model(stack))
        configs["pull"] = gateway_config(pull_model(stack))
        capacity_url = ""
        if options.capacity_levels:
            slow = SimStack(
                nodes=0,
                prefills=0,
                proxy=True,
                model=MODEL,
                proxy_args=[
                    "--itl-ms",
                    str(options.capacity_itl_ms),
                    "--prefill-ms-per-token",
                    "0",
                ],
                preexec_fn=die_with_parent(),
                one_process=options.one_process,
            )
            cleanup.enter_context(slow)
            assert slow.proxy is not None
            capacity_url = slow.proxy.url
            if max(options.capacity_workers) > 1 and redis is None:
                redis = LocalRedis()
                redis.start()
                cleanup.callback(redis.close)
            for workers in options.capacity_workers:
                configs[f"capacity-{workers}w"] = capacity_config(
                    native_model(slow), workers, redis
                )
        if options.node_cooldown_s is not None:
            for config in configs.values():
                gate = config.setdefault("gate", {})
                gate.update(node_cooldown_s=options.node_cooldown_s, probe_interval_s=0.1)
        children: dict[str, GatewayChild | VllmRouterChild] = {}
        cleanup.callback(stop_all, children.values())  # whichever have started, together
        for label, config in configs.items():
            children[label] = GatewayChild(config, work / label)
            if options.baseline is not None and label.startswith(BASELINED):
                other = GatewayChild(config, work / f"{BASELINE_PREFIX}{label}", options.baseline)
                children[f"{BASELINE_PREFIX}{label}"] = other
        router = None
        if peer:
            prefill, decode = stack.prefills[0].url, stack.decodes[0].url
            router = VllmRouterChild(peer, prefill, decode, work / "vllm-router.log")
            children["vllm-router"] = router
        all_ready(list(children.values()))
        gateways = {k: v for k, v in children.items() if isinstance(v, GatewayChild)}
        yield Deployment(
            stack,
            {size: gateways[f"latency-{size}"] for size in pools},
            gateways["native"],
            gateways["pull"],
            router,
            capacity_url,
            {w: gateways[f"capacity-{w}w"] for w in options.capacity_workers if capacity_url},
            batched,
            {size: gateways[f"batched-{size}"] for size in options.batched_pools if batched},
            {
                replicas: [gateways[f"handoff-redis-{replicas}x-{i}"] for i in range(replicas)]
                for replicas in options.handoff_redis_replicas
                if redis is not None and options.handoff_clients
            },
            {
                label.removeprefix(BASELINE_PREFIX): gateway
                for label, gateway in gateways.items()
                if label.startswith(BASELINE_PREFIX)
            },
        )


def batched_stack(options: BenchOptions) -> SimStack:
    """TileRT 0.1.6 nodes as they ship: the first token on a line of its own, then a line
    every `batch_interval_ms`; no servers of their own."""
    size = max(options.batched_pools)
    node_args = [
        "--step-ms",
        str(options.node_step_ms),
        "--tokens-per-step",
        str(options.node_tokens_per_step),
        "--protocol",
        "0.1.6",
        "--stream-interval-ms",
        str(options.batch_interval_ms),
    ]
    return SimStack(
        nodes=size,
        prefills=0,
        model=MODEL,
        node_args=node_args,
        preexec_fn=die_with_parent(),
        one_process=options.one_process,
    )
