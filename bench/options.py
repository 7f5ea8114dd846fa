"""What a bench run does: its paths, concurrencies, sizes and where it writes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

# The reference load: 256-token outputs at ~600 tokens/s per stream, 4 nodes.
NODE_STEP_MS = 5.0
NODE_TOKENS_PER_STEP = 3.0
HANDOFF_CLIENTS_PER_NODE = 3
# TileRT 0.1.6 writes the first token on a line of its own, then a line every 200 ms.
BATCH_INTERVAL_MS = 200.0


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Every figure of one run. `requests` is per method and concurrency, split over
    `rounds` interleaved rounds of at least `concurrency` requests each."""

    out: Path = Path("bench-results")
    nodes: int = 4
    latency_levels: tuple[int, ...] = ()  # default: 1, `nodes` and 16 streams
    batched_levels: tuple[int, ...] | None = None  # default: 1 and `nodes` streams
    """The latency path on a pool of TileRT 0.1.6 nodes, which batch their lines every
    `batch_interval_ms` (the latency levels' nodes write a line per decode step)."""
    batch_interval_ms: float = BATCH_INTERVAL_MS
    native_levels: tuple[int, ...] = (1, 16, 64)
    tokens: int = 256
    requests: int = 32
    rounds: int = 3
    native_itl_ms: float = 5.0
    capacity_levels: tuple[int, ...] = (32, 64, 128)
    """Native path streams at `capacity_itl_ms` per token, to find how many one gateway
    relays within the gap target, with each count of worker processes."""
    capacity_workers: tuple[int, ...] = (1, 2)
    capacity_itl_ms: float = 50.0  # 20 tokens/s per stream
    capacity_tokens: int = 40
    ttft_requests: int = 300
    """Short requests (`ttft_tokens`) at 1 stream and one per node, on each pool: the TTFT
    targets' own levels, with enough requests that a p99 is not the slowest one or two."""
    ttft_tokens: int = 16
    handoff_requests: int = 1200
    """Short latency requests (`handoff_tokens`) from `HANDOFF_CLIENTS_PER_NODE` clients
    per node, so that a freed node always has a waiter: how long the hand-off takes."""
    handoff_tokens: int = 16
    handoff_redis_replicas: tuple[int, ...] = (1, 3)
    """The hand-off also through the Redis gate, with each of these counts of gateway
    replicas sharing the pool (clients spread over them in turn)."""
    node_step_ms: float = NODE_STEP_MS
    node_tokens_per_step: float = NODE_TOKENS_PER_STEP
    one_process: bool = False
    """Each simulated stack served by one process (`SimStack(one_process=True)`): quicker
    to start, its simulators' CPU shared."""
    node_cooldown_s: float | None = None
    """Every gateway's `gate.node_cooldown_s`, with a probe every 0.1 s (None: the gateway's
    defaults, 5 s and 1 s). Gateways sharing nodes flush them as they start, and one that
    finds a node another is flushing takes it out until a probe after its cooldown."""
    peers: bool = True
    baseline: Path | None = None  # another checkout of the project, measured alongside
    command: str = "pd-gateway bench"
    report: Path | None = None  # a Markdown file whose marked place gets the table
    notes: list[str] = field(default_factory=list)

    @property
    def latency(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.latency_levels or (1, self.nodes, 16))))

    @property
    def first_token(self) -> tuple[int, ...]:
        """The TTFT levels' streams: 1 and one per node."""
        return tuple(sorted({1, self.nodes})) if self.ttft_requests else ()

    @property
    def batched(self) -> tuple[int, ...]:
        levels = (1, self.nodes) if self.batched_levels is None else self.batched_levels
        return tuple(sorted(set(levels)))

    @property
    def batched_pools(self) -> list[int]:
        """The TileRT 0.1.6 pool's sizes: its levels', and the configured nodes for its TTFT
        levels."""
        if not self.batched:
            return []
        sizes = {self.pool_size(level) for level in self.batched}
        return sorted(sizes | ({self.nodes} if self.first_token else set()))

    @property
    def stack_nodes(self) -> int:
        """Nodes the simulated stack runs: one per stream at the highest level."""
        return max(self.nodes, *self.latency)

    def pool_size(self, concurrency: int) -> int:
        """The gateway's pool at `concurrency`: the configured nodes, or one node per stream
        beyond them (a TileRT node decodes one stream at a time)."""
        return max(self.nodes, concurrency)

    @property
    def handoff_clients(self) -> int:
        return HANDOFF_CLIENTS_PER_NODE * self.nodes if self.handoff_requests else 0

    @property
    def pools(self) -> list[int]:
        """The pool sizes the latency gateways have: one per latency level's, and the
        configured nodes for the TTFT levels and the hand-off."""
        sizes = {self.pool_size(level) for level in self.latency}
        configured = self.first_token or self.handoff_clients
        return sorted(sizes | ({self.nodes} if configured else set()))

    @property
    def widest(self) -> int:
        levels = (*self.latency, *self.batched, *self.native_levels, *self.capacity_levels)
        return max(*levels, self.handoff_clients)

    def per_round(self, concurrency: int, requests: int | None = None) -> int:
        """Requests per method in a round: its share of `requests` (default: the run's),
        and at least one per stream."""
        total = self.requests if requests is None else requests
        return max(concurrency, -(-total // self.rounds))


def quick(options: BenchOptions) -> BenchOptions:
    """A run of seconds that still exercises every path, method and measure."""
    return replace(
        options,
        nodes=2,
        latency_levels=(1, 2),
        batched_levels=(1, 2),
        native_levels=(1, 4),
        tokens=32,
        requests=4,
        rounds=2,
        native_itl_ms=1.0,
        capacity_levels=(4,),
        capacity_itl_ms=10.0,
        capacity_tokens=8,
        ttft_requests=6,
        ttft_tokens=8,
        handoff_requests=8,
        handoff_tokens=8,
        one_process=True,
        node_cooldown_s=0.0,
    )
