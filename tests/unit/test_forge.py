"""Pure translation front end -> member and back, table-tested."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from federation import jobs, labels
from federation.dispatch import forge, reflect
from federation.dispatch.placement import Placement
from federation.jobs import GangSpec, JobRef
from vkprovider.objects import references

JOB = JobRef("team-a", "native", "train")


def front_pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nodeName": "vk-pool",
        "schedulerName": "default-scheduler",
        "priority": 1500,
        "priorityClassName": "train",
        "schedulingGroup": {"podGroupName": "train"},
        "schedulingGates": [{"name": "x"}],
        "serviceAccountName": "trainer",
        "nodeSelector": {"type": "virtual-kubelet", "gpu.vkprovider.io/V100": "true", "disk": "ssd"},
        "tolerations": [
            {"key": "virtual-kubelet.io/provider", "operator": "Exists"},
            {"key": "dedicated", "operator": "Exists"},
        ],
        "volumes": [
            {"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            {"name": "data", "configMap": {"name": "settings"}},
        ],
        "containers": [
            {
                "name": "main",
                "image": "trainer:1",
                "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
                "volumeMounts": [
                    {"name": "kube-api-access-x", "mountPath": "/var/run/secrets"},
                    {"name": "data", "mountPath": "/d"},
                ],
            }
        ],
    }
    base.update(spec)
    return {
        "metadata": {
            "name": "w0",
            "namespace": "team-a",
            "uid": "uid-1",
            "labels": {"app": "train", "scheduling.x-k8s.io/pod-group": "x"},
            "annotations": {"scheduling.koordinator.sh/numa-topology-spec": "{}", "scheduling.k8s.io/group-name": "g"},
        },
        "spec": base,
    }


OWNER = labels.Owner("vk-pool", "fe-uid")


def translate(pod: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "job": JOB,
        "gang": GangSpec(min_member=4),
        "role": "worker-min",
        "member": "member-2",
        "owner": OWNER,
        "namespace_prefix": "offline-",
        "gang_api": "native",
        "scheduler_name": "default-scheduler",
        "service_account": "default",
        "colocation": False,
        "placement": None,
        "network_pod_label": "vkprovider.io/network-pod",
    }
    args.update(kwargs)
    return forge.to_member(pod, **args)  # type: ignore[arg-type]


def test_member_pod_identity_and_what_is_stripped() -> None:
    out = translate(front_pod())
    meta, spec = out["metadata"], out["spec"]
    assert meta["name"] == "w0" and meta["namespace"] == "offline-team-a"
    assert meta["labels"][labels.MANAGED] == "true" and meta["labels"][labels.ORIGIN_UID] == "uid-1"
    assert meta["labels"][labels.JOB_LABEL] == jobs.job_hash(JOB) and len(jobs.job_hash(JOB)) <= 63
    # Ours only with both this instance and this front end: another front end may name its node vk-pool too.
    assert meta["labels"][labels.INSTANCE] == "vk-pool" and meta["labels"][labels.FRONT_END] == "fe-uid"
    assert OWNER.owns(meta["labels"]) and not labels.Owner("vk-pool", "other-fe").owns(meta["labels"])
    assert "scheduling.x-k8s.io/pod-group" not in meta["labels"]
    assert "scheduling.k8s.io/group-name" not in meta["annotations"]
    assert meta["annotations"]["scheduling.koordinator.sh/numa-topology-spec"] == "{}"  # NUMA untouched
    assert meta["annotations"][labels.MEMBER] == "member-2"
    for gone in ("nodeName", "schedulingGates", "priority"):
        assert gone not in spec
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["schedulingGroup"] == {"podGroupName": forge.gang_name(JOB)}
    assert spec["priorityClassName"] == "vkprovider-worker-min"
    assert spec["serviceAccountName"] == "default" and spec["automountServiceAccountToken"] is False
    assert [v["name"] for v in spec["volumes"]] == ["data"]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["data"]
    # Guaranteed integer CPUs stay as they are.
    assert spec["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}


def test_colocation_names_and_same_network_selector() -> None:
    out = translate(
        front_pod(),
        colocation=True,
        gang_api="scheduler-plugins",
        placement=Placement("member-2", network_pod="np3"),
        gang=GangSpec(min_member=4, same_network=True),
    )
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": str(8 * 2**30)}
    assert out["spec"]["nodeSelector"]["vkprovider.io/network-pod"] == "np3"
    assert out["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == forge.gang_name(JOB)
    assert "schedulingGroup" not in out["spec"]


def test_elastic_pods_join_no_gang_and_gang_pods_share_a_class() -> None:
    core = translate(front_pod(), role="worker-max", gang_role="ps")
    elastic = translate(front_pod(), role="worker-max", gang_role="ps", in_gang=False)
    assert core["spec"]["priorityClassName"] == "vkprovider-ps"
    assert elastic["spec"]["priorityClassName"] == "vkprovider-worker-max"
    assert "schedulingGroup" not in elastic["spec"]
    assert forge.gang_role(["worker-max", "ps", "worker-min"]) == "ps"


@pytest.mark.parametrize("api", ["native", "scheduler-plugins", "volcano"])
def test_gang_objects(api: str) -> None:
    gang = GangSpec(min_member=16, same_network=True, timeout=120)
    obj = forge.gang_object(
        JOB, gang, namespace="offline-team-a", gang_api=api, placement=None, network_pod_label="np", owner=OWNER
    )
    assert obj["metadata"]["name"] == forge.gang_name(JOB)
    if api == "native":
        assert obj["spec"]["schedulingPolicy"]["gang"]["minCount"] == 16
        assert obj["spec"]["schedulingConstraints"] == {"topology": [{"key": "np"}]}
    else:
        assert obj["spec"]["minMember"] == 16


def test_status_back() -> None:
    member_pod = {
        "spec": {"nodeName": "member-2-node-003"},
        "status": {
            "phase": "Running",
            "podIP": "10.102.3.1",
            "hostIP": "127.102.0.4",
            "startTime": "t",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True}],
        },
    }
    status = forge.status_from_member(member_pod)
    assert status["phase"] == "Running" and status["podIP"] == "10.102.3.1" and "hostIP" not in status
    assert [c["type"] for c in status["conditions"]] == ["Ready"]
    pending = forge.status_from_member(
        {
            "spec": {},
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/20 nodes are available"}],
            },
        }
    )
    assert pending["reason"] == "MemberScheduling" and "0/20" in pending["message"]


def test_references_of_a_pod() -> None:
    spec = front_pod()["spec"]
    spec["containers"][0]["envFrom"] = [{"secretRef": {"name": "token"}}]
    spec["imagePullSecrets"] = [{"name": "registry"}]
    spec["volumes"].append({"name": "root", "configMap": {"name": "kube-root-ca.crt"}})
    configmaps, secrets = references(spec)
    assert configmaps == {"settings"} and secrets == {"token", "registry"}
    services = [
        {"spec": {"clusterIP": "None", "selector": {"app": "train"}}},
        {"spec": {"clusterIP": "10.0.0.1", "selector": {"app": "train"}}},
        {"spec": {"clusterIP": "None", "selector": {"app": "other"}}},
    ]
    assert reflect.headless_services_for({"app": "train"}, services) == [services[0]]


def test_the_front_end_pod_is_left_as_it_was() -> None:
    """to_member copies only what it changes (the spec, its containers) and shares the rest with
    the front-end pod, a cached object every other reader sees: it must come out untouched."""
    pod = front_pod(initContainers=[{"name": "init", "image": "i:1", "resources": {"requests": {"cpu": "1"}}}])
    before = copy.deepcopy(pod)
    for colocation in (False, True):
        out = translate(
            pod, colocation=colocation, placement=Placement(member="member-2", network_pod="np-1", gpu_model="V100")
        )
        assert pod == before
        assert [m["name"] for m in out["spec"]["containers"][0]["volumeMounts"]] == ["data"]
        assert [v["name"] for v in out["spec"]["volumes"]] == ["data"]
    assert out["spec"]["containers"][0]["resources"] != pod["spec"]["containers"][0]["resources"]  # colocation
