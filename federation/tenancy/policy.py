"""What a tenant is in a member cluster: the objects onboarding creates there, and the rules
that keep one tenant's provider inside its own namespaces. Pure; `federation.tenancy.onboard` applies
them.

A tenant (a team with its own offline cluster) reaches a member with one ServiceAccount. What
that account may do, and why:

- **cluster-wide, read only**: nodes, NodeResourceTopologies and pods (the requests model counts
  every pod on a node to know what is free, and the provider follows its own pods with one
  watch), PriorityClasses (to check ours exist);
- **namespaces**: create and patch only. RBAC cannot restrict a create by name, so a
  ValidatingAdmissionPolicy (GA since 1.30) admits only names with the tenant's prefix, carrying
  the tenant's label and Pod Security labels no looser than the member allows; a patch of
  another tenant's namespace is refused the same way. No get or list: other tenants' namespace
  names are not the tenant's business;
- **RoleBindings**: create, admitted only in the tenant's own namespaces, binding only its own
  account to its own namespaced ClusterRole (`bind` on that one role, by name);
- **inside its namespaces** (that namespaced ClusterRole, bound per namespace by the provider
  when it creates one): pods and their logs and streams, the ConfigMaps, Secrets and Services it
  reflects, the gang objects of each dialect, the default ServiceAccount, and a ResourceQuota
  whose content the policy pins to what the member granted.

Pods the account creates must use one of the offline PriorityClasses: a tenant cannot start
online work. What is refused is refused with 403 by the member's own apiserver, so a leaked
credential is no worse than a misbehaving provider.

Kubernetes has no quota across namespaces: the member enforces the tenant's quota in each of
its namespaces, and the provider lends at most that quota in all (its capacity cap).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from federation import bands, labels, podsecurity
from federation.capacity import quantities
from federation.podsecurity import Level

#: On every object onboarding creates, and on the namespaces the tenant's provider creates.
TENANT = "vkprovider.io/tenant"
MANAGED_BY = "app.kubernetes.io/managed-by"
ONBOARD = "vkprovider-onboard"
#: PriorityClasses are shared by tenants: each tenant using one marks it with its own key.
USES_PREFIX = "tenants.vkprovider.io/"
ACCOUNT = "provider"
TOKEN_BINDING = "provider-token"
QUOTA = "vkprovider-tenant"
ROLE_BINDING = "vkprovider-tenant"
NETWORK_POLICY = "vkprovider-tenant"
#: In the tenant's home namespace: the member namespaces its providers made (a data key each).
#: A tenant may not list namespaces; its provider reads this to find its pods after a restart.
REGISTRY = labels.TENANT_REGISTRY
#: The Role (and RoleBinding) that gives the provider its rights in its home namespace.
HOME_ROLE = "vkprovider-tenant-home"
NAME = re.compile(r"^[a-z][a-z0-9]{0,19}$")
#: The label every namespace carries with its own name (Kubernetes sets it).
NAMESPACE_NAME = "kubernetes.io/metadata.name"
#: Tolerations every tenant pod may carry (federation.podsecurity says which and why).
LIFECYCLE_TOLERATIONS = podsecurity.LIFECYCLE_TOLERATIONS

GANG_GROUPS = ["scheduling.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"]


class TenancyError(ValueError):
    """A tenant or quota that cannot be used; the message says why."""


def check_name(tenant: str) -> None:
    # No hyphen: prefix "a-" must never be the start of another tenant's "a-b-".
    if not NAME.match(tenant):
        raise TenancyError(f"tenant {tenant!r}: use 1-20 lower-case letters and digits, starting with a letter")


def home_namespace(tenant: str) -> str:
    return labels.tenant_home(tenant)


def prefix(tenant: str) -> str:
    return f"{tenant}-"


def cluster_role(tenant: str) -> str:
    return f"vkprovider:tenant:{tenant}"


def namespaced_role(tenant: str) -> str:
    return f"vkprovider:tenant:{tenant}:namespaced"


def policy_name(tenant: str) -> str:
    return f"vkprovider-tenant-{tenant}"


def username(tenant: str) -> str:
    return f"system:serviceaccount:{home_namespace(tenant)}:{ACCOUNT}"


def uses_label(tenant: str) -> str:
    return f"{USES_PREFIX}{tenant}"


def tenant_labels(tenant: str) -> dict[str, str]:
    return {TENANT: tenant, MANAGED_BY: ONBOARD}


def parse_quota(text: str | None) -> dict[str, str]:
    """`cpu=8,memory=32Gi,nvidia.com/gpu=4` -> resource -> quantity (validated)."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise TenancyError(f"quota {part!r}: write resource=quantity, as cpu=8")
        try:
            quantities.parse(value)
        except ValueError as exc:
            raise TenancyError(f"quota {name}: {exc}") from exc
        out[name] = value
    return out


def quota_hard(quota: dict[str, str]) -> dict[str, str]:
    """The ResourceQuota `hard` that caps requests (what the scheduler counts)."""
    return {f"requests.{name}": value for name, value in sorted(quota.items())}


def _meta(name: str, tenant: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": tenant_labels(tenant)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def namespaced_rules() -> list[dict[str, Any]]:
    """What the provider does inside one of its namespaces."""
    write = ["get", "list", "watch", "create", "update", "patch", "delete"]
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*write, "deletecollection"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        # Our pods' usage, for the virtual node's stats (federation.usage).
        {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": write},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
        {"apiGroups": GANG_GROUPS, "resources": ["podgroups"], "verbs": [*write, "deletecollection"]},
    ]


def home_rules() -> list[dict[str, Any]]:
    """What the provider does in the tenant's home namespace: keep the registry of its
    namespaces, and renew its own token (TokenRequest for its account alone)."""
    return [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [REGISTRY], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [ACCOUNT], "verbs": ["create"]},
    ]


def cluster_rules(tenant: str, *, direct_reads: bool = False) -> list[dict[str, Any]]:
    """What the provider does across the member: create namespaces (admitted by the policy only
    as the tenant's) and bind its role in them; read PriorityClasses. Reading every pod and node
    is allowed only where the member's owner chose direct reads (a member with one tenant);
    otherwise capacity comes from the member's capacity agent."""
    read = ["get", "list", "watch"]
    rules: list[dict[str, Any]] = []
    if direct_reads:
        rules += [
            {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": read},
            {"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"], "verbs": read},
            {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
        ]
    return [
        *rules,
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": read},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create", "patch"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["create"]},
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "verbs": ["bind"],
            "resourceNames": [namespaced_role(tenant)],
        },
    ]


def allowed_enforce_levels(level: Level) -> list[str]:
    """Pod Security levels a tenant namespace may be labelled with: the member's or stricter."""
    return list(podsecurity.LEVELS[podsecurity.LEVELS.index(level) :])


def _cel(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_list(values: list[str]) -> str:
    return "[" + ", ".join(_cel(v) for v in values) + "]"


def _labelled(obj: str, tenant: str) -> str:
    """CEL: the object `obj` (an expression) carries the tenant's label."""
    label, meta = _cel(TENANT), f"{obj}.metadata"
    return f"has({meta}.labels) && {label} in {meta}.labels && {meta}.labels[{label}] == {_cel(tenant)}"


@dataclass(frozen=True)
class Fence:
    """What a tenant's pods may do in a member beyond its Pod Security level, as onboarding set
    it: tolerations only of these keys (beyond LIFECYCLE_TOLERATIONS), and ingress to its
    namespaces only from its own and from these namespaces (the member's monitoring)."""

    tolerations: tuple[str, ...] = ()
    monitoring: tuple[str, ...] = ()

    def toleration_keys(self) -> list[str]:
        return sorted({*LIFECYCLE_TOLERATIONS, *self.tolerations})


def network_policy(tenant: str, namespace: str, fence: Fence) -> dict[str, Any]:
    """In each tenant namespace: ingress only from the tenant's namespaces and the monitoring
    ones (effective where the member's CNI enforces NetworkPolicy). Egress stays open: pods
    need DNS, storage and the registries."""
    peers: list[dict[str, Any]] = [{"namespaceSelector": {"matchLabels": {TENANT: tenant}}}]
    peers += [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: ns}}} for ns in fence.monitoring]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY,
            "namespace": namespace,
            "labels": {TENANT: tenant, labels.MANAGED: "true"},
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
    }


def _network_policy_rule(tenant: str, fence: Fence) -> str:
    """CEL: a NetworkPolicy create is exactly `network_policy` (policies add up: a second one,
    or a wider one, would open the namespace)."""
    allowed = [f"{{{_cel(TENANT)}: {_cel(tenant)}}}"] + [
        f"{{{_cel(NAMESPACE_NAME)}: {_cel(ns)}}}" for ns in fence.monitoring
    ]
    peer = (
        "has(p.namespaceSelector) && !has(p.podSelector) && !has(p.ipBlock) "
        "&& !has(p.namespaceSelector.matchExpressions) && has(p.namespaceSelector.matchLabels) "
        f"&& p.namespaceSelector.matchLabels in [{', '.join(allowed)}]"
    )
    return (
        f"request.operation == 'CREATE' && object.metadata.name == {_cel(NETWORK_POLICY)} "
        "&& (!has(object.spec.podSelector.matchLabels) || size(object.spec.podSelector.matchLabels) == 0) "
        "&& !has(object.spec.podSelector.matchExpressions) "
        "&& has(object.spec.policyTypes) && object.spec.policyTypes == ['Ingress'] "
        "&& has(object.spec.ingress) && size(object.spec.ingress) == 1 && !has(object.spec.ingress[0].ports) "
        f"&& has(object.spec.ingress[0].from) && size(object.spec.ingress[0].from) == {1 + len(fence.monitoring)} "
        f"&& object.spec.ingress[0].from.all(p, {peer})"
    )


def policy_validations(tenant: str, level: Level, quota: dict[str, str], fence: Fence) -> list[dict[str, Any]]:
    """CEL rules the tenant's own requests must pass. A namespace is the tenant's when it
    carries the tenant's label, which only the tenant's own creates can set: every namespaced
    request is checked against the namespace object, not its name."""
    pre = _cel(prefix(tenant))
    enforce = _cel(f"{podsecurity.LABEL_PREFIX}enforce")
    classes = _cel_list([bands.class_name(b) for b in bands.BANDS])
    hard = quota_hard(quota)
    if hard:
        pinned = " && ".join(
            f"{_cel(k)} in object.spec.hard && quantity(string(object.spec.hard[{_cel(k)}]))"
            f".compareTo(quantity({_cel(v)})) == 0"
            for k, v in hard.items()
        )
        quota_rule = (
            f"object.metadata.name == {_cel(QUOTA)} && has(object.spec.hard) "
            f"&& size(object.spec.hard) == {len(hard)} && {pinned}"
        )
    else:
        quota_rule = "false"
    # The pod itself (not exec, attach or the like) being created or changed.
    # (request.subResource is absent, not empty, for the object itself)
    sub = "(has(request.subResource) ? request.subResource : '')"
    pod = f"request.resource.resource == 'pods' && {sub} == '' && object != null"
    containers = "(has(object.spec.initContainers) ? object.spec.initContainers : []) + object.spec.containers"
    tolerations = _cel_list(fence.toleration_keys())
    return [
        {
            "expression": f"request.resource.resource != 'namespaces' || (object.metadata.name.startsWith({pre}) "
            f"&& {_labelled('object', tenant)} "
            f"&& (request.operation != 'UPDATE' || ({_labelled('oldObject', tenant)})))",
            "message": f"tenant {tenant} may create only namespaces named {prefix(tenant)}… and labelled "
            f"{TENANT}={tenant}, and change only namespaces it created",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'namespaces' || (has(object.metadata.labels) "
            f"&& {enforce} in object.metadata.labels "
            f"&& object.metadata.labels[{enforce}] in {_cel_list(allowed_enforce_levels(level))})",
            "message": f"tenant namespaces must enforce Pod Security level {level} or stricter",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource == 'namespaces' || (namespaceObject != null "
            f"&& {_labelled('namespaceObject', tenant)})",
            "message": f"tenant {tenant} may act only in namespaces it created (labelled {TENANT}={tenant})",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'rolebindings' || object == null "
            f"|| (object.roleRef.kind == 'ClusterRole' && object.roleRef.name == {_cel(namespaced_role(tenant))} "
            f"&& has(object.subjects) && object.subjects.all(s, s.kind == 'ServiceAccount' "
            f"&& s.namespace == {_cel(home_namespace(tenant))} && s.name == {_cel(ACCOUNT)}))",
            "message": f"tenant {tenant} may bind only its own account to {namespaced_role(tenant)}",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({pod}) || (has(object.spec.priorityClassName) "
            f"&& object.spec.priorityClassName in {classes})",
            "message": f"tenant {tenant} may run only pods of the offline PriorityClasses",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({pod}) || request.operation != 'CREATE' || !has(object.spec.nodeName) "
            "|| object.spec.nodeName == ''",
            "message": f"tenant {tenant} may not set spec.nodeName: the member's scheduler places its pods",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({pod}) || !has(object.spec.tolerations) "
            f"|| object.spec.tolerations.all(x, has(x.key) && x.key in {tolerations})",
            "message": f"tenant {tenant} may tolerate only the taints {', '.join(fence.toleration_keys())} "
            "(spec.tolerations)",
            "reason": "Forbidden",
        },
        {
            "expression": f"!({pod}) || request.operation != 'CREATE' || ({containers}).all(c, !has(c.ports) "
            "|| c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))",
            "message": f"tenant {tenant} may not use hostPort (spec.containers[*].ports[*].hostPort)",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'pods' || {sub} != 'binding'",
            "message": f"tenant {tenant} may not bind pods to nodes: the member's scheduler places its pods",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'resourcequotas' || object == null || ({quota_rule})",
            "message": f"tenant {tenant} may create only the quota the member granted it",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'networkpolicies' || ({_network_policy_rule(tenant, fence)})",
            "message": f"tenant {tenant} may create only its namespace's NetworkPolicy {NETWORK_POLICY}, "
            "as onboarding set it, and never change or delete it",
            "reason": "Forbidden",
        },
    ]


def admission_policy(tenant: str, level: Level, quota: dict[str, str], fence: Fence) -> dict[str, Any]:
    every = ["*"]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(policy_name(tenant), tenant),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["namespaces"],
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": every,
                        "resources": [
                            "pods",
                            "pods/*",
                            "configmaps",
                            "secrets",
                            "services",
                            "serviceaccounts",
                            "resourcequotas",
                        ],
                    },
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": every,
                        "resources": ["rolebindings"],
                    },
                    {
                        "apiGroups": ["networking.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": every,
                        "resources": ["networkpolicies"],
                    },
                    {"apiGroups": GANG_GROUPS, "apiVersions": ["*"], "operations": every, "resources": ["podgroups"]},
                ]
            },
            "matchConditions": [
                {"name": "tenant-account", "expression": f"request.userInfo.username == {_cel(username(tenant))}"}
            ],
            "validations": policy_validations(tenant, level, quota, fence),
        },
    }


def policy_binding(tenant: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(policy_name(tenant), tenant),
        "spec": {"policyName": policy_name(tenant), "validationActions": ["Deny"]},
    }


def member_objects(
    tenant: str, level: Level, quota: dict[str, str], fence: Fence, *, direct_reads: bool = False
) -> list[dict[str, Any]]:
    """What onboarding creates in a member, in creation order (PriorityClasses aside)."""
    home = home_namespace(tenant)
    account = [{"kind": "ServiceAccount", "namespace": home, "name": ACCOUNT}]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(home, tenant)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ACCOUNT, tenant, home)},
        # The provider's tokens are bound to this Secret: deleting it revokes them at once.
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(TOKEN_BINDING, tenant, home)},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(REGISTRY, tenant, home)},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": _meta(HOME_ROLE, tenant, home), "rules": home_rules()},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": _meta(HOME_ROLE, tenant, home),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": HOME_ROLE},
            "subjects": account,
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": _meta(namespaced_role(tenant), tenant),
            "rules": namespaced_rules(),
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": _meta(cluster_role(tenant), tenant),
            "rules": cluster_rules(tenant, direct_reads=direct_reads),
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(cluster_role(tenant), tenant),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": cluster_role(tenant)},
            "subjects": account,
        },
        admission_policy(tenant, level, quota, fence),
        policy_binding(tenant),
    ]


def role_binding(tenant: str, namespace: str) -> dict[str, Any]:
    """Created by the tenant's provider in each namespace it creates: its rights there."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": ROLE_BINDING, "namespace": namespace, "labels": {TENANT: tenant, labels.MANAGED: "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": namespaced_role(tenant)},
        "subjects": [{"kind": "ServiceAccount", "namespace": home_namespace(tenant), "name": ACCOUNT}],
    }


def resource_quota(tenant: str, namespace: str, quota: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": QUOTA, "namespace": namespace, "labels": {TENANT: tenant, labels.MANAGED: "true"}},
        "spec": {"hard": quota_hard(quota)},
    }


def kubeconfig(*, server: str, ca_data: bytes | None, token: str, name: str) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if ca_data:
        cluster["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def member_cluster(
    *,
    name: str,
    tenant: str,
    secret_namespace: str,
    secret_name: str,
    level: Level,
    quota: dict[str, str],
    fence: Fence,
    agent_address: str | None,
    token_seconds: int,
) -> dict[str, Any]:
    """The front end's MemberCluster: how the tenant's provider reaches the member (its
    kubeconfig Secret; capacity from the member's agent unless direct reads were allowed) and
    the fence it works within there."""
    spec: dict[str, Any] = {
        "kubeconfigSecretRef": {"namespace": secret_namespace, "name": secret_name, "key": "kubeconfig"},
        "namespaceMapping": {"prefix": prefix(tenant)},
        "podSecurity": level,
        "source": "agent" if agent_address else "direct",
        "tenancy": {
            "tenant": tenant,
            "clusterRole": namespaced_role(tenant),
            "serviceAccount": {"namespace": home_namespace(tenant), "name": ACCOUNT},
            "quota": dict(sorted(quota.items())),
            "allowedTolerations": sorted(fence.tolerations),
            "monitoringNamespaces": sorted(fence.monitoring),
            "tokenSeconds": token_seconds,
        },
    }
    if agent_address:
        spec["agentAddress"] = agent_address
    if quota:
        spec["capacity"] = {"cap": dict(sorted(quota.items()))}
    return {
        "apiVersion": "vkprovider.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": _meta(name, tenant),
        "spec": spec,
    }
