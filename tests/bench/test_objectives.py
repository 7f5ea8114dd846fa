"""`pd-gateway bench --scenario objectives`, briefly: every policy runs every class on one
deployment, a fixed latency rule puts its classes on nodes and the native policies none,
the objectives policy's answers carry their plans, and the report names its targets."""

from __future__ import annotations

import sys

import pytest

from bench.objectives import CLASSES, POLICIES, ObjectivesOptions, measure, report
from tests.support.gateway_python import gateway_python


@pytest.mark.e2e
def test_each_policy_serves_every_class_and_the_report_names_the_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scenario starts its gateways and simulators with this interpreter: the gateway's.
    monkeypatch.setattr(sys, "executable", gateway_python())
    options = ObjectivesOptions.quick()
    runs = measure(options)

    assert [(r.policy, r.level) for r in runs] == [(p, 1) for p in POLICIES]
    by = {r.policy: r for r in runs}
    for run in runs:
        for cls in CLASSES:
            samples = run.of(cls)
            assert samples and all(s.error is None for s in samples), (run.policy, cls)
    assert all(s.route == "latency" for s in by["all_latency"].samples)
    assert not any(s.route == "latency" for s in by["all_native"].samples)
    assert by["all_native"].node_seconds == 0 < by["all_latency"].node_seconds
    planned = [s for s in by["objectives"].samples if s.cls != "batch"]
    assert planned and all(s.way in ("whole", "split", "tilert") for s in planned)
    assert by["objectives"].prediction_errors()
    table = report(runs, options, "pd-gateway bench --scenario objectives --quick")
    assert "| level | policy | class | answers |" in table
    assert "| level 1: chat attainment ≥ 0.95" in table
    assert "node-seconds ≤ 0.7× all-latency's" in table
    assert "median absolute prediction error ≤ 20% of the actual" in table
    assert "agents' follow-up TTFT p50, conditional ≤ 0.7× always-split's" in table
