"""Pod security at the member boundary end to end: at the default level (baseline) pods asking
for the node (hostPath, hostNetwork, hostPID, a privileged container) never reach a member and
end Failed with ForbiddenByMemberPolicy, a Warning Event naming the field, and no retry; a
member set to `privileged` runs them; member namespaces carry the Pod Security Admission labels
of their member's level (an existing one of ours is relabelled before a pod goes there)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from e2e.fixtures import Lab
from federation.labels import INSTANCE, MANAGED
from tests.e2e.helpers import changes_during, delete_namespace, eventually, make_namespace, pods
from tests.e2e.memberwatch import PODS, MemberWatch
from tests.e2e.test_dispatch import cleanup, cleanup_and_stop, start_synced
from tests.e2e.test_federation_capacity import PUBLISH_INTERVAL, UNREACHABLE_GRACE, federation_vk
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

REASON = "ForbiddenByMemberPolicy"
PSA = "pod-security.kubernetes.io/"

CONTAINER = {"name": "main", "image": "registry.example/app:1", "resources": {"requests": {"cpu": "100m"}}}
#: name -> (spec fields, the field the refusal names)
FORBIDDEN: dict[str, tuple[dict[str, Any], str]] = {
    "hostpath": ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "spec.volumes[0].hostPath"),
    "hostnetwork": ({"hostNetwork": True}, "spec.hostNetwork"),
    "hostpid": ({"hostPID": True}, "spec.hostPID"),
    "privileged": (
        {"containers": [{**CONTAINER, "securityContext": {"privileged": True}}]},
        "spec.containers[0].securityContext.privileged",
    ),
}


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


def bound_pod(name: str, node: str, **spec: Any) -> dict[str, Any]:
    """A pod for the virtual node `node`, with `spec` fields replaced."""
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [dict(CONTAINER)],
        },
    }
    body["spec"].update(spec)
    return body


async def namespace_labels(lab: Lab, member: str, ns: str) -> dict[str, str]:
    async with lab.client(member) as client:
        found = await client.get(f"/api/v1/namespaces/{ns}")
    return dict(found["metadata"].get("labels") or {})


def psa_labels(level: str) -> dict[str, str]:
    out = {}
    for mode in ("enforce", "warn", "audit"):
        out[f"{PSA}{mode}"] = level
        out[f"{PSA}{mode}-version"] = "latest"
    return out


@pytest.mark.shares_lab
async def test_default_level_refuses_host_access_before_any_member_sees_it(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, lab.members)
    await start_synced(proc)
    ns = await make_namespace(offline, f"psa-{uuid.uuid4().hex[:6]}")
    watch = MemberWatch(lab=lab, members=lab.members, selector=f"{INSTANCE}={proc.node}", paths=(PODS,))
    await watch.start()
    try:
        for name, (spec, _) in FORBIDDEN.items():
            await offline.create(f"/api/v1/namespaces/{ns}/pods", bound_pod(name, proc.node, **spec))
        await offline.create(f"/api/v1/namespaces/{ns}/pods", bound_pod("plain", proc.node))

        async def settled() -> dict[str, dict[str, Any]] | None:
            items = {p["metadata"]["name"]: p for p in await pods(offline, ns)}
            refused = [items.get(n, {}).get("status", {}).get("reason") == REASON for n in FORBIDDEN]
            running = items.get("plain", {}).get("status", {}).get("phase") == "Running"
            return items if all(refused) and running else None

        items = await eventually(settled, timeout=60, what="refused pods Failed and the plain pod Running")
        for name, (_, field) in FORBIDDEN.items():
            status = items[name]["status"]
            assert status["phase"] == "Failed", (name, status)
            message = status["message"]
            assert field in message and "baseline" in message, (name, message)
            assert all(m in message for m in lab.members), (name, message)
            assert "vkprovider.io/member" not in (items[name]["metadata"].get("annotations") or {})

        # One Warning Event per refused pod, naming the field.
        async def warned() -> dict[str, dict[str, Any]] | None:
            listed = await offline.list(f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": f"reason={REASON}"})
            by_pod = {e["involvedObject"]["name"]: e for e in listed["items"]}
            return by_pod if set(by_pod) == set(FORBIDDEN) else None

        events = await eventually(warned, timeout=15, what=f"{REASON} Events")
        for name, (_, field) in FORBIDDEN.items():
            assert events[name]["type"] == "Warning" and field in events[name]["message"]

        # Not retried: from the refusals on, for three seconds, watched (every change seen, not
        # one look after a sleep), no refused pod changes and no further Event is written.
        since = min(int(items[name]["metadata"]["resourceVersion"]) for name in FORBIDDEN)
        pod_changes, event_changes = await asyncio.gather(
            changes_during(offline, f"/api/v1/namespaces/{ns}/pods", since=str(since), window=3),
            changes_during(
                offline,
                f"/api/v1/namespaces/{ns}/events",
                since=str(since),
                window=3,
                params={"fieldSelector": f"reason={REASON}"},
            ),
        )
        refused_at = {name: int(items[name]["metadata"]["resourceVersion"]) for name in FORBIDDEN}
        changed = [
            (e["type"], meta["name"])
            for e in pod_changes
            if (meta := e["object"]["metadata"])["name"] in refused_at
            and int(meta["resourceVersion"]) > refused_at[meta["name"]]
        ]
        assert changed == [], changed
        known = {e["metadata"]["uid"]: int(e["metadata"]["resourceVersion"]) for e in events.values()}
        again = [
            e["object"]["message"]
            for e in event_changes
            if int(e["object"]["metadata"]["resourceVersion"]) > known.get(e["object"]["metadata"]["uid"], 0)
        ]
        assert again == [], f"{REASON} Events written again (or counted again): {again}"
        watch.check()
        reached = {s.name for s in watch.history if s.namespace == ns}
        assert reached == {"plain"}, f"member(s) saw {reached}"

        # The plain pod's member namespace carries the member's level.
        member = items["plain"]["metadata"]["annotations"]["vkprovider.io/member"]
        labels = await namespace_labels(lab, member, ns)
        assert labels.items() >= psa_labels("baseline").items(), labels
    finally:
        await watch.stop()
        await cleanup_and_stop(lab, offline, ns, proc)


@pytest.mark.shares_lab
async def test_a_privileged_member_runs_them_and_relabels_its_namespace(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    members = [
        {"name": m, "kubeconfig": str(lab.kubeconfig(m)), **({"podSecurity": "privileged"} if m == "member-2" else {})}
        for m in lab.members
    ]
    federation = {"members": members, "unreachable_grace": UNREACHABLE_GRACE, "publish_interval": PUBLISH_INTERVAL}
    proc = federation_vk(lab, tmp_path, lab.members)
    proc.overrides["provider.federation"] = federation
    ns = f"psa-priv-{uuid.uuid4().hex[:6]}"
    # A namespace of ours from before, labelled for baseline: relabelled before a pod goes there
    # (else member-2's own admission would refuse the pods).
    async with lab.client("member-2") as member:
        stale = {MANAGED: "true", **psa_labels("baseline")}
        await member.create("/api/v1/namespaces", {"metadata": {"name": ns, "labels": stale}})
    try:
        await start_synced(proc)
        await make_namespace(offline, ns)
        for name in ("hostpath", "privileged"):
            spec, _ = FORBIDDEN[name]
            await offline.create(f"/api/v1/namespaces/{ns}/pods", bound_pod(name, proc.node, **spec))

        async def running() -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            up = [p for p in items if p["status"].get("phase") == "Running"]
            return items if len(up) == 2 else None

        try:
            items = await eventually(running, timeout=60, what="host-access pods Running in the privileged member")
        except AssertionError as exc:
            states = {p["metadata"]["name"]: p["status"] for p in await pods(offline, ns)}
            raise AssertionError(f"{exc}; front end: {states}") from None
        assert {p["metadata"]["annotations"]["vkprovider.io/member"] for p in items} == {"member-2"}
        async with lab.client("member-2") as member:
            there = await pods(member, ns)
        assert sorted(p["metadata"]["name"] for p in there) == ["hostpath", "privileged"]
        labels = await namespace_labels(lab, "member-2", ns)
        assert labels.items() >= psa_labels("privileged").items(), labels
    finally:
        try:
            await cleanup(lab, offline, ns)
        finally:
            proc.ensure_stopped()
            async with lab.client("member-2") as member:
                await delete_namespace(member, ns)
