"""Other routers measured in the same rounds, when installed.

vllm-router (the `vllm-router` package on PyPI, a Rust binary) fronts vLLM prefill and
decode servers in its PD mode, which is what the native path's pull mode does. The hook:
a peer is found by its executable; until one is driven by the bench, it is reported by
state only (JSON `peers`, the Markdown's targets).
"""

from __future__ import annotations

import shutil

VLLM_ROUTER = "vllm-router"


def peer_states() -> dict[str, str]:
    """Each known peer and whether this run measured it."""
    if shutil.which(VLLM_ROUTER) is None:
        return {VLLM_ROUTER: "not installed (pip install vllm-router)"}
    return {VLLM_ROUTER: "installed, not measured by this version of the bench"}
