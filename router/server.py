"""Runs the app under uvicorn (uvloop + httptools) on a socket bound before start-up, so that
port 0 works and the real address can be announced."""

from __future__ import annotations

import logging
import socket

import uvicorn

from router.app import create_app
from router.config import GatewayConfig

READY_PREFIX = "pd-gateway listening on "


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class _AnnouncingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(READY_PREFIX + self._url, flush=True)


def serve(config: GatewayConfig, *, log_level: str = "info") -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    sock = bind(config.server.host, config.server.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    uv_config = uvicorn.Config(
        create_app(config),
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
    )
    _AnnouncingServer(uv_config, f"http://{shown}:{port}/v1").run(sockets=[sock])
