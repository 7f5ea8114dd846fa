"""Commands that `pd-gateway` runs from packages beside the gateway: the test equipment
(`pd-gateway demo`, `pd-gateway bench`), which the wheel holds and the container image
leaves out. The gateway never imports them: each registers itself under the entry-point
group `pd_gateway.commands` (pyproject.toml), and the command line loads what is installed.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

GROUP = "pd_gateway.commands"


class Subcommands(Protocol):
    """What `ArgumentParser.add_subparsers` returns: where a command adds its own parser."""

    def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser: ...


Register = Callable[[Subcommands], None]
"""What an entry point of the group names: adds its command's parser, whose defaults set
`run` to a function of the parsed arguments returning the exit status."""


class UsageError(Exception):
    """A command's input is unusable; the message says which and why."""


def add_config_option(command: argparse.ArgumentParser, *, bundled: bool = False) -> None:
    """`--config`, as every command that reads a configuration takes it."""
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


def add_installed(commands: Subcommands) -> None:
    """Every command of the group: registered by its package, or, where the installation
    leaves the package out, a command that says so."""
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            register: Register = entry.load()
        except ModuleNotFoundError as exc:
            package = entry.module.split(".")[0]
            if exc.name != package:
                raise  # a dependency of theirs is missing: not what this is about
            _add_missing(commands, entry.name, package)
            continue
        register(commands)


def _add_missing(commands: Subcommands, name: str, package: str) -> None:
    missing = commands.add_parser(name, help=f"(not installed here: needs the {package} package)")
    missing.set_defaults(run=_refuse(f"pd-gateway {name}", package), takes_any=True)


def _refuse(command: str, package: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise UsageError(missing_message(command, [package]))

    return run


def missing_equipment(command: str, *packages: str) -> str | None:
    """Why `command` cannot run here (the packages it needs that are not installed), or None.
    Each is imported: one of them may need another that is missing."""
    missing: list[str] = []
    for name in packages:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in packages:
                raise  # a dependency of theirs: not what this is about
            if exc.name not in missing:
                missing.append(exc.name)
    return missing_message(command, missing) if missing else None


def missing_message(command: str, packages: list[str]) -> str:
    names = " and ".join(f"the {name} package" for name in packages)
    return (
        f"{command} needs {names}, which this installation leaves out (the container image"
        " holds the gateway only); run it where pd-gateway is installed from its source or"
        " its wheel"
    )
