"""deploy/: the manifests parse, the embedded router.yaml is valid (loaded as `serve` loads
it), and the pieces agree: replicas, rollout, disruption budget, autoscaler, Redis, secrets
and the shutdown arithmetic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import GatewayConfig, load_config, parse_config
from router.server import CUT_GRACE_S

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(name: str) -> list[dict[str, Any]]:
    with (DEPLOY / "k8s" / name).open(encoding="utf-8") as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (first, *_) = workload["spec"]["template"]["spec"]["containers"]
    return first


MANIFESTS = sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml"))


def embedded_config() -> GatewayConfig:
    configmap = find(documents("gateway.yaml"), "ConfigMap", "pd-gateway-config")
    return parse_config(yaml.safe_load(configmap["data"]["router.yaml"]))


def test_the_manifests_are_the_expected_ones() -> None:
    assert MANIFESTS == ["backends-example.yaml", "gateway.yaml", "redis.yaml"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_is_a_named_kubernetes_object(name: str) -> None:
    docs = documents(name)
    assert docs
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert doc["metadata"]["name"]


def test_gateway_configmap_holds_a_valid_configuration(tmp_path: Path) -> None:
    configmap = find(documents("gateway.yaml"), "ConfigMap", "pd-gateway-config")
    config = embedded_config()
    assert config.server.host == "0.0.0.0"
    assert config.gate.backend == "redis"
    # As `serve` reads it: from a file, with the environment's overrides.
    path = tmp_path / "router.yaml"
    path.write_text(configmap["data"]["router.yaml"], encoding="utf-8")
    loaded = load_config(path, environ={})
    assert loaded.gate == config.gate
    assert loaded.models == config.models


def test_gateway_keys_come_from_a_mounted_secret() -> None:
    docs = documents("gateway.yaml")
    config = embedded_config()
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
    # Three replicas sharing the pool through Redis; a rollout never drops below them.
    assert spec["replicas"] == 3
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    gateway = container(deployment)
    assert gateway["args"] == ["serve", "--config", "/etc/pd-gateway/router.yaml"]
    port = gateway["ports"][0]["containerPort"]
    config = embedded_config()
    assert config.server.port == port
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    service = find(docs, "Service", "pd-gateway")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]


def test_termination_grace_covers_the_drain_and_the_cleanups() -> None:
    """The arithmetic in gateway.yaml's comment, from the configuration it ships."""
    deployment = find(documents("gateway.yaml"), "Deployment", "pd-gateway")
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    config = embedded_config()
    t = config.timeouts
    assert config.gate.redis is not None
    redis = config.gate.redis
    # AppState.aclose: the slot cleanups of cut requests, then the gate's close (its waiters
    # leave, its background tasks stop, the close script runs).
    cleanups = max(t.kv_transfer_s + 5, t.cancel_s + t.decode_stall_s) + t.connect_s
    gate_close = 3 * redis.socket_timeout_s + redis.poll_s
    needed = int(pre_stop[1]) + config.server.shutdown_grace_s + CUT_GRACE_S + cleanups
    needed += gate_close
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= needed, (grace, needed)
    # A lease outlives a few missed renewals, and a killed replica's nodes come back well
    # before a drained one would have finished.
    assert redis.renew_every_s * 3 <= redis.lease_ttl_s < grace


def test_disruption_budget_and_autoscaler_keep_three_replicas() -> None:
    docs = documents("gateway.yaml")
    deployment = find(docs, "Deployment", "pd-gateway")
    labels = deployment["spec"]["selector"]["matchLabels"]
    budget = find(docs, "PodDisruptionBudget", "pd-gateway")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert budget["spec"]["maxUnavailable"] == 1
    hpa = find(docs, "HorizontalPodAutoscaler", "pd-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "pd-gateway")
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"] == 3
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    # CPU utilisation is relative to the request: the container must make one.
    assert container(deployment)["resources"]["requests"]["cpu"]


def test_gateway_reaches_the_shipped_redis_with_the_shared_secret() -> None:
    gateway_docs, redis_docs = documents("gateway.yaml"), documents("redis.yaml")
    config = embedded_config()
    assert config.gate.redis is not None
    redis_config = config.gate.redis
    service = find(redis_docs, "Service", "pd-gateway-redis")
    (port,) = service["spec"]["ports"]
    host_port = redis_config.url.partition("://")[2].split("/")[0]
    assert host_port == f"{service['metadata']['name']}:{port['port']}"
    assert not redis_config.url_has_password and redis_config.password is None
    # The password file lies in the mounted Secret that the Redis pod reads too.
    pod = find(gateway_docs, "Deployment", "pd-gateway")["spec"]["template"]["spec"]
    (mount,) = [
        m
        for m in pod["containers"][0]["volumeMounts"]
        if redis_config.password_file is not None
        and redis_config.password_file.startswith(m["mountPath"] + "/")
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret, key = volume["secret"]["secretName"], redis_config.password_file.rsplit("/", 1)[1]
    redis = find(redis_docs, "Deployment", "pd-gateway-redis")
    env = {e["name"]: e for e in container(redis)["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    assert service["spec"]["selector"] == redis["spec"]["selector"]["matchLabels"]
    policy = find(redis_docs, "NetworkPolicy", "pd-gateway-redis")
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"] == pod_labels(gateway_docs)


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, Any]:
    template = find(docs, "Deployment", "pd-gateway")["spec"]["template"]
    labels: dict[str, Any] = template["metadata"]["labels"]
    return labels


def test_redis_is_one_instance_that_never_evicts_a_lease() -> None:
    redis = find(documents("redis.yaml"), "Deployment", "pd-gateway-redis")
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["strategy"]["type"] == "Recreate"  # never two instances at once
    script = " ".join(container(redis)["args"])
    assert "--maxmemory-policy noeviction" in script
    assert "--save ''" in script and "--appendonly no" in script
    assert "$REDIS_PASSWORD" in script and "requirepass" in script


def test_gateway_nodes_are_the_statefulset_pods() -> None:
    (model,) = embedded_config().models
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
