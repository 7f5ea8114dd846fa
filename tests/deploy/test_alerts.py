"""The alerts evaluated as Prometheus evaluates them: `promtool test rules` on the rules of
the PrometheusRule, with the unit tests in `alerts/` (hand-built series) and with series
scraped from a gate driven through a real Redis outage.

promtool comes from `python -m tests.deploy.promtool` (the README's test command runs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import GateConfig, RedisGateConfig
from router.gate import make_gate
from router.gate.redis import RedisGate
from router.telemetry.metrics import Metrics
from tests.deploy.promtool import promtool, runs
from tests.deploy.test_monitoring import RULES, alert_rules
from tests.gate.conftest import nodes
from tests.gate.redis_server import running_redis

pytestmark = pytest.mark.e2e  # promtool runs as a process (and one test runs a redis-server)

UNIT_TESTS = Path(__file__).parent / "alerts"


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    assert runs(tool), f"no promtool at {tool}: run `python -m tests.deploy.promtool` first"
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True)


def rules_beside(directory: Path) -> Path:
    """The PrometheusRule's groups as a plain rule file, where the unit tests expect it."""
    spec = yaml.safe_load(RULES.read_text(encoding="utf-8"))["spec"]
    rules = directory / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return rules


def test_the_rules_are_valid(tmp_path: Path) -> None:
    checked = run_promtool("check", "rules", rules_beside(tmp_path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("unit_test", sorted(UNIT_TESTS.glob("*.test.yaml")), ids=lambda p: p.name)
def test_the_alert_unit_tests(unit_test: Path, tmp_path: Path) -> None:
    rules_beside(tmp_path)
    shutil.copy(unit_test, tmp_path)
    result = run_promtool("test", "rules", tmp_path / unit_test.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    fired = set()
    for unit_test in UNIT_TESTS.glob("*.test.yaml"):
        for case in yaml.safe_load(unit_test.read_text(encoding="utf-8"))["tests"]:
            fired |= {t["alertname"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert {rule["alert"] for rule in alert_rules()} <= fired


async def test_a_redis_outage_as_the_gateway_reports_it_fires(tmp_path: Path) -> None:
    """Each step is a scrape: the pool snapshot /metrics reads, then the gauge's value. Redis
    is stopped after four scrapes, with no lease held (nothing to renew)."""
    metrics = Metrics()
    scrapes: list[float] = []
    with running_redis() as server:
        config = GateConfig(
            backend="redis",
            redis=RedisGateConfig(url=server.url, key_prefix="alerts", socket_timeout_s=0.5),
            max_queue=8,
        )
        gate = make_gate(config, nodes(1), metrics.gate)
        assert isinstance(gate, RedisGate)
        try:
            for step in range(12):
                if step == 4:
                    server.stop()
                await gate.snapshot()
                value = metrics.registry.get_sample_value(
                    "pd_gateway_gate_redis_up", {"deployment": "single"}
                )
                assert value is not None
                scrapes.append(value)
        finally:
            await gate.close()
    assert scrapes == [1] * 4 + [0] * 8
    series = 'pd_gateway_gate_redis_up{deployment="single", instance="gw-0"}'
    unit_test = alert_test(series, scrapes, fires_at="4m", quiet_at="3m")
    rules_beside(tmp_path)
    (tmp_path / "outage.test.yaml").write_text(yaml.safe_dump(unit_test), encoding="utf-8")
    result = run_promtool("test", "rules", tmp_path / "outage.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def alert_test(series: str, values: list[float], *, fires_at: str, quiet_at: str) -> dict[str, Any]:
    """A promtool unit test: `series` scraped every 30 s, the Redis alert quiet at
    `quiet_at` and firing for gw-0 at `fires_at` (labels checked, annotations too)."""
    rule = next(r for r in alert_rules() if r["alert"] == "PdGatewayRedisUnreachable")
    annotations = {
        "runbook_url": rule["annotations"]["runbook_url"],
        "summary": rule["annotations"]["summary"].replace("{{ $labels.instance }}", "gw-0"),
        "description": rule["annotations"]["description"],
    }
    return {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [{"series": series, "values": " ".join(f"{v:g}" for v in values)}],
                "alert_rule_test": [
                    {"eval_time": quiet_at, "alertname": rule["alert"], "exp_alerts": []},
                    {
                        "eval_time": fires_at,
                        "alertname": rule["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", "instance": "gw-0"},
                                "exp_annotations": annotations,
                            }
                        ],
                    },
                ],
            }
        ],
    }
