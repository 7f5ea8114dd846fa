"""The shipped Redis's members (deploy/kustomize/base/redis-member.sh), run as the
StatefulSet runs them, each pod on a loopback address of its own: three data servers and
three sentinels find their master, writes reach it through them, a master killed is
replaced, and when it comes back it follows the new one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import RedisError
from redis.sentinel import Sentinel

from demo.redis import redis_server_binary
from tests.deploy.render import BASE
from tests.gate.redis_deployments import bindable
from tests.support.processes import stop_group

pytestmark = pytest.mark.e2e  # redis-server and sentinel processes

SCRIPT = BASE / "redis-member.sh"
ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # one loopback address a pod
MASTER = "pdgw"
PASSWORD = "members-test-password"


def ports_free_everywhere() -> tuple[int, int]:
    """A data port and a sentinel port free on every member's address."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            first = probe.getsockname()[1]
        ports = (first, first + 1)
        if all(bindable(port, address) for address in ADDRESSES for port in ports):
            return ports
    raise RuntimeError("no pair of ports free on every loopback address")


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll the servers' own answers until they say so (bounded): nothing to wait on."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except RedisError:
            pass
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


@dataclass
class Members:
    """Three pods' worth of members, each started by the shipped script."""

    root: Path
    redis_port: int
    sentinel_port: int
    running: dict[tuple[int, str], subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, index: int, role: str) -> None:
        data = self.root / f"member-{index}"
        data.mkdir(exist_ok=True)
        binaries = str(Path(redis_server_binary()).parent)
        env = {
            **os.environ,
            "PATH": f"{binaries}{os.pathsep}{os.environ.get('PATH', '')}",
            "SELF": ADDRESSES[index],
            "BIND": ADDRESSES[index],
            "PEERS": " ".join(ADDRESSES),
            "MASTER_NAME": MASTER,
            "REDIS_PASSWORD": PASSWORD,
            "REDISCLI_AUTH": PASSWORD,  # as the pod's data server has it, for its probes
            "DATA": str(data),
            "REDIS_PORT": str(self.redis_port),
            "SENTINEL_PORT": str(self.sentinel_port),
            "DOWN_AFTER_MS": "1000",
        }
        log = (data / f"{role}.log").open("ab")
        self.running[index, role] = subprocess.Popen(
            ["sh", str(SCRIPT), role],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def start_pod(self, index: int) -> None:
        self.start(index, "redis")
        until(lambda: self.ask(self.data(index), "PING"), f"member {index} answers")
        self.start(index, "sentinel")
        until(lambda: self.ask(self.sentinel(index), "PING"), f"sentinel {index} answers")

    def kill(self, index: int, role: str) -> None:
        stop_group(self.running.pop((index, role)), sig=signal.SIGKILL)

    def data(self, index: int) -> Redis:
        return Redis(ADDRESSES[index], self.redis_port, password=PASSWORD, socket_timeout=2)

    def sentinel(self, index: int) -> Redis:
        return Redis(ADDRESSES[index], self.sentinel_port, socket_timeout=2)

    @staticmethod
    def ask(server: Redis, *command: str) -> Any:
        """One command's answer, the connection closed after it."""
        with server:
            return server.execute_command(*command)

    def master_named(self, index: int) -> str:
        host, _port = self.ask(self.sentinel(index), "SENTINEL GET-MASTER-ADDR-BY-NAME", MASTER)
        return host.decode() if isinstance(host, bytes) else str(host)

    def knows_the_others(self, index: int) -> bool:
        replicas = self.ask(self.sentinel(index), "SENTINEL REPLICAS", MASTER)
        sentinels = self.ask(self.sentinel(index), "SENTINEL SENTINELS", MASTER)
        return len(replicas) == 2 and len(sentinels) == 2

    def role(self, index: int) -> tuple[str, str | None]:
        """`master`, or `slave` and the address it follows."""
        answer = self.ask(self.data(index), "ROLE")
        kind = answer[0].decode()
        return kind, (answer[1].decode() if kind == "slave" else None)

    @property
    def url(self) -> str:
        sentinels = ",".join(f"{address}:{self.sentinel_port}" for address in ADDRESSES)
        return f"redis+sentinel://{sentinels}/{MASTER}"

    def close(self) -> None:
        for popen in self.running.values():
            stop_group(popen, sig=signal.SIGKILL)
        self.running.clear()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[Members]:
    redis_port, sentinel_port = ports_free_everywhere()
    started = Members(tmp_path, redis_port, sentinel_port)
    try:
        yield started
    finally:
        started.close()


def written_through_the_sentinels(members: Members, key: str) -> bool:
    """Whether a write reached the master the sentinels name now (as the gate finds it:
    tests/gate/test_redis_sentinel.py runs the gate itself through a failover)."""
    sentinel = Sentinel([(address, members.sentinel_port) for address in ADDRESSES])
    try:
        with sentinel.master_for(MASTER, password=PASSWORD, socket_timeout=2) as master:
            return bool(master.set(key, "1")) and master.get(key) == b"1"
    finally:
        for client in sentinel.sentinels:
            client.close()


def test_the_members_elect_serve_fail_over_and_take_a_returning_master_back(
    members: Members,
) -> None:
    for index in range(3):  # in order, as the StatefulSet starts its pods
        members.start_pod(index)
    first = ADDRESSES[0]
    until(lambda: all(members.master_named(i) == first for i in range(3)), "one master named")
    until(lambda: members.role(1) == ("slave", first), "member 1 follows the first")
    until(lambda: members.role(2) == ("slave", first), "member 2 follows the first")
    # A sentinel learns the replicas from the master's INFO (every 10 s) and its peers from
    # their hellos: a failover needs the leader to know them (a long-running deployment's
    # sentinels always do).
    for index in range(3):
        until(
            lambda index=index: members.knows_the_others(index),  # type: ignore[misc]
            f"sentinel {index} knows both replicas and both other sentinels",
        )

    assert written_through_the_sentinels(members, "before")

    members.kill(0, "redis")
    until(lambda: members.master_named(1) != first, "a new master named", timeout_s=60)
    promoted = members.master_named(1)
    assert promoted in ADDRESSES[1:]
    until(lambda: written_through_the_sentinels(members, "after"), "a write to the new master")

    members.start(0, "redis")  # the pod's container restarted by the kubelet
    until(lambda: members.ask(members.data(0), "PING"), "the old master answers again")
    # It starts as a replica of the new master (asked of the sentinels), never as a second
    # master for the sentinels to correct.
    assert members.role(0) == ("slave", promoted)
    assert all(members.master_named(i) == promoted for i in range(3))
    with members.data(0) as returned:
        until(lambda: returned.get("after") == b"1", "the returned member has the new writes")
