"""Loaded at start-up by every process of a NIXL vLLM server (this folder leads its
PYTHONPATH): NIXL's UCX progress thread waits at least a millisecond between idle polls.

NIXL 1.5's Python agent (`nixl_cu13._api.nixl_agent`) sets its progress thread's delay to
0 µs, and the UCX backend's shared progress thread turns the delay into `poll()`'s timeout
in whole milliseconds, rounded up: 0, so the thread never sleeps, and each NIXL server
spins a core while it has nothing to move (two servers: both cores of the test machine,
under every other test running meanwhile). Its loop is event-driven (it wakes on the UCX
workers' event descriptors), so a 1 ms timeout, the least it rounds to, changes no
transfer; it only lets the thread sleep.

The agent's configuration class is replaced, once `nixl_cu13._api` has been imported, by
one that keeps the delay at 1000 µs or more: nothing is imported before vLLM imports NIXL
itself (vLLM sets UCX's environment first).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

API = "nixl_cu13._api"
LEAST_DELAY_US = 1000


def _patch(api: ModuleType) -> None:
    bindings = api.nixlBind
    base = bindings.nixlAgentConfig
    field = base.pthrDelay

    class AgentConfig(base):  # type: ignore[misc, valid-type]
        @property
        def pthrDelay(self) -> int:
            return int(field.fget(self))

        @pthrDelay.setter
        def pthrDelay(self, us: int) -> None:
            field.fset(self, max(int(us), LEAST_DELAY_US))

    bindings.nixlAgentConfig = AgentConfig


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `API` as the other finders do, and patches it once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != API:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


sys.meta_path.insert(0, _AfterImport())
