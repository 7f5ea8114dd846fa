"""`server.workers` > 1: several gateway processes on one listening socket, an event loop
each, sharing the TileRT pool through the Redis gate.

The parent binds the socket, forks the workers (they inherit it; the kernel spreads the
connections), announces the address once every worker listens, passes SIGTERM, SIGINT
and SIGHUP on to them, and forks a new worker in place of one that died until it is told
to stop. Counters and histograms live in prometheus_client's multiprocess files, so a
scrape of any worker counts the requests of all of them, the dead ones included.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from types import FrameType

from router.process import lifeline
from router.telemetry import logs
from router.telemetry.metrics import METRICS_DIR_ENV

log = logging.getLogger("pd_gateway")

RESTART_DELAY_S = 1.0
"""Before a dead worker's replacement starts: a worker that cannot start does not spin."""
_POLL_S = 0.1

Worker = Callable[[Callable[[], None]], int]
"""Runs one worker in the forked child: serves until told to stop, calls its argument once
it listens, returns the exit status."""


def supervise(count: int, worker: Worker, announce: Callable[[], None]) -> int:
    """Run `count` workers until SIGTERM/SIGINT has stopped them all; `announce` once all
    of them listen. Returns 0 if every worker stopped cleanly, the status of a worker that
    could not start, else 1."""
    metrics_dir = tempfile.mkdtemp(prefix="pd-gateway-metrics-")
    os.environ[METRICS_DIR_ENV] = metrics_dir
    try:
        return _Supervisor(count, worker, announce).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def use_shared_metrics() -> None:
    """In a worker, before any metric exists: keep values in the multiprocess files."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call, unused-ignore]


class _Supervisor:
    def __init__(self, count: int, worker: Worker, announce: Callable[[], None]) -> None:
        self._count = count
        self._worker = worker
        self._announce = announce
        self._children: dict[int, float] = {}  # pid -> when it was started
        self._stopping = False
        self._status = 0
        self._forward: list[int] = []  # signals received, to pass on
        self._announced = False
        self._ready, self._ready_write = os.pipe()

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            for _ in range(self._count):
                self._start()
            self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._ready)
            os.close(self._ready_write)
        return self._status

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGHUP:
            self._stopping = True
        self._forward.append(sig)

    def _start(self) -> None:
        die_with_parent = lifeline.die_with_parent()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 1
            try:
                # Signals come from the parent alone, once each: a group signal (Ctrl-C,
                # kill of the group) would reach a worker twice, and a second SIGTERM
                # cuts its requests short. A worker dies with the parent.
                os.setpgid(0, 0)
                if die_with_parent is not None:
                    die_with_parent()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                os.close(self._ready)
                logs.name_this_worker()
                use_shared_metrics()
                status = self._worker(self._listening)
            except BaseException:
                log.exception("gateway worker %d failed", os.getpid())
            finally:
                os._exit(status)
        self._children[pid] = time.monotonic()

    def _listening(self) -> None:
        os.write(self._ready_write, b".")

    def _loop(self) -> None:
        listening = 0
        pending_restarts: list[float] = []  # when each replacement is due
        while self._children or (pending_restarts and not self._stopping):
            while self._forward:
                sig = self._forward.pop(0)
                for pid in self._children:
                    os.kill(pid, sig)
            readable, _, _ = select.select([self._ready], [], [], _POLL_S)
            if readable:
                listening += len(os.read(self._ready, 64))
                if listening >= self._count and not self._announced:
                    self._announced = True
                    self._announce()
            self._reap(pending_restarts)
            now = time.monotonic()
            for due in [d for d in pending_restarts if d <= now]:
                pending_restarts.remove(due)
                if not self._stopping:
                    self._start()

    def _reap(self, pending_restarts: list[float]) -> None:
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self._children.clear()
                return
            if pid == 0:
                return
            self._children.pop(pid, None)
            _mark_dead(pid)
            code = os.waitstatus_to_exitcode(status)
            if not self._announced and not self._stopping:
                # A worker that cannot start: the others would not either; stop them all.
                log.error("gateway worker %d exited (%s) before listening", pid, code)
                self._stopping = True
                self._status = self._status or (code if code > 0 else 1)
                self._forward.append(signal.SIGTERM)
                continue
            if self._stopping:
                # uvicorn ends by raising the signal it stopped for again: a clean stop.
                if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                    self._status = self._status or 1
                continue
            log.warning("gateway worker %d exited (%s); starting another", pid, code)
            pending_restarts.append(time.monotonic() + RESTART_DELAY_S)


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call, unused-ignore]
