"""Command-line entry of the simulated decode node: bind, announce, serve."""

from __future__ import annotations

import socket

from sim import serving
from sim.tilert.config import NodeConfig, parse_config
from sim.tilert.control import ControlPlane
from sim.tilert.dataplane import DataPlane
from sim.tilert.http import build_app
from sim.tilert.node import Node
from sim.tokenizers import load_vocab


async def run_node(config: NodeConfig) -> None:
    """Serve one node until SIGINT/SIGTERM."""
    node = Node(config, load_vocab(config.tokenizer))
    ctrl = serving.listen(config.host, config.ctrl_port)
    http = serving.listen(config.host, config.http_port)
    streams: list[tuple[socket.socket, serving.StreamHandler]] = [(ctrl, ControlPlane(node))]
    data_port = None
    if config.data_plane:
        data = serving.listen(config.host, config.data_port)
        data_port = serving.port_of(data)
        node.data_address = (config.host, data_port)
        streams.append((data, DataPlane(node)))
    ready = {
        "ctrl_port": serving.port_of(ctrl),
        "http_port": serving.port_of(http),
        "data_port": data_port,
    }
    await serving.serve(build_app(node), http, streams, ready)


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.tilert``."""
    config = parse_config(argv)
    serving.run(lambda: run_node(config))
