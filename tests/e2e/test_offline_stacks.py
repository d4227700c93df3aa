"""Real offline stacks (issue 38): JobSet, unmodified, in the lab's front end (e2e.stacks), and
its jobs on lent capacity.

A JobSet's leader and workers are Jobs of their own, each the owner of its pods; to a gang
scheduler at the front end they are one job that starts whole or not at all. Here the JobSet
controller (built from its pinned module, its webhooks answering through the apiserver) makes
the Jobs, the Job controller the pods, the front end's scheduler binds them to the virtual
node, and the provider takes all of them to one member, pinned on the JobSet.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e import lab as lab_mod
from e2e.fixtures import Lab
from federation import jobs
from federation.jobs import JobRef
from tests.e2e.helpers import delete_namespace, eventually, make_namespace, pods
from tests.e2e.memberwatch import PODGROUPS, PODS, MemberWatch
from tests.e2e.test_federation_capacity import federation_vk
from vkprovider.kube import KubeClient, NotFound

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Away from member-1, where the reclaim tests run (e2e.fixtures.CHAIN).
MEMBERS = ["member-2", "member-3"]
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2"


def replicated_job(name: str, node: str, pods_at_once: int) -> dict[str, Any]:
    """One replicated Job whose pods ask for the virtual node and finish after 5 s in a member."""
    pod_spec = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        "containers": [{"name": "main", "image": "trainer:1", "resources": {"requests": {"cpu": "2"}}}],
    }
    job = {
        "parallelism": pods_at_once,
        "completions": pods_at_once,
        "backoffLimit": 0,
        "template": {"metadata": {"annotations": {"vkprovider.io/sim-complete-after": "5s"}}, "spec": pod_spec},
    }
    return {"name": name, "replicas": 1, "template": {"spec": job}}


def pods_seen(watch: MemberWatch) -> dict[str, set[str]]:
    """The members that ever held a pod of the watched job, with those pods' names (its gang
    object, created there with it, is not a pod)."""
    out: dict[str, set[str]] = {}
    for s in watch.history:
        if s.path == PODS:
            out.setdefault(s.member, set()).add(s.name)
    return out


def jobset(name: str, node: str, *, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": [replicated_job("leader", node, 1), replicated_job("workers", node, workers)]},
    }


@pytest.mark.lab_turn(shares=["offline", *MEMBERS])
async def test_a_jobsets_leader_and_workers_run_in_one_member_and_it_completes(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await lab_mod.add_stacks(lab.state_dir, ("jobset",))
    proc = federation_vk(lab, tmp_path, MEMBERS)
    proc.start()
    ns = await make_namespace(offline, f"jobset-{uuid.uuid4().hex[:6]}")
    watch = MemberWatch.for_job(lab, MEMBERS, jobs.job_hash(JobRef(ns, jobs.JOBSET, "train")))
    await watch.start()
    try:
        await proc.wait_ready()
        await offline.create(f"{JOBSETS}/namespaces/{ns}/jobsets", jobset("train", proc.node, workers=4))

        async def completed() -> dict[str, Any] | None:
            found = await offline.get(f"{JOBSETS}/namespaces/{ns}/jobsets/train")
            conditions = {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}
            if conditions.get("Failed") == "True":
                raise AssertionError(f"the JobSet failed: {found['status']}")
            return found if conditions.get("Completed") == "True" else None

        try:
            done = await eventually(completed, timeout=120, what="the JobSet completed")
        except AssertionError as exc:
            states = {
                p["metadata"]["name"]: (p["status"].get("phase"), p["status"].get("reason"))
                for p in await pods(offline, ns)
            }
            raise AssertionError(f"{exc}; front-end pods: {states}; members saw {watch.seen}") from None
        watch.check()
        front = await pods(offline, ns)
        assert len(front) == 5, [p["metadata"]["name"] for p in front]
        assert {p["status"]["phase"] for p in front} == {"Succeeded"}
        # One job: every pod of the leader's and the workers' Jobs went to the same member, and
        # no pod of it was ever in the other.
        went = pods_seen(watch)
        assert len(went) == 1 and len(next(iter(went.values()))) == 5, watch.seen
        (member,) = went
        # Sent as one gang: the member got a gang object for it (a plain job gets none).
        assert {s.member for s in watch.history if s.path == PODGROUPS} == {member}
        assert {p["metadata"]["annotations"]["vkprovider.io/member"] for p in front} == {member}
        # The durable pin is on the JobSet itself.
        assert done["metadata"]["annotations"]["vkprovider.io/member"] == member
    finally:
        await watch.stop()
        await delete_namespace(offline, ns)
        proc.ensure_stopped()


KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


def kueue_objects(tag: str, node: str, ns: str, *, cores: int) -> list[tuple[str, dict[str, Any]]]:
    """The virtual node as a ResourceFlavor (its hostname injected as the admitted pods' node
    selector, its taint tolerated), a ClusterQueue of `cores` CPU on it, and a LocalQueue."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": f"vk-{tag}"},
        "spec": {
            "nodeLabels": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        },
    }
    quota = {"name": "cpu", "nominalQuota": cores}
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": f"lent-{tag}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": f"vk-{tag}", "resources": [quota]}]}],
        },
    }
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "lq", "namespace": ns},
        "spec": {"clusterQueue": f"lent-{tag}"},
    }
    return [
        (f"{KUEUE}/resourceflavors", flavor),
        (f"{KUEUE}/clusterqueues", cluster_queue),
        (f"{KUEUE}/namespaces/{ns}/localqueues", local_queue),
    ]


def queued_job(name: str, *, pods_at_once: int) -> dict[str, Any]:
    """A batch Job for LocalQueue lq: no node selector of its own (Kueue's flavor gives it one)."""
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "batch:1", "resources": {"requests": {"cpu": "2"}}}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "parallelism": pods_at_once,
            "completions": pods_at_once,
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": {"vkprovider.io/sim-complete-after": "5s"}}, "spec": pod_spec},
        },
    }


@pytest.mark.lab_turn(shares=["offline", *MEMBERS])
async def test_a_job_queued_in_kueue_on_the_virtual_nodes_flavor_is_admitted_and_runs_in_one_member(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await lab_mod.add_stacks(lab.state_dir, ("jobset", "kueue"))
    proc = federation_vk(lab, tmp_path, MEMBERS)
    proc.start()
    tag = uuid.uuid4().hex[:6]
    ns = await make_namespace(offline, f"kueue-{tag}")
    watch = MemberWatch.for_job(lab, MEMBERS, jobs.job_hash(JobRef(ns, jobs.OWNER, "Job/batch")))
    await watch.start()
    objects = kueue_objects(tag, proc.node, ns, cores=8)
    try:
        await proc.wait_ready()
        for path, body in objects:
            await offline.create(path, body)
        await offline.create(f"/apis/batch/v1/namespaces/{ns}/jobs", queued_job("batch", pods_at_once=3))

        async def complete() -> dict[str, Any] | None:
            found = await offline.get(f"/apis/batch/v1/namespaces/{ns}/jobs/batch")
            return found if (found.get("status") or {}).get("succeeded") == 3 else None

        try:
            job = await eventually(complete, timeout=120, what="the queued Job complete")
        except AssertionError as exc:
            workloads = await offline.list(f"{KUEUE}/namespaces/{ns}/workloads")
            said = [(w["metadata"]["name"], (w.get("status") or {}).get("conditions")) for w in workloads["items"]]
            raise AssertionError(f"{exc}; workloads: {said}; members saw {watch.seen}") from None
        watch.check()
        # Admitted by Kueue: unsuspended, with the flavor's node selector on its pods.
        assert job["spec"]["suspend"] is False
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": proc.node}
        (workload,) = (await offline.list(f"{KUEUE}/namespaces/{ns}/workloads"))["items"]
        admitted = {c["type"]: c["status"] for c in workload["status"]["conditions"]}
        assert admitted.get("Admitted") == "True", workload["status"]
        went = pods_seen(watch)
        assert len(went) == 1 and len(next(iter(went.values()))) == 3, watch.seen
    finally:
        await watch.stop()
        await delete_namespace(offline, ns)
        for path, body in reversed(objects[:2]):
            with contextlib.suppress(NotFound):  # not made: the test failed before
                await offline.delete(f"{path}/{body['metadata']['name']}")
        proc.ensure_stopped()
