"""The virtual node: its object (pure builders) and the controller that registers it and keeps
its status current.

Status is written with strategic-merge patches, so conditions set by other writers (the node
lifecycle controller, a problem detector) survive: only the condition types we own are sent.
Patches are coalesced: a burst of provider changes becomes one patch per `status_min_interval`.
Readiness depends on this process alone, never on a backend's reachability.
"""

from __future__ import annotations

import asyncio
import platform
from typing import Any

from vkprovider import logs
from vkprovider.kube import ApiError, KubeClient, NotFound
from vkprovider.metrics import Metrics
from vkprovider.podstatus import now_rfc3339
from vkprovider.provider import NODE_LABEL, PROVIDER_LABEL, NodeProvider, NodeStatus
from vkprovider.settings import NodeSettings

VERSION = "v1.37.2-vkprovider"
OWN_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
_CONDITION_TEXT = {
    "Ready": ("True", "KubeletReady", "vkprovider is posting ready status"),
    "MemoryPressure": ("False", "KubeletHasSufficientMemory", "the provider manages memory"),
    "DiskPressure": ("False", "KubeletHasNoDiskPressure", "the provider manages disk"),
    "PIDPressure": ("False", "KubeletHasSufficientPID", "the provider manages processes"),
    "NetworkUnavailable": ("False", "RouteCreated", "the provider manages pod networking"),
}


def node_labels(settings: NodeSettings, name: str, extra: dict[str, str]) -> dict[str, str]:
    labels = {
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/exclude-from-external-load-balancers": "true",
        NODE_LABEL: "true",
        PROVIDER_LABEL: settings.provider_id,
    }
    labels.update(extra)
    labels.update(settings.labels)
    return labels


def node_taints(settings: NodeSettings) -> list[dict[str, str]]:
    if not settings.taint:
        return []
    return [{"key": settings.taint_key, "value": settings.provider_id, "effect": settings.taint_effect}]


def conditions(
    current: list[dict[str, Any]], extra: list[dict[str, Any]], *, now: str, ready: bool = True
) -> list[dict[str, Any]]:
    """Our conditions, with transition times kept while a condition's status holds."""
    old = {c.get("type"): c for c in current}
    out = []
    wanted: list[tuple[str, str, str, str]] = []
    for ctype in OWN_CONDITIONS:
        status, reason, message = _CONDITION_TEXT[ctype]
        if ctype == "Ready" and not ready:
            status, reason, message = "False", "KubeletNotReady", "vkprovider is not ready"
        wanted.append((ctype, status, reason, message))
    wanted += [(c["type"], c["status"], c.get("reason", ""), c.get("message", "")) for c in extra]
    for ctype, status, reason, message in wanted:
        prior = old.get(ctype)
        transition = prior.get("lastTransitionTime") if prior and prior.get("status") == status else None
        out.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition or now,
            }
        )
    return out


def node_status(
    settings: NodeSettings,
    provided: NodeStatus,
    *,
    current: dict[str, Any] | None,
    port: int,
    now: str,
    name: str | None = None,
) -> dict[str, Any]:
    """The status part of the node object (pure)."""
    capacity = dict(provided.capacity or settings.capacity)
    allocatable = dict(provided.allocatable or capacity)
    status: dict[str, Any] = {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": conditions((current or {}).get("conditions", []), provided.conditions, now=now),
        "addresses": [
            {"type": "InternalIP", "address": settings.internal_ip()},
            {"type": "Hostname", "address": name or settings.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": VERSION,
            "kubeProxyVersion": "",
            "containerRuntimeVersion": f"vkprovider://{settings.provider_id}",
            "kernelVersion": platform.release(),
            "osImage": "vkprovider",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }
    # Resources the provider no longer reports are removed (a merge patch keeps map keys).
    for field in ("capacity", "allocatable"):
        for gone in set((current or {}).get(field, {})) - set(status[field]):
            status[field][gone] = None
    return status


def build_node(
    settings: NodeSettings, provided: NodeStatus, *, port: int, now: str, name: str | None = None
) -> dict[str, Any]:
    name = name or settings.name
    status = node_status(settings, provided, current=None, port=port, now=now, name=name)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels(settings, name, provided.labels),
            "annotations": dict(provided.annotations),
        },
        "spec": {"taints": node_taints(settings)},
        "status": status,
    }


class _FixedNode:
    """Node status from settings for providers without a NodeProvider."""

    def __init__(self, settings: NodeSettings) -> None:
        self._settings = settings

    async def node_status(self, node_name: str) -> NodeStatus:
        return NodeStatus(capacity=dict(self._settings.capacity or {"cpu": "100", "memory": "512Gi", "pods": "1000"}))

    def notify_node_status(self, callback: Any) -> None:
        return None


class NodeController:
    """Registers the node, then patches its status on change (coalesced) and periodically."""

    def __init__(
        self,
        *,
        client: KubeClient,
        settings: NodeSettings,
        provider: object,
        port: int,
        metrics: Metrics,
        name: str | None = None,
    ) -> None:
        self._client = client
        self._settings = settings
        self.name = name or settings.name
        self._provider: NodeProvider = provider if isinstance(provider, NodeProvider) else _FixedNode(settings)
        self._port = port
        self._metrics = metrics
        self._dirty = asyncio.Event()
        self._path = f"/api/v1/nodes/{self.name}"
        self.uid: str | None = None
        self._meta: tuple[dict[str, str], dict[str, str]] | None = None  # labels, annotations last applied
        self._log = logs.get("node", node=self.name)
        self._provider.notify_node_status(self._on_provider_change)

    def _on_provider_change(self, node: str) -> None:
        if node == self.name:
            self._dirty.set()

    def changed(self) -> None:
        """Ask for a status patch soon (coalesced with other requests)."""
        self._dirty.set()

    async def register(self) -> str:
        """Create the node, or bring an existing one up to date; returns its UID."""
        provided = await self._provider.node_status(self.name)
        try:
            current = await self._client.get(self._path)
        except NotFound:
            node = build_node(self._settings, provided, port=self._port, now=now_rfc3339(), name=self.name)
            created = await self._client.create("/api/v1/nodes", node)
            self.uid = created["metadata"]["uid"]
            self._meta = (node["metadata"]["labels"], node["metadata"]["annotations"])
            self._log.info("node registered", uid=self.uid)
            return self.uid
        taints = [t for t in current.get("spec", {}).get("taints", []) if t.get("key") != self._settings.taint_key]
        updated = await self._client.patch(
            self._path, {"spec": {"taints": taints + node_taints(self._settings)}}, patch_type="merge"
        )
        self.uid = updated["metadata"]["uid"]
        await self._patch_status(updated)
        self._log.info("node updated on start", uid=self.uid)
        return self.uid

    async def _patch_metadata(self, current: dict[str, Any], provided: NodeStatus) -> None:
        """Labels and annotations the provider reports, written when they change; keys it no
        longer reports are removed (only keys under our own prefixes, never other writers')."""
        labels = node_labels(self._settings, self.name, provided.labels)
        annotations = dict(provided.annotations)
        if self._meta == (labels, annotations):
            return
        meta = current.get("metadata", {})
        patch_labels: dict[str, str | None] = dict(labels)
        for key in meta.get("labels", {}):
            if key not in labels and ".vkprovider.io/" in "." + key:
                patch_labels[key] = None
        patch_annotations: dict[str, str | None] = dict(annotations)
        for key in meta.get("annotations", {}):
            if key not in annotations and key.startswith("vkprovider.io/"):
                patch_annotations[key] = None
        await self._client.patch(
            self._path, {"metadata": {"labels": patch_labels, "annotations": patch_annotations}}, patch_type="merge"
        )
        self._meta = (labels, annotations)

    async def _patch_status(self, current: dict[str, Any] | None = None) -> None:
        if current is None:
            current = await self._client.get(self._path)
        provided = await self._provider.node_status(self.name)
        await self._patch_metadata(current, provided)
        status = node_status(
            self._settings, provided, current=current.get("status"), port=self._port, now=now_rfc3339(), name=self.name
        )
        await self._client.patch(f"{self._path}/status", {"status": status}, patch_type="strategic")
        self._metrics.node_patches.inc()

    async def run(self) -> None:
        """Keep the status current until cancelled."""
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=self._settings.status_interval)
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self._patch_status()
            except NotFound:
                self._log.warning("node object was deleted; registering again")
                await self.register()
            except ApiError as exc:
                self._metrics.errors.labels("node", exc.reason).inc()
                self._log.warning("node status patch failed", error=str(exc))
                self._dirty.set()
            await asyncio.sleep(self._settings.status_min_interval)
