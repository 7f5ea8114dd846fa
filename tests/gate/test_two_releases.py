"""Two releases on one Redis: the previous release of the gateway, built into a wheel from
git history, serves one pool of simulated TileRT nodes beside this release, both gateways
on one real Redis, under more requests than nodes: no node is ever double-booked, every
request is answered, and every node is free again at the end. It is the rolling update
docs/upgrades.md gives (a release that writes the versions its predecessor reads), with
every piece of shared state in play: node records, the scripts' state with the tenants'
fair shares, and the tenants' rate-limit buckets, which both releases must count as one.

The nodes' own records are the judge of double-booking, not the gateways. The test fails
if the two releases disagree on what a shared key means: run the previous release under
another `key_prefix` (two gates, one pool) and the nodes record two decodes at once. A
deliberate format mismatch is refused, not misread: tests/gate/test_redis_state_format.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from router.gate.redis.scripts import SCRIPTS
from sim.stack import NodeInfo, SimStack
from tests.gate.redis_server import RedisServer, running_redis
from tests.support.deployment import (
    directive,
    gateway_config,
    latency_model,
    request_decodes,
    sim_get,
    version_args,
)
from tests.support.gateway import GatewayProcess
from tests.support.http import plain
from tests.support.processes import run_in_group
from tests.support.stacks import StackPool
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("fresh_sims")]

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "fa7799c"
"""main before the scripts' state and the tenants' buckets carried a version (issue 44):
it writes version 1 of every shared format and checks none, the step docs/upgrades.md
starts from. A release that changes a shared format moves this on to the release before
it, so that the step it makes is the one tested."""
NODES = 3
REQUESTS = 60  # half through each release's gateway, all at once: most of them queue
TENANTS = ("alpha", "beta")  # alpha of weight 2: the scripts keep fair shares
REQUESTS_PER_MINUTE = 31
"""Each tenant's limit: its 30 requests fit (the bucket at most 58 s ahead of now, under
the minute's burst), each moving the shared bucket on by 60/31 s."""
EPOCH_S = 1704067200  # the tenants' scripts count ms from 2024-01-01 UTC
PROBE = """
import hashlib, json, router
from router.gate.redis.scripts import SCRIPTS
print(json.dumps({"router": router.__file__, "scripts": {
    name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}}))
"""


# -- the previous release, from git history ---------------------------------------------------


@pytest.fixture(scope="session")
def release_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the previous release is built and installed, once per session (per worker)."""
    return tmp_path_factory.mktemp("previous-release")


def installed_release(cache: Path) -> Path:
    """The folder the previous release's wheel is installed in, built now unless it was
    earlier in the session. Called from the test, so that a missing commit fails it."""
    target = cache / "installed"
    if target.is_dir():
        return target
    git = ["git", "-C", str(ROOT)]
    found = run_in_group(
        [*git, "rev-parse", "--verify", "--quiet", f"{PREVIOUS_RELEASE}^{{commit}}"],
        timeout_s=60,
    )
    if found.returncode != 0:
        pytest.fail(
            f"commit {PREVIOUS_RELEASE} (the previous release) is not in the git history of"
            f" {ROOT}: the test builds its wheel from it. Fetch it (in a shallow clone:"
            f" `git fetch --unshallow`). {found.stderr.strip()}"
        )
    archive, source, wheels = cache / "source.tar", cache / "source", cache / "wheels"
    succeeded(
        [*git, "archive", "--format=tar", "-o", str(archive), PREVIOUS_RELEASE], timeout_s=120
    )
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    pip = [sys.executable, "-m", "pip"]
    succeeded(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)]
    )
    [wheel] = wheels.glob("pd_gateway-*.whl")
    staging = cache / "staging"  # complete before it is the installed release
    succeeded([*pip, "install", "-q", "--no-deps", "--target", str(staging), str(wheel)])
    staging.rename(target)
    return target


def succeeded(argv: list[str], *, timeout_s: float = 300, **options: Any) -> str:
    """`argv`'s output; the test fails with its errors if it does not succeed."""
    done = run_in_group(argv, timeout_s=timeout_s, **options)
    assert done.returncode == 0, f"{' '.join(argv[:4])} ... failed:\n{done.stderr}"
    return done.stdout


def released_scripts(release: Path, workdir: Path) -> dict[str, str]:
    """The SHA-1 of each gate script of the release installed in `release`, as a process
    started as its gateway is (interpreter, path, directory) finds them: checked to import
    that release, not the checkout, whose process would load none of these scripts."""
    answer = json.loads(
        succeeded(
            [sys.executable, "-c", PROBE],
            timeout_s=60,
            env={**os.environ, "PYTHONPATH": str(release)},
            cwd=workdir,
        )
    )
    assert Path(answer["router"]).is_relative_to(release), answer["router"]
    scripts: dict[str, str] = answer["scripts"]
    return scripts


# -- the deployment ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    version = version_args("0.1.6")
    return sim_stacks.get(
        nodes=NODES,
        prefills=1,
        model="ds",
        node_args=["--step-ms", "2", *version["node_args"]],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0", *version["prefill_args"]],
    )


def deployment_config(stack: SimStack, redis: RedisServer, prefix: str) -> dict[str, Any]:
    """What both releases run: one pool, one Redis, one key prefix; tenants named by a
    header, each with a rate limit and one with a weight."""
    return gateway_config(
        [latency_model(stack, "ds")],
        gate={
            "backend": "redis",
            "redis": {
                "url": redis.url,
                "key_prefix": prefix,
                # Generous on a loaded machine: no lease may expire under this load.
                "lease_ttl_s": 10,
                "renew_every_s": 1,
                "poll_s": 0.2,
                "socket_timeout_s": 2,
            },
            "max_queue": 4 * REQUESTS,
            "max_queue_wait_ms": 120_000,
        },
        timeouts={"decode_stall_s": 15, "kv_transfer_s": 15},
        tenants={
            "identify": ["header"],
            "header": "x-tenant",
            "every": {"requests_per_minute": REQUESTS_PER_MINUTE},
            "named": {"alpha": {"weight": 2}},
        },
    )


def start_both(
    exits: ExitStack, config: dict[str, Any], root: Path, release: Path
) -> tuple[GatewayProcess, GatewayProcess]:
    """The previous release's gateway (the .venv's interpreter, the release first on its
    path) and this release's, started together; each stopped when `exits` closes."""
    (root / "previous").mkdir()
    (root / "current").mkdir()
    previous = GatewayProcess(config, root / "previous", python=sys.executable, release=release)
    current = GatewayProcess(config, root / "current")
    for gateway in (previous, current):
        exits.callback(gateway.stop)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for started in [pool.submit(g.start, 120.0) for g in (previous, current)]:
            started.result()
    return previous, current


# -- the load and its judges -------------------------------------------------------------------


def words(count: int, seed: int) -> str:
    return " ".join(f"w{(seed + i) % 10}" for i in range(count))


async def ask(http: httpx.AsyncClient, gateway: GatewayProcess, i: int) -> tuple[int, str]:
    """Request `i`, of tenant TENANTS[i // 2 % 2] (so both tenants through both gateways):
    its status, and whether its answer was the text it asked for."""
    text = words(30, i)
    reply = await http.post(
        gateway.base_url + "/chat/completions",
        json={"model": "ds", "messages": [{"role": "user", "content": directive(text)}]},
        headers={"x-tenant": TENANTS[i // 2 % 2]},
    )
    if reply.status_code != 200:
        return reply.status_code, reply.text
    content = reply.json()["choices"][0]["message"]["content"]
    return 200, "ok" if content == text else f"answered {content!r}"


async def load(gateways: tuple[GatewayProcess, GatewayProcess]) -> list[tuple[int, str]]:
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=REQUESTS)
    async with httpx.AsyncClient(timeout=180, limits=limits) as http:
        return await asyncio.gather(*(ask(http, gateways[i % 2], i) for i in range(REQUESTS)))


def double_bookings(nodes: list[NodeInfo]) -> tuple[list[str], int]:
    """Every time a node served two requests at once, as its own records tell; and the
    number of requests' decodes in all."""
    found, decodes = [], 0
    for node in nodes:
        records = sim_get(node.url, "/sim/records")
        if records["max_overlap"] > 1:
            found.append(f"{node.url}: {records['max_overlap']} decodes at once")
        intervals = sorted((d["start"], d["end"]) for d in records["decodes"])
        for (_, end), (start, _) in itertools.pairwise(intervals):
            if end is None or end > start:
                found.append(f"{node.url}: a decode started at {start} before another ended")
        decodes += len(request_decodes(records["decodes"]))
    return found, decodes


def all_free(stack: SimStack, gateways: tuple[GatewayProcess, ...]) -> None:
    """Every node idle, and each gateway sees the shared pool with no holder, nobody
    waiting and every node in service."""
    wait_until(
        lambda: all(sim_get(n.url, "/decode_status")["status"] == "idle" for n in stack.nodes),
        what="every node idle",
        timeout_s=60,
    )
    for gateway in gateways:
        gateway.wait_all_free(timeout_s=60)
        wait_until(
            lambda g=gateway: g.pool()["models"]["ds"]["waiting"] == 0,
            what="an empty shared queue",
            timeout_s=60,
        )


def lease_counters(gateway: GatewayProcess) -> dict[str, float]:
    text = plain().get(gateway.url + "/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(("pd_gateway_gate_lease_", "pd_gateway_gate_shared_records"))
    }


def redis_ms(client: Redis) -> float:
    """Now on the Redis server's clock, as the tenants' scripts count it."""
    seconds, micros = client.time()
    return (seconds - EPOCH_S) * 1000 + micros / 1000


# -- the test ----------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # the wheel built from history, on a loaded machine
def test_the_previous_release_and_this_one_share_one_pool_on_one_redis(
    stack: SimStack, redis: RedisServer, release_cache: Path, tmp_path: Path
) -> None:
    release = installed_release(release_cache)
    previous_scripts = released_scripts(release, tmp_path)
    current_scripts = {
        name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()
    }
    assert set(previous_scripts.values()).isdisjoint(current_scripts.values())

    prefix = f"two-releases-{uuid.uuid4().hex[:12]}"
    client = Redis.from_url(redis.url, decode_responses=True)
    with ExitStack() as exits:
        exits.callback(client.close)
        gateways = start_both(exits, deployment_config(stack, redis, prefix), tmp_path, release)
        started_ms = redis_ms(client)
        began = time.monotonic()
        answers = asyncio.run(load(gateways))
        took_s = time.monotonic() - began
        buckets = {
            tenant: client.get(f"{prefix}:tenants:{{{tenant}}}:requests") for tenant in TENANTS
        }
        failed = [(i, answer) for i, answer in enumerate(answers) if answer != (200, "ok")]
        assert failed == [], failed
        all_free(stack, gateways)
        found, decodes = double_bookings(stack.nodes)
        assert found == []
        assert decodes >= REQUESTS

        # Each release ran its own scripts on this Redis: the previous one's are there.
        loaded = client.script_exists(previous_scripts["acquire"], current_scripts["acquire"])
        assert loaded == [True, True]
        # Both granted nodes; no lease was lost, no release refused, nothing unreadable.
        for gateway in gateways:
            counters = lease_counters(gateway)
            assert counters["pd_gateway_gate_lease_grants_total"] > 0, gateway.log_path
            for lost in ("expiries", "fencing_rejections"):
                assert counters[f"pd_gateway_gate_lease_{lost}_total"] == 0, lost
            assert not any("unreadable" in name and value for name, value in counters.items())
        # Both counted against each tenant's one bucket: every request moved it on.
        per_tenant = REQUESTS // len(TENANTS)
        for tenant, tat in buckets.items():
            assert tat is not None, f"{tenant}'s bucket expired: the load took {took_s:.1f} s"
            ahead_ms = float(tat) - started_ms  # 1 ms for the doubles' rounding
            assert ahead_ms >= per_tenant * 60_000 / REQUESTS_PER_MINUTE - 1, (tenant, ahead_ms)
        # Every node free in the shared state itself: no lease, no waiter, no grant left.
        assert list(client.scan_iter(f"{prefix}:lease:*")) == []
        left = [
            key
            for key in client.scan_iter(f"{prefix}:pool:*")
            if key.endswith((":queue", ":wait", ":grants", ":shared"))
        ]
        assert left == []
        for key in client.scan_iter(f"{prefix}:node:*"):
            assert client.hmget(key, "held", "out_ms") == [None, None], key
        assert client.get(f"{prefix}:format") == "1"
