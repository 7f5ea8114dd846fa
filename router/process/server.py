"""Runs the app under uvicorn (uvloop + httptools, eager tasks on Python 3.12+) on a socket
bound before start-up, so that port 0 works and the real address can be announced."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from router.config import ConfigError, GatewayConfig
from router.http.app import create_app
from router.process.front_door import (
    FrontDoorLimits,
    connection_limit,
    protocol_class,
    raise_fd_limit,
)
from router.process.startup import (
    QuietLifespan,
    StartupFailure,
    cannot_listen,
    failure_of,
    quiet_startup_log,
)
from router.process.tasks import install_eager_tasks
from router.process.workers import supervise
from router.runtime.state import AppState, freeze_heap
from router.serving.live import LiveResponses
from router.telemetry import logs

log = logging.getLogger("pd_gateway")

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


# After the grace period, how long cut answers get to send their last event.
CUT_GRACE_S = 2.0


class _AnnouncingServer(uvicorn.Server):
    """Announces its address once listening, and shuts down in this order:

    1. SIGTERM/SIGINT: /ready answers 503 while the listener stays open, and the answers
       in flight run on, for at most `server.shutdown_grace_s`;
    2. answers still running are cut: a stream gets an error event and `[DONE]`, a request
       still waiting gets a 503 (their nodes are cancelled and their slots released);
    3. uvicorn's own shutdown: stop listening, close connections, the app's shutdown.

    A second signal skips the waiting.
    """

    def __init__(
        self, config: uvicorn.Config, on_ready: Callable[[], None], app: FastAPI, grace_s: float
    ) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._app = app
        self._grace_s = grace_s

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        # Before the app's start-up, so that every task of the process is eager.
        install_eager_tasks(asyncio.get_running_loop())
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self._app.state, "gateway", None)
        if state is not None:
            state.draining = True
        if self.should_exit:
            self.force_exit = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state: AppState | None = getattr(self._app.state, "gateway", None)
        if state is not None:
            await self._drain(state.live)
        await super().shutdown(sockets=sockets)

    async def _drain(self, live: LiveResponses) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace_s
        while len(live) and not self.force_exit and loop.time() < deadline:
            # Polled like uvicorn's own wait, so that a second signal is noticed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.idle(), min(0.1, max(0.0, deadline - loop.time())))
        if len(live) and not self.force_exit:
            log.warning("shutdown grace period over: ending %d answer(s) in flight", len(live))
            live.cut_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.idle(), CUT_GRACE_S)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        state: AppState | None = getattr(self._app.state, "gateway", None)
        if state is not None:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: asyncio.ensure_future(_reload(state))
            )
        freeze_heap()
        if self.started:
            self._on_ready()


async def _reload(state: AppState) -> None:
    """SIGHUP: read the configuration file again; a bad one is ignored (the reload logs
    why)."""
    with contextlib.suppress(ConfigError):
        await state.reload()


def serve(config: GatewayConfig, *, log_level: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT; `log_level` overrides `logging.level`. With
    `server.workers` > 1, that many processes share the socket (`router.process.workers`).
    Raises StartupFailure when the port cannot be had or the app cannot start."""
    socks = [_listen(config.server.host, config.server.port)]
    if config.server.operator_port is not None:
        socks.append(_listen(config.server.host, config.server.operator_port))
    sock = socks[0]
    log_level = log_level or config.logging.level
    logs.configure(log_level, config.logging.format)
    quiet_startup_log()
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1"

    def announce() -> None:
        if len(socks) > 1:
            log.info("the operator's endpoints (/metrics, /admin) on port %d", _port(socks[1]))
        print(READY_PREFIX + url, flush=True)

    if config.server.workers == 1:
        _serve_on(socks, config, log_level, announce)
        return
    create_app(config)  # a secret that cannot be read fails here, not in every worker
    status = supervise(
        config.server.workers,
        lambda ready: _worker(socks, config, log_level, ready),
        announce,
    )
    if status:
        raise SystemExit(status)


def _listen(host: str, port: int) -> socket.socket:
    try:
        return bind(host, port)
    except OSError as exc:
        raise cannot_listen(f"{host}:{port}", exc) from None


def _port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def _worker(
    socks: list[socket.socket],
    config: GatewayConfig,
    log_level: str,
    on_ready: Callable[[], None],
) -> int:
    """`_serve_on` in a worker process: a start-up failure is its last words."""
    try:
        return _serve_on(socks, config, log_level, on_ready)
    except StartupFailure as failure:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        return failure.status


def _serve_on(
    socks: list[socket.socket],
    config: GatewayConfig,
    log_level: str,
    on_ready: Callable[[], None],
) -> int:
    """One gateway process on `socks` (the API's, then the operator's if it has its own)
    until it is stopped; its exit status."""
    app = create_app(config)
    if len(socks) > 1:
        app.operator_port = _port(socks[1])
    server_config = config.server
    limits = FrontDoorLimits(
        first_request_timeout_s=server_config.first_request_timeout_s,
        head_timeout_s=server_config.head_timeout_s,
        body_timeout_s=server_config.body_timeout_s,
        max_connections=connection_limit(server_config.max_connections, raise_fd_limit()),
    )
    uv_config = uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol_class(
            limits, app.state.metrics.connection_refused, app.state.metrics.client_connections
        ),
        log_level=log_level,
        log_config=None,  # uvicorn's records go through our handler and format
        access_log=False,  # ours is richer: RequestContext
        timeout_keep_alive=config.server.keep_alive_s,
        # Answers in flight were waited for, then cut (`_AnnouncingServer`): what is left
        # are connections closing.
        timeout_graceful_shutdown=int(CUT_GRACE_S),
    )
    uv_config.load()
    uv_config.lifespan_class = QuietLifespan
    server = _AnnouncingServer(uv_config, on_ready, app, config.server.shutdown_grace_s)
    try:
        server.run(sockets=socks)
    except SystemExit:
        failure = getattr(app.state, "startup_failure", None)
        if failure is None:
            raise
        raise failure_of(failure) from None
    return 0 if server.started else 1
