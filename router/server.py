"""Runs the app under uvicorn (uvloop + httptools) on a socket bound before start-up, so that
port 0 works and the real address can be announced."""

from __future__ import annotations

import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from router import logs
from router.app import create_app
from router.config import GatewayConfig

READY_PREFIX = "pd-gateway listening on "


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _AnnouncingServer(uvicorn.Server):
    """Announces its address once listening, and marks the app as draining on SIGTERM/SIGINT
    so that /ready fails while in-flight streams finish (uvicorn's graceful shutdown)."""

    def __init__(self, config: uvicorn.Config, url: str, app: FastAPI) -> None:
        super().__init__(config)
        self._url = url
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._app.state, "gateway", None)
        if state is not None:
            state.draining = True
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(READY_PREFIX + self._url, flush=True)


def serve(config: GatewayConfig, *, log_level: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT; `log_level` overrides `logging.level`."""
    sock = bind(config.server.host, config.server.port)  # OSError before anything else
    log_level = log_level or config.logging.level
    logs.configure(log_level, config.logging.format)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    app = create_app(config)
    uv_config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        log_config=None,  # uvicorn's records go through our handler and format
        access_log=False,  # ours is richer: RequestContext
        # Typed as whole seconds, used as asyncio.wait's timeout: any number works.
        timeout_graceful_shutdown=config.server.shutdown_grace_s,  # type: ignore[arg-type]
    )
    _AnnouncingServer(uv_config, f"http://{shown}:{port}/v1", app).run(sockets=[sock])
