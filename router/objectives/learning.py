"""What an answer teaches, once it has ended: the timings of the servers and the node that
served it (every request, objective or not), and for a request with an objective, how its
prediction compared with what happened (`pd_gateway_prediction_error_seconds`, the access
record's `objective_met`).

Read off the access record, which the paths fill in as they go: constant work per request.
Only answers that ended well teach: a failure's times say nothing of a healthy server.
"""

from __future__ import annotations

import math

from policies import Objective
from router.objectives.prediction import Planned
from router.objectives.timings import Timings
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics


def learn(
    timings: Timings,
    access: AccessRecord,
    planned: Planned | None,
    *,
    objective: Objective | None = None,
    rule: str = "",
    metrics: Metrics | None = None,
    timed: bool = True,
) -> None:
    """`timed`: the answer's stream events are its tokens (not a Responses stream's, whose
    first event comes before any token)."""
    ended_well = access.error_code is None and (access.status or 200) < 400
    if ended_well and timed:
        _teach(timings, access)
    if planned is not None and objective is not None:
        _judge(access, planned, objective, rule, metrics, ended_well and timed)


def _teach(timings: Timings, access: AccessRecord) -> None:
    # A request moved from the latency path (a spill, the guard) started its native answer
    # late, after a wait for a node perhaps: its first-token time is no server's.
    ttft_s = None if access.ttft_ms is None or access.reroute_reason else access.ttft_ms / 1e3
    prefill_s = None if access.prefill_ms is None else access.prefill_ms / 1e3
    itl_s = access.itl_s
    if access.prefill is not None and prefill_s is not None and access.prefill_tokens is not None:
        timings.learn_prefill(access.prefill, access.prefill_tokens, prefill_s)
    if access.path == "latency" and access.node is not None:
        if access.continued or access.native_decode is not None:
            return  # a seam in its times: no one node's or hand-off's
        if ttft_s is not None and prefill_s is not None:
            waited_s = (access.queue_wait_ms or 0.0) / 1e3
            timings.learn_handoff("tilert", max(0.0, ttft_s - waited_s - prefill_s))
        if itl_s is not None:
            timings.learn_node_gap(access.node, itl_s)
        return
    server = access.upstream
    if access.path != "throughput" or server is None:
        return
    if access.native_way == "split":
        if ttft_s is not None and prefill_s is not None:
            timings.learn_handoff("split", max(0.0, ttft_s - prefill_s))
    elif ttft_s is not None and access.uncached_tokens is not None:
        timings.learn_whole(server, access.uncached_tokens, ttft_s)
    if itl_s is not None and access.running is not None:
        timings.learn_gap(server, access.running, itl_s)


def _judge(
    access: AccessRecord,
    planned: Planned,
    objective: Objective,
    rule: str,
    metrics: Metrics | None,
    measured: bool,
) -> None:
    """The prediction against what happened: the objective met or missed on every bound that
    could be measured (a non-streamed answer has no first-token time; an answer that failed
    missed it); the prediction's error where the answer went the planned way."""
    prediction = planned.prediction
    way = _served_way(access)
    ttft_s = None if access.ttft_ms is None else access.ttft_ms / 1e3
    itl_s = access.itl_s
    checks = []
    if objective.ttft_ms is not None and ttft_s is not None:
        checks.append(ttft_s * 1e3 <= objective.ttft_ms)
    if objective.itl_ms is not None and itl_s is not None:
        checks.append(itl_s * 1e3 <= objective.itl_ms)
    failed = access.error_code is not None or (access.status or 200) >= 400
    met = False if failed else (all(checks) if checks and measured else None)
    access.objective_met = met
    if metrics is None:
        return
    outcome = "unmeasured" if met is None else "met" if met else "missed"
    metrics.objective(access.model or "", rule, way, outcome)
    if not measured or way != prediction.name:
        return
    for quantity, actual, predicted in (
        ("ttft", ttft_s, prediction.ttft_s),
        ("itl", itl_s, prediction.itl_s),
    ):
        if actual is not None and math.isfinite(predicted):
            metrics.prediction_error(access.model or "", way, quantity, actual - predicted)


def _served_way(access: AccessRecord) -> str:
    """The way that served the answer: a node, or the native way (the proxy's in proxy
    mode, where the gateway does not split)."""
    if access.path == "latency":
        return "tilert"
    return access.native_way or "proxy"
