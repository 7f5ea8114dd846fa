"""How pytest-xdist shares the suite among its workers: a module at a time (`--dist
loadscope`, so that a module's simulators and gateway start once), except the real_vllm
tier (tests/real_vllm/), whose modules all go to one worker as one unit. Its vLLM servers
take 25-100 s each to start and 3 GB each to run: on one worker, every configuration
starts once per run (the tier's session-wide server too), where two workers would each
start their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

REAL_VLLM_SCOPE = "tests/real_vllm"


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the whole real_vllm tier."""
    module = nodeid.split("::", 1)[0]
    if Path(module).is_relative_to(REAL_VLLM_SCOPE):
        return REAL_VLLM_SCOPE
    return nodeid.rsplit("::", 1)[0]


class ModuleScheduling(LoadScopeScheduling):
    """`--dist loadscope` with the real_vllm tier as one scope."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling | None:
    """The scheduler for `--dist loadscope` (None: xdist's own for any other mode)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return ModuleScheduling(config, log)  # type: ignore[arg-type]
