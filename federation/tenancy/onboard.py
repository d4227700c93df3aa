"""`vkprovider onboard` and `vkprovider offboard`: join a tenant's offline cluster to one member
cluster, and take it away, with the member's and the front end's admin kubeconfigs.

Onboarding creates in the member what `federation.tenancy.policy` describes (home namespace, account,
roles, admission policy, the offline PriorityClasses) and a token of that account bound to a
Secret there; in the front end, a kubeconfig Secret and the MemberCluster the tenant's provider
picks up. Every object carries `vkprovider.io/tenant`, so offboarding finds them all.

It runs in three phases so that an error changes nothing: checks (both clusters answer, the
caller may create everything it needs), the plan (each object read back: create, update,
unchanged, or taken by someone else), then the changes; a new credential goes to the front end
only once the member's authorizer grants it what the provider asks first. Running it again
changes nothing; the token is replaced only when a third of its life is left or what it is
bound to changed, so a periodic run (a CronJob) rotates it.

Offboarding disables the MemberCluster, so the tenant's provider drains the member through the
reclaim path (checkpoint notice, graceful deletion; its front-end pods end Reclaimed), waits
until no pod of the tenant is left there, deletes what onboarding and the provider created on
both sides, and checks that nothing labelled with the tenant is left. PriorityClasses are
shared by tenants: a tenant's mark is taken off them, the classes stay.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from federation import bands, labels, podsecurity
from federation.config import ReclaimConfig
from federation.members.objects import release
from federation.podsecurity import Level
from federation.tenancy import policy
from federation.tenancy.policy import TenancyError
from vkprovider.kube import AlreadyExists, ApiError, ClusterAccess, Forbidden, KubeClient, NotFound, load_kubeconfig
from vkprovider.kube.access import KubeconfigError
from vkprovider.kube.credentials import token_claims

MEMBER, FRONT = "member", "front end"
POLL = 1.0

#: kind -> (collection prefix, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Secret": ("/api/v1", "secrets", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "Pod": ("/api/v1", "pods", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "ValidatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "PriorityClass": ("/apis/scheduling.k8s.io/v1", "priorityclasses", False),
    "MemberCluster": ("/apis/vkprovider.io/v1alpha1", "memberclusters", False),
}


class OnboardError(Exception):
    """Onboarding or offboarding cannot go on; the message says why and what to do."""


def collection(kind: str, namespace: str | None = None) -> str:
    prefix, plural, namespaced = KINDS[kind]
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespaced and namespace else f"{prefix}/{plural}"


def path_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{collection(obj['kind'], meta.get('namespace'))}/{meta['name']}"


@dataclass
class Step:
    cluster: str
    obj: dict[str, Any]
    action: str = "create"  # create, update, unchanged, rotate, delete, unmark, overlap (a warning)
    current: dict[str, Any] | None = None
    why: str = ""

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "-")

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


def table(steps: list[Step]) -> str:
    rows = [("CLUSTER", "KIND", "NAMESPACE", "NAME", "ACTION")]
    rows += [(s.cluster, s.kind, s.namespace, s.name, s.action + (f" ({s.why})" if s.why else "")) for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip() for row in rows
    )


def contains(current: Any, desired: Any) -> bool:
    """Whether `current` holds everything `desired` says (fields the server defaulted aside)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(contains(current.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    out["labels"] = obj["metadata"].get("labels") or {}
    return out


def _owned_by(current: dict[str, Any], tenant: str) -> bool:
    return (current["metadata"].get("labels") or {}).get(policy.TENANT) == tenant


def token_is_current(kubeconfig_text: str, *, server: str, binding_uid: str, ttl: float, now: float) -> str:
    """Why the token in a kubeconfig we wrote must be replaced; "" when it need not."""
    try:
        doc = yaml.safe_load(kubeconfig_text) or {}
        token = doc["users"][0]["user"]["token"]
        written_server = doc["clusters"][0]["cluster"]["server"]
    except (KeyError, IndexError, TypeError, yaml.YAMLError):
        return "unreadable"
    if written_server != server:
        return "server changed"
    claims = token_claims(token)
    bound = ((claims.get("kubernetes.io") or {}).get("secret") or {}).get("uid")
    if bound != binding_uid:
        return "binding changed"
    if float(claims.get("exp", 0)) - now < ttl / 3:
        return "expires soon"
    return ""


@dataclass
class Clusters:
    member: KubeClient
    front: KubeClient
    member_access: ClusterAccess


async def _reach(client: KubeClient, what: str, where: str) -> None:
    try:
        await client.get("/version")
    except ApiError as exc:
        raise OnboardError(f"cannot reach the {what} at {where}: {exc}; check its kubeconfig") from exc


Check = tuple[str, ...]  # (verb, group, resource, subresource, namespace[, name])


async def _allowed(client: KubeClient, checks: list[Check]) -> list[str]:
    """The (verb, group, resource, subresource, namespace[, name]) the caller may not do."""
    missing = []
    for verb, group, resource, sub, namespace, *name in checks:
        attributes = {"verb": verb, "group": group, "resource": resource, "subresource": sub, "namespace": namespace}
        if name:
            attributes["name"] = name[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = await client.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        if not (answer.get("status") or {}).get("allowed"):
            where = f" in namespace {namespace}" if namespace else ""
            missing.append(f"{verb} {resource}{'/' + sub if sub else ''}{'.' + group if group else ''}{where}")
    return missing


MEMBER_NEEDS: list[Check] = [
    ("create", "", "namespaces", "", ""),
    ("delete", "", "namespaces", "", ""),
    ("create", "", "serviceaccounts", "", "*"),
    ("create", "", "serviceaccounts", "token", "*"),
    ("create", "", "secrets", "", "*"),
    ("create", "rbac.authorization.k8s.io", "clusterroles", "", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
    ("create", "rbac.authorization.k8s.io", "roles", "", "*"),
    ("create", "rbac.authorization.k8s.io", "rolebindings", "", "*"),
    ("create", "", "configmaps", "", "*"),
    ("list", "", "namespaces", "", ""),
    ("create", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", ""),
    ("create", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", ""),
    ("create", "scheduling.k8s.io", "priorityclasses", "", ""),
    ("patch", "scheduling.k8s.io", "priorityclasses", "", ""),
]


def front_needs(namespace: str) -> list[Check]:
    return [
        ("create", "", "secrets", "", namespace),
        ("update", "", "secrets", "", namespace),
        ("delete", "", "secrets", "", namespace),
        ("create", "vkprovider.io", "memberclusters", "", ""),
        ("patch", "vkprovider.io", "memberclusters", "", ""),
        ("delete", "vkprovider.io", "memberclusters", "", ""),
    ]


async def _preflight(clusters: Clusters, *, front_namespace: str, member_file: Path, front_file: Path) -> None:
    await _reach(clusters.member, "member cluster", f"{clusters.member_access.server} ({member_file})")
    await _reach(clusters.front, "front-end cluster", str(front_file))
    try:
        await clusters.front.list(labels.MEMBERS_PATH, params={"limit": 1})
    except NotFound:
        raise OnboardError(
            "the MemberCluster CRD is not installed in the front end: install the chart "
            "(charts/vkprovider) or apply federation/crds/memberclusters.yaml first"
        ) from None
    missing = [f"member: {m}" for m in await _allowed(clusters.member, MEMBER_NEEDS)]
    missing += [f"front end: {m}" for m in await _allowed(clusters.front, front_needs(front_namespace))]
    if missing:
        raise OnboardError(
            "the kubeconfigs given may not do what onboarding needs (use cluster-admin credentials):\n  "
            + "\n  ".join(missing)
        )


async def _current(client: KubeClient, obj: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return await client.get(path_of(obj))
    except NotFound:
        return None


def _class_conflict(current: dict[str, Any], desired: dict[str, Any]) -> str | None:
    """Why an existing PriorityClass cannot be shared as the one desired, if it cannot."""
    for key in ("value", "preemptionPolicy"):
        if current.get(key) != desired.get(key):
            return f"with {key} {current.get(key)}, {desired.get(key)} needed"
    return None


def _priority_class_step(desired: dict[str, Any], current: dict[str, Any] | None, tenant: str) -> Step:
    mark = policy.uses_label(tenant)
    if current is None:
        desired["metadata"]["labels"] = {labels.MANAGED: "true", policy.MANAGED_BY: policy.ONBOARD, mark: "true"}
        return Step(MEMBER, desired)
    step = Step(MEMBER, desired, current=current)
    conflict = _class_conflict(current, desired)
    if conflict:
        step.action, step.why = "conflict", f"exists {conflict}"
        return step
    if (current["metadata"].get("labels") or {}).get(mark) == "true":
        step.action = "unchanged"
    else:
        step.action = "update"
        step.why = "mark as used by the tenant"
        desired["metadata"]["labels"] = {mark: "true"}
    return step


@dataclass(frozen=True)
class Access:
    """How the tenant's provider will see the member: its capacity agent (`agent_address`), or
    direct reads of every pod and node (a member with this one tenant), and its tokens' life."""

    agent_address: str | None = None
    direct_reads: bool = False
    token_seconds: int = 3600


async def _overlaps(clusters: Clusters, tenant: str) -> list[Step]:
    """Namespaces named like the tenant's but not its own (created by someone else): the
    tenant's provider can never use them; a front-end namespace mapped to one fails there."""
    listed = await clusters.member.list("/api/v1/namespaces")
    out = []
    for ns in listed["items"]:
        meta = ns["metadata"]
        if meta["name"].startswith(policy.prefix(tenant)) and not _owned_by(ns, tenant):
            why = "named like the tenant's, not its own: its provider may not use it"
            out.append(Step(MEMBER, {"kind": "Namespace", "metadata": {"name": meta["name"]}}, "overlap", ns, why))
    return out


async def plan(
    clusters: Clusters,
    *,
    tenant: str,
    member_name: str,
    front_namespace: str,
    level: Level,
    quota: dict[str, str],
    reclaim: ReclaimConfig,
    fence: policy.Fence,
    access: Access,
) -> tuple[list[Step], list[Step]]:
    """Steps in the member and in the front end (the kubeconfig Secret and MemberCluster are
    planned here but written after the token is made)."""
    member_steps: list[Step] = []
    for desired in policy.member_objects(tenant, level, quota, fence, direct_reads=access.direct_reads):
        current = await _current(clusters.member, desired)
        step = Step(MEMBER, desired, current=current)
        if current is not None:
            if not _owned_by(current, tenant):
                step.action, step.why = "conflict", "exists and is not the tenant's"
            elif contains(_content(current), _content(desired)):
                step.action = "unchanged"
            else:
                step.action = "update"
        if access.direct_reads and desired["kind"] == "ClusterRole" and step.name == policy.cluster_role(tenant):
            step.why = "direct reads: the tenant may read every pod and node of the member"
        member_steps.append(step)
    member_steps += await _overlaps(clusters, tenant)
    classes = bands.priority_classes(threshold=reclaim.online_threshold, offline_preemption=reclaim.offline_preemption)
    member_steps.extend([_priority_class_step(d, await _current(clusters.member, d), tenant) for d in classes])

    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": f"{member_name}-kubeconfig",
            "namespace": front_namespace,
            "labels": policy.tenant_labels(tenant),
        },
    }
    member_cluster = policy.member_cluster(
        name=member_name,
        tenant=tenant,
        secret_namespace=front_namespace,
        secret_name=secret["metadata"]["name"],
        level=level,
        quota=quota,
        fence=fence,
        agent_address=access.agent_address,
        token_seconds=access.token_seconds,
    )
    front_steps = []
    for desired in (secret, member_cluster):
        current = await _current(clusters.front, desired)
        step = Step(FRONT, desired, current=current)
        if current is not None and not _owned_by(current, tenant):
            step.action, step.why = "conflict", "exists and is not the tenant's"
        elif current is not None and desired["kind"] == "MemberCluster":
            step.action = "unchanged" if contains(_content(current), _content(desired)) else "update"
        elif current is not None:
            step.action = "unchanged"  # the token is judged once the binding Secret exists
        front_steps.append(step)
    return member_steps, front_steps


async def _write(client: KubeClient, step: Step) -> None:
    obj = step.obj
    if step.action == "create":
        try:
            await client.create(collection(step.kind, obj["metadata"].get("namespace")), obj)
        except AlreadyExists:
            # Made since the plan read it: by a concurrent onboard of this tenant (the same
            # object), or, for a shared PriorityClass, of another tenant, whose mark it carries.
            if step.kind == "PriorityClass":
                await _mark_made_meanwhile(client, obj)
    elif step.action == "update" and step.kind == "PriorityClass":
        await client.patch(path_of(obj), {"metadata": {"labels": obj["metadata"]["labels"]}})
    elif step.action in ("update", "rotate"):
        assert step.current is not None
        body = json.loads(json.dumps(obj))
        body["metadata"]["resourceVersion"] = step.current["metadata"]["resourceVersion"]
        await client.replace(path_of(obj), body)


async def _mark_made_meanwhile(client: KubeClient, obj: dict[str, Any]) -> None:
    """Our mark on a PriorityClass another tenant's onboarding made between our plan and our
    write, as the plan does when it finds one (the mark records the tenant as a user)."""
    conflict = _class_conflict(await client.get(path_of(obj)), obj)
    if conflict:
        raise OnboardError(f"PriorityClass {obj['metadata']['name']} was made meanwhile {conflict}")
    await client.patch(path_of(obj), {"metadata": {"labels": obj["metadata"]["labels"]}})


async def _token(clusters: Clusters, tenant: str, ttl: float) -> tuple[str, str]:
    """A new token of the tenant's account, bound to its binding Secret; and that Secret's UID."""
    home = policy.home_namespace(tenant)
    binding = await clusters.member.get(f"/api/v1/namespaces/{home}/secrets/{policy.TOKEN_BINDING}")
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": int(ttl),
            "boundObjectRef": {
                "kind": "Secret",
                "apiVersion": "v1",
                "name": policy.TOKEN_BINDING,
                "uid": binding["metadata"]["uid"],
            },
        },
    }
    answer = await clusters.member.create(f"/api/v1/namespaces/{home}/serviceaccounts/{policy.ACCOUNT}/token", request)
    return str(answer["status"]["token"]), str(binding["metadata"]["uid"])


async def _binding_uid(clusters: Clusters, tenant: str) -> str:
    home = policy.home_namespace(tenant)
    try:
        binding = await clusters.member.get(f"/api/v1/namespaces/{home}/secrets/{policy.TOKEN_BINDING}")
    except NotFound:
        return ""
    return str(binding["metadata"]["uid"])


def first_use(tenant: str, access: Access) -> list[Check]:
    """What a tenant's provider asks its member first (federation.tenancy.policy): onboarding
    hands the credential over once the member's authorizer grants these to the new token."""
    needs: list[Check] = [
        ("create", "", "namespaces", "", ""),
        ("get", "", "configmaps", "", policy.home_namespace(tenant), policy.REGISTRY),
        ("create", "", "serviceaccounts", "token", policy.home_namespace(tenant), policy.ACCOUNT),
    ]
    if access.direct_reads:
        needs += [("list", "", "pods", "", ""), ("watch", "", "nodes", "", "")]
    return needs


GRANT_WAIT = 30.0  # seconds for new RBAC objects to reach the member's authorizer


async def _fenced(client: KubeClient, tenant: str) -> bool:
    """Whether the member's admission policy holds the tenant in now: a RoleBinding of its own
    role in a namespace not its own (dry run) is refused by the policy, not admitted."""
    probe = policy.role_binding(tenant, "default")
    try:
        await client.create(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", probe, params={"dryRun": "All"}
        )
    except Forbidden as exc:
        return "ValidatingAdmissionPolicy" in str(exc)
    return False


async def _granted(member_access: ClusterAccess, token: str, needs: list[Check], *, tenant: str) -> None:
    """Wait until the member allows the new token what the provider does first, and its
    admission policy holds the token in. A RoleBinding takes effect when the apiserver's
    informer brings it, and an admission policy when its own does, moments after their creates:
    a provider started at once could be refused (a false alarm in its log), and, worse, a
    credential handed over before the policy is in effect could bind itself anywhere."""
    access = dataclasses.replace(
        member_access, token=token, token_file=None, credentials=None, cert_data=None, key_data=None
    )
    deadline = time.monotonic() + GRANT_WAIT
    async with KubeClient(access, user_agent="vkprovider-onboard") as client:
        while (missing := await _allowed(client, needs)) or not await _fenced(client, tenant):
            if time.monotonic() > deadline:
                what = f"still refused {', '.join(missing)}" if missing else "not yet held by the admission policy"
                raise OnboardError(
                    f"the tenant's new credential is {what} after {GRANT_WAIT:.0f}s; "
                    "the member's objects are written, the front end's are not: run onboard again"
                )
            await asyncio.sleep(POLL / 10)


def _kubeconfig_text(secret: dict[str, Any]) -> str:
    raw = (secret.get("data") or {}).get("kubeconfig", "")
    try:
        return base64.b64decode(raw).decode()
    except ValueError:
        return ""


async def onboard(
    *,
    tenant: str,
    front_file: Path,
    member_file: Path,
    member_name: str | None,
    front_namespace: str,
    quota_text: str | None,
    level: Level,
    server: str | None,
    dry_run: bool,
    reclaim: ReclaimConfig,
    fence: policy.Fence,
    access: Access,
) -> list[Step]:
    policy.check_name(tenant)
    quota = policy.parse_quota(quota_text)
    member_access = load_kubeconfig(member_file)
    name = member_name or member_access.name
    server = server or member_access.server
    front_access = load_kubeconfig(front_file)
    async with (
        KubeClient(member_access, user_agent="vkprovider-onboard") as member,
        KubeClient(front_access, user_agent="vkprovider-onboard") as front,
    ):
        clusters = Clusters(member=member, front=front, member_access=member_access)
        await _preflight(clusters, front_namespace=front_namespace, member_file=member_file, front_file=front_file)
        member_steps, front_steps = await plan(
            clusters,
            tenant=tenant,
            member_name=name,
            front_namespace=front_namespace,
            level=level,
            quota=quota,
            reclaim=reclaim,
            fence=fence,
            access=access,
        )
        secret_step = front_steps[0]
        if secret_step.current is not None and secret_step.action != "conflict":
            why = token_is_current(
                _kubeconfig_text(secret_step.current),
                server=server,
                binding_uid=await _binding_uid(clusters, tenant),
                ttl=access.token_seconds,
                now=time.time(),
            )
            if why:
                secret_step.action, secret_step.why = "rotate", why
        steps = member_steps + front_steps
        conflicts = [s for s in steps if s.action == "conflict"]
        if conflicts:
            lines = [f"{s.cluster}: {s.kind} {s.namespace}/{s.name}: {s.why}" for s in conflicts]
            raise OnboardError(
                "names onboarding needs are taken; nothing was changed. Delete these or choose another "
                "--tenant / --member-name:\n  " + "\n  ".join(lines)
            )
        if dry_run:
            return steps
        with contextlib.suppress(AlreadyExists):
            await front.create("/api/v1/namespaces", {"metadata": {"name": front_namespace}})
        for step in member_steps:
            await _write(member, step)
        if secret_step.action in ("create", "rotate"):
            token, _ = await _token(clusters, tenant, access.token_seconds)
            await _granted(member_access, token, first_use(tenant, access), tenant=tenant)
            config = policy.kubeconfig(
                server=server, ca_data=member_access.ca_data, token=token, name=f"{name}-{tenant}"
            )
            if member_access.insecure_skip_verify:
                config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
            secret_step.obj["data"] = {"kubeconfig": base64.b64encode(yaml.safe_dump(config).encode()).decode()}
            await _write(front, secret_step)
        await _write(front, front_steps[1])
        return steps


# -- offboard ----------------------------------------------------------------------------------


async def _until(check: Callable[[], Awaitable[bool]], *, deadline: float, what: str) -> None:
    while not await check():
        if time.monotonic() > deadline:
            raise OnboardError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


def _say(message: str) -> None:
    print(f"offboard: {message}", flush=True)


async def _labelled(client: KubeClient, kind: str, tenant: str) -> list[dict[str, Any]]:
    try:
        listed = await client.list(collection(kind), params={"labelSelector": f"{policy.TENANT}={tenant}"})
    except NotFound:
        return []  # the API (a CRD) is not there: nothing of that kind
    items: list[dict[str, Any]] = listed["items"]
    for item in items:
        item.setdefault("kind", kind)
    return items


async def _tenant_pods(member: KubeClient, tenant: str) -> list[dict[str, Any]]:
    out = []
    for ns in await _labelled(member, "Namespace", tenant):
        name = ns["metadata"]["name"]
        if name == policy.home_namespace(tenant):
            continue
        out.extend((await member.list(f"/api/v1/namespaces/{name}/pods"))["items"])
    return out


MEMBER_KINDS = [
    "Namespace",
    "ClusterRoleBinding",
    "ClusterRole",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "Role",
    "RoleBinding",
    "ResourceQuota",
    "NetworkPolicy",
]


async def leftovers(member: KubeClient | None, front: KubeClient, tenant: str, member_name: str | None) -> list[str]:
    """What is still labelled with the tenant (PriorityClasses: still marked)."""
    left = []
    if member is not None:
        for kind in MEMBER_KINDS:
            for item in await _labelled(member, kind, tenant):
                meta = item["metadata"]
                left.append(f"member: {kind} {meta.get('namespace', '-')}/{meta['name']}")
        marked = await member.list(collection("PriorityClass"), params={"labelSelector": policy.uses_label(tenant)})
        left += [f"member: PriorityClass {p['metadata']['name']} (marked)" for p in marked["items"]]
    for kind in ("MemberCluster", "Secret"):
        for item in await _labelled(front, kind, tenant):
            meta = item["metadata"]
            if kind == "MemberCluster" and member_name and meta["name"] != member_name:
                continue
            if kind == "Secret" and member_name and meta["name"] != f"{member_name}-kubeconfig":
                continue
            left.append(f"front end: {kind} {meta.get('namespace', '-')}/{meta['name']}")
    return left


async def offboard(
    *,
    tenant: str,
    front_file: Path,
    member_file: Path,
    member_name: str | None,
    front_namespace: str,
    timeout: float,
    force: bool,
) -> list[str]:
    policy.check_name(tenant)
    member_access = load_kubeconfig(member_file)
    name = member_name or member_access.name
    deadline = time.monotonic() + timeout
    done: list[str] = []
    async with (
        KubeClient(member_access, user_agent="vkprovider-offboard") as member,
        KubeClient(load_kubeconfig(front_file), user_agent="vkprovider-offboard") as front,
    ):
        await _reach(member, "member cluster", f"{member_access.server} ({member_file})")
        await _reach(front, "front-end cluster", str(front_file))
        try:
            current: dict[str, Any] | None = await front.get(f"{labels.MEMBERS_PATH}/{name}")
        except NotFound:
            current = None
        if current is not None and not _owned_by(current, tenant):
            raise OnboardError(f"MemberCluster {name} is not tenant {tenant}'s; nothing was changed")
        pods = await _tenant_pods(member, tenant)
        if current is not None:
            if (current.get("spec") or {}).get("enabled", True):
                await front.patch(f"{labels.MEMBERS_PATH}/{name}", {"spec": {"enabled": False}})
                _say(f"MemberCluster {name} disabled: the tenant's pods there get checkpoint notices, then go")
        elif pods and not force:
            raise OnboardError(
                f"{len(pods)} pod(s) of tenant {tenant} are in the member and no MemberCluster {name} drains them; "
                "re-run with --force to delete them without notice"
            )
        if not force:

            async def drained() -> bool:
                return not await _tenant_pods(member, tenant)

            try:
                await _until(drained, deadline=deadline, what=f"tenant {tenant}'s pods to leave the member")
            except OnboardError:
                remaining = len(await _tenant_pods(member, tenant))
                raise OnboardError(
                    f"{remaining} pod(s) of tenant {tenant} are still in the member: is the tenant's provider running? "
                    "It drains them through checkpoint notices; re-run offboard, or add --force"
                ) from None
            _say(f"no pod of tenant {tenant} is left in the member")
        for kind in ("MemberCluster", "Secret"):
            for item in await _labelled(front, kind, tenant):
                meta = item["metadata"]
                wanted = (name, None) if kind == "MemberCluster" else (f"{name}-kubeconfig", front_namespace)
                if (meta["name"], meta.get("namespace")) != wanted:
                    continue
                if kind == "MemberCluster":
                    # Drained (or --force): the drain finalizer has nothing left to hold, and
                    # the tenant's provider may not be running to take it off.
                    await release(front, meta["name"])
                with contextlib.suppress(NotFound):
                    await front.delete(path_of(item))
                done.append(f"front end: deleted {kind} {meta.get('namespace', '-')}/{meta['name']}")
        for kind in (
            "Namespace",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ClusterRoleBinding",
            "ClusterRole",
        ):
            for item in await _labelled(member, kind, tenant):
                with contextlib.suppress(NotFound):
                    await member.delete(path_of(item))
                done.append(f"member: deleted {kind} {item['metadata']['name']}")
        # A binding of the tenant's role outside its namespaces (made before the member's policy
        # held, or by hand) would outlive them: every one of them goes too.
        for item in await _labelled(member, "RoleBinding", tenant):
            if (item.get("roleRef") or {}).get("name") == policy.namespaced_role(tenant):
                with contextlib.suppress(NotFound):
                    await member.delete(path_of(item))
                meta = item["metadata"]
                done.append(f"member: deleted RoleBinding {meta.get('namespace')}/{meta['name']}")
        mark = policy.uses_label(tenant)
        marked = await member.list(collection("PriorityClass"), params={"labelSelector": mark})
        for item in marked["items"]:
            path = f"{collection('PriorityClass')}/{item['metadata']['name']}"
            await member.patch(path, {"metadata": {"labels": {mark: None}}})
            done.append(f"member: unmarked PriorityClass {item['metadata']['name']}")

        async def nothing_left() -> bool:
            return not await leftovers(member, front, tenant, name)

        try:
            await _until(nothing_left, deadline=max(deadline, time.monotonic() + 120), what="deletions to finish")
        except OnboardError:
            left = await leftovers(member, front, tenant, name)
            raise OnboardError("objects of the tenant are left:\n  " + "\n  ".join(left)) from None
        _say(f"nothing labelled {policy.TENANT}={tenant} is left in the member or for {name} in the front end")
    return done


# -- command line ------------------------------------------------------------------------------


def add_arguments(sub: Any) -> None:
    on = sub.add_parser("onboard", help="join a tenant's offline cluster to a member cluster")
    on.add_argument("--tenant", required=True, help="tenant name: lower-case letters and digits")
    on.add_argument("--front-end-kubeconfig", required=True, type=Path, help="admin kubeconfig of the front end")
    on.add_argument("--member-kubeconfig", required=True, type=Path, help="admin kubeconfig of the member")
    on.add_argument("--member-name", help="MemberCluster name (default: the member kubeconfig's context)")
    on.add_argument("--namespace", default="vkprovider", help="front-end namespace of the kubeconfig Secret")
    on.add_argument("--quota", help="what the tenant may take there, as cpu=8,memory=32Gi,nvidia.com/gpu=4")
    on.add_argument("--pod-security", default=podsecurity.DEFAULT, choices=list(podsecurity.LEVELS))
    on.add_argument("--member-server", help="the member's apiserver URL as the provider reaches it")
    on.add_argument(
        "--token-ttl",
        type=int,
        default=3600,
        help="seconds the provider's tokens live (at least 600); the provider renews them before expiry",
    )
    on.add_argument(
        "--agent-address", help="host:port of the member's capacity agent, where the provider reads its capacity"
    )
    on.add_argument(
        "--direct-reads",
        action="store_true",
        help="let the tenant read every pod and node of the member instead (a member with this one tenant)",
    )
    on.add_argument(
        "--allow-toleration",
        action="append",
        default=[],
        metavar="KEY",
        help="a taint key the tenant's pods may tolerate (repeat for more); node lifecycle ones always",
    )
    on.add_argument(
        "--monitoring-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="a member namespace whose pods may reach the tenant's (its NetworkPolicy; repeat for more)",
    )
    on.add_argument("--online-threshold", type=int, default=0, help="priority from which member pods are online")
    on.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    off = sub.add_parser("offboard", help="take a tenant's offline cluster away from a member cluster")
    off.add_argument("--tenant", required=True)
    off.add_argument("--front-end-kubeconfig", required=True, type=Path)
    off.add_argument("--member-kubeconfig", required=True, type=Path)
    off.add_argument("--member-name", help="MemberCluster name (default: the member kubeconfig's context)")
    off.add_argument("--namespace", default="vkprovider", help="front-end namespace of the kubeconfig Secret")
    off.add_argument("--timeout", type=float, default=900.0, help="seconds the drain and clean-up may take")
    off.add_argument("--force", action="store_true", help="do not wait for the drain: delete the tenant's pods")


def main(args: argparse.Namespace) -> int:
    try:
        if args.command == "onboard":
            reclaim = ReclaimConfig.model_validate({"onlineThreshold": args.online_threshold})
            if bool(args.agent_address) == args.direct_reads:
                raise OnboardError(
                    "say how the tenant's provider sees the member's capacity: --agent-address of the member's "
                    "capacity agent (`federation agent`, run by the member's owner), or --direct-reads to let the "
                    "tenant read every pod and node (a member with this one tenant)"
                )
            if args.token_ttl < 600:
                raise OnboardError("--token-ttl: at least 600 seconds (the apiserver's minimum)")
            steps = asyncio.run(
                onboard(
                    tenant=args.tenant,
                    front_file=args.front_end_kubeconfig,
                    member_file=args.member_kubeconfig,
                    member_name=args.member_name,
                    front_namespace=args.namespace,
                    quota_text=args.quota,
                    level=args.pod_security,
                    server=args.member_server,
                    dry_run=args.dry_run,
                    reclaim=reclaim,
                    fence=policy.Fence(tuple(args.allow_toleration), tuple(args.monitoring_namespace)),
                    access=Access(args.agent_address, args.direct_reads, args.token_ttl),
                )
            )
            print(table(steps))
            changed = sum(1 for s in steps if s.action not in ("unchanged", "overlap"))
            verb = "would change" if args.dry_run else "changed"
            print(f"onboard: {verb} {changed} of {len(steps)} object(s)" + (" (dry run)" if args.dry_run else ""))
            return 0
        for line in asyncio.run(
            offboard(
                tenant=args.tenant,
                front_file=args.front_end_kubeconfig,
                member_file=args.member_kubeconfig,
                member_name=args.member_name,
                front_namespace=args.namespace,
                timeout=args.timeout,
                force=args.force,
            )
        ):
            print(line)
        return 0
    except (OnboardError, TenancyError, KubeconfigError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except ApiError as exc:
        print(f"error: the API refused it: {exc}", file=sys.stderr, flush=True)
        return 1
