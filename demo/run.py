"""Runs the demo: the simulators, then `pd-gateway serve` as a child, until Ctrl-C or SIGTERM.

With `replicas` > 1: a local Redis, that many `pd-gateway serve` children on the redis gate
backend (one shared pool), and a round-robin front on the gateway's address; a replica that
exits (killed by the user, say) leaves the others serving.

Every simulator, Redis and each gateway run in process groups of their own, so the
terminal's Ctrl-C reaches only the demo, which then stops the gateways first (in-flight
requests finish), then the front, the simulators and Redis, and waits for each to exit.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import yaml

import router
from demo.front import RoundRobinFront
from demo.instructions import instructions
from demo.plan import DemoError, ModelPlan, plan_stacks
from demo.ports import Endpoints, rewrite, shifted, started
from demo.redis import LocalRedis
from demo.workdirs import dir_prefix, remove_stale_dirs
from router.commands import missing_equipment
from router.config import GatewayConfig, load_config, parse_config
from router.process.lifeline import die_with_parent
from router.process.server import READY_PREFIX

if TYPE_CHECKING:
    from sim.stack import SimStack

# The folder the `router` package was imported from: the gateways' children import the
# same code (a checkout, or site-packages).
IMPORT_ROOT = Path(router.__file__).resolve().parents[1]
READY_TIMEOUT_S = 60.0
# Beyond server.shutdown_grace_s: the gateway's own slot cleanups (10 s) and a margin.
GATEWAY_STOP_MARGIN_S = 15.0
# The demo's shared pool, unless the configuration sets gate.redis itself: a short lease, so
# that a node held by a killed replica is seen serving again within seconds.
DEMO_REDIS = {"key_prefix": "pdgw-demo", "lease_ttl_s": 3.0, "renew_every_s": 1.0, "poll_s": 0.5}


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
    replicas: int = 1,
) -> int:
    """Start the simulated stack and the gateway, print what to try, run until a signal.

    `port` is the gateway's (0: any free port); `port_offset` moves every configured port;
    `free_ports` lets the OS choose every port (the gateway's too, unless `port` is given).
    `replicas` > 1 runs that many gateways on one Redis-backed pool behind one address.
    Returns 0 after Ctrl-C or SIGTERM, 1 if a process failed. ConfigError and DemoError
    (the configuration cannot be run here) are raised before anything starts.
    """
    if replicas < 1:
        raise DemoError(f"--replicas must be at least 1, not {replicas}")
    if (problem := missing_equipment("pd-gateway demo", "sim")) is not None:
        raise DemoError(problem)
    config, plans = _load(config_path, port_offset)
    if port is None:
        port = 0 if free_ports else config.server.port
    remove_stale_dirs()  # what demos killed outright (kill -9) had to leave behind
    redis = LocalRedis() if replicas > 1 else None  # DemoError now if there is no binary
    # Ctrl-C stops the demo however it was started: a shell starts a background job with
    # SIGINT ignored, and Python then leaves it ignored.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    previous_hup = signal.signal(signal.SIGHUP, _raise_stopped)  # the terminal closed
    stacks: list[SimStack] = []
    gateways: list[_Gateway] = []
    front: RoundRobinFront | None = None
    workdir = tempfile.TemporaryDirectory(prefix=dir_prefix("demo"))
    try:
        if redis is not None:  # bound first: a taken port fails before anything starts
            front = RoundRobinFront(config.server.host, port, lambda: _addresses(gateways))
        endpoints = _start_stacks(plans, stacks, pin_ports=not free_ports)
        document = rewrite(config, endpoints, port=port if redis is None else 0)
        if redis is not None:
            _start_redis(redis)
            _share_pool(document, config, redis.url)
        effective = parse_config(document, base_dir=config.base_dir)
        config_file = Path(workdir.name) / "router.yaml"
        config_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        print(describe(plans, stacks, config_file), flush=True)
        grace_s = effective.server.shutdown_grace_s + GATEWAY_STOP_MARGIN_S
        if front is None or redis is None:
            gateway = _Gateway(config_file, log_level, stop_grace_s=grace_s)
            gateways.append(gateway)
            print(instructions(effective, gateway.wait_ready(READY_TIMEOUT_S)), flush=True)
            code = gateway.popen.wait()
            raise DemoFailed(f"the gateway exited with code {code}")
        print(f"Redis (the pool's shared state): {redis.url}  pid {_pid(redis)}", flush=True)
        for i in range(replicas):
            name = f"replica {i + 1}"
            gateways.append(_Gateway(config_file, log_level, stop_grace_s=grace_s, name=name))
        lines = [f"{g.name}: {g.wait_ready(READY_TIMEOUT_S)}  pid {g.popen.pid}" for g in gateways]
        front.start()
        print(instructions(effective, front.base_url, replicas=lines), flush=True)
        _watch(gateways)
        raise DemoFailed("every gateway replica has exited")
    except (KeyboardInterrupt, _Stopped):
        what = "the gateway replicas, Redis" if redis is not None else "the gateway"
        print(f"\nStopping {what} and the simulators.", flush=True)
        return 0
    except DemoFailed as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        # Neither a second Ctrl-C nor a SIGTERM or SIGHUP may cut the teardown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        for gateway in gateways:  # every one drains at once, then each is waited for
            gateway.terminate()
        for gateway in gateways:
            gateway.stop()
        if front is not None:
            front.stop()
        for stack in reversed(stacks):
            stack.stop()
        if redis is not None:
            redis.close()
        workdir.cleanup()
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, previous_hup)


def _start_redis(redis: LocalRedis) -> None:
    try:
        redis.start()
    except DemoError as exc:
        raise DemoFailed(str(exc)) from None


def _share_pool(document: dict[str, object], config: GatewayConfig, url: str) -> None:
    """Every replica on the redis gate backend, at the demo's own Redis (the configuration's
    own gate.redis settings kept, but for where Redis is and its password)."""
    gate = document["gate"]
    assert isinstance(gate, dict)
    settings = gate["redis"] if config.gate.redis is not None else dict(DEMO_REDIS)
    settings.update(url=url, password=None, password_file=None)
    gate.update(backend="redis", redis=settings)


def _addresses(gateways: list[_Gateway]) -> list[tuple[str, int]]:
    """Where the running replicas listen (read by the front for every connection)."""
    return [g.address for g in list(gateways) if g.address is not None and g.running]


def _watch(gateways: list[_Gateway]) -> None:
    """Until every replica has exited; each exit is reported as it happens."""
    running = list(gateways)
    while running:
        time.sleep(0.2)  # a signal interrupts it (KeyboardInterrupt, _Stopped)
        for gateway in [g for g in running if not g.running]:
            running.remove(gateway)
            code = gateway.popen.returncode
            print(
                f"{gateway.name} (pid {gateway.popen.pid}) exited with code {code};"
                f" {len(running)} of {len(gateways)} replicas serving",
                flush=True,
            )


def _pid(redis: LocalRedis) -> int:
    assert redis.popen is not None
    return redis.popen.pid


@contextmanager
def bundled_config() -> Iterator[Path]:
    """The demo's own router.yaml, shipped in this package."""
    with resources.as_file(resources.files("demo").joinpath("router.yaml")) as path:
        yield path


def _load(config_path: Path | None, port_offset: int) -> tuple[GatewayConfig, list[ModelPlan]]:
    if config_path is None:
        with bundled_config() as path:
            config = load_config(path)
    else:
        config = load_config(config_path)
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
        lines.append(f"  {plan.model.name} (tokenizer {plan.tokenizer})")
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

    def __init__(
        self, config_file: Path, log_level: str, *, stop_grace_s: float, name: str = ""
    ) -> None:
        self._stop_grace_s = stop_grace_s
        self.name = name or "gateway"
        self._prefix = f"[{name}] " if name else ""
        self.address: tuple[str, int] | None = None  # once it has announced its URL
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # transformers warns at import that PyTorch is absent; the gateway needs only tokenizers.
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMPORT_ROOT), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "router.cli", "serve", "--config", str(config_file)]
        self.popen = subprocess.Popen(
            [*argv, "--log-level", log_level],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # a demo killed outright takes its gateways along
        )
        self._ready: queue.Queue[str | None] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, name="gateway-out", daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            print(self._prefix + line, end="", flush=True)
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX) :].strip()
                parts = urlsplit(url)
                if parts.hostname is not None and parts.port is not None:
                    self.address = (parts.hostname, parts.port)
                self._ready.put(url)
        self._ready.put(None)

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, timeout_s: float) -> str:
        """The base URL the gateway announced; DemoFailed if it exits or takes too long."""
        try:
            url = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            raise DemoFailed(f"the gateway did not start within {timeout_s:.0f} s") from None
        if url is None:
            raise DemoFailed(f"the gateway exited with code {self.popen.wait()} before starting")
        return url

    def terminate(self) -> None:
        """SIGTERM: the gateway drains (in-flight requests finish) and exits."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)

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
