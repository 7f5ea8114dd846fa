"""Installs NIXL for the `real_vllm` tier's NIXL tests (`test_native_nixl.py`): PyPI's `nixl`
(a meta package: `import nixl` loads whichever `nixl_cuXX` is there, and with a CPU-only
torch the first it finds) and `nixl-cu13`, its binary wheel with UCX inside. Built for CUDA
but needing no GPU: its UCX backend registers host memory (DRAM) and moves it over
shared memory and TCP, which is all vLLM's NixlConnector asks on the CPU platform.

    python -m tests.real_vllm.nixl_install

It goes into a folder of its own, `.venv-vllm/nixl/` (`uv pip install --target`, `--no-deps`:
the meta package names `nixl-cu12` and `nixl-cu13` 1.5.2, which PyPI does not have for
this Python; 1.5.1 is the binary wheels' last release), put on the PYTHONPATH of the NIXL
servers alone: vLLM imports NIXL only for a NIXL connector, and the other servers of the
tier start as before. It goes with `.venv-vllm` (recreated, it is gone, and this installs
it again). Does nothing when it is there and imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.real_vllm.install import VENV, vllm_python
from tests.support import installer

NIXL_PACKAGES = ("nixl==1.5.2", "nixl-cu13==1.5.1")
SITE = VENV / "nixl"
PROBE = "from nixl._api import nixl_agent, nixl_agent_config"


def nixl_site() -> Path:
    """Where the NIXL servers find NIXL: `PD_NIXL_SITE`, else `.venv-vllm/nixl`."""
    return Path(os.environ.get("PD_NIXL_SITE") or SITE)


def nixl_ready(python: Path, site: Path) -> bool:
    """Whether vLLM's interpreter imports NIXL's agent from `site`."""
    if not (python.exists() and site.is_dir()):
        return False
    env = {**os.environ, **installer.WRITES_BYTECODE, "PYTHONPATH": str(site)}
    return subprocess.run([str(python), "-c", PROBE], env=env, capture_output=True).returncode == 0


def install() -> None:
    python, site = vllm_python(), nixl_site()
    if not python.exists():
        sys.exit(f"no vLLM interpreter at {python}: run `python -m tests.real_vllm.install` first")
    if not nixl_ready(python, site):
        try:
            packages = ["--no-deps", "--upgrade", *NIXL_PACKAGES]
            installer.install(python, packages, target=site, compiled=False)
        except installer.InstallFailed as failure:
            sys.exit(f"NIXL did not install in {site}: {failure}")
    if not nixl_ready(python, site):
        sys.exit(f"NIXL did not install in {site}")
    print(f"NIXL is ready in {site}")


if __name__ == "__main__":
    install()
