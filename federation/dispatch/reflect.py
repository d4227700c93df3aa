"""What a pod needs beside itself in a member: the ConfigMaps and Secrets it references and the
headless Services that give its job's pods their rendezvous names (pure helpers).

Reflected copies carry our labels, are kept in sync with the front end, and are deleted when no
pod of ours in that member namespace references them any more. Service-account tokens of the
front end are never carried: the member's own service account is used.
"""

from __future__ import annotations

from typing import Any

from federation import labels


def _reflected_meta(meta: dict[str, Any], *, namespace: str, owner: labels.Owner) -> dict[str, Any]:
    """Metadata of any reflected copy: the source's name and labels, plus ours."""
    ours = {**owner.labels(), labels.REFLECTED: "true"}
    return {
        "name": meta.get("name"),
        "namespace": namespace,
        "labels": {**(meta.get("labels") or {}), **ours},
        "annotations": {labels.ORIGIN_UID: meta.get("uid", "")},
    }


def copy_of(obj: dict[str, Any], *, namespace: str, owner: labels.Owner) -> dict[str, Any]:
    """The member copy of a front-end ConfigMap or Secret."""
    meta = obj.get("metadata") or {}
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": obj.get("kind") or ("Secret" if "type" in obj else "ConfigMap"),
        "metadata": _reflected_meta(meta, namespace=namespace, owner=owner),
    }
    for field in ("data", "binaryData", "stringData", "type", "immutable"):
        if field in obj:
            out[field] = obj[field]
    return out


def same_content(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(f) == b.get(f) for f in ("data", "binaryData", "type"))


def headless_services_for(pod_labels: dict[str, str], services: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Headless Services of the namespace whose selector picks the pod."""
    out = []
    for svc in services:
        spec = svc.get("spec") or {}
        selector = spec.get("selector") or {}
        if spec.get("clusterIP") == "None" and selector and all(pod_labels.get(k) == v for k, v in selector.items()):
            out.append(svc)
    return out


def service_copy(svc: dict[str, Any], *, namespace: str, owner: labels.Owner) -> dict[str, Any]:
    meta = svc.get("metadata") or {}
    spec = svc.get("spec") or {}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _reflected_meta(meta, namespace=namespace, owner=owner),
        "spec": {
            "clusterIP": "None",
            "selector": spec.get("selector"),
            "ports": [{k: v for k, v in p.items() if k != "nodePort"} for p in spec.get("ports") or []],
            "publishNotReadyAddresses": spec.get("publishNotReadyAddresses", False),
        },
    }
