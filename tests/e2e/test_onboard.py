"""Onboarding end to end (issue 11, parts 2 and 3): `vkprovider onboard` joins tenants A and B
to member-2 and member-3 of the lab (away from member-1, so it runs beside the reclaim chain),
each tenant's provider runs pods with nothing but the credential onboarding made, A's
credential is refused by the members wherever B or online work lives, a second onboard changes
nothing, and `offboard` of A leaves nothing labelled A while B keeps running."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import Lab
from federation import labels
from federation.tenancy import policy as tenancy
from federation.tenancy.onboard import KINDS, collection
from tests.e2e.helpers import (
    capacity_agents,
    delete_namespace,
    eventually,
    install_member_cluster_crd,
    make_namespace,
    pods,
    settle,
)
from tests.e2e.test_federation_capacity import PUBLISH_INTERVAL, UNREACHABLE_GRACE
from tests.e2e.test_outages import plain_pod
from tests.e2e.vk import VkProcess
from vkprovider.kube import ApiError, Forbidden, KubeClient, NotFound
from vkprovider.kube.access import parse_kubeconfig

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(alone=["member-2", "member-3"], shares=["offline"]),
]

MEMBERS = ("member-2", "member-3")
FRONT_NS = "vkprovider-tenants"
QUOTA_CPU = 2  # B's quota per member, in CPUs


async def cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vkprovider.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    return int(proc.returncode or 0), out.decode()


#: The docs' onboarding example, which onboards and offboards tenant A here.
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "tenant-onboarding.sh"


async def example(action: str, lab: Lab, tenant: str, member: str, agent: str) -> tuple[int, str]:
    """docs/examples/tenant-onboarding.sh ACTION, with what a reader sets for this lab."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "TENANT": tenant,
        "FRONT_END": str(lab.kubeconfig("offline")),
        "MEMBER": str(lab.kubeconfig(member)),
        "MEMBER_NAME": f"{tenant}-{member}",
        "AGENT": agent,
        "NAMESPACE": FRONT_NS,
    }
    proc = await asyncio.create_subprocess_exec(
        "sh", str(EXAMPLE), action, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
    return int(proc.returncode or 0), out.decode()


#: A refusal in a provider's log; the word boundaries keep "403" in a timestamp or port out.
DENIED = re.compile(r"\b403\b|Forbidden")


def clusters(lab: Lab, tenant: str, member: str) -> list[str]:
    return [
        "--tenant", tenant, "--member-name", f"{tenant}-{member}",
        "--front-end-kubeconfig", str(lab.kubeconfig("offline")),
        "--member-kubeconfig", str(lab.kubeconfig(member)), "--namespace", FRONT_NS,
    ]  # fmt: skip


async def labelled(lab: Lab, tenant: str) -> dict[tuple[str, str, str, str], str]:
    """(cluster, kind, namespace, name) -> resourceVersion of everything labelled with the
    tenant (or marking a PriorityClass as the tenant's), on every cluster of the lab."""
    out: dict[tuple[str, str, str, str], str] = {}
    for cluster in ("offline", *lab.members):
        async with lab.client(cluster) as client:
            for kind in KINDS:
                selectors = [f"{tenancy.TENANT}={tenant}"]
                if kind == "PriorityClass":
                    selectors.append(tenancy.uses_label(tenant))
                for selector in selectors:
                    try:
                        listed = await client.list(collection(kind), params={"labelSelector": selector})
                    except NotFound:
                        continue
                    for item in listed["items"]:
                        meta = item["metadata"]
                        out[(cluster, kind, meta.get("namespace", ""), meta["name"])] = meta["resourceVersion"]
    return out


async def credential(offline: KubeClient, tenant: str, member: str) -> KubeClient:
    secret = await offline.get(f"/api/v1/namespaces/{FRONT_NS}/secrets/{tenant}-{member}-kubeconfig")
    text = base64.b64decode(secret["data"]["kubeconfig"]).decode()
    return KubeClient(parse_kubeconfig(yaml.safe_load(text), base=Path("."), name=f"{tenant} on {member}"))


async def placed(lab: Lab, namespace: str) -> dict[tuple[str, str], str]:
    """(member, pod name) -> UID of the pods in a member namespace, over every member."""
    out: dict[tuple[str, str], str] = {}
    for member in MEMBERS:
        async with lab.client(member) as admin:
            for pod in await pods(admin, namespace):
                out[(member, pod["metadata"]["name"])] = pod["metadata"]["uid"]
    return out


async def refused(call: Any, what: str) -> str:
    try:
        await call
    except Forbidden as exc:
        return str(exc)
    except ApiError as exc:
        raise AssertionError(f"{what}: expected 403, got {exc!r}") from None
    raise AssertionError(f"{what}: allowed, expected 403")


def tenant_provider(lab: Lab, workdir: Path, tenant: str) -> VkProcess:
    settings = {
        "provider.type": "federation",
        "node.provider_id": "federation",
        "provider.federation": {
            "members": [],
            "member_selector": f"{tenancy.TENANT}={tenant}",
            "unreachable_grace": UNREACHABLE_GRACE,
            "publish_interval": PUBLISH_INTERVAL,
        },
    }
    return VkProcess(lab=lab, node=f"vk-{tenant}", workdir=workdir, overrides=settings)


def tenant_pod(name: str, node: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    body = plain_pod(name, node, {labels.CHECKPOINT_SECONDS: "1"})
    body["spec"].update(spec or {})
    return body


async def test_onboarded_tenants_run_apart_and_offboarding_one_leaves_nothing_of_it(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await install_member_cluster_crd(offline)
    suffix = uuid.uuid4().hex[:4]
    a, b = f"a{suffix}", f"b{suffix}"
    ns_a = await make_namespace(offline, f"work-{a}")
    ns_b = await make_namespace(offline, f"work-{b}")
    procs: list[VkProcess] = []
    stack = contextlib.ExitStack()
    agents = stack.enter_context(capacity_agents(lab, list(MEMBERS), tmp_path))

    def onboarding(tenant: str, member: str) -> list[str]:
        return [*clusters(lab, tenant, member), "--agent-address", agents[member]]

    try:
        # A dry run prints the plan and changes nothing.
        rc, out = await cli("onboard", *onboarding(a, MEMBERS[0]), "--dry-run")
        assert rc == 0, out
        assert "ValidatingAdmissionPolicy" in out and "create" in out and "(dry run)" in out, out
        assert await labelled(lab, a) == {}

        results = await settle(
            *[
                asyncio.create_task(example("onboard", lab, a, m, agents[m]), name=f"test/onboard-{a}-{m}")
                for m in MEMBERS
            ],
            *[
                asyncio.create_task(
                    cli("onboard", *onboarding(b, m), "--quota", f"cpu={QUOTA_CPU}"), name=f"test/onboard-{b}-{m}"
                )
                for m in MEMBERS
            ],
        )
        for rc, out in results:
            assert rc == 0, out

        # Again: nothing changes, to the resourceVersion.
        before = await labelled(lab, a)
        assert {k[:2] for k in before} >= {(MEMBERS[0], "ClusterRole"), ("offline", "MemberCluster")}
        rc, out = await cli("onboard", *onboarding(a, MEMBERS[0]))
        assert rc == 0 and "changed 0 of" in out, out
        assert await labelled(lab, a) == before

        # Each tenant's provider, with only what onboarding made, runs pods.
        for tenant in (a, b):
            proc = tenant_provider(lab, tmp_path, tenant)
            procs.append(proc)
            proc.start()
        for proc in procs:
            await proc.wait_ready()
        proc_a, proc_b = procs
        await offline.create(
            f"/api/v1/namespaces/{ns_a}/secrets",
            {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}},
        )
        mounts = {"volumes": [{"name": "creds", "secret": {"secretName": "creds"}}]}
        for i in range(3):
            await offline.create(f"/api/v1/namespaces/{ns_a}/pods", tenant_pod(f"a{i}", proc_a.node, mounts))
            await offline.create(f"/api/v1/namespaces/{ns_b}/pods", tenant_pod(f"b{i}", proc_b.node))

        async def running(ns: str) -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            return items if len(items) == 3 and all(p["status"].get("phase") == "Running" for p in items) else None

        await eventually(lambda: running(ns_a), timeout=90, what="tenant A's pods running")
        await eventually(lambda: running(ns_b), timeout=90, what="tenant B's pods running")
        for proc in procs:
            denied = [line for line in proc.log_path.read_text().splitlines() if DENIED.search(line)]
            assert not denied, denied[:3]

        # Where B's pods run, A (onboarded there too) is refused what is not its own.
        b_ns = f"{b}-{ns_b}"
        # Plain pods are placed one by one, so B's three may be spread over both members.
        placed_b = await placed(lab, b_ns)
        assert len(placed_b) == 3, placed_b
        member_b = min(member for member, _ in placed_b)
        for member in MEMBERS:
            async with lab.client(member) as admin:
                # Reflected Secrets live in the tenant's own namespaces only.
                secrets = await admin.list("/api/v1/secrets", params={"labelSelector": labels.REFLECTED})
                for item in secrets["items"]:
                    assert item["metadata"]["namespace"].startswith(f"{a}-"), item["metadata"]
        async with lab.client(member_b) as admin:
            b_pod = (await pods(admin, b_ns))[0]["metadata"]["name"]
            online = await admin.create(
                "/api/v1/namespaces/default/pods", {"metadata": {"generateName": "online-"}, **plain_pod("x", "")}
            )
        online_name = online["metadata"]["name"]
        async with await credential(offline, a, member_b) as cred_a:
            reasons = [
                await refused(cred_a.list(f"/api/v1/namespaces/{b_ns}/secrets"), "list B's Secrets"),
                await refused(cred_a.list(f"/api/v1/namespaces/{b_ns}/configmaps"), "list B's ConfigMaps"),
                await refused(cred_a.delete(f"/api/v1/namespaces/{b_ns}/pods/{b_pod}"), "delete B's pod"),
                await refused(
                    cred_a.create(f"/api/v1/namespaces/{b_ns}/pods", tenant_pod("intruder", "")), "create in B's ns"
                ),
                await refused(
                    cred_a.patch(f"/api/v1/namespaces/{b_ns}", {"metadata": {"labels": {tenancy.TENANT: a}}}),
                    "take B's namespace",
                ),
                await refused(
                    cred_a.create("/api/v1/namespaces", {"metadata": {"name": f"{b}-mine", "labels": {}}}),
                    "create a namespace with B's prefix",
                ),
                await refused(cred_a.list("/api/v1/secrets"), "list Secrets across the member"),
                await refused(cred_a.list("/api/v1/namespaces/kube-system/secrets"), "list kube-system Secrets"),
                await refused(cred_a.create("/api/v1/namespaces/default/pods", plain_pod("y", "")), "create online"),
                await refused(cred_a.delete(f"/api/v1/namespaces/default/pods/{online_name}"), "delete online"),
                await refused(
                    cred_a.patch(
                        f"/api/v1/namespaces/default/pods/{online_name}", {"metadata": {"labels": {"x": "y"}}}
                    ),
                    "patch online",
                ),
                await refused(
                    cred_a.create(
                        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
                        tenancy.role_binding(a, "default"),
                    ),
                    "bind itself in an online namespace",
                ),
            ]
            assert any("ValidatingAdmissionPolicy" in r for r in reasons), reasons
        async with lab.client(member_b) as admin:
            await admin.delete(f"/api/v1/namespaces/default/pods/{online_name}", body={"gracePeriodSeconds": 0})

        # B's quota: the member refuses more, and B's node offers no more than the quotas.
        async with await credential(offline, b, member_b) as cred_b:
            big = tenant_pod("big", "")
            big["spec"]["priorityClassName"] = "vkprovider-worker-max"
            big["spec"]["tolerations"] = []  # within the member's fence: only the quota refuses it
            big["spec"]["containers"][0]["resources"] = {"requests": {"cpu": str(QUOTA_CPU + 1)}}
            said = await refused(cred_b.create(f"/api/v1/namespaces/{b_ns}/pods", big), "exceed the quota")
            assert "exceeded quota" in said, said
        node_b = await offline.get(f"/api/v1/nodes/{proc_b.node}")
        cpu = node_b["status"]["capacity"]["cpu"]
        assert int(cpu.removesuffix("m")) <= QUOTA_CPU * len(MEMBERS) * (1000 if cpu.endswith("m") else 1), cpu

        # Offboard A from both members at once (each run drains and deletes only what is of its
        # MemberCluster and member): its pods leave through the reclaim path, nothing labelled A
        # is left, B runs on.
        offboarded = await settle(
            *[
                asyncio.create_task(example("offboard", lab, a, m, agents[m]), name=f"test/offboard-{a}-{m}")
                for m in MEMBERS
            ]
        )
        for rc, out in offboarded:
            assert rc == 0, out
        assert await labelled(lab, a) == {}
        ended = await pods(offline, ns_a)
        assert all(p["status"].get("phase") == "Failed" and p["status"].get("reason") == "Reclaimed" for p in ended), [
            (p["metadata"]["name"], p["status"].get("phase"), p["status"].get("reason")) for p in ended
        ]
        assert await running(ns_b) is not None, "tenant B's pods stopped running when A was offboarded"
        assert await placed(lab, b_ns) == placed_b, "tenant B's member pods changed when A was offboarded"
    finally:
        for proc in procs:
            proc.ensure_stopped()
        await settle(
            *[
                asyncio.create_task(
                    cli("offboard", *clusters(lab, tenant, member), "--force"), name=f"test/offboard-{tenant}-{member}"
                )
                for tenant in (a, b)
                for member in MEMBERS
            ]
        )
        for ns in (ns_a, ns_b):
            await delete_namespace(offline, ns)
        stack.close()
        for proc in procs:
            with contextlib.suppress(NotFound):
                await offline.delete(f"/api/v1/nodes/{proc.node}")
