"""Routing by band (pure): where a pod of a routed job may run, written into its spec at admission.

Users opt in per namespace (label `vkprovider.io/routing` on the namespace) or per job (the same
label on its pods, e.g. in a Job's pod template; `off` opts a job out of its namespace's
policy). Two policies, the two usages of the design we implement:

| policy | ps, worker-min | worker-max |
|---|---|---|
| hybrid ("native floor, elastic acceleration") | native nodes only | virtual nodes preferred (tolerated) |
| elastic ("elastic only") | virtual nodes only | virtual nodes only |

"Native nodes only" is a required node affinity `type NotIn [virtual-kubelet]`; "virtual nodes"
are this provider's own (label `vkprovider.io/instance`, not any virtual kubelet's, nor a
stopped provider's that still shows Ready): "preferred" is a toleration of their taint plus a
preferred affinity (weight 100), so elastic workers still run natively when no capacity is lent;
"only" a toleration and a required affinity. The pod's own constraints are kept: our expression is added
to each of its required terms (AND). A pod's band is its `vkprovider.io/role` label or its
priority (federation.bands), which the apiserver resolves before mutating webhooks run.

The mutation is idempotent (a pod seen twice is changed once) and records what it did in the
annotation `vkprovider.io/routed` ("hybrid/worker-max").
"""

from __future__ import annotations

import copy
from typing import Any

from federation import bands, labels

#: Label on a namespace or a job's pods: the routing policy, `hybrid`, `elastic` or `off` (on a job).
POLICY_LABEL = "vkprovider.io/routing"
#: Annotation the routing webhook writes on a pod it routed: the policy and the pod's band.
ROUTED = "vkprovider.io/routed"
HYBRID = "hybrid"
ELASTIC = "elastic"
OFF = "off"
POLICIES = (HYBRID, ELASTIC)
NODE_TYPE_KEY = "type"
VIRTUAL = "virtual-kubelet"
TAINT_KEY = "virtual-kubelet.io/provider"

TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
OFF_VIRTUAL = {"key": NODE_TYPE_KEY, "operator": "NotIn", "values": [VIRTUAL]}


def policy_of(pod: dict[str, Any], namespace_policy: str | None) -> str | None:
    """The policy that applies: the pod's label first (off: none), else its namespace's."""
    own = ((pod.get("metadata") or {}).get("labels") or {}).get(POLICY_LABEL)
    chosen = own if own is not None else namespace_policy
    return chosen if chosen in POLICIES else None


def on_virtual(instance: str) -> dict[str, Any]:
    """The node affinity expression for this provider's virtual nodes."""
    return {"key": labels.INSTANCE, "operator": "In", "values": [instance]}


def placement(policy: str, band: str, instance: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool]:
    """(required expression, preferred expression, tolerate the virtual nodes) for a band."""
    if policy == ELASTIC:
        return on_virtual(instance), None, True
    if band == bands.WORKER_MAX:
        return None, on_virtual(instance), True
    return OFF_VIRTUAL, None, False


def _require(spec: dict[str, Any], expression: dict[str, Any]) -> None:
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        if expression not in expressions:
            expressions.append(copy.deepcopy(expression))


def _prefer(spec: dict[str, Any], expression: dict[str, Any]) -> None:
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    wanted = {"weight": 100, "preference": {"matchExpressions": [copy.deepcopy(expression)]}}
    if wanted not in preferred:
        preferred.append(wanted)


def route(pod: dict[str, Any], policy: str, instance: str) -> list[dict[str, Any]]:
    """JSON Patch operations that route the pod under `policy`; [] when nothing changes."""
    band = bands.band_of(pod)
    required, preferred, tolerate = placement(policy, band, instance)
    spec = copy.deepcopy(pod.get("spec") or {})
    before_affinity = copy.deepcopy(spec.get("affinity"))
    before_tolerations = copy.deepcopy(spec.get("tolerations"))
    if required is not None:
        _require(spec, required)
    if preferred is not None:
        _prefer(spec, preferred)
    if tolerate:
        tolerations = spec.setdefault("tolerations", [])
        if not any(t.get("key") == TAINT_KEY and t.get("operator") == "Exists" for t in tolerations):
            tolerations.append(dict(TOLERATION))
    ops: list[dict[str, Any]] = []
    if spec.get("affinity") != before_affinity:
        ops.append({"op": "add", "path": "/spec/affinity", "value": spec["affinity"]})
    if spec.get("tolerations") != before_tolerations:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": spec["tolerations"]})
    if not ops:
        return []
    annotations = (pod.get("metadata") or {}).get("annotations")
    if annotations is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ROUTED: f"{policy}/{band}"}})
    else:
        path = "/metadata/annotations/" + ROUTED.replace("/", "~1")  # JSON Pointer escapes "/"
        ops.append({"op": "add", "path": path, "value": f"{policy}/{band}"})
    return ops


def webhook_configuration(*, name: str, url: str, ca_bundle: str, timeout_seconds: int = 2) -> dict[str, Any]:
    """The MutatingWebhookConfiguration that sends routed pods to `url` (fails open)."""

    def hook(hook_name: str, path: str, namespace_selector: dict[str, Any], object_selector: dict[str, Any]) -> Any:
        return {
            "name": hook_name,
            "clientConfig": {"url": url.rstrip("/") + path, "caBundle": ca_bundle},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "namespaceSelector": namespace_selector,
            "objectSelector": object_selector,
            "failurePolicy": "Ignore",  # the front end never blocks on us: an unrouted pod is still a pod
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout_seconds,
            "matchPolicy": "Equivalent",
            "reinvocationPolicy": "Never",
        }

    unlabelled = {"matchExpressions": [{"key": POLICY_LABEL, "operator": "DoesNotExist"}]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"vkprovider.io/managed": "true"}},
        "webhooks": [
            hook(
                f"{policy}-namespaces.routing.vkprovider.io",
                f"/route/{policy}",
                {"matchExpressions": [{"key": POLICY_LABEL, "operator": "In", "values": [policy]}]},
                unlabelled,
            )
            for policy in POLICIES
        ]
        + [
            hook(
                "jobs.routing.vkprovider.io",
                "/route/pod",
                {},
                {"matchExpressions": [{"key": POLICY_LABEL, "operator": "In", "values": list(POLICIES)}]},
            )
        ],
    }
