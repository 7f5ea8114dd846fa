"""deploy/: the kustomize base and every overlay render, the embedded router.yaml is valid
(loaded as `serve` loads it), and the pieces agree: replicas, rollout, disruption budget,
autoscaler, Redis, secrets, the config's rollout hash and the shutdown arithmetic."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from router.config import GatewayConfig, load_config, parse_config
from router.process.server import CUT_GRACE_S
from tests.deploy.render import (
    BASE,
    INSTALLATIONS,
    KUSTOMIZE,
    Doc,
    container,
    find,
    find_prefix,
    render,
    render_dir,
    router_yaml_text,
)

pytestmark = pytest.mark.e2e  # kustomize runs as a process (kubectl kustomize)

install = pytest.mark.parametrize(
    "kustomization", INSTALLATIONS, ids=[str(p.relative_to(KUSTOMIZE)) for p in INSTALLATIONS]
)


def embedded_config(docs: list[Doc]) -> GatewayConfig:
    return parse_config(yaml.safe_load(router_yaml_text(docs)))


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = find(docs, "Deployment", "pd-gateway")["spec"]["template"]["spec"]
    return spec


def test_the_kustomizations_are_the_expected_ones() -> None:
    names = sorted(
        str(p.parent.relative_to(KUSTOMIZE)) for p in KUSTOMIZE.rglob("kustomization.yaml")
    )
    assert names == [
        "backends-example",
        "base",
        "components/autoscaling",
        "components/ingress",
        "components/monitoring",
        "components/tokenizers",
        "overlays/autoscaled",
        "overlays/example",
    ]


@install
def test_every_object_is_named_and_namespaced_alike(kustomization: Path) -> None:
    docs = render(kustomization)
    assert docs
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert len(namespaces) == 1, namespaces
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert doc["metadata"]["name"]


@install
def test_the_configmap_holds_a_valid_configuration(kustomization: Path, tmp_path: Path) -> None:
    docs = render(kustomization)
    config = embedded_config(docs)
    assert config.server.host == "0.0.0.0"
    assert config.gate.backend == "redis"
    # As `serve` reads it: from a file, with the environment's overrides.
    path = tmp_path / "router.yaml"
    path.write_text(router_yaml_text(docs), encoding="utf-8")
    loaded = load_config(path, environ={})
    assert loaded.gate == config.gate
    assert loaded.models == config.models
    # The Deployment mounts this very ConfigMap (its generated, hashed name).
    name = find_prefix(docs, "ConfigMap", "pd-gateway-config")["metadata"]["name"]
    (volume,) = [v for v in pod_spec(docs)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == name


def test_a_configuration_change_rolls_the_pods(tmp_path: Path) -> None:
    """The ConfigMap's name carries a hash of router.yaml and the pod template names it:
    an edit is a new template, hence a rollout."""
    copy = tmp_path / "kustomize"
    shutil.copytree(KUSTOMIZE, copy)
    before = pod_spec(render_dir(copy / "base"))
    router = copy / "base" / "router.yaml"
    router.write_text(
        router.read_text(encoding="utf-8").replace("max_queue: 256", "max_queue: 128"),
        encoding="utf-8",
    )
    after = pod_spec(render_dir(copy / "base"))

    def config_volume(spec: Doc) -> str:
        (volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
        name: str = volume["configMap"]["name"]
        return name

    assert config_volume(before) != config_volume(after)
    assert config_volume(after).startswith("pd-gateway-config-")


@install
def test_gateway_keys_come_from_a_mounted_secret(kustomization: Path) -> None:
    docs = render(kustomization)
    config = embedded_config(docs)
    files = [config.admin.api_key_file, *(k.key_file for k in config.auth.api_keys)]
    assert config.auth.api_keys, "clients authenticate in the shipped manifests"
    pod = pod_spec(docs)
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "keys"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "keys"]
    assert volume["secret"]["secretName"] == "pd-gateway-keys"
    assert all(f is not None and f.startswith(mount["mountPath"] + "/") for f in files)
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    # Referenced, never shipped: no Secret object in the output.
    assert not [d for d in docs if d["kind"] == "Secret"]


@install
def test_gateway_deployment(kustomization: Path) -> None:
    docs = render(kustomization)
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
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    port, operator_port = ports["http"], ports["operator"]
    config = embedded_config(docs)
    assert (config.server.port, config.server.operator_port) == (port, operator_port)
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(operator_port)
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["resources"]["requests"]["cpu"] and gateway["resources"]["limits"]["memory"]
    account = find(docs, "ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    service = find(docs, "Service", "pd-gateway")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    policy = find(docs, "NetworkPolicy", "pd-gateway")
    assert policy["spec"]["podSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    api, operators = policy["spec"]["ingress"]
    assert api == {"ports": [{"protocol": "TCP", "port": port}]}  # from anywhere
    # /metrics and /admin: this namespace and Prometheus's alone.
    assert operators["ports"] == [{"protocol": "TCP", "port": operator_port}]
    assert operators["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
    ]
    service_ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert service_ports == {"http": "http", "operator": "operator"}


@install
def test_termination_grace_covers_the_drain_and_the_cleanups(kustomization: Path) -> None:
    """The arithmetic in the base's gateway.yaml comment, from the configuration shipped."""
    docs = render(kustomization)
    deployment = find(docs, "Deployment", "pd-gateway")
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    config = embedded_config(docs)
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


@install
def test_disruption_budget_and_autoscaler_keep_three_replicas(kustomization: Path) -> None:
    docs = render(kustomization)
    deployment = find(docs, "Deployment", "pd-gateway")
    labels = deployment["spec"]["selector"]["matchLabels"]
    budget = find(docs, "PodDisruptionBudget", "pd-gateway")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert budget["spec"]["maxUnavailable"] == 1
    if any(d["kind"] == "ScaledObject" for d in docs):  # KEDA's, in place of the HPA
        scaled = find(docs, "ScaledObject", "pd-gateway")
        assert scaled["spec"]["scaleTargetRef"] == {"name": "pd-gateway"}  # a Deployment
        assert scaled["spec"]["minReplicaCount"] == deployment["spec"]["replicas"] == 3
        assert scaled["spec"]["maxReplicaCount"] > scaled["spec"]["minReplicaCount"]
        assert "cpu" in [t["type"] for t in scaled["spec"]["triggers"]]
    else:
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


@install
def test_gateway_reaches_the_shipped_redis_with_the_shared_secret(kustomization: Path) -> None:
    docs = render(kustomization)
    config = embedded_config(docs)
    assert config.gate.redis is not None
    redis_config = config.gate.redis
    service = find(docs, "Service", "pd-gateway-redis")
    redis = find(docs, "StatefulSet", "pd-gateway-redis")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    # The gate asks every member's sentinel, by the names the headless Service gives them.
    members = [f"pd-gateway-redis-{i}.pd-gateway-redis" for i in range(redis["spec"]["replicas"])]
    sentinels = ",".join(f"{member}:{ports['sentinel']}" for member in members)
    assert redis_config.url == f"redis+sentinel://{sentinels}/pdgw"
    assert redis["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    env = {e["name"]: e for e in container(redis)["env"]}
    assert env["PEERS"]["value"].split() == members
    assert env["MASTER_NAME"]["value"] == "pdgw"
    assert not redis_config.url_has_password and redis_config.password is None
    # The password file lies in the mounted Secret that the Redis pods read too.
    pod = pod_spec(docs)
    (mount,) = [
        m
        for m in pod["containers"][0]["volumeMounts"]
        if redis_config.password_file is not None
        and redis_config.password_file.startswith(m["mountPath"] + "/")
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret, key = volume["secret"]["secretName"], redis_config.password_file.rsplit("/", 1)[1]
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
    assert service["spec"]["selector"] == redis["spec"]["selector"]["matchLabels"]
    policy = find(docs, "NetworkPolicy", "pd-gateway-redis")
    (rule,) = policy["spec"]["ingress"]
    template = find(docs, "Deployment", "pd-gateway")["spec"]["template"]
    admitted = [source["podSelector"]["matchLabels"] for source in rule["from"]]
    assert admitted == [template["metadata"]["labels"], redis["spec"]["selector"]["matchLabels"]]
    assert {p["port"] for p in rule["ports"]} == set(ports.values())


@install
def test_redis_is_three_members_with_sentinels_volumes_and_a_disruption_budget(
    kustomization: Path,
) -> None:
    docs = render(kustomization)
    redis = find(docs, "StatefulSet", "pd-gateway-redis")
    assert redis["spec"]["replicas"] == 3  # a sentinel quorum of 2 survives one member lost
    pod = redis["spec"]["template"]["spec"]
    commands = {c["name"]: c["command"] for c in pod["containers"]}
    envs = {c["name"]: {e["name"]: e for e in c["env"]} for c in pod["containers"]}
    # The same member, but a sentinel takes no password: redis-cli must offer none to it.
    assert envs["sentinel"] == {k: v for k, v in envs["redis"].items() if k != "REDISCLI_AUTH"}
    assert commands == {
        "redis": ["sh", "/scripts/redis-member.sh", "redis"],
        "sentinel": ["sh", "/scripts/redis-member.sh", "sentinel"],
    }
    (scripts,) = [v for v in pod["volumes"] if v["name"] == "scripts"]
    generated = find_prefix(docs, "ConfigMap", "pd-gateway-redis-scripts")
    assert scripts["configMap"]["name"] == generated["metadata"]["name"]
    script = generated["data"]["redis-member.sh"]
    assert script == (BASE / "redis-member.sh").read_text(encoding="utf-8")
    assert "--maxmemory-policy noeviction" in script and "--appendonly yes" in script
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    budget = find(docs, "PodDisruptionBudget", "pd-gateway-redis")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == redis["spec"]["selector"]


@install
def test_tokenizers_come_from_a_volume_never_a_configmap(kustomization: Path) -> None:
    docs = render(kustomization)
    config = embedded_config(docs)
    pod = pod_spec(docs)
    mounts = {
        m["mountPath"]: m for m in container(find(docs, "Deployment", "pd-gateway"))["volumeMounts"]
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    for model in config.models:
        if model.tokenizer == "deepseek":
            continue  # shipped in the image
        (mount,) = [m for path, m in mounts.items() if model.tokenizer.startswith(path + "/")]
        volume = volumes[mount["name"]]
        assert "persistentVolumeClaim" in volume, "a tokenizer.json is too big for a ConfigMap"
        assert mount["readOnly"] is True
        find(docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_the_ingress_streams() -> None:
    (overlay,) = [p for p in INSTALLATIONS if p.name == "example"]
    docs = render(overlay)
    ingress = find(docs, "Ingress", "pd-gateway")
    notes = ingress["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 600  # prefill_s
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"]["name"] == "pd-gateway"
