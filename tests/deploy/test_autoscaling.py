"""The autoscaling overlay as KEDA would act on it: the gateway's CPU-only HPA gone for a
ScaledObject on CPU, requests in flight and the TileRT queue; each backend of the example
scaled on the gateway's sizing signals; every query asked of the configured Prometheus,
about the installation's namespace, naming metrics the gateway exports; and each query
evaluated by Prometheus's own engine (`promtool test rules`) over the series of two
gateway replicas, to the replicas KEDA should set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.render import KUSTOMIZE, Doc, render
from tests.deploy.test_alerts import run_promtool
from tests.deploy.test_monitoring import exported, metric_names

pytestmark = pytest.mark.e2e  # kustomize and promtool run as processes

AUTOSCALED = KUSTOMIZE / "overlays" / "autoscaled"


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render(AUTOSCALED)


def scaled_objects(docs: list[Doc]) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "ScaledObject"}


def prometheus_triggers(scaled: Doc) -> list[dict[str, Any]]:
    return [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]


def router_yaml(docs: list[Doc]) -> dict[str, Any]:
    (config,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("pd-gateway-config")
    ]
    loaded: dict[str, Any] = yaml.safe_load(config["data"]["router.yaml"])
    return loaded


def test_the_gateway_scales_on_cpu_requests_in_flight_and_the_queue(docs: list[Doc]) -> None:
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]  # KEDA makes it
    gateway = scaled_objects(docs)["pd-gateway"]
    assert gateway["spec"]["scaleTargetRef"] == {"name": "pd-gateway"}
    assert gateway["spec"]["minReplicaCount"] == 3
    kinds = [t["type"] for t in gateway["spec"]["triggers"]]
    assert kinds == ["cpu", "prometheus", "prometheus"]
    queries = " ".join(t["metadata"]["query"] for t in prometheus_triggers(gateway))
    assert {"pd_gateway_requests_in_flight", "pd_gateway_pool_queue_depth"} <= metric_names(queries)


def test_every_scaled_object_targets_a_workload_of_the_example(docs: list[Doc]) -> None:
    backends = render(KUSTOMIZE / "backends-example")
    workloads = {
        (d["kind"], d["metadata"]["name"])
        for d in [*docs, *backends]
        if d["kind"] in ("Deployment", "StatefulSet")
    }
    for name, scaled in scaled_objects(docs).items():
        target = scaled["spec"]["scaleTargetRef"]
        assert (target.get("kind", "Deployment"), target["name"]) in workloads, name


def test_only_a_pool_found_by_dns_follows_its_statefulset(docs: list[Doc]) -> None:
    """Scaling a StatefulSet adds nodes to a pool only where the gateway discovers them."""
    config = router_yaml(docs)
    discovered = {
        m["name"]: m["latency"]["discover"]["dns"]
        for m in config["models"]
        if "discover" in m.get("latency", {})
    }
    tilert = {
        scaled["spec"]["scaleTargetRef"]["name"]: re.search(
            r'model="([^"]+)"', prometheus_triggers(scaled)[0]["metadata"]["query"]
        )
        for scaled in scaled_objects(docs).values()
        if scaled["spec"]["scaleTargetRef"].get("kind") == "StatefulSet"
    }
    assert tilert
    for statefulset, model in tilert.items():
        assert model is not None and discovered.get(model.group(1)) == statefulset


def test_every_query_asks_the_configured_prometheus_about_this_namespace(
    docs: list[Doc],
) -> None:
    settings = yaml.safe_load((AUTOSCALED / "autoscaling.yaml").read_text(encoding="utf-8"))
    assert settings["metadata"]["annotations"]["config.kubernetes.io/local-config"] == "true"
    assert not [d for d in docs if d["metadata"]["name"] == "pd-gateway-autoscaling"]
    names = exported()
    models = {m["name"] for m in router_yaml(docs)["models"]}
    triggers = [t for s in scaled_objects(docs).values() for t in prometheus_triggers(s)]
    assert len(triggers) == 7
    for trigger in triggers:
        metadata = trigger["metadata"]
        assert metadata["serverAddress"] == settings["data"]["prometheus"]
        query = metadata["query"]
        assert f'namespace="{settings["data"]["namespace"]}"' in query, query
        assert metric_names(query) and metric_names(query) <= names, query
        assert set(re.findall(r'model="([^"]+)"', query)) <= models, query
        assert float(metadata["threshold"]) > 0


def promtool_expr_test(
    queries: dict[str, str], series: list[tuple[str, str]], expected: dict[str, float]
) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [
            {"expr": queries[name], "eval_time": "2m", "exp_samples": [{"value": value}]}
            for name, value in expected.items()
        ],
    }


def test_the_queries_add_up_the_replicas_as_the_method_says(
    docs: list[Doc], tmp_path: Path
) -> None:
    """Two gateway replicas of the llm-serving installation, one of another namespace: the
    TileRT nodes are the pool's (one replica's figure), the prefill and decode servers the
    sum of the replicas' demand, rounded up; the gateway's replicas, KEDA's AverageValue
    target aside, the sum of requests in flight and one replica's queue."""
    objects = scaled_objects(docs)
    queries = {
        f"{name}/{trigger['name']}": trigger["metadata"]["query"]
        for name, scaled in objects.items()
        for trigger in prometheus_triggers(scaled)
    }
    ns = 'namespace="llm-serving",job="pd-gateway"'
    elsewhere = 'namespace="staging",job="pd-gateway",instance="s"'
    series = []
    for instance, tilert, prefill, decode, in_flight, queue in (
        ("a", 5, 1.25, 0.6, 100, 7),
        ("b", 5, 0.5, 0.3, 40, 7),
    ):
        labels = f'{ns},instance="{instance}",model="deepseek-v3.2"'
        series += [
            (f'pd_gateway_sizing_recommended_replicas{{{labels},pool="tilert"}}', f"{tilert}x3"),
            (f'pd_gateway_sizing_demand_replicas{{{labels},pool="prefill"}}', f"{prefill}x3"),
            (f'pd_gateway_sizing_demand_replicas{{{labels},pool="decode"}}', f"{decode}x3"),
            (
                f'pd_gateway_requests_in_flight{{{ns},instance="{instance}",path="latency"}}',
                f"{in_flight}x3",
            ),
            (f"pd_gateway_pool_queue_depth{{{labels}}}", f"{queue}x3"),
        ]
    series += [  # another installation's gateway: none of its figures count here
        (
            f'pd_gateway_sizing_recommended_replicas{{{elsewhere},model="deepseek-v3.2",pool="tilert"}}',
            "50x3",
        ),
        (
            f'pd_gateway_sizing_demand_replicas{{{elsewhere},model="deepseek-v3.2",pool="prefill"}}',
            "50x3",
        ),
        (f'pd_gateway_requests_in_flight{{{elsewhere},path="latency"}}', "5000x3"),
    ]
    expected = {
        "deepseek-tilert/tilert-nodes": 5,
        "deepseek-prefill/prefill-servers": 2,  # 1.25 + 0.5, rounded up
        "deepseek-decode/decode-servers": 1,  # 0.9, rounded up
        "pd-gateway/in-flight": 140,
        "pd-gateway/tilert-queue": 7,
    }
    unit = {"rule_files": [], "evaluation_interval": "1m"}
    unit["tests"] = [promtool_expr_test(queries, series, expected)]
    path = tmp_path / "queries.test.yaml"
    path.write_text(yaml.safe_dump(unit), encoding="utf-8")
    result = run_promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    # And the test can fail: a wrong expectation is reported.
    expected["deepseek-prefill/prefill-servers"] = 1
    unit["tests"] = [promtool_expr_test(queries, series, expected)]
    path.write_text(yaml.safe_dump(unit), encoding="utf-8")
    failed = run_promtool("test", "rules", path)
    assert failed.returncode != 0 and "prefill" in failed.stdout + failed.stderr


def test_the_autoscaling_component_leaves_the_base_alone() -> None:
    """Without the component the base keeps its CPU HPA (no KEDA needed)."""
    base = render(KUSTOMIZE / "base")
    assert [d["kind"] for d in base if d["kind"] == "HorizontalPodAutoscaler"]
    assert not [d for d in base if d["kind"] == "ScaledObject"]
