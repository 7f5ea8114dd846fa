"""`pd-gateway`: serve, check a configuration, run the demo."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from router.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pd-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default="router.yaml", type=Path)
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port (0 = any free port)")
    serve.add_argument("--log-level", default="info")

    check = commands.add_parser("check", help="validate a configuration and exit")
    check.add_argument("--config", default="router.yaml", type=Path)

    demo = commands.add_parser("demo", help="start the simulated stack and the gateway")
    demo.add_argument("--config", default=None, type=Path, help="default: the bundled router.yaml")
    demo.add_argument("--port", type=int, default=None, help="gateway port (default from config)")

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            from router.server import serve as run

            config = load_config(args.config)
            overrides = {
                k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None
            }
            if overrides:
                server = config.server.model_copy(update=overrides)
                config = config.model_copy(update={"server": server})
            run(config, log_level=args.log_level)
        elif args.command == "check":
            config = load_config(args.config)
            print(f"{args.config}: ok ({len(config.models)} model(s))")
        elif args.command == "demo":
            from router.demo import run_demo

            return run_demo(args.config, port=args.port)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
