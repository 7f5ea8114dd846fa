"""The example backends match the configurations that point at them: every model of
every shipped cluster router.yaml has its prefill (TileRT connector + NIXL, token ids
returned), its native decode (NIXL) and its TileRT nodes (a StatefulSet behind a headless
Service, one pod per listed node, of the pool's release), with the vLLM parsers that
correspond to its output_parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from router.config import GatewayConfig, ModelConfig, PullConfig, parse_config
from tests.deploy.render import (
    BACKENDS,
    INSTALLATIONS,
    KUSTOMIZE,
    Doc,
    container,
    find,
    render,
    router_yaml_text,
)

pytestmark = pytest.mark.e2e  # kustomize runs as a process (kubectl kustomize)

VLLM_PARSERS = {
    # output_parser: (--reasoning-parser, --tool-call-parser), vLLM's registered names.
    "glm45": ("glm45", "glm45"),
    "glm47": ("glm45", "glm47"),
    "deepseek_v32": ("deepseek_v3", "deepseek_v32"),
}

install = pytest.mark.parametrize(
    "kustomization", INSTALLATIONS, ids=[str(p.relative_to(KUSTOMIZE)) for p in INSTALLATIONS]
)


def config_of(kustomization: Path) -> GatewayConfig:
    return parse_config(yaml.safe_load(router_yaml_text(render(kustomization))))


def service_workload(docs: list[Doc], url: str) -> Doc:
    """The Deployment behind the Service that `url` names (host and port)."""
    parsed = urlparse(url)
    service = find(docs, "Service", str(parsed.hostname))
    assert parsed.port in [p["port"] for p in service["spec"]["ports"]]
    selector = service["spec"]["selector"]
    (workload,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    ]
    return workload


def flags(workload: Doc) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in container(workload)["args"]:
        name, _, value = arg.partition("=")
        out[name] = value
    return out


def env(workload: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(workload).get("env", [])}


def kv_transfer_config(workload: Doc) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(flags(workload)["--kv-transfer-config"])
    return config


def check_vllm(workload: Doc, model: ModelConfig) -> None:
    args = flags(workload)
    assert args["--served-model-name"] == model.name
    if model.output_parser in VLLM_PARSERS:
        reasoning, tools = VLLM_PARSERS[model.output_parser]
        assert args.get("--reasoning-parser") == reasoning, model.name
        assert args.get("--tool-call-parser") == tools, model.name
        assert "--enable-auto-tool-choice" in args
    else:
        assert "--reasoning-parser" not in args and "--tool-call-parser" not in args


@install
def test_every_model_has_matching_backends(kustomization: Path) -> None:
    backends = render(BACKENDS)
    config = config_of(kustomization)
    for model in config.models:
        assert model.latency is not None
        for pool in model.latency.pools:
            for url in pool.prefill:
                prefill = service_workload(backends, url)
                check_vllm(prefill, model)
                assert "--return-tokens-as-token-ids" in flags(prefill)
                transfer = kv_transfer_config(prefill)
                assert transfer["kv_connector"] == "MultiConnector"
                names = [
                    c["kv_connector"] for c in transfer["kv_connector_extra_config"]["connectors"]
                ]
                assert names == ["TileRTConnector", "NixlConnector"]
                assert pool.tilert in container(prefill)["image"]
            if pool.discover is not None:
                check_discovered(backends, pool.discover, pool.tilert, pool.prefill)
            else:
                check_nodes(backends, pool.nodes, pool.tilert, pool.prefill)
        assert isinstance(model.throughput, PullConfig)
        for url in model.throughput.decode:
            decode = service_workload(backends, url)
            check_vllm(decode, model)
            assert kv_transfer_config(decode)["kv_connector"] == "NixlConnector"


def check_discovered(backends: list[Doc], discover: Any, tilert: str, prefill: list[str]) -> None:
    """A pool found by DNS names the headless Service of its nodes' StatefulSet, with
    their ports."""
    service_name = discover.dns.split(".", 1)[0]
    headless = find(backends, "Service", service_name)
    assert headless["spec"]["clusterIP"] == "None"
    (statefulset,) = [
        d
        for d in backends
        if d["kind"] == "StatefulSet" and d["spec"]["serviceName"] == service_name
    ]
    ports = {p["name"]: p["containerPort"] for p in container(statefulset)["ports"]}
    assert (discover.ctrl_port, discover.http_port) == (ports["ctrl"], ports["http"])
    check_release(backends, statefulset, tilert, prefill)


def check_nodes(backends: list[Doc], nodes: list[Any], tilert: str, prefill: list[str]) -> None:
    """The pool's nodes are exactly the pods of one StatefulSet behind a headless Service,
    of the pool's TileRT release; a 0.1.6 node expects as many senders as its prefill's
    connector sends from."""
    (service_name,) = {node.host.split(".", 1)[1] for node in nodes}
    headless = find(backends, "Service", service_name)
    assert headless["spec"]["clusterIP"] == "None"
    (statefulset,) = [
        d
        for d in backends
        if d["kind"] == "StatefulSet" and d["spec"]["serviceName"] == service_name
    ]
    name = statefulset["metadata"]["name"]
    expected = [f"{name}-{i}.{service_name}" for i in range(statefulset["spec"]["replicas"])]
    assert [node.host for node in nodes] == expected
    ports = {p["name"]: p["containerPort"] for p in container(statefulset)["ports"]}
    assert {(n.ctrl_port, n.http_port) for n in nodes} == {(ports["ctrl"], ports["http"])}
    check_release(backends, statefulset, tilert, prefill)


def check_release(backends: list[Doc], statefulset: Doc, tilert: str, prefill: list[str]) -> None:
    """The nodes run the pool's TileRT release; a 0.1.6 node expects as many senders as
    its prefill's connector sends from."""
    assert container(statefulset)["image"].endswith(":" + tilert)
    assert statefulset["metadata"]["labels"]["pd-gateway/tilert"] == tilert
    node_senders = env(statefulset).get("TILERT_PD_SENDERS")
    for url in prefill:
        prefill_senders = env(service_workload(backends, url)).get("TILERT_PD_SENDERS")
        if tilert == "0.1.6":
            assert node_senders is not None and node_senders == prefill_senders
        else:
            assert node_senders is None and prefill_senders is None  # 0.1.5: rank 0 only


def test_the_parser_table_covers_every_output_parser() -> None:
    from router.parsers.registry import OUTPUT_PARSERS

    assert set(VLLM_PARSERS) == set(OUTPUT_PARSERS) - {"none"}


def test_every_backend_serves_a_model_of_the_example() -> None:
    (overlay,) = [p for p in INSTALLATIONS if p.name == "example"]
    served = {m.name for m in config_of(overlay).models}
    for doc in render(BACKENDS):
        if doc["kind"] == "Deployment":
            assert flags(doc)["--served-model-name"] in served
