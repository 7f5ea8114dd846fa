"""`pd-gateway`: serve, check a configuration, explain a classification, run the demo or bench.

`demo` and `bench` are the test equipment's own commands, loaded where installed
(router/commands.py).

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
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from policies.types import ENDPOINTS as POLICY_ENDPOINTS
from policies.types import Endpoint
from router import __version__
from router.commands import UsageError, add_config_option, add_installed
from router.config import ConfigError, GatewayConfig, ModelConfig, load_config
from router.process.startup import StartupFailure
from router.telemetry.logs import LEVELS
from router.upstream.tilert import FEATURES, RELEASE_FEATURES

if TYPE_CHECKING:
    from policies import Decision
    from router.runtime.epoch import ConfigEpoch
    from router.runtime.intake import Intake
    from router.upstream import Upstreams

T = TypeVar("T")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_any", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pd-gateway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    add_config_option(serve)
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=_port, help="override server.port (0 = any free port)")
    serve.add_argument("--log-level", choices=LEVELS, help="override logging.level (default: info)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", help="validate a configuration and exit")
    add_config_option(check)
    check.add_argument(
        "--probe",
        action="store_true",
        help="also reach every TileRT node (its release and features, against its pool's),"
        " every vLLM server and proxy (/health, its load from /metrics, the models of"
        " /v1/models) and the gate's shared state (gate.backend: redis): Redis answers, the"
        " password works, the gate's scripts load",
    )
    check.set_defaults(run=_check)

    health = commands.add_parser(
        "health",
        help="ask the gateway this configuration runs for its /health (status 0 if it answers"
        " 200, 1 otherwise): a container's health check",
    )
    add_config_option(health)
    health.add_argument(
        "--timeout", type=float, default=3.0, metavar="S", help="seconds to wait (default: 3)"
    )
    health.set_defaults(run=_health)

    explain = commands.add_parser(
        "classify", help="explain where a request would go, without contacting any backend"
    )
    add_config_option(explain)
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
    explain.add_argument(
        "--probe",
        action="store_true",
        help="for a rule with an objective, predict from the servers' load as their /metrics"
        " report it (else an idle deployment); the pool's queue is taken as empty",
    )
    explain.set_defaults(run=_classify)

    schema = commands.add_parser(
        "schema", help="print the JSON Schema of router.yaml (deploy/kustomize/router.schema.json)"
    )
    schema.set_defaults(run=_schema)

    # demo and bench, where installed. Registering them imports their packages (a third of
    # a second of CPU): done only when one of them, or the list of commands, is asked for,
    # not for every `serve` of every replica.
    if _command_word(argv) not in commands.choices:
        add_installed(commands)
    return parser


def _command_word(argv: list[str]) -> str | None:
    """The command `argv` names: its first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def _schema(args: argparse.Namespace) -> int:
    from router.config.json_schema import dumps

    sys.stdout.write(dumps())
    return 0


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
        from router.preflight import probe

        return probe(config)
    return 0


def _health(args: argparse.Namespace) -> int:
    import httpx

    server = load_config(args.config).server
    if server.port == 0:
        raise UsageError(f"{args.config}: server.port is 0 (any free port): nothing to ask")
    host = _LOCAL.get(server.host, server.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{server.port}/health"
    try:
        status = httpx.get(url, timeout=args.timeout).status_code
    except httpx.HTTPError as exc:
        print(f"{url}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"{url}: {status}")
    return 0 if status == 200 else 1


_LOCAL = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
"""A server listening on every address is asked on the loopback one."""


async def _nothing(epoch: ConfigEpoch, upstreams: Upstreams) -> None:
    return None


async def _prepared(
    config: GatewayConfig, use: Callable[[ConfigEpoch, Upstreams], Awaitable[T]]
) -> T:
    """`use` the configuration's objects as `serve` builds them at start-up (every file it
    names read: secrets, tokenizers, chat templates), with nothing started or contacted,
    and the upstream connections a probe may use."""
    from router.runtime.state import AppState

    state = AppState(config)
    try:
        await state.prepare()
        return await use(state.epoch, state.upstreams)
    finally:
        await state.discard()


def _classify(args: argparse.Namespace) -> int:
    """Print `Decision.explain()` and the response headers the decision implies."""
    from router.errors import GatewayError, ModelNotFound
    from router.openai.endpoints import ENDPOINTS
    from router.openai.requests import parse_body
    from router.runtime.intake import decide, take_in
    from router.tenants.identity import tenant_of

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

    async def explain(
        epoch: ConfigEpoch, upstreams: Upstreams
    ) -> tuple[str | None, Decision, list[str], dict[str, str]]:
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
        user = intake.body.get("user")
        tenant = tenant_of(
            config.tenants,
            key_name=key_name,
            headers=headers,
            user=user if isinstance(user, str) else None,
        )
        try:
            decision = await decide(
                epoch, intake, headers=headers, api_key_name=key_name, tenant=tenant
            )
        except GatewayError as exc:
            raise UsageError(f"{source}: {exc.message}") from None
        plan: list[str] = []
        answer_headers = decision.response_headers()
        if decision.objective is not None:
            probe = upstreams if args.probe else None
            plan, planned = await _explain_plan(intake, decision, headers=headers, probe=probe)
            answer_headers.update(planned)
        return assumption, decision, plan, answer_headers

    assumption, decision, plan, answer_headers = asyncio.run(_prepared(config, explain))
    if assumption is not None:
        print(assumption)
    print(decision.explain())
    for line in plan:
        print(line)
    print("response headers:")
    for name, value in answer_headers.items():
        print(f"  {name}: {value}")
    return 0


async def _explain_plan(
    intake: Intake,
    decision: Decision,
    *,
    headers: dict[str, str],
    probe: Upstreams | None,
) -> tuple[list[str], dict[str, str]]:
    """For a decision with an objective, each way's prediction and the choice, and the
    headers the plan adds: the timings the model's `objectives` settings assume (what a
    running gateway has learned is its own: `GET /admin/timings`), on an idle deployment;
    with `probe`, the servers' load as their `/metrics` report it. The pool's queue is
    taken as empty: reading it could change it (a shared pool's state is kept by each read)."""
    from router.runtime.background import server_load
    from router.selection import scrape_once
    from router.serving import RoutedRequest, new_request_id

    model = intake.model
    assumed = model.config.objectives
    lines = [
        "timings: as models[].objectives assumes them"
        f" (prefill {assumed.prefill_ms_per_token} ms/token + {assumed.prefill_base_ms} ms,"
        f" itl {assumed.itl_ms} ms + {assumed.itl_ms_per_running} ms per running request,"
        f" node itl {assumed.tilert_itl_ms} ms, hand-off {assumed.handoff_ms} ms)"
    ]
    if probe is not None:
        await scrape_once(model.server_sets(), partial(server_load, probe), interval_s=60.0)
        lines.append("signals: the servers' load as their /metrics report it; no node busy")
    else:
        lines.append("signals: assumed idle (no request in flight, no node busy, nothing cached)")
    routed = RoutedRequest(
        intake.endpoint,
        intake.parsed,
        intake.body,
        decision,
        new_request_id(),
        {},
        client_body=intake.client_body,
        client_headers=headers,
    )
    plan = await model.objective.plan(routed, node_wait_s=0.0)
    return lines + plan.explain(), routed.headers


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
