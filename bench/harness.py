"""What the benchmarks share: `pd-gateway serve` as a child process on a free loopback
port, and the router.yaml model entry for a simulated stack's latency path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from router.server import READY_PREFIX
from sim.stack import SimStack

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def latency_model(stack: SimStack, name: str, **entry: Any) -> dict[str, Any]:
    """A model served by `stack`'s prefill servers and TileRT nodes (DeepSeek tokenizer)."""
    return {
        "name": name,
        "tokenizer": "deepseek",
        "latency": {
            "prefill": [p.url for p in stack.prefills],
            "nodes": [
                {"host": n.host, "ctrl_port": n.ctrl_port, "http_port": n.http_port}
                for n in stack.nodes
            ],
        },
        **entry,
    }


class BenchGateway:
    """`pd-gateway serve` from the checkout at `root`, as a child in its own process group, on
    a free loopback port."""

    def __init__(self, config: dict[str, Any], workdir: Path, root: Path = PROJECT_ROOT) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "router.yaml"
        document = {**config, "server": {"host": "127.0.0.1", "port": 0}}
        config_path.write_text(yaml.safe_dump(document), encoding="utf-8")
        self.log_path = workdir / "gateway.log"
        self.base_url = ""
        env = dict(os.environ, PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "router.cli", "serve", "--config", str(config_path)]
        with self.log_path.open("w") as log:
            self.popen = subprocess.Popen(
                [*argv, "--port", "0", "--log-level", "warning"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=root,
                start_new_session=True,
            )

    def wait_ready(self) -> str:
        """The announced base URL (blocks on the child's stdout until it prints it)."""
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith(READY_PREFIX):
                self.base_url = line[len(READY_PREFIX) :].strip()
                return self.base_url
        raise SystemExit(f"the gateway did not start:\n{self.log_path.read_text()}")

    def cpu_s(self) -> tuple[float, float]:
        """utime and stime of the gateway process (all its threads), in seconds."""
        stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise SystemExit("no VmHWM in /proc: not Linux?")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@contextmanager
def running_gateways(
    config: dict[str, Any], roots: dict[str, Path] | None = None
) -> Iterator[dict[str, BenchGateway]]:
    """One gateway per labelled checkout (by default this one, as `gateway`), all with
    `config`; stopped on the way out. Wait for each with `wait_ready`."""
    roots = roots or {"gateway": PROJECT_ROOT}
    with tempfile.TemporaryDirectory(prefix="pd-gateway-bench-") as workdir:
        gateways: dict[str, BenchGateway] = {}
        try:
            for label, root in roots.items():
                gateways[label] = BenchGateway(config, Path(workdir) / label, root)
            yield gateways
        finally:
            for gateway in gateways.values():
                gateway.stop()
