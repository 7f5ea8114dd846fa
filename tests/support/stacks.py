"""Simulated stacks shared by the modules of a test run, one per shape.

Starting a stack costs a Python process or more and a few seconds; most end-to-end
modules only need simulators of a given shape in a clean state. `StackPool.get(**shape)`
starts a stack the first time a shape is asked for (every simulator in one process, see
`SimStack(one_process=True)`, unless asked otherwise), and hands the same stack to later
modules asking for the same shape, reset (faults cleared, records emptied). Modules that
kill a simulator's process start their own `SimStack` instead.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sim.stack import SimStack
from tests.support.deployment import reset, version_args


class StackPool:
    def __init__(self) -> None:
        self._stacks: dict[str, SimStack] = {}

    def get(self, *, one_process: bool = True, **shape: Any) -> SimStack:
        """A running stack of `shape` (SimStack's keyword arguments), reset. Its simulators
        share one process unless `one_process` is false: a test whose simulator works
        hard (a prompt of 200,000 tokens to count) would stall the others."""
        key = json.dumps({"one_process": one_process, **shape}, sort_keys=True)
        stack = self._stacks.get(key)
        if stack is None:
            stack = SimStack(**shape, one_process=one_process).start()
            self._stacks[key] = stack
        else:
            reset(stack)
        return stack

    def close(self) -> None:
        """Stop every stack at once: one after another, a worker's last test waited up to
        10 s for them (each stack's processes given their grace in turn), at the end of
        the run."""
        stacks, self._stacks = list(self._stacks.values()), {}
        if stacks:
            with ThreadPoolExecutor(len(stacks)) as stopping:
                list(stopping.map(SimStack.stop, stacks))


def latency_stack(pool: StackPool, tilert_version: str) -> SimStack:
    """Four fast nodes of one TileRT release and one prefill server serving `ds` and
    `solo`: the latency path's modules share it."""
    version = version_args(tilert_version)
    return pool.get(
        nodes=4,
        prefills=1,
        model=["ds", "solo"],
        node_args=["--step-ms", "1", *version["node_args"]],
        prefill_args=["--itl-ms", "0", "--prefill-ms-per-token", "0", *version["prefill_args"]],
    )
