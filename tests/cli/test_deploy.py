"""deploy/: the manifests parse, the embedded router.yaml is valid, and the pieces agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import parse_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(name: str) -> list[dict[str, Any]]:
    with (DEPLOY / "k8s" / name).open(encoding="utf-8") as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (first, *_) = workload["spec"]["template"]["spec"]["containers"]
    return first


@pytest.mark.parametrize("name", ["gateway.yaml", "backends-example.yaml"])
def test_every_manifest_is_a_named_kubernetes_object(name: str) -> None:
    docs = documents(name)
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert doc["metadata"]["name"]


def test_gateway_configmap_holds_a_valid_configuration() -> None:
    configmap = find(documents("gateway.yaml"), "ConfigMap", "pd-gateway-config")
    config = parse_config(yaml.safe_load(configmap["data"]["router.yaml"]))
    assert config.server.host == "0.0.0.0"
    assert config.gate.backend == "memory"


def test_gateway_keys_come_from_a_mounted_secret() -> None:
    docs = documents("gateway.yaml")
    configmap = find(docs, "ConfigMap", "pd-gateway-config")
    config = parse_config(yaml.safe_load(configmap["data"]["router.yaml"]))
    files = [config.admin.api_key_file, *(k.key_file for k in config.auth.api_keys)]
    assert config.auth.api_keys, "clients authenticate in the shipped manifests"
    pod = find(docs, "Deployment", "pd-gateway")["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "keys"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "keys"]
    assert volume["secret"]["secretName"] == "pd-gateway-keys"
    assert all(f is not None and f.startswith(mount["mountPath"] + "/") for f in files)
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_gateway_deployment() -> None:
    docs = documents("gateway.yaml")
    deployment = find(docs, "Deployment", "pd-gateway")
    spec = deployment["spec"]
    # One replica per pool, never two at once, until the gate state is shared.
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    gateway = container(deployment)
    assert gateway["args"] == ["serve", "--config", "/etc/pd-gateway/router.yaml"]
    port = gateway["ports"][0]["containerPort"]
    configmap = find(docs, "ConfigMap", "pd-gateway-config")
    assert yaml.safe_load(configmap["data"]["router.yaml"])["server"]["port"] == port
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    pre_stop = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # Room for the preStop sleep, the drain of in-flight streams and the slot cleanups.
    config = parse_config(yaml.safe_load(configmap["data"]["router.yaml"]))
    cleanup = config.timeouts.kv_transfer_s + 10  # consuming a transfer cut off mid-flight
    needed = int(pre_stop[1]) + config.server.shutdown_grace_s + cleanup
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= needed
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    service = find(docs, "Service", "pd-gateway")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]


def test_gateway_nodes_are_the_statefulset_pods() -> None:
    configmap = find(documents("gateway.yaml"), "ConfigMap", "pd-gateway-config")
    (model,) = parse_config(yaml.safe_load(configmap["data"]["router.yaml"])).models
    backends = documents("backends-example.yaml")
    statefulset = find(backends, "StatefulSet", "tilert-decode")
    headless = find(backends, "Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    name = statefulset["metadata"]["name"]
    expected = [
        f"{name}-{i}.{headless['metadata']['name']}" for i in range(statefulset["spec"]["replicas"])
    ]
    assert model.latency is not None
    assert [node.host for node in model.latency.nodes] == expected
    ports = {p["name"]: p["containerPort"] for p in container(statefulset)["ports"]}
    assert {(n.ctrl_port, n.http_port) for n in model.latency.nodes} == {
        (ports["ctrl"], ports["http"])
    }
    for service in ("vllm-prefill", "vllm-decode"):
        assert any(
            service in url
            for url in [*model.latency.prefill, *getattr(model.throughput, "decode", [])]
        )


def kv_transfer_config(workload: dict[str, Any]) -> dict[str, Any]:
    (arg,) = [a for a in container(workload)["args"] if a.startswith("--kv-transfer-config=")]
    return json.loads(arg.split("=", 1)[1])


def test_prefill_combines_tilert_and_nixl_and_returns_token_ids() -> None:
    prefill = find(documents("backends-example.yaml"), "Deployment", "vllm-prefill")
    assert "--return-tokens-as-token-ids" in container(prefill)["args"]
    config = kv_transfer_config(prefill)
    assert config["kv_connector"] == "MultiConnector"
    names = [c["kv_connector"] for c in config["kv_connector_extra_config"]["connectors"]]
    assert names == ["TileRTConnector", "NixlConnector"]


def test_native_decode_uses_nixl() -> None:
    decode = find(documents("backends-example.yaml"), "Deployment", "vllm-decode")
    assert kv_transfer_config(decode)["kv_connector"] == "NixlConnector"


def test_dockerfile() -> None:
    lines = [
        line.strip()
        for line in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(line.startswith("RUN pip install .") for line in lines)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    assert lines[-2:] == [
        'ENTRYPOINT ["pd-gateway"]',
        'CMD ["serve", "--config", "/etc/pd-gateway/router.yaml"]',
    ]
