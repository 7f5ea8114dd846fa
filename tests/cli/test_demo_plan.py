"""The demo's plan: which simulators a configuration needs, and the configuration moved to them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from demo.plan import DemoError, parser_flags, plan_stacks
from demo.ports import Endpoints, rewrite, shifted, started
from router.config import load_config, parse_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
NODE = {"host": "127.0.0.1", "ctrl_port": 5556, "http_port": 5557}


def model(name: str = "m", **sections: Any) -> dict[str, Any]:
    return {"name": name, "tokenizer": "deepseek", **sections}


def latency(*prefill: str, nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"prefill": list(prefill), "nodes": nodes or [NODE]}


def plans_of(*models: dict[str, Any]) -> list[Any]:
    return plan_stacks(parse_config({"models": list(models)}, base_dir=PROJECT_ROOT))


# The vLLM parser flags of the throughput path's servers, per output_parser.
DS_FLAGS = ["--reasoning-parser", "deepseek_v3", "--tool-call-parser", "deepseek_v32"]
DS_FLAGS += ["--enable-auto-tool-choice"]
GLM_FLAGS = ["--reasoning-parser", "glm45", "--tool-call-parser", "glm47"]
GLM_FLAGS += ["--enable-auto-tool-choice"]


def test_parser_flags_follow_the_output_parser() -> None:
    assert parser_flags("deepseek_v32") == DS_FLAGS
    assert parser_flags("glm47") == GLM_FLAGS
    assert parser_flags("glm45")[3] == "glm45"
    assert parser_flags("none") == []


def servers(plan: Any) -> list[tuple[str, str, str | None, int | None]]:
    return [(s.url, s.role, s.engine_id, s.side_channel_port) for s in plan.servers]


def test_the_default_configuration() -> None:
    ds, glm = plan_stacks(load_config(PROJECT_ROOT / "router.yaml"))
    assert (ds.model.name, ds.tokenizer, ds.host) == ("deepseek-v3.2", "deepseek", "127.0.0.1")
    assert [(n.ctrl_port, n.http_port) for n in ds.nodes] == [(5556, 5557), (5566, 5567)]
    # The latency prefill server is also the pull-mode prefill server: one process.
    assert servers(ds) == [
        ("http://127.0.0.1:8100", "prefill", None, None),
        ("http://127.0.0.1:8200", "decode", None, None),
    ]
    assert ds.stack_args(pin_ports=True) == {
        "node-0": ["--protocol", "0.1.6", "--ctrl-port", "5556", "--http-port", "5557"],
        "node-1": ["--protocol", "0.1.6", "--ctrl-port", "5566", "--http-port", "5567"],
        "prefill-0": [*DS_FLAGS, "--tilert-protocol", "0.1.6", "--port", "8100"],
        "decode-0": [*DS_FLAGS, "--port", "8200"],
    }
    assert glm.tokenizer == str(PROJECT_ROOT / "sim" / "fixtures" / "glm")
    assert servers(glm) == [
        ("http://127.0.0.1:8300", "prefill", "glm-prefill-0", 5600),
        ("http://127.0.0.1:8400", "decode", None, None),
    ]
    assert glm.stack_args(pin_ports=True)["prefill-0"] == [
        *GLM_FLAGS,
        *("--engine-id", "glm-prefill-0", "--tilert-protocol", "0.1.6"),
        *("--port", "8300", "--side-channel-port", "5600"),
    ]
    # Free ports: only what is not a port stays pinned.
    assert glm.stack_args(pin_ports=False) == {
        "node-0": ["--protocol", "0.1.6"],
        "prefill-0": [*GLM_FLAGS, "--engine-id", "glm-prefill-0", "--tilert-protocol", "0.1.6"],
        "decode-0": GLM_FLAGS,
    }


@pytest.mark.parametrize(
    ("throughput", "expected"),
    [
        (
            {"mode": "proxy", "urls": ["http://127.0.0.1:8300"]},
            [("http://127.0.0.1:8100", "prefill"), ("http://127.0.0.1:8300", "both")],
        ),
        (
            {
                "mode": "pull",
                "prefill": ["http://127.0.0.1:8100"],
                "decode": ["http://127.0.0.1:8100"],
            },
            [("http://127.0.0.1:8100", "both")],
        ),
        (
            {
                "mode": "pull",
                "prefill": ["http://127.0.0.1:8101"],
                "decode": ["http://127.0.0.1:8200"],
            },
            [
                ("http://127.0.0.1:8100", "prefill"),
                ("http://127.0.0.1:8101", "prefill"),
                ("http://127.0.0.1:8200", "decode"),
            ],
        ),
    ],
    ids=["proxy", "same-url-prefill-and-decode", "separate"],
)
def test_server_roles(throughput: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    (plan,) = plans_of(model(latency=latency("http://127.0.0.1:8100"), throughput=throughput))
    assert [(s.url, s.role) for s in plan.servers] == expected


def test_a_proxy_stand_in_is_a_both_role_server() -> None:
    proxy = {"mode": "proxy", "urls": ["http://127.0.0.1:8300"]}
    (plan,) = plans_of(model(throughput=proxy))
    assert plan.stack_args(pin_ports=True) == {
        "prefill-0": ["--role", "both", "--engine-id", "proxy-0", "--port", "8300"]
    }


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            [model(latency=latency("http://10.1.2.3:8000"))],
            "model m: '10.1.2.3' is not a loopback address",
        ),
        (
            [model(latency=latency("http://localhost:8100"))],
            "model m: the demo runs a model's simulators on one host",
        ),
        (
            [
                model("a", latency=latency("http://127.0.0.1:8100")),
                model(
                    "b",
                    latency=latency(
                        "http://127.0.0.1:8100", nodes=[{**NODE, "ctrl_port": 6, "http_port": 7}]
                    ),
                ),
            ],
            "http://127.0.0.1:8100 is configured for models 'a' and 'b'",
        ),
        (
            [
                model(
                    throughput={
                        "mode": "push",
                        "prefill": [
                            {
                                "url": "http://127.0.0.1:8100",
                                "engine_id": "p",
                                "side_channel_host": "192.168.0.9",
                                "side_channel_port": 5600,
                            }
                        ],
                        "decode": ["http://127.0.0.1:8200"],
                    }
                )
            ],
            "model m: side_channel_host: '192.168.0.9' is not a loopback address",
        ),
    ],
    ids=["remote", "mixed-hosts", "shared-url", "remote-side-channel"],
)
def test_refusals(models: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(DemoError) as raised:
        plans_of(*models)
    assert str(raised.value).startswith(message)


def test_port_offset_moves_every_port_and_keeps_paths_loadable(tmp_path: Path) -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    doc = rewrite(config, shifted(plan_stacks(config), 1000), port=9000)
    moved = parse_config(doc, base_dir=tmp_path)  # loads from anywhere: paths are absolute
    ds, glm = moved.models
    assert moved.server.port == 9000
    assert ds.latency is not None and glm.latency is not None
    assert ds.latency.prefill == ["http://127.0.0.1:9100"]
    assert [(n.ctrl_port, n.http_port) for n in ds.latency.nodes] == [(6556, 6557), (6566, 6567)]
    assert ds.throughput is not None and ds.throughput.model_dump(exclude_none=True) == {
        "mode": "pull",
        "prefill": ["http://127.0.0.1:9100"],
        "decode": ["http://127.0.0.1:9200"],
        "continuations": 1,
    }
    assert glm.tokenizer == str(PROJECT_ROOT / "sim" / "fixtures" / "glm")
    assert glm.throughput is not None and glm.throughput.mode == "push"
    (engine,) = glm.throughput.prefill
    assert (engine.url, engine.side_channel_port) == ("http://127.0.0.1:9300", 6600)
    assert moved.classification == config.classification


def test_rules_file_path_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text("default: {path: latency}\n", encoding="utf-8")
    (tmp_path / "router.yaml").write_text(
        "classification: {rules_file: rules.yaml}\n"
        "models: [{name: m, tokenizer: deepseek, latency: "
        "{prefill: ['http://127.0.0.1:8100'], nodes: [{host: 127.0.0.1}]}}]\n",
        encoding="utf-8",
    )
    config = load_config(tmp_path / "router.yaml")
    doc = rewrite(config, shifted(plan_stacks(config), 1), port=0)
    assert doc["classification"]["rules_file"] == str(tmp_path / "rules.yaml")
    assert doc["models"][0]["latency"]["pools"][0]["nodes"][0] == {
        "host": "127.0.0.1",
        "ctrl_port": 5557,
        "http_port": 5558,
        "name": None,
        "tilert": "0.1.6",
        "pool": "default",
    }


def test_started_maps_the_configuration_to_the_real_ports() -> None:
    (_, glm) = plan_stacks(load_config(PROJECT_ROOT / "router.yaml"))
    stack = SimpleNamespace(
        # What SimStack publishes (NodeInfo, ServerInfo), without importing the simulators.
        nodes=[SimpleNamespace(ctrl_port=41000, http_port=41001)],
        prefills=[SimpleNamespace(port=42000, side_channel_port=42001)],
        decodes=[SimpleNamespace(port=43000, side_channel_port=43001)],
    )
    endpoints = started(glm, stack)  # type: ignore[arg-type]
    assert endpoints == Endpoints(
        urls={
            "http://127.0.0.1:8300": "http://127.0.0.1:42000",
            "http://127.0.0.1:8400": "http://127.0.0.1:43000",
        },
        nodes={("127.0.0.1", 5576, 5577): (41000, 41001)},
        side_channels={"http://127.0.0.1:8300": 42001, "http://127.0.0.1:8400": 43001},
    )


def test_offset_out_of_range() -> None:
    config = load_config(PROJECT_ROOT / "router.yaml")
    with pytest.raises(DemoError, match="port 5556 moved by -6000 is -444, outside 1-65535"):
        shifted(plan_stacks(config), -6000)


def test_each_pool_runs_the_release_it_names() -> None:
    pools = [
        {"name": "old", "tilert": "0.1.5", "prefill": ["http://127.0.0.1:8100"], "nodes": [NODE]},
        {
            "name": "new",
            "prefill": ["http://127.0.0.1:8300"],
            "nodes": [{**NODE, "ctrl_port": 6, "http_port": 7}],
        },
    ]
    (plan,) = plans_of(model(latency={"pools": pools}))
    assert plan.stack_args(pin_ports=False) == {
        "node-0": ["--protocol", "0.1.5"],
        "node-1": ["--protocol", "0.1.6"],
        "prefill-0": ["--tilert-protocol", "0.1.5"],
        "prefill-1": ["--tilert-protocol", "0.1.6"],
    }
