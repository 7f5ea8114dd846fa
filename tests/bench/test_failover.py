"""`pd-gateway bench --scenario failover`, briefly: on both TileRT releases, with nodes
dying and stalling mid-answer, and on the native path in `pull` mode with decode servers
dying mid-answer, every answer comes out whole, the continuations are counted, each has
its seam, and the report names its targets."""

from __future__ import annotations

import sys

import pytest

from bench.failover import FAULTS, NATIVE, POOLS, FailoverOptions, measure, report
from tests.support.gateway_python import gateway_python


@pytest.mark.e2e
def test_every_answer_comes_out_whole_and_each_continuation_has_its_seam(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The scenario starts its gateway and simulators with this process's interpreter: the
    # gateway's Python, as in every test that starts a gateway.
    monkeypatch.setattr(sys, "executable", gateway_python())
    options = FailoverOptions.quick()
    rounds = measure(options)

    nodes = [(pool, fault) for pool in POOLS if pool != NATIVE for fault in FAULTS]
    assert [(r.pool, r.fault) for r in rounds] == [*nodes, (NATIVE, "died")]
    for r in rounds:
        assert r.failed == [] and r.whole == r.answers == options.clients * options.answers_each
        assert r.continued >= 1, (r.pool, r.fault)  # the chaos broke something
        assert len(r.seams_s) == r.continued
        assert len(r.prefill_s) >= r.continued  # each continuation's own prefill
        # Each continuation for the round's own fault (the gateway's `reason`): a stall
        # given up after `decode_stall_s`, a cut stream at once.
        if r.fault == "stalled":
            assert set(r.reasons) == {"decode_stalled"}, (r.pool, r.reasons)
        else:
            assert "decode_stalled" not in r.reasons, (r.pool, r.reasons)
    table = report(rounds, options, "pd-gateway bench --scenario failover --quick")
    assert "| seam p50 ms |" in table and "| target | measured | met |" in table
    assert "TileRT 0.1.6 died: seam p50 within a continuation prefill + 50 ms" in table
    assert "vLLM pull died: seam p50 within a continuation prefill + 50 ms" in table
