"""Command-line entry of the simulated decode node: bind, announce, serve."""

from __future__ import annotations

import socket

from sim import runner
from sim.tilert.config import NodeConfig, parse_config
from sim.tilert.control import ControlPlane
from sim.tilert.dataplane import DataPlane
from sim.tilert.http import build_app
from sim.tilert.node import Node
from sim.tokenizers import Vocab, load_vocab


def node_member(config: NodeConfig, vocab: Vocab) -> runner.Member:
    """One node with its sockets bound and listening, not yet serving."""
    node = Node(config, vocab)
    ctrl = runner.listen(config.host, config.ctrl_port)
    http = runner.listen(config.host, config.http_port)
    streams: list[tuple[socket.socket, runner.StreamHandler]] = [(ctrl, ControlPlane(node))]
    data_port = None
    if config.data_plane:
        data = runner.listen(config.host, config.data_port)
        data_port = runner.port_of(data)
        node.data_address = (config.host, data_port)
        streams.append((data, DataPlane(node)))
    ready = {
        "ctrl_port": runner.port_of(ctrl),
        "http_port": runner.port_of(http),
        "data_port": data_port,
    }
    return runner.Member(build_app(node), http, streams, ready)


async def run_node(config: NodeConfig) -> None:
    """Serve one node until SIGINT/SIGTERM."""
    member = node_member(config, load_vocab(config.tokenizer))
    await runner.serve([member], member.ready)


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.tilert``."""
    config = parse_config(argv)
    runner.run(lambda: run_node(config))
