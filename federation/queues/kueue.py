"""Keeps a Kueue ClusterQueue's quota for the virtual node's ResourceFlavor equal to the node's
allocatable as published (damped: a rise waits `damping_hold`, a fall is at once), so what
Kueue admits follows the tide (I/O).

Written only when the quota differs from the queue's, with the queue's resourceVersion: a
concurrent edit by its owner wins, and the next publish tries again from what it says. The queue
is read again at least every RECHECK seconds, so a quota changed by hand is put back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from federation.config import KueueQuotaConfig
from federation.queues.quota import with_quota
from vkprovider import logs
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound

CLUSTER_QUEUES = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
RECHECK = 30.0


class QuotaKeeper:
    def __init__(self, config: KueueQuotaConfig, *, front: Callable[[], KubeClient | None], node: str) -> None:
        self.config = config
        self.node = config.node or node
        self._front = front
        self._synced: dict[str, str] | None = None  # the allocatable last written (or found) in the queue
        self._checked = 0.0  # monotonic time of that
        self._told: str | None = None  # the last trouble logged, said once
        self._log = logs.get("kueue-quota", cluster_queue=config.cluster_queue, flavor=config.flavor)
        self.writes = 0

    async def sync(self, allocatable: Mapping[str, str]) -> None:
        """The queue's quota for our flavor set to `allocatable` if it differs."""
        front = self._front()
        if front is None or not self.config.cluster_queue:
            return
        if dict(allocatable) == self._synced and time.monotonic() - self._checked < RECHECK:
            return
        path = f"{CLUSTER_QUEUES}/{self.config.cluster_queue}"
        try:
            queue = await front.get(path)
            groups = with_quota(queue.get("spec") or {}, self.config.flavor, allocatable)
            if groups is not None:
                queue["spec"].update(groups)
                await front.replace(path, queue)
                self.writes += 1
                self._log.info("ClusterQueue quota set to the virtual node's allocatable", node=self.node)
            self._synced, self._checked = dict(allocatable), time.monotonic()
            self._told = None
        except Conflict:
            return  # changed meanwhile: the next publish reads it again
        except NotFound:
            self._say(f"ClusterQueue {self.config.cluster_queue} not found")
        except ApiError as exc:
            self._say(f"ClusterQueue {self.config.cluster_queue} not written: {exc}")

    def _say(self, trouble: str) -> None:
        if trouble != self._told:
            self._log.warning(trouble)
            self._told = trouble
