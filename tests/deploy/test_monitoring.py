"""The Grafana dashboard and the alerts query only metrics the gateway exports (names read
from a live registry, with the exposition's suffixes), and cover what an operator watches."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.gate import GateSnapshot
from router.telemetry.metrics import Metrics
from tests.deploy.render import KUSTOMIZE, render

MONITORING = KUSTOMIZE / "components" / "monitoring"
DASHBOARD = MONITORING / "pd-gateway-dashboard.json"
RULES = MONITORING / "prometheusrule.yaml"

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}


SCRAPED = 'up{job="pd-gateway"}'
"""Prometheus's own series of the gateway's targets (the ServiceMonitor's job)."""
RUNBOOKS = Path(__file__).parents[2] / "docs" / "runbooks.md"


def exported() -> set[str]:
    """Every series name /metrics can show, from the registry itself."""
    metrics = Metrics()
    snapshot = GateSnapshot(nodes=1, busy={"n": None}, out={}, waiting=0, retry_after_s=1)
    metrics.render({"m": snapshot})
    names: set[str] = set()
    for family in metrics.registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bpd_gateway_[a-z0-9_]+", expr))


def dashboard_queries() -> list[str]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for panel in board["panels"] for t in panel["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_every_query_names_an_exported_metric() -> None:
    names = exported()
    queries = dashboard_queries() + [r["expr"] for r in alert_rules()]
    for expr in queries:
        used = metric_names(expr)
        assert used or SCRAPED in expr, f"no gateway metric in {expr!r}"
        assert used <= names, (expr, used - names)


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    used = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert {
        "pd_gateway_requests_total",
        "pd_gateway_reroutes_total",
        "pd_gateway_ttft_seconds_bucket",
        "pd_gateway_inter_token_seconds_bucket",
        "pd_gateway_request_seconds_bucket",
        "pd_gateway_prompt_tokens_total",
        "pd_gateway_completion_tokens_total",
        "pd_gateway_requests_in_flight",
        "pd_gateway_gate_redis_up",
        "pd_gateway_pool_queue_depth",
        "pd_gateway_queue_wait_seconds_bucket",
        "pd_gateway_pool_slot_busy",
        "pd_gateway_pool_node_in_service",
        "pd_gateway_upstream_errors_total",
        "pd_gateway_gate_lease_renewal_failures_total",
        "pd_gateway_gate_redis_round_trip_seconds_bucket",
        "pd_gateway_node_flushes_total",
        "pd_gateway_upstream_server_state",
        "pd_gateway_upstream_ejections_total",
        "pd_gateway_upstream_requests_waiting",
        "pd_gateway_upstream_requests_running",
        "pd_gateway_upstream_kv_cache_usage",
        "pd_gateway_kv_events_last_message_timestamp_seconds",
        "pd_gateway_kv_events_state",
    } <= used
    titles = [p["title"] for p in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]]
    assert len(titles) == len(set(titles))


def test_the_alerts() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert "pd_gateway_pool_node_in_service" in rules["PdGatewayPoolNoNodeInService"]["expr"]
    assert "pd_gateway_reroutes_total" in rules["PdGatewaySustainedSpill"]["expr"]
    assert "pd_gateway_pool_queue_depth" in rules["PdGatewayQueueSaturated"]["expr"]
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_every_alert_leads_to_its_runbook() -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(encoding="utf-8"), re.MULTILINE))
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert set(alerts) == headings  # a section per alert, none for an alert that is gone
    for name, rule in alerts.items():
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}"


@pytest.mark.e2e  # kustomize runs as a process
def test_an_installation_names_where_its_runbooks_are() -> None:
    docs = render(KUSTOMIZE / "overlays" / "example")
    [rules] = [d for d in docs if d["kind"] == "PrometheusRule"]
    urls = [r["annotations"]["runbook_url"] for g in rules["spec"]["groups"] for r in g["rules"]]
    assert len(urls) == len(alert_rules())
    local = yaml.safe_load((KUSTOMIZE / "overlays" / "example" / "runbooks.yaml").read_text())
    base = local["data"]["url"]
    assert base.startswith("https://")
    assert urls == [f"{base}#{r['alert'].lower()}" for r in alert_rules()]
    assert not [d for d in docs if d["metadata"]["name"] == "pd-gateway-runbooks"]  # not applied
