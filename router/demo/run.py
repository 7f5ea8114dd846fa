"""Runs the demo: the simulators, then `pd-gateway serve` as a child, until Ctrl-C or SIGTERM.

Every simulator and the gateway run in process groups of their own, so the terminal's
Ctrl-C reaches only the demo, which then stops the gateway first (in-flight requests
finish) and the simulators after it, and waits for each to exit.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import yaml

from router.config import GatewayConfig, load_config, parse_config
from router.demo.plan import DemoError, ModelPlan, plan_stacks
from router.demo.ports import Endpoints, rewrite, shifted, started
from router.demo.usage import usage
from router.server import READY_PREFIX

if TYPE_CHECKING:
    from sim.stack import SimStack

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "router.yaml"
READY_TIMEOUT_S = 60.0
# Beyond server.shutdown_grace_s: the gateway's own slot cleanups (10 s) and a margin.
GATEWAY_STOP_MARGIN_S = 15.0


class DemoFailed(Exception):
    """A simulator or the gateway did not start, or the gateway died."""


class _Stopped(BaseException):
    """SIGTERM arrived: unwind as Ctrl-C does."""


def run_demo(
    config_path: Path | None,
    *,
    port: int | None = None,
    port_offset: int = 0,
    free_ports: bool = False,
    log_level: str = "warning",
) -> int:
    """Start the simulated stack and the gateway, print what to try, run until a signal.

    `port` is the gateway's (0: any free port); `port_offset` moves every configured port;
    `free_ports` lets the OS choose every port (the gateway's too, unless `port` is given).
    Returns 0 after Ctrl-C or SIGTERM, 1 if a process failed. ConfigError and DemoError
    (the configuration cannot be run here) are raised before anything starts.
    """
    config, plans = _load(config_path, port_offset)
    if port is None:
        port = 0 if free_ports else config.server.port
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    stacks: list[SimStack] = []
    gateway: _Gateway | None = None
    workdir = tempfile.TemporaryDirectory(prefix="pd-gateway-demo-")
    try:
        endpoints = _start_stacks(plans, stacks, pin_ports=not free_ports)
        document = rewrite(config, endpoints, port=port)
        effective = parse_config(document, base_dir=config.base_dir)
        config_file = Path(workdir.name) / "router.yaml"
        config_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        print(describe(plans, stacks, config_file), flush=True)
        grace_s = effective.server.shutdown_grace_s + GATEWAY_STOP_MARGIN_S
        gateway = _Gateway(config_file, log_level, stop_grace_s=grace_s)
        print(usage(effective, gateway.wait_ready(READY_TIMEOUT_S)), flush=True)
        code = gateway.popen.wait()
        raise DemoFailed(f"the gateway exited with code {code}")
    except (KeyboardInterrupt, _Stopped):
        print("\nStopping the gateway and the simulators.", flush=True)
        return 0
    except DemoFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        # Neither a second Ctrl-C nor a SIGTERM may cut the teardown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if gateway is not None:
            gateway.stop()
        for stack in reversed(stacks):
            stack.stop()
        workdir.cleanup()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)


def _load(config_path: Path | None, port_offset: int) -> tuple[GatewayConfig, list[ModelPlan]]:
    path = config_path or DEFAULT_CONFIG
    if not path.is_file() and config_path is None:
        raise DemoError(f"no bundled router.yaml at {path}; pass --config")
    config = load_config(path)
    plans = plan_stacks(config)
    if port_offset:
        server_port = config.server.port + port_offset if config.server.port else 0
        document = rewrite(config, shifted(plans, port_offset), port=server_port)
        config = parse_config(document, base_dir=config.base_dir)
        plans = plan_stacks(config)
    return config, plans


def _start_stacks(plans: list[ModelPlan], stacks: list[SimStack], *, pin_ports: bool) -> Endpoints:
    """Start each model's simulators in turn; every stack is in `stacks` for the teardown."""
    from sim.stack import StackError

    endpoints = Endpoints()
    for plan in plans:
        stack = plan.stack(pin_ports=pin_ports)
        stacks.append(stack)  # before start: an interrupt may come at any moment
        try:
            stack.start()
        except StackError as exc:
            hint = " (a port in use? try --port-offset or --free-ports)" if pin_ports else ""
            message = f"a simulator of {plan.model.name} did not start{hint}: {exc}"
            raise DemoFailed(message) from None
        endpoints.update(started(plan, stack))
    return endpoints


def describe(plans: list[ModelPlan], stacks: list[SimStack], config_file: Path) -> str:
    """The simulators, where they listen, and the configuration the gateway runs on."""
    lines = ["Simulated backends (no GPU):"]
    for plan, stack in zip(plans, stacks, strict=True):
        lines.append(f"  {plan.model.name} (tokenizer {plan.model.tokenizer})")
        for node in stack.nodes:
            lines.append(f"    TileRT node    {node.url}  ctrl port {node.ctrl_port}")
        servers = [*zip(plan.prefill_kind, stack.prefills, strict=True)]
        servers += zip(plan.decode_kind, stack.decodes, strict=True)
        for server, info in servers:
            lines.append(f"    vLLM {server.role:<9} {info.url}  engine {info.engine_id}")
    lines.append(f"Gateway configuration: {config_file}")
    return "\n".join(lines)


class _Gateway:
    """`pd-gateway serve` as a child in its own process group; its stdout is echoed."""

    def __init__(self, config_file: Path, log_level: str, *, stop_grace_s: float) -> None:
        self._stop_grace_s = stop_grace_s
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # transformers warns at import that PyTorch is absent; the gateway needs only tokenizers.
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        argv = [sys.executable, "-m", "router.cli", "serve", "--config", str(config_file)]
        self.popen = subprocess.Popen(
            [*argv, "--log-level", log_level],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._ready: queue.Queue[str | None] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, name="gateway-out", daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            print(line, end="", flush=True)
            if line.startswith(READY_PREFIX):
                self._ready.put(line[len(READY_PREFIX) :].strip())
        self._ready.put(None)

    def wait_ready(self, timeout_s: float) -> str:
        """The base URL the gateway announced; DemoFailed if it exits or takes too long."""
        try:
            url = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            raise DemoFailed(f"the gateway did not start within {timeout_s:.0f} s") from None
        if url is None:
            raise DemoFailed(f"the gateway exited with code {self.popen.wait()} before starting")
        return url

    def stop(self) -> None:
        """SIGTERM (in-flight requests finish), then SIGKILL after the grace period."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(self._stop_grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._pump_thread.join(timeout=5)  # echo what the gateway printed last
        if self.popen.stdout is not None and not self._pump_thread.is_alive():
            self.popen.stdout.close()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise _Stopped
