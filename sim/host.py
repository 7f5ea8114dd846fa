"""Several simulators in one process: ``python -m sim.host SPEC``.

SPEC is a JSON list of command lines, each ``["tilert", *args]`` or ``["vllm", *args]``
with the arguments ``python -m sim.tilert`` / ``python -m sim.vllm`` take. Every member
binds its sockets, then one ``SIM-READY {"members": [...]}`` line lists each member's
readiness fields in SPEC's order, and one event loop serves them all. Starting one
process instead of one per simulator is what makes this cheaper; the members share
that process's CPU and die together.
"""

from __future__ import annotations

import json
import sys

from sim import runner
from sim.tilert.cli import node_member
from sim.tilert.config import parse_config as parse_node_config
from sim.tokenizers import Vocab, load_vocab
from sim.vllm.cli import server_member
from sim.vllm.config import parse_config as parse_server_config


def members(spec: list[list[str]]) -> list[runner.Member]:
    """Bind every member of ``spec`` (a vocabulary is loaded once per tokenizer)."""
    vocabs: dict[str, Vocab] = {}

    def vocab(name: str) -> Vocab:
        if name not in vocabs:
            vocabs[name] = load_vocab(name)
        return vocabs[name]

    bound = []
    for kind, *args in spec:
        if kind == "tilert":
            node = parse_node_config(args)
            bound.append(node_member(node, vocab(node.tokenizer)))
        elif kind == "vllm":
            server = parse_server_config(args)
            bound.append(server_member(server, vocab(server.tokenizer)))
        else:
            raise SystemExit(f"unknown simulator kind {kind!r} (tilert or vllm)")
    return bound


async def run(spec: list[list[str]]) -> None:
    """Serve every member of ``spec`` until SIGINT/SIGTERM."""
    bound = members(spec)
    await runner.serve(bound, {"members": [m.ready for m in bound]})


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.host``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m sim.host SPEC (a JSON list of command lines)")
    spec = json.loads(args[0])
    runner.run(lambda: run(spec))


if __name__ == "__main__":
    main()
