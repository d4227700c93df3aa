"""The node's heartbeat: a Lease in kube-node-lease, renewed every 10 s for 40 s.

It is renewed as long as this process runs its controllers; a backend being unreachable never
stops it (that would make the node NotReady and evict every pod after 300 s).
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from vkprovider import logs
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound
from vkprovider.metrics import Metrics

NAMESPACE = "kube-node-lease"


def micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(*, node: str, node_uid: str | None, duration: int, now: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node, "namespace": NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": node, "leaseDurationSeconds": duration, "renewTime": now},
    }


class LeaseController:
    def __init__(
        self, *, client: KubeClient, node: str, node_uid: str | None, duration: int, interval: float, metrics: Metrics
    ) -> None:
        self._client = client
        self._node = node
        self._node_uid = node_uid
        self._duration = duration
        self._interval = interval
        self._metrics = metrics
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{node}"
        self._log = logs.get("lease", node=node)
        self.renewals = 0

    async def renew(self) -> None:
        now = micro_time()
        try:
            current = await self._client.get(self._path)
        except NotFound:
            body = lease_body(node=self._node, node_uid=self._node_uid, duration=self._duration, now=now)
            await self._client.create(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", body)
        else:
            current["spec"].update(holderIdentity=self._node, leaseDurationSeconds=self._duration, renewTime=now)
            await self._client.replace(self._path, current)
        self.renewals += 1

    async def run(self) -> None:
        while True:
            for attempt in range(5):  # quick retries before waiting a full interval
                try:
                    await self.renew()
                    break
                except Conflict:
                    continue
                except ApiError as exc:
                    self._metrics.errors.labels("lease", exc.reason).inc()
                    self._log.warning("lease renewal failed", error=str(exc), attempt=attempt)
                    await asyncio.sleep(min(7.0, 0.2 * 2**attempt))
            await asyncio.sleep(self._interval)
