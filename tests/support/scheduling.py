"""How pytest-xdist shares the suite among its workers: how many there are, and a module
at a time (`--dist loadscope`, so that a module's simulators and gateway start once),
except the real_vllm tier, whose modules go to one worker as one unit, handed out first.

Half again as many workers as CPUs: a third of a worker's time goes to waiting, not
computing (for processes to start, for the stalls and timeouts the tests provoke, for a
`serial` test's turn). On 2 CPUs, with a worker per CPU the CPUs were 73 % busy and the
tests took 818 s; with three workers, 86 % and 757 s, on the same code.

A vLLM server takes 25-100 s to start and 3 GB to run. On one worker, the tier's servers
start one after another (its shared server once per run, each other configuration once),
never two at once; handed out first, the tier runs beside the other modules from the
run's start. Handed out in xdist's own order (the modules with the most tests first), its
small modules came last and made the run's tail, each starting a server while the other
worker had nothing left to do; handed out first but spread over the workers, two servers
started at once and slowed each other and everything else.

The other units follow longest first, as far as the collection tells: those that start
processes (simulators, gateways) before those that run in-process; within each group the
most tests first, except the benchmark scenarios' modules (`tests/bench/`), first among
the process units: each of their few tests runs a whole scenario, 30-45 s. Handed out in
xdist's own order (the most tests first, whatever they do), units of a few end-to-end
tests each came last and made a tail of minutes; handed out by their count of tests, the
scenarios came last among the process units, and the first `serial` test waited up to
25 s for the one running beside it.

The modules holding a `serial` test are one unit too, handed out after the other process
units and before the in-process ones: a `serial` test waits for the test beside it to end
and idles the other worker while it runs. Spread over both workers at the end of a run,
their serial tests waited for each other's neighbours, 108 worker-seconds in a run of
832 s; as one unit on one worker, what runs beside them is the in-process units, tests of
milliseconds. The scheduler sees test ids, not markers, so the modules are named here
(`SERIAL_MODULES`); a `serial` test in a module not named fails the collection.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from xdist.scheduler import LoadScopeScheduling

REAL_VLLM_TIER = "tests/real_vllm/"
SCENARIOS = "tests/bench/"
TIER_SCOPE = "tests/real_vllm: the real-vLLM tier, on one worker"
SERIAL_MODULES = frozenset(
    {
        "tests/e2e/test_event_loop.py",
        "tests/e2e/test_front_door.py",
        "tests/e2e/test_paused_replica.py",
        "tests/e2e/test_replicas.py",
        "tests/e2e/test_upstream_failover.py",
        "tests/sim/test_sim_itl_per_running.py",
    }
)
SERIAL_SCOPE = "the modules holding a serial test, on one worker"


def worker_count() -> int:
    """pytest-xdist's worker count for `-n logical` (the option pyproject.toml sets): half
    again as many as the CPUs this process may run on."""
    cpus = len(os.sched_getaffinity(0))
    return cpus + cpus // 2


class UnnamedSerialModule(pytest.UsageError):
    """A `serial` test in a module `SERIAL_MODULES` does not name."""


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module (or class), the real_vllm tier, or
    the modules holding a serial test."""
    if nodeid.startswith(REAL_VLLM_TIER):
        return TIER_SCOPE
    if nodeid.split("::", 1)[0] in SERIAL_MODULES:
        return SERIAL_SCOPE
    return nodeid.rsplit("::", 1)[0]


def in_handout_order(items: list[pytest.Item]) -> None:
    """Order the collected tests as xdist hands their units out (each unit kept whole):
    the real_vllm tier first; then the units that start processes (marked `e2e`); then
    the modules holding a `serial` test; last the in-process units. Within each group,
    the most tests first (the benchmark scenarios first among the process units)."""
    unnamed = {
        module
        for item in items
        if item.get_closest_marker("serial")
        and (module := item.nodeid.split("::", 1)[0]) not in SERIAL_MODULES
    }
    if unnamed:
        raise UnnamedSerialModule(
            f"serial tests in {sorted(unnamed)}: name the module in"
            " tests/support/scheduling.py's SERIAL_MODULES"
        )
    sizes = Counter(scope_of(item.nodeid) for item in items)
    processes = {scope_of(i.nodeid) for i in items if i.get_closest_marker("e2e")}

    def rank(item: pytest.Item) -> tuple[int, bool, int]:
        scope = scope_of(item.nodeid)
        if scope == TIER_SCOPE:
            group = 0
        elif scope == SERIAL_SCOPE:
            group = 2
        else:
            group = 1 if scope in processes else 3
        scenario = group == 1 and scope.startswith(SCENARIOS)
        return group, not scenario, -sizes[scope]

    items.sort(key=rank)  # stable: each unit's tests stay together and in order


class ModuleScheduling(LoadScopeScheduling):
    """`--dist loadscope` with the real_vllm tier as one unit, the units handed out in the
    order of the collection (`in_handout_order`), not re-sorted by size."""

    def __init__(self, config: pytest.Config, log: object) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)  # type: ignore[arg-type]

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling | None:
    """The scheduler for `--dist loadscope` (None: xdist's own for any other mode)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ModuleScheduling(config, log)
