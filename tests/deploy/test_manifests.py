"""Every kustomization shipped renders to objects that validate against the Kubernetes
schemas (kubernetes-validate, bundled), strictly: an unknown field is an error. The
Prometheus Operator's kinds are not in those schemas; they are checked against the
fields of their CRDs that the shipped objects use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy.render import EVERY_KUSTOMIZATION, KUSTOMIZE, Doc, render

pytestmark = pytest.mark.e2e  # kustomize runs as a process (kubectl kustomize)

KUBERNETES = "1.30.0"
"""The oldest release the manifests are checked against (autoscaling/v2, policy/v1 and
every field used are older)."""

_STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": _STRING_MAP},
    "additionalProperties": False,
}
OPERATOR_KINDS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {},
            "kind": {},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "selector": _SELECTOR,
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            },
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {},
            "kind": {},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["groups"],
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string"},
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["alert", "expr"],
                                        "properties": {
                                            "alert": {"type": "string"},
                                            "expr": {"type": "string"},
                                            "for": {
                                                "type": "string",
                                                "pattern": "^[0-9]+(ms|s|m|h)$",
                                            },
                                            "labels": _STRING_MAP,
                                            "annotations": _STRING_MAP,
                                        },
                                        "additionalProperties": False,
                                    },
                                },
                            },
                            "additionalProperties": False,
                        },
                    }
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    },
}

_INT_MIN_0 = {"type": "integer", "minimum": 0}
OPERATOR_KINDS[("keda.sh/v1alpha1", "ScaledObject")] = {
    # KEDA 2.x's CRD (keda.sh_scaledobjects.yaml), the fields the shipped objects use and
    # their neighbours, with its required fields and enums.
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {},
        "kind": {},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                    "additionalProperties": False,
                },
                "pollingInterval": _INT_MIN_0,
                "cooldownPeriod": _INT_MIN_0,
                "initialCooldownPeriod": _INT_MIN_0,
                "idleReplicaCount": _INT_MIN_0,
                "minReplicaCount": _INT_MIN_0,
                "maxReplicaCount": _INT_MIN_0,
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "properties": {"failureThreshold": _INT_MIN_0, "replicas": _INT_MIN_0},
                    "additionalProperties": False,
                },
                "advanced": {
                    "type": "object",
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                # autoscaling/v2's HorizontalPodAutoscalerBehavior
                                "behavior": {"type": "object"},
                            },
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": _STRING_MAP,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {}, "kind": {}},
                                "additionalProperties": False,
                            },
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

every = pytest.mark.parametrize(
    "kustomization",
    EVERY_KUSTOMIZATION,
    ids=[str(p.relative_to(KUSTOMIZE)) for p in EVERY_KUSTOMIZATION],
)


def problems(doc: Doc) -> list[str]:
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    crd = OPERATOR_KINDS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
    if crd is not None:
        validator = jsonschema.Draft202012Validator(crd)
        return [
            f"{where}: {list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {list(exc.path)}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where}: no schema for {doc.get('apiVersion')} {doc.get('kind')}"]
    return []


@every
def test_the_rendered_objects_validate(kustomization: Path) -> None:
    found = [p for doc in render(kustomization) for p in problems(doc)]
    assert found == []


def test_the_validation_catches_a_mistake() -> None:
    base = KUSTOMIZE / "base"
    (deployment,) = [
        d
        for d in render(base)
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "pd-gateway"
    ]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    assert problems(deployment)
    deployment = next(d for d in render(base) if d["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "three"
    assert problems(deployment)


def test_every_kind_shipped_is_checked() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for k in EVERY_KUSTOMIZATION for d in render(k)}
    assert set(OPERATOR_KINDS) <= kinds
    assert {
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("v1", "ServiceAccount"),
        ("v1", "PersistentVolumeClaim"),
        ("batch/v1", "Job"),
        ("policy/v1", "PodDisruptionBudget"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("networking.k8s.io/v1", "Ingress"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    } <= kinds
