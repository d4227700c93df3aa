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
NAME = re.compile(r"^[a-z][a-z0-9]{0,19}$")

GANG_GROUPS = ["scheduling.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"]


class TenancyError(ValueError):
    """A tenant or quota that cannot be used; the message says why."""


def check_name(tenant: str) -> None:
    # No hyphen: prefix "a-" must never be the start of another tenant's "a-b-".
    if not NAME.match(tenant):
        raise TenancyError(f"tenant {tenant!r}: use 1-20 lower-case letters and digits, starting with a letter")


def home_namespace(tenant: str) -> str:
    return f"vkprovider-tenant-{tenant}"


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
        {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": write},
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": GANG_GROUPS, "resources": ["podgroups"], "verbs": [*write, "deletecollection"]},
    ]


def cluster_rules(tenant: str) -> list[dict[str, Any]]:
    read = ["get", "list", "watch"]
    return [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": read},
        {"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"], "verbs": read},
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


def policy_validations(tenant: str, level: Level, quota: dict[str, str]) -> list[dict[str, Any]]:
    """CEL rules the tenant's own requests must pass (namespaces, RoleBindings, pods, quotas)."""
    t, pre = _cel(tenant), _cel(prefix(tenant))
    enforce = _cel(f"{podsecurity.LABEL_PREFIX}enforce")
    label = _cel(TENANT)
    mine = f"has(object.metadata.labels) && {label} in object.metadata.labels && object.metadata.labels[{label}] == {t}"
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
    return [
        {
            "expression": f"request.resource.resource != 'namespaces' || (object.metadata.name.startsWith({pre}) "
            f"&& {mine} && (request.operation != 'UPDATE' || (has(oldObject.metadata.labels) "
            f"&& {label} in oldObject.metadata.labels && oldObject.metadata.labels[{label}] == {t})))",
            "message": f"tenant {tenant} may create or change only namespaces named {prefix(tenant)}… "
            f"and labelled {TENANT}={tenant}",
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
            "expression": f"request.resource.resource != 'rolebindings' || (request.namespace.startsWith({pre}) "
            f"&& object.roleRef.kind == 'ClusterRole' && object.roleRef.name == {_cel(namespaced_role(tenant))} "
            f"&& has(object.subjects) && object.subjects.all(s, s.kind == 'ServiceAccount' "
            f"&& s.namespace == {_cel(home_namespace(tenant))} && s.name == {_cel(ACCOUNT)}))",
            "message": f"tenant {tenant} may bind only its own account to {namespaced_role(tenant)} "
            f"in its own namespaces",
            "reason": "Forbidden",
        },
        {
            "expression": "request.resource.resource != 'pods' || (has(object.spec.priorityClassName) "
            f"&& object.spec.priorityClassName in {classes})",
            "message": f"tenant {tenant} may run only pods of the offline PriorityClasses",
            "reason": "Forbidden",
        },
        {
            "expression": f"request.resource.resource != 'resourcequotas' || ({quota_rule})",
            "message": f"tenant {tenant} may create only the quota the member granted it",
            "reason": "Forbidden",
        },
    ]


def admission_policy(tenant: str, level: Level, quota: dict[str, str]) -> dict[str, Any]:
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
                        "resources": ["namespaces", "pods", "resourcequotas"],
                    },
                    {
                        "apiGroups": ["rbac.authorization.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["rolebindings"],
                    },
                ]
            },
            "matchConditions": [
                {"name": "tenant-account", "expression": f"request.userInfo.username == {_cel(username(tenant))}"}
            ],
            "validations": policy_validations(tenant, level, quota),
        },
    }


def policy_binding(tenant: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(policy_name(tenant), tenant),
        "spec": {"policyName": policy_name(tenant), "validationActions": ["Deny"]},
    }


def member_objects(tenant: str, level: Level, quota: dict[str, str]) -> list[dict[str, Any]]:
    """What onboarding creates in a member, in creation order (PriorityClasses aside)."""
    home = home_namespace(tenant)
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(home, tenant)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ACCOUNT, tenant, home)},
        # The provider's tokens are bound to this Secret: deleting it revokes them at once.
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(TOKEN_BINDING, tenant, home)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(namespaced_role(tenant), tenant),
            "rules": namespaced_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(cluster_role(tenant), tenant),
            "rules": cluster_rules(tenant),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(cluster_role(tenant), tenant),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role(tenant)},
            "subjects": [{"kind": "ServiceAccount", "namespace": home, "name": ACCOUNT}],
        },
        admission_policy(tenant, level, quota),
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
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kubeconfigSecretRef": {"namespace": secret_namespace, "name": secret_name, "key": "kubeconfig"},
        "namespaceMapping": {"prefix": prefix(tenant)},
        "podSecurity": level,
        "tenancy": {
            "tenant": tenant,
            "clusterRole": namespaced_role(tenant),
            "serviceAccount": {"namespace": home_namespace(tenant), "name": ACCOUNT},
            "quota": dict(sorted(quota.items())),
        },
    }
    if quota:
        spec["capacity"] = {"cap": dict(sorted(quota.items()))}
    return {
        "apiVersion": "vkprovider.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": _meta(name, tenant),
        "spec": spec,
    }
