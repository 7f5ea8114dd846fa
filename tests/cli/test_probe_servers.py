"""What `check --probe` takes from the configuration and how it reports a server: each vLLM
server and proxy once with every use, its load and models in one line, the warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.config import GatewayConfig
from router.preflight.servers import Findings, Use, describe, model_ids, servers_of, warnings
from router.selection.load import Load

TOKENIZER = str(Path(__file__).resolve().parents[2] / "sim" / "fixtures" / "glm")


def node(host: str) -> dict[str, Any]:
    return {"host": host, "ctrl_port": 5557, "http_port": 8080}


def config(*models: dict[str, Any]) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"models": [{"tokenizer": TOKENIZER, **model} for model in models]}
    )


def push_engine(url: str) -> dict[str, Any]:
    return {"url": url, "engine_id": url, "side_channel_host": "h", "side_channel_port": 5600}


def test_every_url_once_with_each_of_its_uses() -> None:
    found = servers_of(
        config(
            {
                "name": "a",
                "latency": {
                    "pools": [
                        {
                            "name": "p1",
                            "prefill": ["http://p:1", "http://p:2"],
                            "nodes": [node("n1")],
                        },
                        {"name": "p2", "prefill": ["http://p:2/"], "nodes": [node("n2")]},
                    ]
                },
                "throughput": {"mode": "pull", "prefill": ["http://p:1"], "decode": ["http://d:1"]},
            },
            {
                "name": "b",
                "throughput": {
                    "mode": "push",
                    "prefill": [push_engine("http://p:1"), push_engine("http://p:3")],
                    "decode": ["http://d:1"],
                },
            },
            {"name": "c", "throughput": {"mode": "proxy", "urls": ["http://x:1"]}},
        )
    )
    assert found == {
        "http://p:1": [
            Use("a", "latency prefill, pool p1"),
            Use("a", "pull prefill"),
            Use("b", "push prefill"),
        ],
        "http://p:2": [Use("a", "latency prefill, pool p1"), Use("a", "latency prefill, pool p2")],
        "http://d:1": [Use("a", "pull decode"), Use("b", "push decode")],
        "http://p:3": [Use("b", "push prefill")],
        "http://x:1": [Use("c", "throughput proxy", proxy=True)],
    }


def test_a_line_shows_the_load_and_the_models() -> None:
    busy = Findings(health="healthy", load=Load(3, 2, 0.255), models=["m", "n"])
    assert describe(busy) == "healthy, running 3, waiting 2, KV cache 25.5%, models: m, n"
    bare = Findings(health="alive (no /health)", models_note="unknown (/v1/models answered 404)")
    assert describe(bare) == (
        "alive (no /health), no vLLM metrics, models: unknown (/v1/models answered 404)"
    )


def test_each_model_the_server_lacks_is_a_warning() -> None:
    findings = Findings(health="healthy", models=["m"])
    assert warnings(findings, ["m", "x", "x"]) == [
        "does not serve 'x', the model name the gateway sends (it serves: m)"
    ]
    assert warnings(findings, ["m"]) == []
    unknown = Findings(health="healthy", models_note="unknown (/v1/models answered 401)")
    assert warnings(unknown, ["m"]) == [
        "cannot tell which models it serves: unknown (/v1/models answered 401)"
    ]


def test_model_ids_of_an_openai_list_only() -> None:
    assert model_ids({"object": "list", "data": [{"id": "a"}, {"id": 3}, "b", {"id": "c"}]}) == [
        "a",
        "c",
    ]
    assert model_ids({"data": []}) == []
    assert model_ids({"data": "a"}) is None
    assert model_ids(["a"]) is None
    assert model_ids(None) is None
