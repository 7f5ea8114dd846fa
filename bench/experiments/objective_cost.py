"""What do objectives cost per request, in CPU: planning a request with an objective (three
ways predicted, the choice, what the paths are told), and learning from every answer's end,
with and without an objective to judge?

Times each step over many requests in this process (`time.process_time`, so other load on
the machine does not count), with learned timings for a realistic number of servers and
nodes. The budget: under 50 µs of CPU per request where objectives are not
used. Run: `python -m bench.experiments.objective_cost [--requests N]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from policies import Objective
from router.config import ObjectivesConfig
from router.objectives import Timings, WayFacts, choose, planned, predict
from router.objectives.learning import learn
from router.objectives.prediction import Planned
from router.selection import Choice
from router.telemetry.access import AccessRecord
from router.telemetry.metrics import Metrics

SERVERS = [f"http://decode-{i}:8000" for i in range(8)]
PREFILLS = [f"http://prefill-{i}:8000" for i in range(4)]
NODES = [f"10.0.0.{i}:5557" for i in range(16)]


def trained() -> Timings:
    timings = Timings(ObjectivesConfig())
    for i in range(200):
        timings.learn_prefill(PREFILLS[i % 4], 1000 + i, 0.05 + i * 1e-5)
        timings.learn_whole(SERVERS[i % 8], 500 + i, 0.08)
        timings.learn_gap(SERVERS[i % 8], 1 + i % 12, 0.01 + 0.001 * (i % 12))
        timings.learn_node_gap(NODES[i % 16], 0.005)
        timings.learn_handoff("split", 0.02)
        timings.learn_handoff("tilert", 0.02)
    return timings


def per_request_us(step: Callable[[int], object], requests: int) -> float:
    started = time.process_time()
    for i in range(requests):
        step(i)
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    requests = parser.parse_args().requests
    timings, metrics = trained(), Metrics()
    objective = Objective(ttft_ms=500, itl_ms=20)

    def plan(i: int) -> None:
        decode, prefill = Choice(SERVERS[i % 8], "load"), Choice(PREFILLS[i % 4], "load")
        facts = (
            WayFacts("whole", 800, decode, running=1 + i % 12),
            WayFacts("split", 1200, decode, prefill, running=1 + i % 12),
            WayFacts("tilert", 1200, prefill=prefill, wait_s=0.1),
        )
        planned(choose(objective, tuple(predict(f, timings) for f in facts), "best"), "best")

    def record(i: int) -> AccessRecord:
        access = AccessRecord("r", model="m", path="throughput", status=200)
        access.native_way, access.upstream, access.running = "split", SERVERS[i % 8], 3
        access.prefill, access.prefill_ms, access.prefill_tokens = PREFILLS[i % 4], 50.0, 1000
        access.ttft_ms = 80.0
        access.token_gap(0.5, 50)
        return access

    prediction = predict(WayFacts("whole", 800, Choice(SERVERS[0], "load"), running=2), timings)
    judged = Planned(prediction, prediction)
    results = {
        "plan a request with an objective (3 ways)": per_request_us(plan, requests),
        "learn from an answer without an objective": per_request_us(
            lambda i: learn(timings, record(i), None), requests
        ),
        "learn from an answer with an objective (judged, 3 metric updates)": per_request_us(
            lambda i: learn(
                timings, record(i), judged, objective=objective, rule="r", metrics=metrics
            ),
            requests,
        ),
        "of which: the record itself": per_request_us(record, requests),
    }
    for what, us in results.items():
        print(f"{us:8.1f} µs  {what}")


if __name__ == "__main__":
    main()
