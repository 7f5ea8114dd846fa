"""`pd-gateway bench --scenario tenants`, briefly: every run serves its tenants, the greedy
tenant is held to its cap when sharing is fair, each weighted tenant holds node time, the
replicas admit the metered tenant's rate and refuse the rest, and the report names its
targets."""

from __future__ import annotations

import sys

import pytest

from bench.tenants import GREEDY, INTERACTIVE, WEIGHTED, TenantsOptions, jain, measure, report
from tests.support.gateway_python import gateway_python


@pytest.mark.e2e
def test_every_run_serves_its_tenants_and_the_report_names_the_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scenario starts its gateways and simulators with this interpreter: the gateway's.
    monkeypatch.setattr(sys, "executable", gateway_python())
    options = TenantsOptions.quick()
    results = measure(options)

    assert [r.name for r in results.neighbour] == ["alone", "shared", "fair, cap 2"]
    for run in results.neighbour:
        assert run.samples and run.errors() == 0, run.name
        assert {s.tenant for s in run.samples} >= set(INTERACTIVE)
        assert run.gateway_ttft_ms and len(run.wait_ms) >= len(run.gateway_ttft_ms)
    assert not any(s.tenant == GREEDY for s in results.neighbour[0].samples)
    assert [r.name for r in results.weighted] == ["weights off", "weights on"]
    for run in results.weighted:
        assert run.errors() == 0 and all(run.node_seconds[t] > 0 for t in WEIGHTED), run
        assert 0 < jain(run) <= 1
    rate = results.rate
    assert rate is not None and rate.admitted > 0 and rate.refused > 0
    assert [c.store for c in results.limiter] == ["memory", "redis"]
    assert all(c.limited_ms and c.unlimited_ms for c in results.limiter)
    table = report(results, options, "pd-gateway bench --scenario tenants --quick")
    assert "| fair, cap 2: interactive TTFT p99 beside the greedy tenant ≤ 1.5× alone" in table
    assert "| Jain's index of weight-normalised node-seconds ≥ 0.95" in table
    assert "| three replicas admit within 2% of the configured rate" in table
    assert "| the limiter adds ≤ 0.5 ms p50 (redis)" in table
