"""The pod controller: pods bound to our node(s) go to the provider, their status comes back.

One watch per node (field selector on spec.nodeName) keeps a cache of the API's pods and feeds
a keyed work queue; a fixed pool of workers syncs one key at a time. The controller is the sole
writer of pod status. Rules it keeps:

- A pod the runtime has reported started (status.startTime) and the provider no longer has was
  lost: it ends Failed with reason ProviderPodLost. Pods are never re-created silently.
- A create the provider refuses leaves the pod Pending (Failed when restartPolicy is Never)
  with reason ProviderFailed and a Warning Event, and is retried with backoff; one it refuses
  as invalid (ProviderInvalid) ends Failed at once, with the provider's reason if it names one,
  and a Warning Event, and is not retried.
- A pod whose mandatory ConfigMap or Secret (or a key of one) is missing is not handed to the
  provider: it waits Pending with the kubelet's reasons and Events until it exists
  (vkprovider.references).
- Deletion: on deletionTimestamp the provider deletes; the API object goes (grace 0, UID
  precondition) once the provider reports it gone or the grace period has passed.
- Start-up clean-up deletes only provider pods the provider says this instance owns and that
  have no pod of the same UID in the API.
- While the API is unreachable nothing is deleted and the provider's pods keep running; pods
  whose sync could not reach it wait (parked, without backoff) and are all synced again the
  moment a pod list succeeds, so every status change of the gap is written once it answers.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vkprovider import logs, podstatus, references
from vkprovider.backoff import ExponentialBackoff
from vkprovider.deletion import delete_in_provider, delete_orphans
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, Conflict, Gone, KubeClient, NotFound, Unreachable
from vkprovider.kube.relist import Expiries, Relist, relist
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod, PodStatus, pod_key, split_key
from vkprovider.podstore import PodStore
from vkprovider.provider import (
    PodAnnotator,
    PodCacheReader,
    PodLifecycle,
    PodNotifier,
    ProviderError,
    ProviderInvalid,
    ProviderNotFound,
)
from vkprovider.settings import PodSettings
from vkprovider.settle import Settling
from vkprovider.workqueue import ShutDown, WorkQueue

PODS_PATH = "/api/v1/pods"


def _seconds_until(timestamp: str) -> float:
    when = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return (when - datetime.datetime.now(datetime.UTC)).total_seconds()


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


async def poll_statuses(cache: PodStore[Pod], queue: WorkQueue, interval: float) -> None:
    """For providers without push: look at every live pod now and then."""
    while True:
        await asyncio.sleep(interval)
        for key, entry in cache.entries():
            if entry.phase not in podstatus.TERMINAL_PHASES:
                queue.add(key)


async def create_in_provider(
    provider: PodLifecycle, pod: Pod, write_status: Callable[[Pod, PodStatus], Awaitable[None]], events: EventRecorder
) -> bool:
    """Hand a new pod to the provider: whether it took it. A refusal as invalid ends the pod
    Failed; any other leaves it Pending (raised, to be retried) or, with restartPolicy Never,
    Failed."""
    try:
        await provider.create_pod(pod)
    except ProviderInvalid as exc:
        reason = exc.reason or "ProviderFailed"
        failed = podstatus.failed_status(pod, reason=reason, message=str(exc), exit_code=1)
        await write_status(pod, failed)
        await events.emit(pod, reason=exc.reason or "ProviderCreateFailed", message=str(exc), warning=True)
        return False
    except ProviderError as exc:
        status = podstatus.provider_failed_status(pod, str(exc))
        if podstatus.status_differs(pod.get("status", {}), status) or pod.get("status", {}).get("message") != str(exc):
            await write_status(pod, status)
        await events.emit(pod, reason="ProviderCreateFailed", message=str(exc), warning=True)
        if status["phase"] == "Pending":
            raise
        return False
    return True


class PodController:
    def __init__(
        self,
        *,
        client: KubeClient,
        provider: PodLifecycle,
        node_names: list[str],
        host_ip: str,
        settings: PodSettings,
        events: EventRecorder,
        metrics: Metrics,
    ) -> None:
        self._client = client
        self._provider = provider
        self._annotator = provider if isinstance(provider, PodAnnotator) else None
        self._nodes = list(node_names)
        self._host_ip = host_ip
        self._settings = settings
        self._events = events
        self._metrics = metrics
        self.cache: PodStore[Pod] = PodStore()
        self._own_writes: dict[str, str] = {}  # key -> resourceVersion our last status write produced
        self._settling = Settling(settings)  # when a new pod's first status write is due
        self._references = references.ReferenceGate(client, events, self._write_status, podstatus.status_differs)
        self._listed: set[str] = set()
        #: Keys whose sync found the API unreachable: synced again once a list succeeds.
        self._parked: set[str] = set()
        self._answered = 0  # successful lists so far: a sync that failed across one is not parked
        self.ready = asyncio.Event()
        if isinstance(provider, PodCacheReader):
            provider.read_pod_cache(self.cache, self.ready)
        self.syncs = 0  # syncs done: what tells the heap trim (vkprovider.heap) work went on
        self.queue: WorkQueue | None = None
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._failure: asyncio.Future[None] | None = None
        self._log = logs.get("pods", node=",".join(node_names))

    def node_of(self, namespace: str, name: str) -> str | None:
        """The node a pod of ours is bound to (for authorizing kubelet API calls about it)."""
        return self.cache.node(f"{namespace}/{name}") or None

    def _watch_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure and not self._failure.done():
            self._failure.set_exception(task.exception())  # type: ignore[arg-type]

    def set_nodes(self, names: list[str]) -> None:
        """Follow pods of exactly these nodes from now on (nodes come and go with members)."""
        for name in [n for n in self._watches if n not in names]:
            self._watches.pop(name).cancel()
            self._listed.discard(name)
            for key in self.cache.on_node(name):
                del self.cache[key]
        for name in names:
            if name not in self._watches:
                task = asyncio.get_running_loop().create_task(self._watch_node(name), name=f"pods/watch/{name}")
                task.add_done_callback(self._watch_done)
                self._watches[name] = task
        self._nodes = list(names)

    # -- the API side ----------------------------------------------------------------------------

    def _observe(self, pod: Pod) -> str:
        key = pod_key(pod)
        self.cache[key] = pod
        rv = pod["metadata"].get("resourceVersion")
        if rv is not None and self._own_writes.get(key) == rv:
            return key  # the echo of our own status write: nothing new
        assert self.queue is not None
        self.queue.add(key)
        return key

    def _relisted(self, node: str, seen: set[str]) -> None:
        for key in [k for k in self.cache.on_node(node) if k not in seen]:
            del self.cache[key]  # deleted while we were not watching
            assert self.queue is not None
            self.queue.add(key)
        self._listed.add(node)
        if self._listed >= set(self._nodes):
            self.ready.set()
        self._unpark()

    async def _watch_node(self, node: str) -> None:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        failures, expiries = 0, Expiries()
        while True:
            try:
                into = Relist(self._observe, lambda seen: self._relisted(node, seen))  # type: ignore[arg-type]
                rv = expiries.listed(await relist(self._client, PODS_PATH, into, params=params))
                failures = 0
                while True:
                    async for event in self._client.watch(PODS_PATH, resource_version=rv, params=params):
                        obj: Any = event["object"]
                        rv = expiries.delivered(obj["metadata"].get("resourceVersion", rv))
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            key = pod_key(obj)
                            if self.cache.uid(key) == obj["metadata"].get("uid"):
                                del self.cache[key]
                            assert self.queue is not None
                            self.queue.add(key)
                        else:
                            self._observe(obj)
            except Gone:
                await expiries.wait(self._log, node=node)
            except ApiError as exc:
                failures += 1
                self._metrics.errors.labels("pod-watch", exc.reason).inc()
                # Capped low: after an outage of the API, this list is what wakes the parked pods.
                delay = min(5.0, 0.2 * 2**failures)
                self._log.warning("pod watch failed", node=node, error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)

    async def _write_status(
        self, pod: Pod, desired: PodStatus, *, annotations: dict[str, str | None] | None = None
    ) -> None:
        meta = pod["metadata"]
        body = podstatus.status_patch(pod.get("status", {}), desired)
        body["metadata"] = {"resourceVersion": meta.get("resourceVersion")}
        if annotations:
            body["metadata"]["annotations"] = annotations  # pods/status accepts metadata too
        key = pod_key(pod)
        try:
            updated: Any = await self._client.patch(
                pod_path(meta.get("namespace", ""), meta.get("name", "")) + "/status", body, patch_type="merge"
            )
        except NotFound:
            # Deleted meanwhile: forget it now; its DELETED event (if not already in) finds nothing.
            if self.cache.uid(key) == meta.get("uid"):
                del self.cache[key]
            return
        self._own_writes[key] = updated["metadata"]["resourceVersion"]
        # A pod deleted meanwhile must not come back (it would be synced for ever), nor a newer one
        # the watch brought (a scale-down's deletionTimestamp) be lost under this older answer.
        self.cache.replace_if_still(key, meta.get("resourceVersion"), updated)
        self._metrics.status_writes.inc()

    def _unpark(self) -> None:
        """The API answers again: sync every pod that could not reach it."""
        assert self.queue is not None
        self._answered += 1
        parked, self._parked = self._parked, set()
        for key in parked:
            self.queue.add(key)

    # -- the provider side -----------------------------------------------------------------------

    def _on_provider_change(self, pod: Pod) -> None:
        if self.queue is None:
            return
        key = pod_key(pod)
        # In a burst, each member change of a new pod (our create's echo, the bind) was a sync.
        phase = pod.get("status", {}).get("phase")
        if not self._settling.absorbs(key, phase, due=self.queue.due(key)):
            self._settling.reported(key)
            # A pod that runs or ended needs one status write: ahead of creates and deletes,
            # which may each hold a worker for seconds on a slow member.
            self.queue.add(key, urgent=phase not in (None, "Pending"))

    # -- sync ------------------------------------------------------------------------------------

    async def sync(self, key: str) -> None:
        """Bring one pod's provider state and API status in line; raises to be retried."""
        namespace, name = split_key(key)
        changed = self._settling.reported_at(key)  # one arriving from here on runs the sync again
        pod = self.cache.get(key)
        if pod is None and not self._listed >= set(self._nodes):
            # Not in the cache proves nothing before every node's pods are listed (a provider
            # notifies about its pods at once after a restart): look again once they are.
            assert self.queue is not None
            self.queue.add_after(key, 0.2)
            return
        if pod is None:
            remote = await self._provider.get_pod(namespace, name)
            if remote is not None:
                self._log.info("pod gone from the API; deleting it in the provider", pod=key)
                try:
                    await self._provider.delete_pod(remote)
                except ProviderNotFound:
                    pass
            self._own_writes.pop(key, None)
            self._settling.forget(key)
            return
        if pod["metadata"].get("deletionTimestamp"):
            self._settling.forget(key)
            await self._sync_deleting(key, pod)
            return
        if podstatus.is_terminal(pod):
            return
        uid = pod["metadata"].get("uid")
        remote = await self._provider.get_pod(namespace, name)
        if remote is not None and remote["metadata"].get("uid") != uid:
            # An earlier pod of the same name is still stopping in the provider.
            try:
                await self._provider.delete_pod(remote)
            except ProviderNotFound:
                pass
            assert self.queue is not None
            self.queue.add_after(key, 0.5)
            return
        if remote is None:
            if podstatus.is_accepted(pod):
                message = "the pod no longer exists in the provider; it is not re-created"
                await self._write_status(pod, podstatus.failed_status(pod, reason="ProviderPodLost", message=message))
                await self._events.emit(pod, reason="ProviderPodLost", message=message, warning=True)
                return
            if not await self._create(key, pod):
                return
            self._settling.created(key, asyncio.get_running_loop().time())
            remote = await self._provider.get_pod(namespace, name)
            if remote is None:
                raise ProviderError(f"pod {key} missing right after create")
        elif not podstatus.pods_equal(pod, remote):
            await self._provider.update_pod(pod)
        provided = remote.get("status", {})
        desired = podstatus.desired_status(pod, provided, host_ip=self._host_ip)
        wanted = self._annotator.pod_annotations(namespace, name) if self._annotator is not None else None
        annotations = podstatus.annotation_changes(pod["metadata"].get("annotations"), wanted) if wanted else {}
        if podstatus.status_differs(pod.get("status", {}), desired) or annotations:
            wait = self._settling.wait(key, desired, asyncio.get_running_loop().time())
            if wait > 0:
                assert self.queue is not None
                self.queue.add_after(key, wait)
                return
            first_end = not podstatus.is_terminal(pod)
            await self._write_status(pod, desired, annotations=annotations)
            if changed is not None:
                self._metrics.status_lag_seconds.observe(time.perf_counter() - changed)
            if first_end and (desired.get("reason") == "Evicted" or podstatus.disrupted(desired)):
                reason = desired.get("reason") or "Disrupted"
                await self._events.emit(pod, reason=reason, message=desired.get("message", ""), warning=True)

    async def _create(self, key: str, pod: Pod) -> bool:
        if await self._references.hold(pod):
            assert self.queue is not None
            self.queue.add_after(key, references.RECHECK)  # starts once what it needs exists
            return False
        return await create_in_provider(self._provider, pod, self._write_status, self._events)

    async def _sync_deleting(self, key: str, pod: Pod) -> None:
        namespace, name = split_key(key)
        uid = pod["metadata"].get("uid")
        provided: PodStatus | None = None  # the provider's last status of this pod
        try:
            gone, provided = await delete_in_provider(self._provider, key, pod)
        except ProviderError as exc:
            # The provider cannot tell now; the grace period still bounds the wait.
            self._log.info("provider cannot confirm a deletion yet", pod=key, error=str(exc))
            gone = False
        remaining = _seconds_until(pod["metadata"]["deletionTimestamp"])
        if not gone and remaining > 0:
            assert self.queue is not None
            self.queue.add_after(key, min(1.0, remaining))
            return
        if not podstatus.is_terminal(pod):
            # A Conflict (the pod changed meanwhile) is retried with the pod as it is now.
            await self._write_status(pod, podstatus.deleted_status(pod, provided, host_ip=self._host_ip))
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            await self._client.delete(pod_path(namespace, name), body=body)
        except (NotFound, Conflict):
            pass  # already gone, or a new pod of that name: not ours to delete

    # -- workers ---------------------------------------------------------------------------------

    async def _worker(self, urgent_only: bool = False) -> None:
        assert self.queue is not None
        queue = self.queue
        seconds, depth = self._metrics.sync_children(), self._metrics.queue_depth.labels("pods")
        while True:
            try:
                key = await queue.get(urgent_only=urgent_only)
            except ShutDown:
                return
            started = time.perf_counter()
            self.syncs += 1
            result = "ok"
            answered = self._answered
            try:
                await self.sync(key)
                queue.forget(key)
            except Conflict:
                result = "conflict"
                queue.add_rate_limited(key)
            except (ApiError, ProviderError) as exc:
                kind = exc.reason if isinstance(exc, ApiError) else type(exc).__name__
                self._metrics.errors.labels("pod-sync", kind).inc()
                if isinstance(exc, Unreachable) and exc.server == self._client.server:
                    # The API itself is down (not a member): no backoff growing through the
                    # outage and no retry storm; the next successful list syncs the pod again.
                    result = "parked"
                    queue.forget(key)
                    if self._answered == answered:
                        self._parked.add(key)
                    else:
                        queue.add_after(key, 0.2)  # it answered meanwhile
                else:
                    result = "error"
                    delay = queue.add_rate_limited(key)
                    self._log.warning("pod sync failed", pod=key, error=str(exc), retry_in=round(delay, 3))
            finally:
                queue.done(key)
                seconds[result].observe(time.perf_counter() - started)
                depth.set(len(queue))

    async def run(self) -> None:
        """Watch, sync and clean up until cancelled."""
        self.queue = WorkQueue(
            backoff=ExponentialBackoff(base=0.05, cap=self._settings.retry_cap),
            observe_wait=self._metrics.queue_waits("pods"),
        )
        failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._failure = failure
        self.set_nodes(self._nodes)
        if not self._nodes:
            self.ready.set()
        tasks = [  # the last `status_workers` serve the urgent lane alone
            asyncio.create_task(self._worker(urgent_only=i >= self._settings.workers), name=f"pods/worker/{i}")
            for i in range(self._settings.workers + self._settings.status_workers)
        ]
        if isinstance(self._provider, PodNotifier):
            self._provider.notify_pods(self._on_provider_change)
        else:
            poll = poll_statuses(self.cache, self.queue, self._settings.status_poll_interval)
            tasks.append(asyncio.create_task(poll, name="pods/poll"))
        orphans = delete_orphans(self._provider, self.cache, self.ready, self._log)
        tasks.append(asyncio.create_task(orphans, name="pods/cleanup"))
        try:
            await asyncio.gather(*tasks, failure)
        finally:
            self.queue.shut_down()
            watches = list(self._watches.values())
            self._watches.clear()
            failure.cancel()
            for task in tasks + watches:
                task.cancel()
            await asyncio.gather(*tasks, *watches, return_exceptions=True)
