"""The stack launcher: readiness, typed endpoints, errors, and no process left behind."""

import os
import uuid
from pathlib import Path

import httpx
import pytest

from sim.stack import SimStack, StackError

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running_with(marker: str) -> list[int]:
    """Pids whose command line mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_stack_starts_everything_and_leaves_nothing_behind() -> None:
    marker = f"leak-{uuid.uuid4().hex}"
    with SimStack(nodes=2, prefills=1, decodes=1, proxy=True, model=marker) as stack:
        assert len(stack.pids) == 5
        assert all(_alive(pid) for pid in stack.pids)
        urls = [n.url for n in stack.nodes] + [s.url for s in [*stack.prefills, *stack.decodes]]
        assert stack.proxy is not None
        for url in [*urls, stack.proxy.url]:
            assert httpx.get(f"{url}/health").status_code == 200
        assert [s.engine_id for s in stack.prefills] == ["prefill-0"]
        assert stack.decodes[0].role == "decode" and stack.proxy.role == "both"
        assert stack.prefills[0].side_channel_port > 0
        assert "curl" in stack.describe()
        assert f"{stack.nodes[0].ctrl_port}" in stack.describe()
        pids = list(stack.pids)
    assert not any(_alive(pid) for pid in pids)
    assert _running_with(marker) == []


def test_an_exception_inside_the_block_still_tears_down() -> None:
    marker = f"leak-{uuid.uuid4().hex}"
    with pytest.raises(RuntimeError, match="boom"), SimStack(nodes=0, model=marker):
        assert _running_with(marker)
        raise RuntimeError("boom")
    assert _running_with(marker) == []


def test_a_process_that_fails_to_start_is_reported_with_its_stderr() -> None:
    marker = f"leak-{uuid.uuid4().hex}"
    with pytest.raises(StackError, match="unrecognized arguments") as failure:
        SimStack(nodes=1, prefills=1, model=marker, node_args=["--bogus"]).start()
    assert "node-0 exited" in str(failure.value)
    assert _running_with(marker) == []


def test_readiness_timeout_is_an_error_and_cleans_up() -> None:
    marker = f"leak-{uuid.uuid4().hex}"
    with pytest.raises(StackError, match="not ready within"):
        SimStack(nodes=0, prefills=1, model=marker, ready_timeout_s=0).start()
    assert _running_with(marker) == []


def test_one_process_serves_every_simulator_each_on_its_own_ports() -> None:
    marker = f"leak-{uuid.uuid4().hex}"
    with SimStack(nodes=2, prefills=1, proxy=True, model=marker, one_process=True) as stack:
        (pid,) = stack.pids
        assert {n.pid for n in stack.nodes} == {stack.prefills[0].pid} == {pid}
        assert stack.proxy is not None
        servers = [*stack.prefills, stack.proxy]
        assert [s.role for s in servers] == ["prefill", "both"]
        for server in servers:
            models = httpx.get(f"{server.url}/v1/models").json()["data"]
            assert [m["id"] for m in models] == [marker]
        first, second = stack.nodes
        armed = httpx.post(f"{first.url}/sim/faults", json={"slow_start_ms": 1}).json()
        assert armed["faults"] != {}
        assert httpx.get(f"{second.url}/sim/faults").json()["faults"] == {}
        httpx.delete(f"{first.url}/sim/faults").raise_for_status()
    assert not _alive(pid)
    assert _running_with(marker) == []
