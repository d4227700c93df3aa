"""A scene for reclaim tests: the federation provider over member-1 alone, declared as a
MemberCluster object (so its cap, windows and notice can change at run time), with audited
identities on the front end and in member-1 (so tests read what the provider did, and when,
from the apiservers' own record), and jobs of ours running there."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import audit
from e2e.fixtures import Lab
from tests.e2e.helpers import (
    MEMBERS,
    delete_namespace,
    eventually,
    install_member_cluster_crd,
    make_namespace,
    pods,
)
from tests.e2e.test_federation_capacity import SCENE_LABEL, federation_vk
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, NotFound

PODGROUPS = "/apis/scheduling.k8s.io/v1beta1"
MEMBER = "member-1"


def front_pod(
    name: str, node: str, *, cpu: int, role: str, group: str | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {"name": "main", "image": "registry.example/train:1", "resources": {"requests": {"cpu": str(cpu)}}}
        ],
    }
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {
        "metadata": {"name": name, "labels": {"vkprovider.io/role": role}, "annotations": annotations or {}},
        "spec": spec,
    }


@dataclass
class Scene:
    lab: Lab
    offline: KubeClient
    proc: VkProcess
    member: str  # the MemberCluster's name (it stands for lab member-1)
    user: str  # the provider's audited identity, on the front end and in member-1
    ns: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"{MEMBERS}/{self.member}"

    async def spec(self, patch: dict[str, Any]) -> None:
        await self.offline.patch(self.path, {"spec": patch})

    async def front(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in await pods(self.offline, self.ns)}

    async def placed(self) -> dict[str, dict[str, Any]]:
        """Our pods in member-1 by name (live ones)."""
        async with self.lab.client(MEMBER) as client:
            items = await pods(client, self.ns)
        return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}

    async def running(self, names: set[str]) -> bool:
        front = await self.front()
        return all(front.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

    def member_deletes(self) -> dict[str, float]:
        """When the provider asked member-1 to delete each pod (the apiserver's audit record)."""
        out: dict[str, float] = {}
        for r in audit.records(self.lab.state, MEMBER, users={self.user}):
            if r.verb == "delete" and r.resource == "pods" and r.namespace == self.ns and r.name:
                out.setdefault(r.name, r.received)
        return out

    async def events(self, reason: str) -> list[dict[str, Any]]:
        listed = await self.offline.list(f"/api/v1/namespaces/{self.ns}/events")
        return [e for e in listed["items"] if e["reason"] == reason]


async def start_scene(
    lab: Lab,
    offline: KubeClient,
    workdir: Path,
    *,
    notice: float,
    capacity: dict[str, Any] | None = None,
) -> Scene:
    """The provider over member-1 as a MemberCluster, and a fresh namespace for the test (made
    while the provider starts)."""
    tag = uuid.uuid4().hex[:6]
    ns = f"rc-{tag}"
    namespace = asyncio.create_task(make_namespace(offline, ns), name=f"reclaim-scene/namespace {ns}")
    try:
        await install_member_cluster_crd(offline)
        user = f"vkp-reclaim-{tag}"
        front_config = audit.user_kubeconfig(lab.state, "offline", user, groups=("system:masters",))
        member_config = audit.user_kubeconfig(lab.state, MEMBER, user, groups=("system:masters",))
        name = f"reclaim-{tag}"
        secret = {
            "metadata": {"name": name, "namespace": "default"},
            "data": {"kubeconfig": base64.b64encode(member_config.read_bytes()).decode()},
        }
        await offline.create("/api/v1/namespaces/default/secrets", secret)
        spec: dict[str, Any] = {
            "kubeconfigSecretRef": {"namespace": "default", "name": name},
            "reclaim": {"noticeSeconds": notice},
        }
        if capacity:
            spec["capacity"] = capacity
        await offline.create(
            MEMBERS,
            {
                "apiVersion": "vkprovider.io/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": name, "labels": {SCENE_LABEL: tag}},
                "spec": spec,
            },
        )
        proc = federation_vk(lab, workdir, [], **{"kube.kubeconfig": str(front_config)})
        # Its own MemberCluster only: scenes of tests that run side by side stay apart (and every
        # other provider of federation_vk leaves scene objects alone: SCENE_LABEL).
        proc.overrides["provider.federation"]["member_selector"] = f"{SCENE_LABEL}={tag}"
        proc.start()
        await proc.wait_ready()

        async def synced() -> bool:
            view = await proc.view()
            return "lent" in view.get("members", {}).get(name, {})

        await eventually(synced, timeout=30, what="member-1's capacity known")
        await namespace
    finally:
        namespace.cancel()  # only if the start failed before it was done
        await asyncio.gather(namespace, return_exceptions=True)
    return Scene(lab=lab, offline=offline, proc=proc, member=name, user=user, ns=ns)


async def stop_scene(scene: Scene) -> None:
    """Delete the namespace while the provider runs (it deletes the member pods), then the
    MemberCluster and the provider; member-1 is left without the namespace. The pods are
    deleted straight away, each with its grace period, not when the namespace controller
    comes to them (the namespace, terminating, takes no new ones)."""
    try:
        await delete_namespace(scene.offline, scene.ns)
        await _delete_pods(scene.offline, scene.ns)
        # A provider that leaves member pods behind fails the test (they would load the next one).
        await eventually(lambda: _none_left(scene), timeout=60, what="the test's pods gone")
    finally:
        with contextlib.suppress(NotFound):
            await scene.offline.delete(scene.path)
        with contextlib.suppress(NotFound):
            await scene.offline.delete(f"/api/v1/namespaces/default/secrets/{scene.member}")
        scene.proc.ensure_stopped()
        async with scene.lab.client(MEMBER) as client:
            await delete_namespace(client, scene.ns)
            await _delete_pods(client, scene.ns)

            async def member_clear() -> bool:
                return not await pods(client, scene.ns)

            # The next test must not find this one's pods still holding member-1's nodes.
            await eventually(member_clear, timeout=60, what=f"member-1 clear of {scene.ns}")


async def _delete_pods(client: KubeClient, ns: str) -> None:
    """Every pod of the namespace deleted (gracefully), in one request."""
    with contextlib.suppress(NotFound):
        await client.delete(f"/api/v1/namespaces/{ns}/pods")


async def _none_left(scene: Scene) -> bool:
    return not await pods(scene.offline, scene.ns)
