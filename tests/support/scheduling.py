"""How pytest-xdist shares the suite among its workers: a module at a time (`--dist
loadscope`, so that a module's simulators and gateway start once), except the modules of
the real_vllm tier that use its shared vLLM server (the `real_vllm` fixture), which go to
one worker as one unit. A vLLM server takes 25-100 s to start and 3 GB to run: on one
worker, the shared server starts once per run, where each worker running one of those
modules would start its own. The tier's other modules each start a server of their own
configuration, once, wherever they run.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

# Every module whose tests use the `real_vllm` fixture (tests/real_vllm/conftest.py refuses
# a run where another does).
SHARED_VLLM_MODULES = frozenset(
    f"tests/real_vllm/{name}.py"
    for name in (
        "test_continuation",
        "test_latency_shapes",
        "test_native_proxy",
        "test_requests_accepted",
        "test_server_signals",
        "test_sim_differential",
    )
)
SHARED_VLLM_SCOPE = "tests/real_vllm: the modules on the shared vLLM server"


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module (or class), or the shared server's."""
    if nodeid.split("::", 1)[0] in SHARED_VLLM_MODULES:
        return SHARED_VLLM_SCOPE
    return nodeid.rsplit("::", 1)[0]


class ModuleScheduling(LoadScopeScheduling):
    """`--dist loadscope` with the shared vLLM server's modules as one scope."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling | None:
    """The scheduler for `--dist loadscope` (None: xdist's own for any other mode)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ModuleScheduling(config, log)  # type: ignore[arg-type]
