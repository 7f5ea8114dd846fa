"""The background loops have one owner: the application state starts them beside the node
probers, a reload starts a new pool's prober and stops a dropped one's, and closing the
state leaves no loop running."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from router.config import parse_config
from router.runtime.state import AppState

SERVER_LOOPS = {"server prober", "load scraper", "kv events", "pool sizing"}


def closed_port() -> int:
    """A loopback port nobody listens on (probes to it fail at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def config(tmp_path: Path, *, with_pool: bool) -> dict[str, Any]:
    port = closed_port()
    model: dict[str, Any] = {
        "name": "m",
        "tokenizer": "deepseek",
        "throughput": {"mode": "proxy", "urls": [f"http://127.0.0.1:{port}"]},
    }
    if with_pool:
        model["latency"] = {
            "pools": [
                {
                    "name": "p",
                    "prefill": [f"http://127.0.0.1:{port}"],
                    "nodes": [{"host": "127.0.0.1", "ctrl_port": port, "http_port": port}],
                }
            ]
        }
    return {
        "models": [model],
        "upstreams": {"probe_interval_s": 30, "load_interval_s": 30},
        "gate": {"probe_interval_s": 30},
    }


def tasks_running() -> set[str]:
    current = asyncio.current_task()
    return {t.get_name() for t in asyncio.all_tasks() if t is not current and not t.done()}


def loops_running() -> set[str]:
    """The named loops (a round's own tasks, such as a scrape's calls, have no name)."""
    return {name for name in tasks_running() if not name.startswith("Task-")}


async def test_the_state_owns_every_loop_and_a_reload_moves_the_pools_own(tmp_path: Path) -> None:
    state = AppState(parse_config(config(tmp_path, with_pool=True), base_dir=tmp_path))
    await state.start()
    try:
        assert loops_running() == SERVER_LOOPS | {"node prober m"}
        await state.reload(parse_config(config(tmp_path, with_pool=False), base_dir=tmp_path))
        assert loops_running() == SERVER_LOOPS
        await state.reload(parse_config(config(tmp_path, with_pool=True), base_dir=tmp_path))
        assert loops_running() == SERVER_LOOPS | {"node prober m"}
    finally:
        await state.aclose()
    assert tasks_running() == set()
