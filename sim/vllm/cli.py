"""Command-line entry of the simulated vLLM server: bind, announce, serve."""

from __future__ import annotations

from sim import runner
from sim.tokenizers import Vocab, load_vocab
from sim.vllm.config import ServerConfig, parse_config
from sim.vllm.http import build_app
from sim.vllm.server import VllmServer


def server_member(config: ServerConfig, vocab: Vocab) -> runner.Member:
    """One server with its sockets bound and listening, not yet serving."""
    server = VllmServer(config, vocab)
    http = runner.listen(config.host, config.port)
    side = runner.listen(config.host, config.side_channel_port)
    server.side_channel_port = runner.port_of(side)
    ready = {
        "port": runner.port_of(http),
        "side_channel_port": server.side_channel_port,
        "engine_id": config.engine_id,
        "role": config.role,
    }
    if server.kv_events is not None:
        ready["kv_events_endpoint"] = server.kv_events.endpoint
    gate = runner.Gate()
    return runner.Member(
        build_app(server, gate), http, [(side, server.side_channel())], ready, gate
    )


async def run_server(config: ServerConfig) -> None:
    """Serve one simulated vLLM instance until SIGINT/SIGTERM."""
    member = server_member(config, load_vocab(config.tokenizer))
    await runner.serve([member], member.ready)


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.vllm``."""
    config = parse_config(argv)
    runner.run(lambda: run_server(config))
