"""Start a whole simulated deployment as separate processes, and tear it all down.

``SimStack`` is a sync context manager (usable from sync and async pytest fixtures): it
starts N TileRT nodes, prefill servers, native decode servers and optionally one
``both``-role server standing in for a native disaggregation proxy, all in parallel,
waits for every ``SIM-READY`` line, and on exit (or exception, or interpreter exit)
terminates each process group, killing what does not stop in time. With
``one_process=True`` every simulator is served by one ``python -m sim.host`` process
instead (one start-up instead of one per simulator; their ``pid`` is then the same).
``python -m sim.stack`` runs one from the command line and prints how to use it.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

_PROJECT_ROOT = Path(__file__).resolve().parents[1]


class StackError(RuntimeError):
    """A simulator process failed to start or announce readiness."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A running simulated TileRT node."""

    host: str
    ctrl_port: int
    http_port: int
    data_port: int | None
    pid: int

    @property
    def url(self) -> str:
        """Base URL of the node's HTTP API."""
        return f"http://{self.host}:{self.http_port}"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A running simulated vLLM server (prefill, decode or proxy stand-in)."""

    role: str
    host: str
    port: int
    engine_id: str
    side_channel_port: int
    pid: int
    kv_events_endpoint: str | None = None  # with --kv-events-config

    @property
    def url(self) -> str:
        """Base URL of the OpenAI server (no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def side_channel_host(self) -> str:
        """Host of the NIXL side channel."""
        return self.host


class _Process:
    """One simulator child: its output readers and its readiness."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        changed: threading.Condition,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        self.ready: dict[str, Any] | None = None
        self.eof = False
        self._changed = changed
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            start_new_session=True,  # its own process group, so teardown reaches everything
            preexec_fn=preexec_fn,
        )
        threading.Thread(target=self._read_stdout, name=f"sim-{name}", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:  # keeps draining after readiness
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("SIM-READY ") and self.ready is None:
                with self._changed:
                    self.ready = json.loads(line.split(" ", 1)[1])
                    self._changed.notify_all()
        with self._changed:
            self.eof = True
            self._changed.notify_all()

    def stderr_text(self, limit: int = 4000) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-limit:]

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class SimStack:
    """A simulated deployment: ``with SimStack(nodes=2) as stack: stack.nodes[0].url``.

    ``*_args`` are extra command-line arguments for every process of a kind;
    ``instance_args`` adds arguments for one process by name (``node-0``, ``prefill-1``,
    ``decode-0``, ``proxy-0``). ``preexec_fn`` runs in each child before exec (e.g. to
    make it die with its parent). Prefill servers get engine ids ``prefill-<i>``, decode
    servers ``decode-<i>``, the proxy stand-in ``proxy``. ``one_process`` serves them all
    from one process: quicker to start, but a test that kills one simulator's process
    needs each in its own.
    """

    def __init__(
        self,
        nodes: int = 1,
        prefills: int = 1,
        decodes: int = 0,
        proxy: bool = False,
        tokenizer: str = "deepseek",
        model: str | Sequence[str] = "sim-model",
        host: str = "127.0.0.1",
        node_args: Sequence[str] = (),
        prefill_args: Sequence[str] = (),
        decode_args: Sequence[str] = (),
        proxy_args: Sequence[str] = (),
        instance_args: Mapping[str, Sequence[str]] | None = None,
        ready_timeout_s: float = 60.0,
        stop_grace_s: float = 3.0,
        preexec_fn: Callable[[], None] | None = None,
        one_process: bool = False,
    ) -> None:
        self._one_process = one_process
        self._counts = (nodes, prefills, decodes, proxy)
        self._tokenizer = tokenizer
        self._models = [model] if isinstance(model, str) else list(model)
        self._host = host
        self._args = {
            "node": list(node_args),
            "prefill": list(prefill_args),
            "decode": list(decode_args),
            "proxy": list(proxy_args),
        }
        self._instance_args = {k: list(v) for k, v in (instance_args or {}).items()}
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        self._preexec_fn = preexec_fn
        self._changed = threading.Condition()
        self._procs: list[_Process] = []
        self.nodes: list[NodeInfo] = []
        self.prefills: list[ServerInfo] = []
        self.decodes: list[ServerInfo] = []
        self.proxy: ServerInfo | None = None

    @property
    def pids(self) -> list[int]:
        """Process ids of every simulator process started (for leak checks)."""
        return [p.popen.pid for p in self._procs]

    def _command(self, kind: str, index: int) -> list[str]:
        """``[simulator, *arguments]``: ``tilert`` or ``vllm`` and its command line."""
        common = ["--host", self._host, "--tokenizer", self._tokenizer]
        if kind == "node":
            command = ["tilert", *common, "--ctrl-port", "0", "--http-port", "0"]
        else:
            role = "both" if kind == "proxy" else kind
            engine_id = "proxy" if kind == "proxy" else f"{kind}-{index}"
            command = ["vllm", "--role", role, *common, "--port", "0"]
            command += ["--side-channel-port", "0", "--engine-id", engine_id]
            # A PD deployment's vLLM reports cached tokens (the decode leg's KV).
            command += ["--enable-prompt-tokens-details"]
            for name in self._models:
                command += ["--served-model-name", name]
        extra = self._instance_args.get(f"{kind}-{index}", [])
        return [*command, *self._args[kind], *extra]

    def _processes(self, plan: list[tuple[str, int]]) -> list[tuple[str, list[str]]]:
        """(name, argv) of each process to start for ``plan``."""
        commands = [self._command(kind, index) for kind, index in plan]
        if self._one_process and commands:
            return [("host", [sys.executable, "-m", "sim.host", json.dumps(commands)])]
        return [
            (f"{kind}-{index}", [sys.executable, "-m", f"sim.{command[0]}", *command[1:]])
            for (kind, index), command in zip(plan, commands, strict=True)
        ]

    def start(self) -> SimStack:
        """Start every process in parallel and wait until all are ready."""
        nodes, prefills, decodes, proxy = self._counts
        plan = [("node", i) for i in range(nodes)]
        plan += [("prefill", i) for i in range(prefills)]
        plan += [("decode", i) for i in range(decodes)]
        plan += [("proxy", 0)] if proxy else []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        env["PYTHONUNBUFFERED"] = "1"
        atexit.register(self.stop)
        try:
            for name, argv in self._processes(plan):
                self._procs.append(_Process(name, argv, env, self._changed, self._preexec_fn))
            self._await_ready()
        except BaseException:
            self.stop()
            raise
        if self._one_process:
            (host,) = self._procs
            members = (host.ready or {})["members"]
            for (kind, _), ready in zip(plan, members, strict=True):
                self._publish(kind, ready, host.popen.pid)
        else:
            for (kind, _), proc in zip(plan, self._procs, strict=True):
                self._publish(kind, proc.ready or {}, proc.popen.pid)
        return self

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        with self._changed:
            while True:
                failed = [p for p in self._procs if p.ready is None and p.eof]
                if failed:
                    proc = failed[0]
                    proc.popen.wait()
                    raise StackError(
                        f"{proc.name} exited with {proc.popen.returncode} before SIM-READY\n"
                        f"command: {' '.join(proc.argv)}\nstderr:\n{proc.stderr_text()}"
                    )
                pending = [p for p in self._procs if p.ready is None]
                if not pending:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    proc = pending[0]
                    raise StackError(
                        f"{proc.name} not ready within {self._ready_timeout_s:.0f}s\n"
                        f"command: {' '.join(proc.argv)}\nstderr:\n{proc.stderr_text()}"
                    )
                self._changed.wait(remaining)

    def _publish(self, kind: str, ready: dict[str, Any], pid: int) -> None:
        if kind == "node":
            self.nodes.append(
                NodeInfo(
                    self._host, ready["ctrl_port"], ready["http_port"], ready.get("data_port"), pid
                )
            )
            return
        info = ServerInfo(
            ready["role"],
            self._host,
            ready["port"],
            ready["engine_id"],
            ready["side_channel_port"],
            pid,
            ready.get("kv_events_endpoint"),
        )
        if kind == "prefill":
            self.prefills.append(info)
        elif kind == "decode":
            self.decodes.append(info)
        else:
            self.proxy = info

    def stop(self) -> None:
        """Terminate every process group; kill what is still alive after the grace period."""
        atexit.unregister(self.stop)
        procs, self._procs = self._procs, []
        for proc in procs:
            proc.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self._stop_grace_s
        for proc in procs:
            try:
                proc.popen.wait(max(deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                pass
            proc.signal_group(signal.SIGKILL)  # stragglers and anything left in the group
            proc.popen.wait()
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()
            proc.stderr.close()

    def __enter__(self) -> SimStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> str:
        """Every endpoint and a working curl sequence, for humans."""
        from sim.stack_cli import describe

        return describe(self)


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.stack``: run a stack until Ctrl-C."""
    from sim.stack_cli import parse_args

    options = parse_args(argv)
    stack = SimStack(**options)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with stack:
        print(stack.describe(), flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
