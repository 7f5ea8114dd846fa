"""A reload keeps what the gateway learned of the vLLM servers it still names: the sets of a
model the reload changed take over the health, load figures and prefix index of the sets
they replace, while a server the reload removed starts fresh when a later one adds it back.
Through `AppState.reload`, as `POST /admin/reload` calls it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from router.config import ConfigError, GatewayConfig, parse_config
from router.runtime.state import AppState
from router.selection import Affinity, Load, ServerSet, load_snapshot, scrape_once
from router.selection.affinity import block_hashes

A, B, C, D = (f"http://prefill-{name}:8000" for name in "abcd")
DECODE = ["http://decode-0:8000"]
PROMPT = Affinity(block_hashes(list(range(64))), tokens=64)


def config(tmp_path: Path, prefill: list[str], decode: list[str] = DECODE) -> GatewayConfig:
    model = {
        "name": "m",
        "tokenizer": "deepseek",
        "throughput": {"mode": "pull", "prefill": prefill, "decode": decode},
    }
    # Nothing in the background judges the servers: only what the test tells the sets.
    upstreams = {"probe_interval_s": 0, "load_interval_s": 0}
    return parse_config({"models": [model], "upstreams": upstreams}, base_dir=tmp_path)


@pytest.fixture
async def state(tmp_path: Path) -> AsyncIterator[AppState]:
    running = AppState(config(tmp_path, [A, B, C, D]))
    await running.prepare()
    try:
        yield running
    finally:
        await running.aclose()


def prefill_set(state: AppState) -> ServerSet:
    (servers,) = [s for s in state.epoch.server_sets()["m"] if s.name == "pull:prefill"]
    return servers


async def reload(state: AppState, new: GatewayConfig) -> None:
    before = prefill_set(state)
    assert await state.reload(new) == {"m": "changed"}
    assert prefill_set(state) is not before  # rebuilt, not kept


async def read_load(url: str) -> Load | None:
    return Load(running=2, waiting=6, kv_cache_usage=0.5) if url == B else None


def seen(state: AppState) -> dict[str, Any]:
    return {url: view["state"] for url, view in prefill_set(state).snapshot().items()}


async def test_a_server_still_named_keeps_its_health_load_and_prefix_across_a_reload(
    state: AppState, tmp_path: Path
) -> None:
    servers = prefill_set(state)
    for _ in range(5):
        servers.report(A, "unreachable")
    await scrape_once(state.epoch.server_sets()["m"], read_load, interval_s=60)
    with servers.hold(C, PROMPT):
        pass
    # Something else of the model changes: another decode instance.
    await reload(state, config(tmp_path, [A, B, C, D], [*DECODE, "http://decode-1:8000"]))
    assert seen(state) == {A: "ejected", B: "healthy", C: "healthy", D: "healthy"}
    assert load_snapshot(prefill_set(state))[B]["waiting"] == 6
    assert prefill_set(state).pick(request=PROMPT).reason == "prefix:4 blocks"


async def test_a_server_a_reload_removes_starts_fresh_when_another_adds_it_back(
    state: AppState, tmp_path: Path
) -> None:
    servers = prefill_set(state)
    for url in (A, B):
        for _ in range(5):
            servers.report(url, "unreachable")
    await reload(state, config(tmp_path, [A, C, D]))
    await reload(state, config(tmp_path, [A, B, C, D]))
    assert seen(state) == {A: "ejected", B: "healthy", C: "healthy", D: "healthy"}
    assert prefill_set(state).snapshot()[B]["failures"] == 0


def reload_gauges(state: AppState) -> tuple[float | None, float | None]:
    sample = state.metrics.registry.get_sample_value
    return (
        sample("pd_gateway_config_last_reload_successful"),
        sample("pd_gateway_config_last_reload_success_timestamp_seconds"),
    )


async def test_the_reload_gauges_say_whether_the_last_load_succeeded(
    state: AppState, tmp_path: Path
) -> None:
    loaded, at_start = reload_gauges(state)
    assert loaded == 1 and at_start is not None and at_start > 0
    broken = config(tmp_path, [A])
    model = broken.models[0].model_copy(update={"tokenizer": str(tmp_path / "absent.json")})
    with pytest.raises(ConfigError):
        await state.reload(broken.model_copy(update={"models": [model]}))
    assert reload_gauges(state) == (0, at_start)  # the running configuration serves on
    await reload(state, config(tmp_path, [A, B]))
    loaded, at_reload = reload_gauges(state)
    assert loaded == 1 and at_reload is not None and at_reload >= at_start
