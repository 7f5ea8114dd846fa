"""`pd-gateway demo`: its arguments, registered under the `pd_gateway.commands` entry-point
group (router/commands.py)."""

from __future__ import annotations

import argparse

from router.commands import Subcommands, UsageError, add_config_option
from router.telemetry.logs import LEVELS


def register(commands: Subcommands) -> None:
    demo = commands.add_parser("demo", help="start the simulated stack and the gateway")
    add_config_option(demo, bundled=True)
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


def _demo(args: argparse.Namespace) -> int:
    from demo.plan import DemoError
    from demo.run import run_demo

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


def _replicas(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 16:
        raise argparse.ArgumentTypeError(f"not a replica count (1 to 16): {text!r}")
    return count
