"""`GET /v1/models`' cards: vLLM's own under the gateway's names, from the servers the
configuration names, kept briefly, shared by concurrent askers, and a fallback when no
server answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.config import ModelConfig, UpstreamsConfig, parse_config
from router.http.model_cards import (
    TTL_S,
    ModelCards,
    card_servers,
    fallback_card,
    pick_card,
)
from router.upstream import Upstreams
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

NODE = {"host": "127.0.0.1", "ctrl_port": 1, "http_port": 2}


def vllm_card(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": 1700000000,
        "owned_by": "vllm",
        "root": "/models/" + name,
        "parent": None,
        "max_model_len": 2048,
        "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        **fields,
    }


def models(tmp_path: Path, *entries: dict[str, Any]) -> list[ModelConfig]:
    return parse_config({"models": list(entries)}, base_dir=tmp_path).models


def proxy(name: str, *urls: str) -> dict[str, Any]:
    return {"name": name, "tokenizer": "deepseek", "throughput": {"mode": "proxy", "urls": urls}}


class Servers:
    """vLLM servers as a mock transport: each base host answers what `answers` says."""

    def __init__(self) -> None:
        self.answers: dict[str, Callable[[], httpx.Response]] = {}
        self.asked: list[str] = []
        self.gate: asyncio.Event | None = None
        self.arrived = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "GET" and request.url.path == "/v1/models"
        self.asked.append(request.url.host)
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers.get(request.url.host)
        if answer is None:
            raise httpx.ConnectError("refused", request=request)
        return answer()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def servers() -> Servers:
    return Servers()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def cards(servers: Servers, clock: Clock) -> AsyncIterator[ModelCards]:
    upstreams = Upstreams(
        UpstreamsConfig(),
        Timeouts(),
        transport=HttpxTransport(httpx.MockTransport(servers.handle)),
    )
    yield ModelCards(upstreams, clock=clock, wall_clock=lambda: 1234.5)
    await upstreams.aclose()


def test_servers_are_the_native_paths_then_the_prefill_servers_each_once(tmp_path: Path) -> None:
    [pull, push, both] = models(
        tmp_path,
        {
            "name": "pull",
            "tokenizer": "deepseek",
            "throughput": {"mode": "pull", "prefill": ["http://p:1"], "decode": ["http://d:1"]},
        },
        {
            "name": "push",
            "tokenizer": "deepseek",
            "throughput": {
                "mode": "push",
                "decode": ["http://d:2"],
                "prefill": [
                    {
                        "url": "http://p:2",
                        "engine_id": "e",
                        "side_channel_host": "h",
                        "side_channel_port": 5600,
                    }
                ],
            },
        },
        {
            **proxy("both", "http://proxy:1"),
            "latency": {"prefill": ["http://pre:1", "http://proxy:1"], "nodes": [NODE]},
        },
    )
    assert card_servers(pull) == ["http://d:1", "http://p:1"]
    assert card_servers(push) == ["http://d:2", "http://p:2"]
    assert card_servers(both) == ["http://proxy:1", "http://pre:1"]


def test_the_card_is_the_base_model_renamed() -> None:
    listing = {
        "object": "list",
        "data": [
            vllm_card("adapter", parent="served", root="/adapters/a"),
            vllm_card("served"),
            vllm_card("alias"),
        ],
    }
    assert pick_card(listing, "gw-name") == {**vllm_card("served"), "id": "gw-name"}
    assert pick_card(listing, "alias") == vllm_card("alias")
    for other in (None, [], {"data": "x"}, {"data": [5, {"no": "id"}]}):
        assert pick_card(other, "m") is None


async def test_vllms_card_is_served_under_the_gateways_name(
    cards: ModelCards, servers: Servers, tmp_path: Path
) -> None:
    servers.answers["down"] = lambda: httpx.Response(503, json={"error": {}})
    servers.answers["up"] = lambda: httpx.Response(200, json={"data": [vllm_card("served")]})
    [model] = models(tmp_path, proxy("mine", "http://refused:1", "http://down:1", "http://up:1"))
    card = await cards.card(model)
    assert card == {**vllm_card("served"), "id": "mine"}
    assert servers.asked == ["refused", "down", "up"]


async def test_a_card_is_kept_for_a_while_then_asked_for_again(
    cards: ModelCards, servers: Servers, clock: Clock, tmp_path: Path
) -> None:
    servers.answers["up"] = lambda: httpx.Response(200, json={"data": [vllm_card("m")]})
    [model] = models(tmp_path, proxy("m", "http://up:1"))
    await cards.card(model)
    clock.now += TTL_S - 0.1
    await cards.card(model)
    assert servers.asked == ["up"]
    clock.now += 0.2
    await cards.card(model)
    assert servers.asked == ["up", "up"]


async def test_with_no_server_answering_the_fallback_is_served_and_kept(
    cards: ModelCards, servers: Servers, clock: Clock, tmp_path: Path
) -> None:
    servers.answers["junk"] = lambda: httpx.Response(200, content=b"not json")
    [model] = models(tmp_path, proxy("m", "http://junk:1", "http://refused:1"))
    expected = fallback_card("m", 1234)
    assert expected == {
        "id": "m",
        "object": "model",
        "created": 1234,
        "owned_by": "vllm",
        "root": "m",
        "parent": None,
    }
    assert await cards.card(model) == expected
    assert await cards.card(model) == expected
    assert servers.asked == ["junk", "refused"]
    clock.now += TTL_S
    servers.answers["refused"] = lambda: httpx.Response(200, json={"data": [vllm_card("x")]})
    assert (await cards.card(model))["max_model_len"] == 2048


async def test_a_changed_configuration_asks_its_own_servers(
    cards: ModelCards, servers: Servers, tmp_path: Path
) -> None:
    servers.answers["a"] = lambda: httpx.Response(200, json={"data": [vllm_card("a")]})
    servers.answers["b"] = lambda: httpx.Response(200, json={"data": [vllm_card("b")]})
    [before] = models(tmp_path, proxy("m", "http://a:1"))
    [after] = models(tmp_path, proxy("m", "http://b:1"))
    assert (await cards.card(before))["root"] == "/models/a"
    assert (await cards.card(after))["root"] == "/models/b"


async def test_concurrent_askers_share_one_lookup_and_one_that_leaves_cancels_nothing(
    cards: ModelCards, servers: Servers, tmp_path: Path
) -> None:
    servers.answers["up"] = lambda: httpx.Response(200, json={"data": [vllm_card("m")]})
    servers.gate = asyncio.Event()
    [model] = models(tmp_path, proxy("m", "http://up:1"))
    leaving = asyncio.create_task(cards.card(model))
    staying = [asyncio.create_task(cards.card(model)) for _ in range(3)]
    await servers.arrived.wait()
    leaving.cancel()
    servers.gate.set()
    answers = await asyncio.gather(*staying)
    assert answers == [vllm_card("m")] * 3
    assert servers.asked == ["up"]


async def test_a_silent_server_costs_one_lookup_budget(
    cards: ModelCards, servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("router.http.model_cards.LOOKUP_S", 0.05)
    servers.gate = asyncio.Event()  # never set: every server stays silent
    [model] = models(tmp_path, proxy("m", "http://silent:1", "http://other:1"))
    assert (await cards.card(model))["owned_by"] == "vllm"
    assert servers.asked == ["silent"]


async def test_every_configured_model_is_listed(
    cards: ModelCards, servers: Servers, tmp_path: Path
) -> None:
    servers.answers["up"] = lambda: httpx.Response(200, json={"data": [vllm_card("a")]})
    configured = models(tmp_path, proxy("a", "http://up:1"), proxy("b", "http://refused:1"))
    listed = await cards.cards(configured)
    assert [card["id"] for card in listed] == ["a", "b"]
    assert listed[0]["max_model_len"] == 2048 and "max_model_len" not in listed[1]
