"""docs/kubernetes.md's installation, taken as a new operator takes it: the package copied
out of the repository, the example overlay copied to an overlay of one's own, rendered and
every object validated; and what the package pins and labels for the cluster it goes to."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.render import (
    BACKENDS,
    EVERY_KUSTOMIZATION,
    KUSTOMIZE,
    Doc,
    render,
    render_dir,
)
from tests.deploy.test_manifests import problems
from tests.real_vllm.install import VLLM_RELEASE

pytestmark = pytest.mark.e2e  # kustomize runs as a process (kubectl kustomize)

MONITORING_RELEASE = "kube-prometheus-stack"
"""The label kube-prometheus-stack's Prometheus selects rules and monitors by, for its
Helm release installed under the chart's own name."""


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The package as docs/kubernetes.md's step 2 copies it: somewhere else entirely, its
    example overlay copied to `overlays/production`."""
    package = tmp_path_factory.mktemp("ops") / "pd-gateway"
    shutil.copytree(KUSTOMIZE, package)
    shutil.copytree(package / "overlays" / "example", package / "overlays" / "production")
    yield package


def test_a_copied_overlay_renders_and_validates(copied: Path) -> None:
    docs = render_dir(copied / "overlays" / "production")
    assert [p for doc in docs for p in problems(doc)] == []
    assert docs == render(KUSTOMIZE / "overlays" / "example")  # the same installation


def test_the_overlay_creates_its_namespace(copied: Path) -> None:
    docs = render_dir(copied / "overlays" / "production")
    [namespace] = [d for d in docs if d["kind"] == "Namespace"]
    name = namespace["metadata"]["name"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {name}
    steps = (KUSTOMIZE.parents[1] / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    assert f"kubectl -n {name} create secret" in steps


def test_every_router_yaml_names_a_schema_beside_it_in_the_copy(copied: Path) -> None:
    configs = sorted(copied.rglob("router.yaml"))
    assert len(configs) >= 3  # the base's and both overlays'
    for config in configs:
        first = config.read_text(encoding="utf-8").splitlines()[0]
        match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert match, f"{config}: {first}"
        assert (config.parent / match[1]).resolve() == copied / "router.schema.json"


def test_the_documented_release_label_patch_takes(copied: Path) -> None:
    overlay = copied / "overlays" / "production"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text(encoding="utf-8"))
    kustomization["patches"].append(
        {
            "target": {"group": "monitoring.coreos.com", "name": "pd-gateway"},
            "patch": "- op: replace\n  path: /metadata/labels/release\n  value: prometheus",
        }
    )
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    watched = [d for d in render_dir(overlay) if d["apiVersion"].startswith("monitoring.")]
    assert {d["kind"] for d in watched} == {"ServiceMonitor", "PrometheusRule"}
    assert {d["metadata"]["labels"]["release"] for d in watched} == {"prometheus"}


def test_the_documented_autoscaling_steps_take(copied: Path) -> None:
    """docs/kubernetes.md, "Autoscaling": the component added to an overlay of one's own,
    the settings and the backends' ScaledObjects copied beside it."""
    overlay = copied / "overlays" / "scaled"
    shutil.copytree(copied / "overlays" / "example", overlay)
    for name in ("autoscaling.yaml", "backends.yaml"):
        shutil.copy(copied / "overlays" / "autoscaled" / name, overlay)
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text(encoding="utf-8"))
    kustomization["components"].append("../../components/autoscaling")
    kustomization["resources"] += ["autoscaling.yaml", "backends.yaml"]
    kustomization["patches"] = [
        p for p in kustomization["patches"] if p["target"]["kind"] != "HorizontalPodAutoscaler"
    ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    docs = render_dir(overlay)
    assert [p for doc in docs for p in problems(doc)] == []
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    scaled = {d["metadata"]["name"] for d in docs if d["kind"] == "ScaledObject"}
    assert scaled == {
        d["metadata"]["name"]
        for d in render(KUSTOMIZE / "overlays" / "autoscaled")
        if d["kind"] == "ScaledObject"
    }


def test_the_monitoring_objects_carry_kube_prometheus_stacks_label() -> None:
    docs = render(KUSTOMIZE / "overlays" / "example")
    watched = [d for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert len(watched) == 2
    assert all(d["metadata"]["labels"]["release"] == MONITORING_RELEASE for d in watched)
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    [service] = [
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "pd-gateway"
    ]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "operator"  # where /metrics is served (server.operator_port)
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in str(d)]
    assert all("release" not in d["metadata"].get("labels", {}) for d in dashboards)


def images(docs: list[Doc]) -> set[str]:
    found = set()
    for doc in docs:
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", {}) or spec.get("jobTemplate", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            found.add(container["image"])
    return found


def test_every_image_is_pinned_to_a_release() -> None:
    shipped = {image for k in EVERY_KUSTOMIZATION for image in images(render(k))}
    assert shipped
    for image in shipped:
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[a-z0-9.]+)?", tag), f"{image}: not a release tag"


def test_the_example_vllm_image_is_the_tested_release() -> None:
    vllm = {i for i in images(render(BACKENDS)) if i.startswith("vllm/vllm-openai:")}
    assert vllm == {f"vllm/vllm-openai:v{VLLM_RELEASE}"}
