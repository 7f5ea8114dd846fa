"""Real Redis deployments for the tests, from the same redis-server binary as the single
server: a Cluster of three masters, and a master with a replica watched by a Sentinel."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from demo.redis import HOST, redis_server_binary
from tests.gate.redis_server import RedisServer, free_port

CLUSTER_SLOTS = 16384


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll a server's own answer until it holds (bounded): there is nothing to wait on."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


class LocalCluster:
    """Three cluster-enabled masters sharing the 16384 slots, met and assigned from Python."""

    def __init__(self, masters: int = 3) -> None:
        self.servers = [
            RedisServer(extra_args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            for _ in range(masters)
        ]
        for server in self.servers:
            server.port = _cluster_port()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{s.port}" for s in self.servers[:2])

    def start(self) -> None:
        for server in self.servers:
            server.start()
        clients = [Redis(host=HOST, port=s.port, decode_responses=True) for s in self.servers]
        try:
            for client in clients[1:]:
                client.execute_command("CLUSTER MEET", HOST, self.servers[0].port)
            share = CLUSTER_SLOTS // len(clients)
            for i, client in enumerate(clients):
                end = CLUSTER_SLOTS if i == len(clients) - 1 else (i + 1) * share
                client.execute_command("CLUSTER ADDSLOTS", *range(i * share, end))
            first, met = self.servers[0].port, time.monotonic()

            def formed() -> bool:
                # A handshake lost on a loaded machine is not tried again by the nodes: the
                # meets are asked again every 10 s (a handshake still under way counts as a
                # known node, so never sooner).
                nonlocal met
                if time.monotonic() - met > 10.0:
                    for client in clients[1:]:
                        client.execute_command("CLUSTER MEET", HOST, first)
                    met = time.monotonic()
                return all(_cluster_ok(client) for client in clients)

            _until(formed, "the cluster forms", timeout_s=60.0)
        finally:
            for client in clients:
                client.close()

    def close(self) -> None:
        for server in self.servers:
            server.close()


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too."""
    while True:
        port = free_port()
        if port + 10000 <= 65535 and bindable(port + 10000):
            return port


def bindable(port: int, host: str = HOST) -> bool:
    """Whether `port` on `host` is free to listen on."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _cluster_ok(client: Redis) -> bool:
    info = client.execute_command("CLUSTER INFO")
    return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3)


@contextmanager
def running_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


class LocalSentinel:
    """A master, its replica and one Sentinel (quorum 1) watching them as `master_name`."""

    def __init__(self, master_name: str = "gate") -> None:
        self.master_name = master_name
        self.master = RedisServer()
        self.replica = RedisServer(extra_args=["--replicaof", HOST, str(self.master.port)])
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="pdgw-sentinel-")
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_for(self.master_name)

    def url_for(self, master_name: str) -> str:
        return f"redis+sentinel://{HOST}:{self.port}/{master_name}"

    def client(self) -> Redis:
        return Redis(host=HOST, port=self.port, decode_responses=True)

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        conf = Path(self._dir.name) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind {HOST}\ndir {self._dir.name}\n"
            f"sentinel monitor {self.master_name} {HOST} {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.master_name} 1000\n"
            f"sentinel failover-timeout {self.master_name} 10000\n"
        )
        self._popen = subprocess.Popen(
            [redis_server_binary(), str(conf), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._dir.name,
            start_new_session=True,
        )
        with self.client() as sentinel:
            _until(lambda: self._replica_known(sentinel), "the sentinel sees the replica")

    def master_port(self) -> int:
        with self.client() as sentinel:
            _host, port = sentinel.execute_command(
                "SENTINEL GET-MASTER-ADDR-BY-NAME", self.master_name
            )
            return int(port)

    def fail_over(self) -> None:
        """Promote the replica, and return once the sentinel names it the master and the
        old master has become its replica (and so refuses writes)."""
        with self.client() as sentinel:
            sentinel.execute_command("SENTINEL FAILOVER", self.master_name)
        _until(lambda: self.master_port() == self.replica.port, "the failover")
        with Redis(host=HOST, port=self.master.port, decode_responses=True) as old:
            _until(lambda: old.execute_command("ROLE")[0] == "slave", "the old master follows")

    def close(self) -> None:
        if self._popen is not None:
            self._popen.terminate()
            self._popen.wait(timeout=10)
        self.replica.close()
        self.master.close()
        self._dir.cleanup()

    def _replica_known(self, sentinel: Redis) -> bool:
        try:
            replicas = sentinel.execute_command("SENTINEL REPLICAS", self.master_name)
        except (RedisError, OSError):  # not answering yet, or not watching yet: asked again
            return False
        return any(
            _field(r, "port") == str(self.replica.port)
            and "s_down" not in _field(r, "flags")
            and _field(r, "master-link-status") == "ok"
            for r in replicas
        )


def _field(reply: object, name: str) -> str:
    """A field of one SENTINEL REPLICAS entry (a flat list or a dict, by client version)."""
    if isinstance(reply, dict):
        return str(reply.get(name, ""))
    items = list(reply) if isinstance(reply, list) else []
    fields = dict(zip(items[::2], items[1::2], strict=False))
    return str(fields.get(name, ""))


@contextmanager
def running_sentinel() -> Iterator[LocalSentinel]:
    deployment = LocalSentinel()
    try:
        deployment.start()
        yield deployment
    finally:
        deployment.close()
