"""`pd-gateway bench --scenario sizing`, briefly: a load that rises and falls makes the
TileRT pool's recommendation rise and fall with it, the gateway's offered load follows the
load's own, every pool gets what it needed worked out beside, and the table says so."""

from __future__ import annotations

import sys

import pytest

from bench.sizing import POOLS, SizingOptions, measure, report
from tests.support.gateway_python import gateway_python


@pytest.mark.e2e
def test_the_recommendation_follows_a_load_that_rises_and_falls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scenario starts its gateway and simulators with this process's interpreter: the
    # gateway's Python, as in every test that starts a gateway.
    monkeypatch.setattr(sys, "executable", gateway_python())
    options = SizingOptions.quick()
    low, high, after = measure(options)

    assert low.failed == high.failed == after.failed == 0
    for phase in (low, high, after):
        assert set(phase.needed) == set(POOLS)
        assert phase.seen, "the gateway's figures were read in every phase"
    assert high.needed["tilert"] > low.needed["tilert"]  # the load itself needed more
    peak = max(r["tilert"] for _, r in high.seen)
    assert peak > max(r["tilert"] for _, r in low.seen)  # and the gateway said so
    assert after.at_end["tilert"] < peak  # and came back down
    # The gateway's offered load at the peak's end: most of the way to the load's own
    # (the rest is the averaging window, as long as the phase).
    assert high.offered_seen is not None
    assert 0.5 * high.offered < high.offered_seen < 1.5 * high.offered

    table = report([low, high, after], options, "pd-gateway bench --scenario sizing --quick")
    assert "| TileRT Erlangs: load / gateway |" in table
    assert "| tilert: recommended at each phase's end within 1 of what it needed |" in table
