"""A tenant's fence in a member (issue 33), its pure parts: what the provider checks before it
sends a pod (the member's admission policy says the same, tested end to end in test_onboard),
what the tenant's account may do across the member, its NetworkPolicy, and how its pods are
followed namespace by namespace."""

from __future__ import annotations

from typing import Any

from federation import labels, podsecurity
from federation.members.pods import MemberPods
from federation.members.scope import NamespaceScope
from federation.tenancy import policy


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}], **spec}}


LIFECYCLE = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]


def test_the_fence_names_tolerations_and_host_ports_outside_it() -> None:
    assert podsecurity.fence(_pod(tolerations=LIFECYCLE), ()) == []
    virtual = [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]
    assert podsecurity.fence(_pod(tolerations=virtual), (), ignored=("virtual-kubelet.io/provider",)) == []
    found = podsecurity.fence(_pod(tolerations=[{"key": "gpu", "operator": "Exists"}, {"operator": "Exists"}]), ())
    assert [str(v) for v in found] == [
        "spec.tolerations[0].key (gpu is not allowed)",
        "spec.tolerations[1].key (every taint is not allowed)",
    ]
    assert podsecurity.fence(_pod(tolerations=[{"key": "gpu", "operator": "Exists"}]), ("gpu",)) == []
    ports = _pod(containers=[{"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 81}]}])
    assert [str(v) for v in podsecurity.fence(ports, ())] == ["spec.containers[0].ports[1].hostPort (not allowed)"]


def test_a_pod_outside_every_fence_is_refused_with_the_fields_named() -> None:
    pod = _pod(tolerations=[{"key": "gpu", "operator": "Exists"}])
    levels: dict[str, podsecurity.Level] = {"m1": "baseline", "m2": "baseline"}
    fences = {"m1": podsecurity.fence(pod, ()), "m2": podsecurity.fence(pod, ())}
    said = podsecurity.refusal(pod, levels, "restricted", pinned=None, fences=fences)
    assert said is not None and "m1 (tenant fence) forbids spec.tolerations[0].key (gpu is not allowed)" in said
    # A member without a fence (not a tenant's), or one that allows the key, takes it.
    assert podsecurity.refusal(pod, levels, "restricted", pinned=None, fences={"m1": fences["m1"]}) is None
    pinned = podsecurity.refusal(pod, {"m1": "baseline"}, "restricted", pinned="m1", fences=fences)
    assert pinned is not None and pinned.startswith("the tenant fence of member m1, where its job runs, forbids")


def test_the_tenant_reads_pods_and_nodes_across_the_member_only_with_direct_reads() -> None:
    def resources(rules: list[dict[str, Any]]) -> set[str]:
        return {r for rule in rules for r in rule["resources"]}

    assert not {"pods", "nodes", "noderesourcetopologies"} & resources(policy.cluster_rules("t1"))
    assert {"pods", "nodes"} <= resources(policy.cluster_rules("t1", direct_reads=True))
    home = policy.home_rules()
    assert all(rule.get("resourceNames") for rule in home), home  # its registry and its own token only


def test_the_network_policy_admits_the_tenants_namespaces_and_monitoring_only() -> None:
    np = policy.network_policy("t1", "t1-work", policy.Fence(monitoring=("monitoring",)))
    assert np["spec"]["policyTypes"] == ["Ingress"] and np["spec"]["podSelector"] == {}
    assert np["spec"]["ingress"] == [
        {
            "from": [
                {"namespaceSelector": {"matchLabels": {policy.TENANT: "t1"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
            ]
        }
    ]
    assert policy.Fence(tolerations=("gpu",)).toleration_keys() == [
        "gpu",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]


def _member_pod(name: str, namespace: str, owner: labels.Owner) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"u-{name}",
            "labels": owner.labels(),
            "annotations": {labels.ORIGIN_NAMESPACE: "front", labels.ORIGIN_NAME: name},
        },
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"phase": "Running"},
    }


def test_a_tenants_pods_are_relisted_namespace_by_namespace() -> None:
    owner = labels.Owner("vk", "fe")
    pods = MemberPods("m1", None, owner=owner, on_change=lambda key, phase: None, scope=NamespaceScope(registry="r"))  # type: ignore[arg-type]
    into = pods.relist_in("t1-a")
    into.page([_member_pod("a0", "t1-a", owner), _member_pod("a1", "t1-a", owner)])
    into.done()
    into = pods.relist_in("t1-b")
    into.page([_member_pod("b0", "t1-b", owner)])
    into.done()
    assert sorted(pods.by_origin) == ["front/a0", "front/a1", "front/b0"]
    # A fresh list of one namespace drops what is gone from it, and only from it.
    into = pods.relist_in("t1-a")
    into.page([_member_pod("a1", "t1-a", owner)])
    into.done()
    assert sorted(pods.by_origin) == ["front/a1", "front/b0"]
    pods.follow("t1-c")
    assert pods.scope is not None and pods.scope.namespaces == {"t1-c"}


def test_a_pod_created_while_its_namespace_is_listed_is_not_taken_for_gone() -> None:
    """A namespace's first list can be in flight while the first pod goes there: the pod, younger
    than the list, is reported by the watch that follows; it must not be dropped (and its
    front-end pod failed as taken away) because the list did not hold it."""
    owner = labels.Owner("vk", "fe")
    pods = MemberPods("m1", None, owner=owner, on_change=lambda key, phase: None, scope=NamespaceScope(registry="r"))  # type: ignore[arg-type]
    into = pods.relist_in("t1-a")
    pods.created(_member_pod("new", "t1-a", owner))
    into.done()
    assert list(pods.by_origin) == ["front/new"] and not pods.tombstones
    whole = pods.relist()
    pods.created(_member_pod("newer", "t1-a", owner))
    whole.done()  # the list held neither: "new" is gone, "newer" is younger than the list
    assert list(pods.by_origin) == ["front/newer"]
