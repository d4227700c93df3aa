"""The tenant boundary end to end (issue 33): what a tenant's member credential may do is what the
member's own apiserver allows, checked here as 403 answers and as `kubectl auth can-i --list`
against the table in docs/concepts/tenants.md; the tenant's provider runs on the capacity the member's agent
reports, follows its pods namespace by namespace, keeps its short-lived token renewed, and two
providers of two front ends whose nodes share a name keep to their own pods."""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import lab as lab_mod
from e2e.fixtures import Lab
from e2e.state import LabState
from federation import labels
from federation.agent.client import AgentSource
from federation.config import MemberConfig
from federation.tenancy import policy as tenancy
from tests.e2e.helpers import (
    can_i,
    capacity_agents,
    delete_namespace,
    eventually,
    install_member_cluster_crd,
    make_namespace,
    pods,
    service_account_kubeconfig,
    settle,
)
from tests.e2e.test_onboard import (
    DENIED,
    FRONT_NS,
    cli,
    clusters,
    credential,
    refused,
    tenant_pod,
    tenant_provider,
)
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, load_kubeconfig

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

MEMBER = "member-1"
TENANTS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "tenants.md"


def documented_rights(*, direct_reads: bool = False) -> dict[str, dict[str, set[str]]]:
    """The docs' table of a tenant credential's rights (concepts/tenants.md): where -> resource -> verbs."""
    text = TENANTS_PAGE.read_text()
    table = text[text.index("**Every right a tenant's credential has on a member**") :]
    out: dict[str, dict[str, set[str]]] = {}
    for line in table.splitlines()[1:]:
        if line.startswith("| where") or line.startswith("|---"):
            continue
        if not line.startswith("|"):
            if out:
                break
            continue
        where, resources, verbs = (cell.strip() for cell in line.strip("|").split("|"))
        if "--direct-reads" in where:
            if not direct_reads:
                continue
            where = "cluster"
        for resource in re.sub(r"\([^)]*\)", "", resources).split(","):
            out.setdefault(where, {}).setdefault(resource.strip(), set()).update(v.strip() for v in verbs.split(","))
    return out


def merged(*parts: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for part in parts:
        for resource, verbs in part.items():
            out.setdefault(resource, set()).update(verbs)
    return out


def beyond(rights: dict[str, set[str]], everyone: dict[str, set[str]]) -> dict[str, set[str]]:
    """`rights` without what every authenticated account may do."""
    out = {r: v - everyone.get(r, set()) for r, v in rights.items()}
    return {r: v for r, v in out.items() if v}


async def onboard(lab: Lab, tenant: str, agent: str, *more: str, front: Path | None = None) -> str:
    args = clusters(lab, tenant, MEMBER)
    if front is not None:
        args[args.index("--front-end-kubeconfig") + 1] = str(front)
    rc, out = await cli("onboard", *args, "--agent-address", agent, *more)
    assert rc == 0, out
    return out


async def offboard(lab: Lab, tenant: str, *, front: Path | None = None) -> None:
    args = clusters(lab, tenant, MEMBER)
    if front is not None:
        args[args.index("--front-end-kubeconfig") + 1] = str(front)
    rc, out = await cli("offboard", *args, "--force")
    assert rc == 0, out


async def allowed(client: KubeClient, verb: str, resource: str, namespace: str = "", sub: str = "") -> bool:
    review = await client.create(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub, "namespace": namespace}
            },
        },
    )
    return bool(review["status"].get("allowed"))


async def running(offline: KubeClient, namespace: str, count: int) -> list[dict[str, Any]] | None:
    items = await pods(offline, namespace)
    return items if len(items) == count and all(p["status"].get("phase") == "Running" for p in items) else None


async def front_end_uid(client: KubeClient) -> str:
    return str((await client.get("/api/v1/namespaces/kube-system"))["metadata"]["uid"])


@pytest.mark.shares_lab
async def test_a_tenant_credential_stays_in_its_fence_and_its_provider_runs_on_the_agents_capacity(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await install_member_cluster_crd(offline)
    t = f"t{uuid.uuid4().hex[:5]}"
    serving = f"{t}-serving"  # an online namespace that shares the tenant's prefix
    work = await make_namespace(offline, f"work-{t}")
    proc = tenant_provider(lab, tmp_path, t)
    async with lab.client(MEMBER) as admin:
        await make_namespace(admin, serving)
        await admin.create(
            f"/api/v1/namespaces/{serving}/secrets", {"metadata": {"name": "online"}, "stringData": {"k": "v"}}
        )
        online = tenant_pod("online", "")
        del online["spec"]["nodeSelector"]
        online["metadata"]["labels"] = {"app": "serving"}
        await admin.create(f"/api/v1/namespaces/{serving}/pods", online)
    try:
        with capacity_agents(lab, [MEMBER], tmp_path) as agents:
            out = await onboard(lab, t, agents[MEMBER])
            assert re.search(rf"Namespace +- +{serving} +overlap", out), out
            async with await credential(offline, t, MEMBER) as cred:
                # The ml/ml-serving case: the credential cannot bind itself into the online namespace.
                said = await refused(
                    cred.create(
                        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{serving}/rolebindings",
                        tenancy.role_binding(t, serving),
                    ),
                    "bind itself in an online namespace of its prefix",
                )
                assert "may act only in namespaces it created" in said, said
                await refused(cred.get(f"/api/v1/namespaces/{serving}/secrets/online"), "read the online Secret")
                await refused(cred.list(f"/api/v1/namespaces/{serving}/pods"), "list online pods")
                await refused(cred.list("/api/v1/pods"), "list pods across the member")
                await refused(
                    cred.patch(f"/api/v1/namespaces/{serving}", {"metadata": {"labels": {tenancy.TENANT: t}}}),
                    "label the online namespace as its own",
                )
                assert not await allowed(cred, "create", "pods", serving, "exec"), "exec into online pods"
                assert not await allowed(cred, "list", "pods"), "kubectl auth can-i list pods --all-namespaces"

            # The tenant's provider runs pods there, with nothing but that credential.
            proc.start()
            await proc.wait_ready()
            for i in range(3):
                await offline.create(f"/api/v1/namespaces/{work}/pods", tenant_pod(f"w{i}", proc.node))
            await eventually(lambda: running(offline, work, 3), timeout=90, what="the tenant's pods running")
            denied = [line for line in proc.log_path.read_text().splitlines() if DENIED.search(line)]
            assert not denied, denied[:3]
            member_ns = f"{t}-{work}"
            async with lab.client(MEMBER) as admin:
                registry = await admin.get(labels.tenant_registry(t))
                assert member_ns in (registry.get("data") or {}), registry
                policy_object = await admin.get(
                    f"/apis/networking.k8s.io/v1/namespaces/{member_ns}/networkpolicies/{tenancy.NETWORK_POLICY}"
                )
                assert policy_object["spec"]["ingress"] == [
                    {"from": [{"namespaceSelector": {"matchLabels": {tenancy.TENANT: t}}}]}
                ]

            # Its virtual node offers what the member's agent says it lends.
            name = f"{t}-{MEMBER}"
            owner = labels.Owner(proc.node, await front_end_uid(offline))
            source = AgentSource(
                MemberConfig(name=name, source="agent", agent_address=agents[MEMBER]),
                on_change=lambda: None,
                owner=owner.key,
            )
            reader = asyncio.create_task(source.run(), name="test/agent-reader")
            try:

                async def agreed() -> dict[str, Any] | None:
                    if not source.synced.is_set():
                        return None
                    said = source.summarize(MemberConfig(name=name).capacity.policy()).to_json()
                    seen = (await proc.view())["members"].get(name, {})
                    keys = ("lent", "used", "free", "online")
                    return said if said["used"] and all(said[k] == seen.get(k) for k in keys) else None

                agent_said = await eventually(agreed, timeout=30, what="the provider's offer equal to the agent's")
                assert agent_said["used"]["cpu"] == "300m", agent_said  # its own three pods, nobody else's
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

            # Inside its own namespace the member keeps its pods within the placement fence.
            async with await credential(offline, t, MEMBER) as cred:
                base = tenant_pod("plain", "")
                base["spec"].pop("nodeSelector")
                base["spec"]["tolerations"] = []
                base["spec"]["priorityClassName"] = "vkprovider-worker-max"
                path = f"/api/v1/namespaces/{member_ns}/pods"
                cases: dict[str, tuple[dict[str, Any], str]] = {
                    "nodename": ({"nodeName": f"{MEMBER}-node-000"}, "may not set spec.nodeName"),
                    "toleration": ({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, "may tolerate only"),
                }
                for case, (spec, rule) in cases.items():
                    body = yaml.safe_load(yaml.safe_dump(base))
                    body["metadata"]["name"] = case
                    body["spec"].update(spec)
                    said = await refused(cred.create(path, body), case)
                    assert rule in said, said
                hostport = yaml.safe_load(yaml.safe_dump(base))
                hostport["metadata"]["name"] = "hostport"
                hostport["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
                said = await refused(cred.create(path, hostport), "hostPort")
                assert "hostPort" in said, said
                admitted = await cred.create(path, base)
                await cred.delete(f"{path}/{admitted['metadata']['name']}", body={"gracePeriodSeconds": 0})

                # Every right the credential has is in the docs' table, and nothing more.
                documented = documented_rights()
                nobody = await _rights_of_nobody(lab, serving, tmp_path)
                checks = {
                    serving: documented["cluster"],
                    tenancy.home_namespace(t): merged(documented["cluster"], documented["home namespace"]),
                    member_ns: merged(documented["cluster"], documented["its namespaces"]),
                }
                for namespace, expected in checks.items():
                    assert beyond(await can_i(cred, namespace), nobody) == expected, namespace

            # A front-end pod outside the fence fails before it is sent, naming the field.
            outside = tenant_pod("gpu", proc.node)
            outside["spec"]["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists"})
            await offline.create(f"/api/v1/namespaces/{work}/pods", outside)

            async def failed() -> dict[str, Any] | None:
                status = (await offline.get(f"/api/v1/namespaces/{work}/pods/gpu")).get("status") or {}
                return status if status.get("phase") == "Failed" else None

            status = await eventually(failed, timeout=30, what="the pod outside the fence failed")
            assert status.get("reason") == "ForbiddenByMemberPolicy", status
            assert "spec.tolerations[1].key (nvidia.com/gpu is not allowed)" in status.get("message", ""), status
    finally:
        proc.ensure_stopped()
        await offboard(lab, t)
        await delete_namespace(offline, work)
        async with lab.client(MEMBER) as admin:
            await delete_namespace(admin, serving)


async def _rights_of_nobody(lab: Lab, namespace: str, workdir: Path) -> dict[str, set[str]]:
    """What an account with no role may do (every authenticated account's rights)."""
    path = workdir / "nobody.yaml"
    async with lab.client(MEMBER) as admin:
        await admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}})
        await service_account_kubeconfig(lab, admin, MEMBER, namespace, "nobody", path)
    async with KubeClient(load_kubeconfig(path)) as nobody:
        return await can_i(nobody, namespace)


@pytest.mark.shares_lab
@pytest.mark.long
async def test_tenant_tokens_renew_and_a_deleted_binding_cuts_the_provider_off(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await install_member_cluster_crd(offline)
    t = f"k{uuid.uuid4().hex[:5]}"
    work = await make_namespace(offline, f"work-{t}")
    proc = tenant_provider(lab, tmp_path, t)
    # A renewal every 3 s of a 10-minute token (the shortest the apiserver issues), and a
    # check every 2 s.
    proc.overrides["provider.federation"].update({"token_renew_after": 0.005, "credential_probe_interval": 2})
    secret_path = f"/api/v1/namespaces/{FRONT_NS}/secrets/{t}-{MEMBER}-kubeconfig"

    async def stored_expiry() -> float:
        secret = await offline.get(secret_path)
        doc = yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"]))
        token = doc["users"][0]["user"]["token"]
        payload = token.split(".")[1]
        return float(yaml.safe_load(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])

    try:
        with capacity_agents(lab, [MEMBER], tmp_path) as agents:
            await onboard(lab, t, agents[MEMBER], "--token-ttl", "600")
            first = await stored_expiry()
            proc.start()
            await proc.wait_ready()

            def renewals() -> int:
                return sum(1 for line in proc.log_path.read_text().splitlines() if "member token renewed" in line)

            async def three() -> int | None:
                return renewals() if renewals() >= 3 else None

            await eventually(three, timeout=90, interval=1.0, what="three renewals of the tenant's token")
            # It keeps working: a pod goes there now, and the Secret holds the newest token.
            await offline.create(f"/api/v1/namespaces/{work}/pods", tenant_pod("after", proc.node))
            await eventually(lambda: running(offline, work, 1), timeout=60, what="a pod after three renewals")
            assert await stored_expiry() > first
            # The provider rewrites the Secret at each renewal, but onboarding writes it only when
            # its token must be replaced (another server or binding, or a third of its life left):
            # the renewed one, with 597 s or more of its 600 s left, is kept, whenever it is read.
            rc, out = await cli(
                "onboard", *clusters(lab, t, MEMBER), "--agent-address", agents[MEMBER], "--token-ttl", "600"
            )
            assert rc == 0 and "changed 0 of" in out, out

            # Offboarding's kill switch: the binding Secret deleted, every token dies.
            async with lab.client(MEMBER) as admin:
                await admin.delete(f"/api/v1/namespaces/{tenancy.home_namespace(t)}/secrets/{tenancy.TOKEN_BINDING}")

            async def cut_off() -> dict[str, Any] | None:
                member = await offline.get(f"{labels.MEMBERS_PATH}/{t}-{MEMBER}")
                found = {c["type"]: c for c in (member.get("status") or {}).get("conditions") or []}
                credential = found.get("Credential")
                return credential if credential and credential["status"] == "False" else None

            condition = await eventually(cut_off, timeout=60, interval=1.0, what="the MemberCluster saying why")
            assert condition["reason"] == "Rejected" and "revoked" in condition["message"], condition
            node = await offline.get(f"/api/v1/nodes/{proc.node}")
            assert node["status"]["capacity"].get("cpu") in ("0", "0m"), node["status"]["capacity"]
    finally:
        proc.ensure_stopped()
        await offboard(lab, t)
        await delete_namespace(offline, work)


@pytest.mark.shares_lab
async def test_two_front_ends_whose_nodes_share_a_name_keep_to_their_own_pods(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await install_member_cluster_crd(offline)
    suffix = uuid.uuid4().hex[:4]
    a, b = f"a{suffix}", f"b{suffix}"
    node = f"vk-{suffix}"  # both front ends name their node so
    seconds: list[LabState] = []  # the second front end's lab, once up
    procs: list[VkProcess] = []
    try:
        with capacity_agents(lab, [MEMBER], tmp_path) as agents:

            async def front_end_a() -> str:
                work = await make_namespace(offline, f"work-{a}")
                await onboard(lab, a, agents[MEMBER])
                return work

            async def front_end_b() -> tuple[Path, str]:
                """The second front end, up, with tenant B onboarded from it onto the same member."""
                seconds.append(await lab_mod.up(tmp_path / "second-front-end", lab_mod.LabSpec(members=0)))
                front = seconds[0].kubeconfig("offline")
                async with KubeClient(load_kubeconfig(front)) as client:
                    await install_member_cluster_crd(client)
                    work = await make_namespace(client, f"work-{b}")
                await onboard(lab, b, agents[MEMBER], front=front)
                return front, work

            # A's onboarding while the second front end starts (the two tenants' onboardings
            # share only the member's PriorityClasses, each marked per tenant).
            task_a = asyncio.create_task(front_end_a(), name=f"test/front-end-{a}")
            task_b = asyncio.create_task(front_end_b(), name=f"test/front-end-{b}")
            await settle(task_a, task_b)
            work_a, (front_b, work_b) = task_a.result(), task_b.result()
            async with KubeClient(load_kubeconfig(front_b)) as offline_b:
                proc_a = tenant_provider(lab, tmp_path / "a", a)
                proc_b = tenant_provider(lab, tmp_path / "b", b)
                proc_b.overrides["kube.kubeconfig"] = str(front_b)
                proc_b.overrides["provider.federation"]["orphan_interval"] = 2.0
                proc_a.node = proc_b.node = node
                procs += [proc_a, proc_b]
                for proc in procs:
                    proc.start()
                await settle(
                    asyncio.create_task(proc_a.wait_ready(), name=f"test/ready-{a}"),
                    asyncio.create_task(proc_b.wait_ready(), name=f"test/ready-{b}"),
                )
                for i in range(2):
                    await offline.create(f"/api/v1/namespaces/{work_a}/pods", tenant_pod(f"p{i}", node))
                    await offline_b.create(f"/api/v1/namespaces/{work_b}/pods", tenant_pod(f"p{i}", node))
                await eventually(lambda: running(offline, work_a, 2), timeout=90, what="A's pods running")
                await eventually(lambda: running(offline_b, work_b, 2), timeout=90, what="B's pods running")

                # Each counts only its own pods as used (both are vk-… of instance `node`).
                async def own_use(proc: VkProcess, tenant: str) -> bool:
                    member = (await proc.view())["members"].get(f"{tenant}-{MEMBER}", {})
                    return str(member.get("used", {}).get("cpu")) == "200m"

                for proc, tenant in ((proc_a, a), (proc_b, b)):
                    await eventually(partial(own_use, proc, tenant), timeout=30, what=f"{tenant}'s own use")

                # A dies; its front-end pods are deleted: nobody but A may clean up its member pods.
                proc_a.kill()
                for i in range(2):
                    await offline.delete(f"/api/v1/namespaces/{work_a}/pods/p{i}", body={"gracePeriodSeconds": 0})
                async with lab.client(MEMBER) as admin:
                    a_pods = {p["metadata"]["uid"] for p in await pods(admin, f"{a}-{work_a}")}
                    assert len(a_pods) == 2
                    # B's own orphan (a member pod of B's whose front-end pod never existed) goes...
                    ghost = tenant_pod("ghost", "")
                    ghost["spec"].pop("nodeSelector")
                    ghost["spec"]["priorityClassName"] = "vkprovider-worker-max"
                    ghost["metadata"]["labels"] = {
                        **labels.Owner(node, await front_end_uid(offline_b)).labels(),
                        labels.ORIGIN_UID: "never",
                    }
                    ghost["metadata"]["annotations"] = {labels.ORIGIN_NAMESPACE: work_b, labels.ORIGIN_NAME: "ghost"}
                    await admin.create(f"/api/v1/namespaces/{b}-{work_b}/pods", ghost)

                    async def ghost_gone() -> bool:
                        return "ghost" not in {p["metadata"]["name"] for p in await pods(admin, f"{b}-{work_b}")}

                    await eventually(ghost_gone, timeout=60, what="B to delete its own orphan")
                    # ... while A's, orphaned as long, stay, and B's running pods too.
                    assert {p["metadata"]["uid"] for p in await pods(admin, f"{a}-{work_a}")} == a_pods
                    assert await running(offline_b, work_b, 2) is not None

                    # A, back, cleans up its own.
                    proc_a.start()
                    await proc_a.wait_ready()

                    async def a_clean() -> bool:
                        return not await pods(admin, f"{a}-{work_a}")

                    await eventually(a_clean, timeout=180, what="A to delete its orphans once back")
                denied = [line for p in procs for line in p.log_path.read_text().splitlines() if DENIED.search(line)]
                assert not denied, denied[:3]
    finally:
        for proc in procs:
            proc.ensure_stopped()
        try:
            offboards = [asyncio.create_task(offboard(lab, a), name=f"test/offboard-{a}")]
            for second in seconds:  # B was onboarded only from the second front end, once up
                front = second.kubeconfig("offline")
                offboards.append(asyncio.create_task(offboard(lab, b, front=front), name=f"test/offboard-{b}"))
            await settle(*offboards)
            await delete_namespace(offline, f"work-{a}")
        finally:
            for second in seconds:
                lab_mod.teardown(second)
