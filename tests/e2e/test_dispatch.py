"""Dispatch end to end: gangs leave the front end whole, land in one member (and one network
pod when asked), never partially anywhere, and time out cleanly when no member can take them."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from e2e.fixtures import Lab
from federation import jobs, labels
from federation.jobs import JobRef
from tests.e2e.helpers import KILL_TRIALS, changes_during, delete_namespace, eventually, make_namespace, pods, settle
from tests.e2e.memberwatch import MemberWatch, partial_spans
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, Unreachable

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: The kill -9 trials' members: not member-1, so they run beside the reclaim chain (e2e.fixtures).
KILL_MEMBERS = ["member-2", "member-3"]
GPU = "nvidia.com/gpu"
V100 = "Tesla-V100-SXM2-32GB"


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def provider(lab: Lab, tmp_path: Path) -> AsyncIterator[VkProcess]:
    proc = federation_vk(lab, tmp_path, lab.members)
    await start_synced(proc)
    try:
        yield proc
    finally:
        proc.ensure_stopped()


async def start_synced(proc: VkProcess) -> None:
    """Start the provider and wait until it knows every member's capacity: nothing is
    dispatched before that."""
    proc.start()
    await proc.wait_ready()
    await eventually(lambda: _members_synced(proc), timeout=30, what="member capacity")


async def _members_synced(proc: VkProcess) -> bool:
    view = await proc.view()
    configured = {m["name"] for m in proc.overrides["provider.federation"]["members"]}
    members = view.get("members", {})
    return configured <= set(members) and all("lent" in members[m] for m in configured)


def gang_pod(name: str, node: str, group: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/trainer:1",
                    "resources": {"requests": {GPU: str(gpus), "cpu": "1"}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def pod_group(name: str, min_count: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def member_2_never_binds(lab: Lab, workdir: Path, members: list[str] | None = None) -> VkProcess:
    """A provider over `members` (every member by default) that prefers member-2, whose pods name
    a scheduler member-2 does not run: a gang sent there is never bound."""
    weights = {"member-1": 1, "member-2": 10, "member-3": 5}
    proc = federation_vk(lab, workdir, members or lab.members)
    for entry in proc.overrides["provider.federation"]["members"]:
        entry["weight"] = weights[entry["name"]]
        if entry["name"] == "member-2":
            entry["scheduler_name"] = "no-such-scheduler"
    return proc


async def cleanup(lab: Lab, offline: KubeClient, ns: str) -> None:
    """Delete the namespace and wait for its pods to go (the provider deletes their member
    pods meanwhile), then drop the member namespaces: later tests start from clean members."""
    await delete_namespace(offline, ns)

    async def gone() -> bool:
        return not await pods(offline, ns)

    try:
        await eventually(gone, timeout=60, what=f"pods of {ns} gone")
    finally:
        for member in lab.members:
            async with lab.client(member) as client:

                async def deleted(client: KubeClient = client) -> bool:
                    # A test may run two parts at once, one in a member's outage (test_outages).
                    with contextlib.suppress(Unreachable):
                        await delete_namespace(client, ns)
                        return True
                    return False

                await eventually(deleted, timeout=90, what=f"{ns} deleted in {member}")


async def cleanup_and_stop(lab: Lab, offline: KubeClient, ns: str, proc: VkProcess) -> None:
    """`cleanup`, then stop the provider (which deletes member pods meanwhile) whatever happens."""
    try:
        await cleanup(lab, offline, ns)
    finally:
        proc.ensure_stopped()


async def job_pods_in_members(lab: Lab, job: JobRef) -> dict[str, list[str]]:
    """Names of the job's pods in each member, found by the job label."""
    out: dict[str, list[str]] = {}
    for member in lab.members:
        async with lab.client(member) as client:
            found = await client.list(
                "/api/v1/pods", params={"labelSelector": f"{labels.JOB_LABEL}={jobs.job_hash(job)}"}
            )
        out[member] = [p["metadata"]["name"] for p in found["items"]]
    return out


async def test_sixteen_gpu_gang_lands_whole_in_one_network_pod(
    lab: Lab, offline: KubeClient, provider: VkProcess
) -> None:
    ns = await make_namespace(offline, f"gang16-{uuid.uuid4().hex[:6]}")
    job = JobRef(ns, "native", "train")
    watch = MemberWatch.for_job(lab, ["member-1", "member-3"], jobs.job_hash(job))
    await watch.start()
    try:
        annotations = {"vkprovider.io/same-network-pod": "true", "vkprovider.io/gpu-model": V100}
        await offline.create(
            f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", pod_group("train", 16, annotations)
        )
        await asyncio.gather(
            *(
                offline.create(f"/api/v1/namespaces/{ns}/pods", gang_pod(f"w{i:02d}", provider.node, "train", 1))
                for i in range(16)
            )
        )

        async def all_running() -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            return items if sum(1 for p in items if p["status"].get("phase") == "Running") == 16 else None

        try:
            await eventually(all_running, timeout=120, what="16 gang pods running")
        except AssertionError as exc:
            states = {
                p["metadata"]["name"]: (p["status"].get("phase"), p["status"].get("reason"))
                for p in await pods(offline, ns)
            }
            async with lab.client("member-2") as member:
                there = {
                    p["metadata"]["name"]: (p["status"].get("phase"), p["spec"].get("nodeName"))
                    for p in await pods(member, ns)
                }
            raise AssertionError(f"{exc}; front end: {states}; member-2: {there}") from None
        async with lab.client("member-2") as member:
            placed = await pods(member, ns)
            nodes = await member.list("/api/v1/nodes")
        assert len(placed) == 16
        network_pod = {
            n["metadata"]["name"]: n["metadata"]["labels"]["vkprovider.io/network-pod"] for n in nodes["items"]
        }
        assert len({network_pod[p["spec"]["nodeName"]] for p in placed}) == 1, "the gang spans network pods"
        front = await pods(offline, ns)
        assert {p["metadata"]["annotations"]["vkprovider.io/member"] for p in front} == {"member-2"}
        # The durable pin is on the job's PodGroup: one write, before anything reached member-2.
        group = await offline.get(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/train")
        assert group["metadata"]["annotations"]["vkprovider.io/member"] == "member-2"
        await asyncio.sleep(1)
        assert watch.seen == {"member-1": set(), "member-3": set()}, "other members saw the gang"
        # The gang's wait and bind times are observed (issue 13's histograms).
        assert await provider.metric("vkprovider_gang_wait_seconds_count") >= 1
        assert await provider.metric("vkprovider_gang_bind_seconds_count") >= 1
    finally:
        await watch.stop()
        await cleanup(lab, offline, ns)


@pytest.mark.shares_lab
async def test_gang_that_fits_nowhere_times_out_and_leaves_nothing(
    lab: Lab, offline: KubeClient, provider: VkProcess
) -> None:
    ns = await make_namespace(offline, f"nofit-{uuid.uuid4().hex[:6]}")
    job = JobRef(ns, "native", "huge")
    watch = MemberWatch.for_job(lab, lab.members, jobs.job_hash(job))
    await watch.start()
    try:
        # 9 GPUs per pod: the pooled node has room in sum, no member node has 9.
        annotations = {"vkprovider.io/gang-timeout-seconds": "8"}
        await offline.create(
            f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", pod_group("huge", 4, annotations)
        )
        for i in range(4):
            await offline.create(f"/api/v1/namespaces/{ns}/pods", gang_pod(f"h{i}", provider.node, "huge", 9))

        async def timed_out() -> list[dict[str, Any]] | None:
            items = await pods(offline, ns)
            failed = [p for p in items if p["status"].get("phase") == "Failed"]
            return items if len(failed) == 4 and all(p["status"]["reason"] == "GangTimeout" for p in failed) else None

        items = await eventually(timed_out, timeout=60, what="GangTimeout on all 4 pods")
        assert "within 8s" in items[0]["status"]["message"]
        await asyncio.sleep(1)
        assert all(not seen for seen in watch.seen.values()), f"a member saw part of the gang: {watch.seen}"
    finally:
        await watch.stop()
        await cleanup(lab, offline, ns)


@pytest.mark.shares_lab
async def test_a_gang_the_member_does_not_bind_rolls_back_to_the_next_member(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """member-2 is preferred but its pods name a scheduler it does not run, so it never binds
    the gang: after the gang's timeout its pods and PodGroup are deleted there and the gang goes
    whole to the next member (member-3), with an Event saying so."""
    proc = member_2_never_binds(lab, tmp_path)
    await start_synced(proc)
    ns = await make_namespace(offline, f"rollback-{uuid.uuid4().hex[:5]}")
    job = JobRef(ns, "native", "g4")
    watch = MemberWatch.for_job(lab, ["member-2"], jobs.job_hash(job))
    await watch.start()
    try:
        group = pod_group("g4", 4, {"vkprovider.io/gang-timeout-seconds": "8"})
        await offline.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", group)
        for i in range(4):
            body = gang_pod(f"w{i}", proc.node, "g4", 0)
            body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
            await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def running_in_member_3() -> bool:
            items = await pods(offline, ns)
            return len(items) == 4 and all(
                p["status"].get("phase") == "Running" and p["metadata"]["annotations"].get(labels.MEMBER) == "member-3"
                for p in items
            )

        await eventually(running_in_member_3, timeout=60, what="the gang running in member-3")
        assert len(watch.seen["member-2"]) == 5, "member-2 got the gang (4 pods and its PodGroup) first"
        placed = await job_pods_in_members(lab, job)
        assert placed["member-2"] == [] and len(placed["member-3"]) == 4 and placed["member-1"] == []
        async with lab.client("member-2") as member_2:
            groups = await member_2.list(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups")
        assert groups["items"] == [], "the member gang is deleted on rollback"
        front_group = await offline.get(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/g4")
        assert front_group["metadata"]["annotations"][labels.MEMBER] == "member-3"
        events = await offline.list(f"/api/v1/namespaces/{ns}/events")
        assert any(e["reason"] == "GangRolledBack" and "member-2" in e["message"] for e in events["items"])
    finally:
        await watch.stop()
        try:
            await cleanup(lab, offline, ns)
        finally:
            proc.ensure_stopped()


@pytest.mark.shares_lab
@pytest.mark.parametrize("dialect", ["scheduler-plugins", "volcano"])
async def test_other_gang_dialects_at_the_front_end(
    lab: Lab, offline: KubeClient, provider: VkProcess, dialect: str
) -> None:
    ns = await make_namespace(offline, f"{dialect[:5]}-{uuid.uuid4().hex[:6]}")
    try:
        if dialect == "scheduler-plugins":
            group = {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "g"},
                "spec": {"minMember": 3},
            }
            await offline.create(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", group)
        else:
            group = {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "g"},
                "spec": {"minMember": 3},
            }
            await offline.create(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups", group)

        def member_of_gang(i: int) -> dict[str, Any]:
            body = gang_pod(f"p{i}", provider.node, "g", 1)
            del body["spec"]["schedulingGroup"]  # the front end's own scheduler knows no such gang
            if dialect == "scheduler-plugins":
                body["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "g"}
            else:
                body["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "g"}
            return body

        for i in range(2):
            await offline.create(f"/api/v1/namespaces/{ns}/pods", member_of_gang(i))

        async def reasons() -> set[str] | None:
            items = await pods(offline, ns)
            found = {p["status"].get("reason", "") for p in items}
            return found if found == {"WaitingForGang"} else None

        await eventually(reasons, timeout=30, what="2 of 3 waiting at the front end")
        items = await pods(offline, ns)
        assert all("2 of 3" in p["status"]["message"] for p in items)
        job = JobRef(ns, dialect, "g")
        for member in lab.members:
            async with lab.client(member) as client:
                leaked = await client.list(
                    "/api/v1/pods", params={"labelSelector": f"{labels.JOB_LABEL}={jobs.job_hash(job)}"}
                )
                assert leaked["items"] == [], f"{member} has part of a waiting gang"
        await offline.create(f"/api/v1/namespaces/{ns}/pods", member_of_gang(2))

        async def running() -> bool:
            items = await pods(offline, ns)
            return sum(1 for p in items if p["status"].get("phase") == "Running") == 3

        await eventually(running, timeout=60, what="the gang running once complete")
        members = {p["metadata"]["annotations"]["vkprovider.io/member"] for p in await pods(offline, ns)}
        assert len(members) == 1
    finally:
        await cleanup(lab, offline, ns)


@pytest.mark.shares_lab
async def test_deleting_front_end_pods_deletes_member_pods(lab: Lab, offline: KubeClient, provider: VkProcess) -> None:
    ns = await make_namespace(offline, f"del-{uuid.uuid4().hex[:6]}")
    try:
        body = gang_pod("solo", provider.node, "none", 0)
        del body["spec"]["schedulingGroup"]
        body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
        await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def placed() -> tuple[str, dict[str, Any]] | None:
            item = await offline.get(f"/api/v1/namespaces/{ns}/pods/solo")
            member = (item["metadata"].get("annotations") or {}).get("vkprovider.io/member")
            return (member, item) if member and item["status"].get("phase") == "Running" else None

        member, item = await eventually(placed, what="the pod running in a member")
        assert item["status"]["hostIP"] == "127.0.0.1" and item["status"]["podIP"]
        await offline.delete(f"/api/v1/namespaces/{ns}/pods/solo")

        async def gone_everywhere() -> bool:
            front = await pods(offline, ns)
            async with lab.client(member) as client:
                there = await pods(client, ns)
            return not front and not there

        await eventually(gone_everywhere, timeout=30, what="the pod gone from the front end and the member")
    finally:
        await cleanup(lab, offline, ns)


@pytest.mark.shares_lab
async def test_config_maps_secrets_and_headless_services_follow_their_pods(
    lab: Lab, offline: KubeClient, provider: VkProcess
) -> None:
    ns = await make_namespace(offline, f"deps-{uuid.uuid4().hex[:6]}")
    try:
        headless = {
            "metadata": {"name": "trainers"},
            "spec": {"clusterIP": "None", "selector": {"app": "trainer"}, "ports": [{"name": "rdzv", "port": 29500}]},
        }
        await offline.create(f"/api/v1/namespaces/{ns}/services", headless)
        await offline.create(
            f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "settings"}, "data": {"lr": "0.1"}}
        )
        secret = {"metadata": {"name": "token"}, "type": "Opaque", "data": {"key": "c2VjcmV0"}}
        await offline.create(f"/api/v1/namespaces/{ns}/secrets", secret)
        body = gang_pod("user", provider.node, "none", 0)
        del body["spec"]["schedulingGroup"]
        body["metadata"]["labels"] = {"app": "trainer"}
        container = body["spec"]["containers"][0]
        container["resources"] = {"requests": {"cpu": "1"}}
        container["envFrom"] = [{"configMapRef": {"name": "settings"}}]
        container["volumeMounts"] = [{"name": "token", "mountPath": "/var/run/token"}]
        body["spec"]["volumes"] = [{"name": "token", "secret": {"secretName": "token"}}]
        await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def placed() -> str | None:
            item = await offline.get(f"/api/v1/namespaces/{ns}/pods/user")
            member = (item["metadata"].get("annotations") or {}).get("vkprovider.io/member")
            return member if member and item["status"].get("phase") == "Running" else None

        member = await eventually(placed, what="the pod running in a member")
        async with lab.client(member) as client:
            copy = await client.get(f"/api/v1/namespaces/{ns}/configmaps/settings")
            assert copy["data"] == {"lr": "0.1"}
            secret_copy = await client.get(f"/api/v1/namespaces/{ns}/secrets/token")
            assert secret_copy["data"] == {"key": "c2VjcmV0"}
            # The rendezvous name resolves in the member: the headless Service is there, selecting the pod.
            service = await client.get(f"/api/v1/namespaces/{ns}/services/trainers")
            assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"app": "trainer"}
            assert service["spec"]["ports"][0]["port"] == 29500
            member_pod = (await pods(client, ns))[0]
            assert member_pod["metadata"]["labels"]["app"] == "trainer"
            # Kept in sync with the front end.
            await offline.patch(f"/api/v1/namespaces/{ns}/configmaps/settings", {"data": {"lr": "0.05"}})

            async def synced() -> bool:
                item = await client.get(f"/api/v1/namespaces/{ns}/configmaps/settings")
                return bool(item["data"] == {"lr": "0.05"})

            await eventually(synced, timeout=20, what="the copy updated")
            await offline.delete(f"/api/v1/namespaces/{ns}/pods/user", params={"gracePeriodSeconds": 0})

            async def copies_gone() -> bool:
                cms = await client.list(
                    f"/api/v1/namespaces/{ns}/configmaps", params={"labelSelector": "vkprovider.io/reflected=true"}
                )
                secrets = await client.list(
                    f"/api/v1/namespaces/{ns}/secrets", params={"labelSelector": "vkprovider.io/reflected=true"}
                )
                services = await client.list(
                    f"/api/v1/namespaces/{ns}/services", params={"labelSelector": "vkprovider.io/reflected=true"}
                )
                return not cms["items"] and not secrets["items"] and not services["items"]

            await eventually(copies_gone, timeout=60, what="reflected copies removed with the last pod")
    finally:
        await cleanup(lab, offline, ns)


@pytest.mark.lab_turn(alone=KILL_MEMBERS, shares=["offline"])
@pytest.mark.long
async def test_kill_9_during_gang_dispatch_never_leaves_a_partial_gang(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """kill -9 at KILL_TRIALS (5) random moments while a 32-pod gang is dispatched. Every member is watched
    for the whole trial, so what happened in between counts, not only the end: no member holds
    part of the gang for longer than the gang timeout (plus the provider's restart), no member
    pod is deleted and created again, every member pod runs a live front-end pod (by UID), and
    the gang ends whole in one member."""
    import random

    timeout = 20.0
    slack = 3.0  # the gang timer's 0.5 s tick, the rollback's delete and the watch's delivery
    proc = federation_vk(lab, tmp_path, KILL_MEMBERS)
    await start_synced(proc)
    rng = random.Random(32)
    # Each trial's cleanup runs beside the next trials: its namespace, pods and member pods are
    # apart from theirs (their watches select their own job), and the members have room for both.
    cleanups: list[asyncio.Task[None]] = []
    try:
        for trial in range(KILL_TRIALS):
            ns = await make_namespace(offline, f"kill{trial}-{uuid.uuid4().hex[:5]}")
            job = JobRef(ns, "native", "g32")
            watch = MemberWatch.for_job(lab, KILL_MEMBERS, jobs.job_hash(job))
            await watch.start()
            try:
                annotations = {"vkprovider.io/gang-timeout-seconds": str(int(timeout))}
                await offline.create(
                    f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", pod_group("g32", 32, annotations)
                )
                creating = asyncio.gather(
                    *(
                        offline.create(f"/api/v1/namespaces/{ns}/pods", gang_pod(f"w{i:02d}", proc.node, "g32", 1))
                        for i in range(32)
                    )
                )
                await asyncio.sleep(rng.uniform(0.2, 2.5))
                proc.kill()
                killed = time.monotonic()
                await creating
                proc.start()
                await proc.wait_ready(timeout=60)
                restart = time.monotonic() - killed

                async def converged(ns: str = ns) -> bool:
                    items = await pods(offline, ns)
                    return len(items) == 32 and all(p["status"].get("phase") == "Running" for p in items)

                try:
                    await eventually(converged, timeout=90, what=f"trial {trial}: the 32-pod gang running")
                except AssertionError as exc:
                    states: dict[str, int] = {}
                    for p in await pods(offline, ns):
                        status, bound = p["status"], bool(p["spec"].get("nodeName"))
                        state = f"{status.get('phase')}/{status.get('reason')}/{bound}"
                        states[state] = states.get(state, 0) + 1
                    in_members = {m: len(names) for m, names in (await job_pods_in_members(lab, job)).items()}
                    raise AssertionError(
                        f"{exc}; front-end pods: {states}; in members: {in_members}; log: {proc.tail(5)}"
                    ) from None
                front = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await pods(offline, ns)}
                await asyncio.sleep(1.0)  # let the watches deliver the last events
                watch.check()
                end = time.monotonic()
                for member in KILL_MEMBERS:
                    for began, ended in partial_spans(watch.history, member=member, minimum=32, end=end):
                        assert ended - began <= timeout + restart + slack, (
                            f"trial {trial}: {member} held part of the gang for {ended - began:.1f}s "
                            f"(gang timeout {timeout:.0f}s, restart {restart:.1f}s)"
                        )
                recreated = {k: uids for k, uids in watch.uids_by_name().items() if len(uids) > 1}
                assert not recreated, f"trial {trial}: member pods deleted and created again: {recreated}"
                strays = {
                    (s.member, s.name, s.origin_uid)
                    for s in watch.history
                    if s.path.endswith("/pods") and front.get(s.name) != s.origin_uid
                }
                assert not strays, f"trial {trial}: member pods whose origin is no live front-end pod: {strays}"
                holders = [m for m in KILL_MEMBERS if watch.holding(m)]
                assert len(holders) == 1, f"trial {trial}: gang split across {holders}"
                assert len(watch.holding(holders[0])) == 32, f"trial {trial}: {holders[0]} holds a partial gang"
            finally:
                try:
                    await watch.stop()
                finally:
                    cleanups.append(asyncio.create_task(cleanup(lab, offline, ns), name=f"test/cleanup-{ns}"))
    finally:
        try:
            await settle(*cleanups)  # while the provider runs: it deletes the member pods
        finally:
            proc.ensure_stopped()


@pytest.mark.shares_lab
async def test_a_job_stays_in_its_member_across_restarts_and_scale_ups(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """A job without a gang has no pin written before dispatch: its member pods' job label is
    the record a restart reads. So after kill -9 and a restart whose weights now prefer another
    member, the job's new pods still follow its first ones, also when killed mid-dispatch."""

    def prefer(proc: VkProcess, member: str) -> None:
        for entry in proc.overrides["provider.federation"]["members"]:
            entry["weight"] = 10 if entry["name"] == member else 1

    proc = federation_vk(lab, tmp_path, lab.members)
    prefer(proc, "member-1")
    await start_synced(proc)
    ns = await make_namespace(offline, f"stay-{uuid.uuid4().hex[:5]}")
    job = JobRef(ns, "owner", "ReplicaSet/web")
    template = gang_pod("x", proc.node, "unused", 0)
    del template["spec"]["schedulingGroup"]
    template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    replica_set = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 10,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
        },
    }

    async def placed() -> dict[str, int]:
        return {m: len(names) for m, names in (await job_pods_in_members(lab, job)).items()}

    async def running(count: int) -> bool:
        items = await pods(offline, ns)
        return len(items) == count and all(p["status"].get("phase") == "Running" for p in items)

    try:
        await offline.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set)
        await eventually(lambda: running(10), timeout=60, what="10 replicas running")
        assert await placed() == {"member-1": 10, "member-2": 0, "member-3": 0}

        proc.kill()
        prefer(proc, "member-2")
        proc.start()
        await proc.wait_ready(timeout=60)
        scale = f"/apis/apps/v1/namespaces/{ns}/replicasets/web"
        await offline.patch(scale, {"spec": {"replicas": 25}})
        await eventually(lambda: running(25), timeout=60, what="25 replicas running")
        assert await placed() == {"member-1": 25, "member-2": 0, "member-3": 0}

        await offline.patch(scale, {"spec": {"replicas": 40}})
        await asyncio.sleep(0.4)
        proc.kill()
        proc.start()
        await proc.wait_ready(timeout=60)
        await eventually(lambda: running(40), timeout=90, what="40 replicas running")
        assert await placed() == {"member-1": 40, "member-2": 0, "member-3": 0}
    finally:
        try:
            await cleanup(lab, offline, ns)  # while the provider runs: it deletes the member pods
        finally:
            proc.ensure_stopped()


async def test_elastic_job_starts_its_minimum_then_grows_as_online_load_falls(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    from e2e import online

    # Online services hold whole machines of member-1 (90-core replicas): 16 of 20 nodes busy.
    kubeconfig = lab.kubeconfig("member-1")
    machine = 90.0

    async def online_replicas(count: int) -> None:
        await online.set_load(kubeconfig, cpu_share=count * machine / 1900, pod_cpu=machine, wait=True, name="machines")

    await online_replicas(16)
    proc = federation_vk(lab, tmp_path, lab.members)
    proc.overrides["provider.federation"]["members"][0]["weight"] = 10  # prefer member-1
    await start_synced(proc)
    ns = await make_namespace(offline, f"elastic-{uuid.uuid4().hex[:6]}")
    try:
        await offline.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups", pod_group("ring", 4, {}))
        for i in range(12):
            body = gang_pod(f"r{i:02d}", proc.node, "ring", 0)
            body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "60"}}
            await offline.create(f"/api/v1/namespaces/{ns}/pods", body)

        async def running_count() -> int:
            return sum(1 for p in await pods(offline, ns) if p["status"].get("phase") == "Running")

        async def exactly(n: int) -> bool:
            return await running_count() == n

        await eventually(lambda: exactly(4), timeout=60, what="the minimum of 4 running together")
        # No room for more while online load is high: from a list with exactly 4 running, three
        # seconds watched (every change seen), and no other pod starts.
        listed = await offline.list(f"/api/v1/namespaces/{ns}/pods")
        first = {p["metadata"]["name"] for p in listed["items"] if p["status"].get("phase") == "Running"}
        assert len(first) == 4, first
        changes = await changes_during(
            offline, f"/api/v1/namespaces/{ns}/pods", since=listed["metadata"]["resourceVersion"], window=3
        )
        started = {e["object"]["metadata"]["name"] for e in changes if e["object"]["status"].get("phase") == "Running"}
        assert started <= first, started - first
        for step, replicas in enumerate(range(15, 7, -1), start=1):
            await online_replicas(replicas)
            wanted = 4 + step
            await eventually(partial(exactly, wanted), timeout=60, what=f"{wanted} workers after a machine freed")
        members = {p["metadata"]["annotations"]["vkprovider.io/member"] for p in await pods(offline, ns)}
        assert members == {"member-1"}
        async with lab.client("member-1") as client:
            assert len(await pods(client, ns)) == 12
    finally:
        await cleanup(lab, offline, ns)
        proc.ensure_stopped()
        await online_replicas(0)
