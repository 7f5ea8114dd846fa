"""`pd-gateway bench --scenario agents`, briefly: every policy runs, the prefix policies
send each later turn where its context is, and the report names its targets."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from bench.agents import POLICIES, AgentOptions, measure, report
from bench.report import embedded, markers
from tests.support.gateway_python import gateway_python


def test_the_scenario_has_its_own_place_in_a_report() -> None:
    start, end = markers("agents")
    page = f"intro\n{start}\nold\n{end}\n{markers()[0]}\n{markers()[1]}\n"
    assert embedded(page, "new\n", start, end) == page.replace("old\n", "new\n")


@pytest.mark.e2e
def test_prefix_affinity_sends_each_turn_where_its_context_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scenario starts its gateway and simulators with this process's interpreter: the
    # gateway's Python, as in every test that starts a gateway.
    monkeypatch.setattr(sys, "executable", gateway_python())
    # Two conversations never wait for an encoding slot (there are two).
    options = replace(AgentOptions.quick(), conversations=2)
    results = measure(options)

    turns = options.conversations * options.turns
    assert set(results.outcomes) == set(POLICIES)
    for name, outcome in results.outcomes.items():
        assert len(outcome.answered) == turns, (name, outcome.errors)
        assert {t.server for t in outcome.answered} <= set(results.urls)
    assert {t.reason for t in results.outcomes["random"].turns} == {"random"}
    oracle = results.outcomes["prefix"].hit_rate(bound=True)
    for name in ("prefix", "prefix_kv_events"):
        outcome = results.outcomes[name]
        later = [t for t in outcome.answered if t.bound_tokens]
        # Every later turn goes by its prefix, and gets most of it from the cache.
        assert [t.reason for t in later] == ["prefix"] * len(later), name
        assert outcome.hit_rate() >= 0.9 * oracle, name
    assert results.outcomes["least_outstanding"].hit_rate() < 0.9 * oracle
    remaining = results.remaining
    assert remaining is not None and len(remaining.answered) == turns, remaining.errors
    assert {t.server for t in remaining.answered} <= set(results.urls[:-1])
    killed = results.killed
    assert killed is not None and results.killed_at is not None
    assert not [code for code in killed.errors if "unreachable" in code]

    table = report(results, "pd-gateway bench --scenario agents --quick")
    assert "| prefix hit rate |" in table and "| target | measured | met |" in table
    assert "healthy on the servers that remain" in table
