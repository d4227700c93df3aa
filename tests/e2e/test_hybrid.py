"""Hybrid jobs end to end (issue 10): a floor on the offline cluster's own (native) nodes and
elastic workers on the virtual node, routed by band by the provider's webhook; gangs counted
across both kinds of capacity; reclaim that takes only the elastic part.

The lab's offline cluster has native simulated nodes (`python -m e2e up --offline-nodes K`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e import nodes, online
from e2e.fixtures import Lab
from federation import jobs, labels
from federation.dispatch import forge, routing
from federation.jobs import JobRef
from tests.e2e.helpers import eventually, make_namespace, pods
from tests.e2e.memberwatch import MemberWatch
from tests.e2e.test_dispatch import cleanup, cleanup_and_stop, pod_group
from tests.e2e.test_examples import example, kubectl_apply
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.vk import VkProcess, free_port
from vkprovider.kube import ApiError, KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

PODGROUPS = "/apis/scheduling.k8s.io/v1beta1"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
NATIVE_PREFIX = "offline-node-"


def job_pod(name: str, group: str, role: str, *, cpu: str = "1", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod of a job as a user writes it: no tolerations, no node affinity."""
    return {
        "metadata": {"name": name, "labels": {"vkprovider.io/role": role}},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": "registry.example/ring:1", "resources": {"requests": {"cpu": cpu}}}
            ],
            **(extra or {}),
        },
    }


def routed_provider(lab: Lab, workdir: Path) -> VkProcess:
    proc = federation_vk(lab, workdir, lab.members)
    proc.overrides["provider.federation"]["members"][0]["weight"] = 10  # member-1 (CPU nodes) first
    proc.overrides["provider.federation"]["routing"] = {
        "enabled": True,
        "port": free_port(),
        "bind": "127.0.0.1",
        "hosts": ["127.0.0.1"],
        "configuration_name": f"vkprovider-routing-{proc.node}",
    }
    return proc


async def start(proc: VkProcess, offline: KubeClient, ns: str | None = None) -> None:
    """Start the provider and wait until it routes: capacity from every member, and (with `ns`, a
    namespace labelled for routing) a server-side dry-run pod there comes back routed. The
    configuration's existence is not enough after a kill -9: the dead process left it behind with
    its own CA, and until the new process has registered its CA the apiserver fails open."""
    proc.start()
    await proc.wait_ready()

    async def ready() -> bool:
        view = await proc.view()
        members = view.get("members", {})
        if len(members) != 3 or not all("lent" in m for m in members.values()):
            return False
        with contextlib.suppress(NotFound):
            await offline.get(f"{WEBHOOKS}/vkprovider-routing-{proc.node}")
            if ns is None:
                return True
            probe = job_pod(f"probe-{uuid.uuid4().hex[:6]}", "probe", "worker-max")
            admitted = await offline.create(f"/api/v1/namespaces/{ns}/pods", probe, params={"dryRun": "All"})
            return routing.ROUTED in (admitted["metadata"].get("annotations") or {})
        return False

    await eventually(ready, timeout=30, what="member capacity and the routing webhook routing")


async def by_name(offline: KubeClient, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in await pods(offline, ns)}


async def gang_below(offline: KubeClient, ns: str, group: str) -> dict[str, Any] | None:
    """The GangBelowMinimum Event on a job's group object, if there is one."""
    listed = await offline.list(f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "reason=GangBelowMinimum"})
    found = [e for e in listed["items"] if e["involvedObject"]["name"] == group]
    return found[0] if found else None


async def test_a_routed_hybrid_job_keeps_its_floor_native_and_grows_on_lent_capacity_until_reclaimed(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = routed_provider(lab, tmp_path)
    await start(proc, offline)
    ns = await make_namespace(offline, f"hybrid-{uuid.uuid4().hex[:6]}")
    plain = await make_namespace(offline, f"plain-{uuid.uuid4().hex[:6]}")
    example_ns = f"hybrid-example-{uuid.uuid4().hex[:6]}"
    try:
        await offline.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {routing.POLICY_LABEL: "hybrid"}}})
        group = pod_group("ring", 3, {"vkprovider.io/checkpoint-seconds": "2"})
        await offline.create(f"{PODGROUPS}/namespaces/{ns}/podgroups", group)
        floor = {"launcher": "ps", "w0": "worker-min", "w1": "worker-min"}
        elastic = [f"e{i}" for i in range(6)]
        for name, role in [*floor.items(), *((e, "worker-max") for e in elastic)]:
            await offline.create(f"/api/v1/namespaces/{ns}/pods", job_pod(name, "ring", role))

        async def all_running(count: int) -> dict[str, dict[str, Any]] | None:
            items = await by_name(offline, ns)
            ok = len(items) == count and all(p["status"].get("phase") == "Running" for p in items.values())
            return items if ok else None

        async def running(count: int, timeout: float, what: str) -> dict[str, dict[str, Any]]:
            """All `count` pods Running, or a failure that says where each pod stands."""
            try:
                return await eventually(lambda: all_running(count), timeout=timeout, what=what)
            except AssertionError as exc:
                states = {
                    n: (p["status"].get("phase"), p["spec"].get("nodeName"), p["status"].get("message"))
                    for n, p in (await by_name(offline, ns)).items()
                }
                raise AssertionError(f"{exc}; pods: {states}; provider: {proc.tail(12)}") from None

        # Well inside the gang timeout (300 s): nothing waits for it.
        items = await running(9, 90, "the floor and the 6 elastic workers running")
        for name in floor:
            assert items[name]["spec"]["nodeName"].startswith(NATIVE_PREFIX), items[name]["spec"]["nodeName"]
            assert items[name]["metadata"]["annotations"][routing.ROUTED].startswith("hybrid/")
        members = {items[e]["metadata"]["annotations"].get(labels.MEMBER) for e in elastic}
        assert {items[e]["spec"]["nodeName"] for e in elastic} == {proc.node}
        assert len(members) == 1 and None not in members, members
        member = members.pop()
        assert member is not None
        group_now = await offline.get(f"{PODGROUPS}/namespaces/{ns}/podgroups/ring")
        assert group_now["metadata"]["annotations"].get(labels.MEMBER) == member  # pinned, durably
        async with lab.client(member) as client:
            there = await pods(client, ns)
            assert sorted(p["metadata"]["annotations"][labels.ORIGIN_NAME] for p in there) == elastic
            gangs = await client.list(f"{PODGROUPS}/namespaces/{ns}/podgroups")
            assert gangs["items"] == [], "the floor is native: no gang object in the member for elastic workers"

        # Across a restart (kill -9): the job stays pinned; new elastic workers follow it alone.
        uids = {p["metadata"]["uid"] for p in there}
        proc.kill()
        # The routing webhook's and the kubelet API's keys were on disk only while they loaded.
        assert not list(proc.tmp.iterdir()), f"left in the killed provider's TMPDIR: {list(proc.tmp.iterdir())}"
        await start(proc, offline, ns)
        more = ["e6", "e7"]
        for name in more:
            await offline.create(f"/api/v1/namespaces/{ns}/pods", job_pod(name, "ring", "worker-max"))
        elastic += more
        items = await running(11, 60, "2 more elastic workers running after a restart")
        assert {items[e]["metadata"]["annotations"].get(labels.MEMBER) for e in elastic} == {member}
        async with lab.client(member) as client:
            there = await pods(client, ns)
            assert sorted(p["metadata"]["annotations"][labels.ORIGIN_NAME] for p in there) == sorted(elastic)
            assert uids <= {p["metadata"]["uid"] for p in there}, "a member pod was created again"
            assert (await client.list(f"{PODGROUPS}/namespaces/{ns}/podgroups"))["items"] == []

        # Routing off: a namespace without the label is left alone; a job's own label routes it.
        untouched = await offline.create(f"/api/v1/namespaces/{plain}/pods", job_pod("plain", "x", "worker-max"))
        assert "affinity" not in untouched["spec"]
        assert not [t for t in untouched["spec"].get("tolerations", []) if t.get("key") == routing.TAINT_KEY]
        assert routing.ROUTED not in (untouched["metadata"].get("annotations") or {})
        labelled = job_pod("mine", "y", "ps")
        labelled["metadata"]["labels"][routing.POLICY_LABEL] = "elastic"
        mine = await offline.create(f"/api/v1/namespaces/{plain}/pods", labelled)
        assert mine["metadata"]["annotations"][routing.ROUTED] == "elastic/ps"

        # Reclaim: member-1's online load comes back; only the elastic workers go.
        assert member == "member-1"
        await online.set_load(lab.kubeconfig(member), cpu_share=0.95, pod_cpu=90, name="hybrid", wait=True)
        try:
            # The whole job hears of the notice: the native launcher names the leaving workers.
            async def launcher_told() -> dict[str, Any] | None:
                value = (await by_name(offline, ns))["launcher"]["metadata"].get("annotations", {})
                notice = value.get(labels.RECLAIM_NOTICE)
                return json.loads(notice) if notice else None

            told_launcher = await eventually(launcher_told, timeout=60, interval=0.1, what="the launcher's notice")
            assert {p["name"] for p in told_launcher["pods"]} <= set(elastic), told_launcher
            assert told_launcher["deadline"] and all(p["reclaimAt"] for p in told_launcher["pods"])

            async def elastic_reclaimed() -> dict[str, dict[str, Any]] | None:
                now = await by_name(offline, ns)
                done = all(now[e]["status"].get("phase") == "Failed" for e in elastic)
                return now if done else None

            now = await eventually(elastic_reclaimed, timeout=90, what="the elastic workers reclaimed")
            reasons = {e: now[e]["status"].get("reason") for e in elastic}
            assert set(reasons.values()) == {"Reclaimed"}, reasons
            for name in floor:
                assert now[name]["status"]["phase"] == "Running", f"{name} lost: {now[name]['status']}"

            async def told() -> set[str] | None:  # the job's report comes with the reclaim round after
                listed = await offline.list(
                    f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "involvedObject.kind=PodGroup"}
                )
                reasons = {e["reason"] for e in listed["items"]}
                return reasons if "PodsReclaimed" in reasons else None

            await eventually(told, timeout=30, what="PodsReclaimed on the PodGroup")

            async def launcher_cleared() -> bool:
                now = await by_name(offline, ns)
                return labels.RECLAIM_NOTICE not in now["launcher"]["metadata"].get("annotations", {})

            await eventually(launcher_cleared, timeout=30, what="the launcher's notice cleared once they left")
        finally:
            await online.set_load(lab.kubeconfig(member), cpu_share=0, pod_cpu=90, name="hybrid")

        # The docs' example (docs/examples/hybrid.yaml), applied with kubectl into a namespace of
        # its own: the floor (launcher, 2 workers) on native nodes, the 3 elastic workers lent,
        # in one member.
        kubectl_apply(lab, example("hybrid.yaml", node=proc.node, namespace=example_ns))

        async def example_running() -> dict[str, dict[str, Any]] | None:
            items = await by_name(offline, example_ns)
            ok = len(items) == 6 and all(p["status"].get("phase") == "Running" for p in items.values())
            return items if ok else None

        shown = await eventually(example_running, timeout=90, what="the hybrid example's 6 pods running")
        for name in ("launcher", "worker-0", "worker-1"):
            assert shown[name]["spec"]["nodeName"].startswith(NATIVE_PREFIX), (name, shown[name]["spec"]["nodeName"])
        lent = [shown[f"elastic-{i}"] for i in range(3)]
        assert {p["spec"]["nodeName"] for p in lent} == {proc.node}
        assert len({p["metadata"]["annotations"].get(labels.MEMBER) for p in lent}) == 1

        # vkprovider down: pods are still created (the webhook fails open), only not routed.
        proc.ensure_stopped()
        late = await offline.create(f"/api/v1/namespaces/{ns}/pods", job_pod("late", "late", "ps"))
        assert routing.ROUTED not in (late["metadata"].get("annotations") or {})
    finally:
        with contextlib.suppress(ApiError):
            await offline.delete(f"{WEBHOOKS}/vkprovider-routing-{proc.node}")
        proc.ensure_stopped()
        proc.start()  # the provider deletes the member pods while the namespaces go
        try:
            await proc.wait_ready()
            await cleanup(lab, offline, plain)
            await cleanup(lab, offline, ns)
            await cleanup(lab, offline, example_ns)
        finally:
            proc.ensure_stopped()


@pytest.mark.shares_lab
async def test_a_gang_split_between_native_and_virtual_nodes_starts_whole_or_says_why(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, lab.members)
    proc.start()
    await proc.wait_ready()
    ns = await make_namespace(offline, f"split-{uuid.uuid4().hex[:6]}")
    to_virtual = {
        "nodeSelector": {"kubernetes.io/hostname": proc.node},
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
    }
    to_native = {"nodeSelector": {nodes.CAPACITY_LABEL: nodes.NATIVE_CAPACITY}}
    job = JobRef(ns, "native", "big")
    watch = MemberWatch.for_job(lab, lab.members, jobs.job_hash(job))
    await watch.start()
    try:
        # 2 native + 2 virtual of a minimum of 4: the virtual 2 are a gang of 2 in one member.
        await offline.create(f"{PODGROUPS}/namespaces/{ns}/podgroups", pod_group("ok", 4, {}))
        for i in range(2):
            await offline.create(
                f"/api/v1/namespaces/{ns}/pods", job_pod(f"ok-n{i}", "ok", "worker-min", extra=to_native)
            )
            await offline.create(
                f"/api/v1/namespaces/{ns}/pods", job_pod(f"ok-v{i}", "ok", "worker-min", extra=to_virtual)
            )

        async def started() -> dict[str, dict[str, Any]] | None:
            items = {k: v for k, v in (await by_name(offline, ns)).items() if k.startswith("ok-")}
            return (
                items
                if len(items) == 4 and all(p["status"].get("phase") == "Running" for p in items.values())
                else None
            )

        items = await eventually(started, timeout=90, what="the split gang running whole")
        member = items["ok-v0"]["metadata"]["annotations"][labels.MEMBER]
        assert items["ok-v1"]["metadata"]["annotations"][labels.MEMBER] == member
        async with lab.client(member) as client:
            gang = await client.get(
                f"{PODGROUPS}/namespaces/{ns}/podgroups/{forge.gang_name(JobRef(ns, 'native', 'ok'))}"
            )
        assert gang["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2

        # One virtual pod taken away in the member leaves 3 of a minimum of 4: the job is told on
        # its PodGroup, and with `split-gang: end` its native pods are ended too.
        await offline.patch(
            f"{PODGROUPS}/namespaces/{ns}/podgroups/ok", {"metadata": {"annotations": {labels.SPLIT_GANG: "end"}}}
        )
        async with lab.client(member) as client:
            await client.delete(f"/api/v1/namespaces/{ns}/pods/ok-v0", params={"gracePeriodSeconds": 0})

        event = await eventually(
            lambda: gang_below(offline, ns, "ok"), timeout=30, what="GangBelowMinimum on the PodGroup"
        )
        assert event["involvedObject"]["kind"] == "PodGroup" and "policy end" in event["message"], event

        async def natives_ended() -> bool:
            now = await by_name(offline, ns)
            return all(n not in now or now[n]["metadata"].get("deletionTimestamp") for n in ("ok-n0", "ok-n1"))

        await eventually(natives_ended, timeout=30, what="the native half ended")

        # The same split, but no member can host the virtual 2 (9 GPUs each, 8 per node at most):
        # they end GangTimeout with an Event after the gang's timeout, and no member ever holds one.
        await offline.create(
            f"{PODGROUPS}/namespaces/{ns}/podgroups", pod_group("big", 4, {"vkprovider.io/gang-timeout-seconds": "10"})
        )
        gpus = {"requests": {"cpu": "1", "nvidia.com/gpu": "9"}, "limits": {"nvidia.com/gpu": "9"}}
        for i in range(2):
            await offline.create(
                f"/api/v1/namespaces/{ns}/pods", job_pod(f"big-n{i}", "big", "worker-min", extra=to_native)
            )
            body = job_pod(f"big-v{i}", "big", "worker-min", extra=to_virtual)
            body["spec"]["containers"][0]["resources"] = gpus
            await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def timed_out() -> dict[str, dict[str, Any]] | None:
            now = await by_name(offline, ns)
            virtual = [now.get(f"big-v{i}") for i in range(2)]
            return now if all(v and v["status"].get("phase") == "Failed" for v in virtual) else None

        now = await eventually(timed_out, timeout=60, what="the virtual part ending GangTimeout")
        for i in range(2):
            assert now[f"big-v{i}"]["status"]["reason"] == "GangTimeout", now[f"big-v{i}"]["status"]

        async def told() -> bool:
            listed = await offline.list(
                f"/api/v1/namespaces/{ns}/events", params={"fieldSelector": "reason=GangTimeout"}
            )
            return {e["involvedObject"]["name"] for e in listed["items"]} >= {"big-v0", "big-v1"}

        # Each pod's Event is its own create, sent after the job's pods were woken for their
        # Failed status: a status may be seen before the last Event (a full run, 97f3bd8).
        await eventually(told, timeout=15, what="a GangTimeout Event on each virtual pod")

        # Its native half is below the minimum with nothing to wait for: the job is told on its
        # PodGroup; the default policy (keep) leaves the native pods running, marked.
        big_event = await eventually(
            lambda: gang_below(offline, ns, "big"), timeout=15, what="GangBelowMinimum on the big PodGroup"
        )
        assert "policy keep" in big_event["message"], big_event

        # The native pods' marks are written beside the Event, not before it (a full run, 38a6f46).
        async def marked() -> bool:
            natives = await by_name(offline, ns)
            return all(
                any(
                    c["type"] == "vkprovider.io/GangBelowMinimum" and c["status"] == "True"
                    for c in natives[f"big-n{i}"]["status"].get("conditions") or []
                )
                for i in range(2)
            )

        await eventually(marked, timeout=15, what="each native pod marked GangBelowMinimum")
        natives = await by_name(offline, ns)
        for i in range(2):
            assert natives[f"big-n{i}"]["status"].get("phase") == "Running", natives[f"big-n{i}"]["status"]
        await asyncio.sleep(1)
        watch.check()
        assert not any(watch.seen.values()), f"a member held pods of a gang it could not host: {watch.seen}"
    finally:
        await watch.stop()
        await cleanup_and_stop(lab, offline, ns, proc)
