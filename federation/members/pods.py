"""Our pods in one member: watched by label (or fed by the member's capacity watch), indexed by
the front-end pod each runs, with what the rest of the provider asks of them.

- `by_origin`: front-end ns/name -> member pod, held as bytes (vkprovider.podstore), indexed by
  the pod's job label: the durable record of where a job went, read after a restart.
- `refs`: the ConfigMaps and Secrets each pod refers to, what the reflection GC keeps.
- Disruptions: a member pod something else took away or stopped in place leaves a tombstone,
  so its front-end pod ends Failed with that reason and is never re-created.
- Reservations: room our pods take before the member's capacity summary counts them.
Kept apart from the dispatcher (federation.dispatch) because reclaim, outages and the shared
watch read it too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from cachetools import TTLCache

from federation import labels
from federation.capacity.inventory import pod_requests
from federation.capacity.reservations import Reservations
from federation.members import disruption
from federation.members.scope import NamespaceScope
from vkprovider import logs
from vkprovider.kube import ApiError, ClusterAccess, Gone, KubeClient, WriteFence
from vkprovider.kube.relist import Expiries, Relist, relist
from vkprovider.objects import references
from vkprovider.podstatus import is_terminal
from vkprovider.podstore import PodStore

Tombstones = TTLCache[str, tuple[dict[str, Any], disruption.Disruption]]


def new_tombstones() -> Tombstones:
    return TTLCache(maxsize=100_000, ttl=600)


class MemberPods:
    """Our pods in one member, watched by label and indexed by the front-end pod they run."""

    def __init__(
        self,
        name: str,
        access: ClusterAccess,
        *,
        owner: labels.Owner,
        on_change: Callable[[str, str | None], None],
        fence: WriteFence | None = None,
        on_disrupted: Callable[[str, dict[str, Any], disruption.Disruption], None] | None = None,
        tombstones: Tombstones | None = None,
        on_listed: Callable[[str], None] | None = None,
        scope: NamespaceScope | None = None,
        on_terminating: Callable[[KubeClient | None, dict[str, Any]], None] | None = None,
    ) -> None:
        self.name = name
        self._on_terminating = on_terminating
        self.access = access
        self._fence = fence
        self._on_disrupted = on_disrupted
        #: Front-end ns/name -> the last state of a member pod something else took away, and why:
        #: its front-end pod ends Failed with that reason and is never re-created. Shared by all
        #: members (the dispatcher's), so it outlives a member removed meanwhile.
        self.tombstones: Tombstones = tombstones if tombstones is not None else new_tombstones()
        #: UIDs of member pods we delete ourselves (their front-end pod went, a gang rolled back).
        self._expected: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=600)
        self._reported: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=600)
        self.owner = owner
        self._on_change = on_change
        #: Front-end ns/name -> member pod, held as bytes (vkprovider.podstore); each entry's
        #: index is the pod's job label, what the per-job scans below look for.
        self.by_origin: PodStore[dict[str, Any]] = PodStore(index=self._job_label)
        #: Front-end ns/name -> (member namespace, ConfigMaps, Secrets) its member pod refers
        #: to, for the pods that refer to any: what the garbage collection keeps.
        self.refs: dict[str, tuple[str, frozenset[str], frozenset[str]]] = {}
        #: Front-end keys whose member pod carries a reclaim notice (vkprovider.io/reclaim-at).
        self.noticed: set[str] = set()
        #: Member pods per job label: the durable record of where a job went, read after a
        #: restart for jobs whose front-end pods do not (yet) carry the pin.
        self.jobs: dict[str, int] = {}
        #: UIDs the watch reported deleted lately, so a late create answer cannot revive one.
        self._deleted: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=300)
        self.synced = asyncio.Event()
        #: The last list or watch failed: what we hold is the last known state, not the present.
        self.failing = False
        self._on_listed = on_listed
        self.client: KubeClient | None = None
        #: Room our pods not yet counted by the member's capacity summary take.
        self.reservations = Reservations()
        #: Namespaces ready for our pods, with the pod-security level their labels carry.
        self.namespaces: dict[str, str] = {}
        #: For a credential that may not read pods across the member: the namespaces ours may
        #: be in (federation.members.scope), and each pod's member namespace, for their relists.
        self.scope = scope
        self._namespace_of: dict[str, str] = {}
        self._log = logs.get("member-pods", cluster=name)

    @staticmethod
    def origin(pod: dict[str, Any]) -> str:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return f"{annotations.get(labels.ORIGIN_NAMESPACE, '')}/{annotations.get(labels.ORIGIN_NAME, '')}"

    @staticmethod
    def _job_label(pod: dict[str, Any]) -> str:
        return sys.intern(str((pod["metadata"].get("labels") or {}).get(labels.JOB_LABEL, "")))

    def keys_of(self, label: str) -> list[str]:
        """Front-end keys of the member pods of the job with this label."""
        return [k for k, e in self.by_origin.entries() if e.extra == label]

    def record(self, pod: dict[str, Any]) -> None:
        """Index a member pod (created by us, or seen by the watch)."""
        key = self.origin(pod)
        if self.scope is not None:
            self._namespace_of[key] = pod["metadata"].get("namespace", "")
        old = self.by_origin.entry(key)
        if old is not None:
            self._count(old.extra, -1)
        self.by_origin[key] = pod
        new = self.by_origin.entry(key)
        assert new is not None
        self._count(new.extra, 1)  # the job label, as the store's index computed it
        if old is None or old.uid != new.uid:  # a pod's volumes and env never change: once per pod
            cms, secrets = references(pod.get("spec") or {})
            if cms or secrets:
                self.refs[key] = (pod["metadata"]["namespace"], frozenset(cms), frozenset(secrets))
            else:
                self.refs.pop(key, None)
        if ((pod.get("metadata") or {}).get("annotations") or {}).get(labels.RECLAIM_AT):
            self.noticed.add(key)
        else:
            self.noticed.discard(key)

    def created(self, pod: dict[str, Any]) -> None:
        """Index a pod we just created, unless the watch has reported it already: the watch's
        copy is then as new or newer (the create's answer can arrive after the events that
        bound and started the pod, and must not put the pod back to Pending here)."""
        uid = pod["metadata"].get("uid")
        if uid in self._deleted or self.by_origin.uid(self.origin(pod)) == uid:
            return
        self.record(pod)

    def _count(self, job: str, delta: int) -> None:
        left = self.jobs.get(job, 0) + delta
        if left > 0:
            self.jobs[job] = left
        else:
            self.jobs.pop(job, None)

    def expect_deletion(self, uid: str) -> None:
        """We delete this member pod ourselves: its going is no disruption to report."""
        self._expected[uid] = True

    def _disrupted(self, pod: dict[str, Any], *, gone: bool) -> None:
        uid = pod["metadata"].get("uid", "")
        if uid in self._expected or uid in self._reported:
            return
        what = disruption.cause_of(pod, member=self.name, gone=gone)
        if what is None:
            return
        self._reported[uid] = True
        if gone:
            self.tombstones[self.origin(pod)] = (pod, what)
        if self._on_disrupted is not None:
            self._on_disrupted(self.name, pod, what)

    def _put(self, pod: dict[str, Any]) -> None:
        key = self.origin(pod)
        if is_terminal(pod):  # type: ignore[arg-type]
            self.reservations.release(key)
        elif pod.get("spec", {}).get("nodeName"):
            self.reservations.release(key, bound=True)
        elif key not in self.reservations:
            self.reservations.hold(key, pod_requests(pod.get("spec") or {}))
        self.record(pod)
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Failed":
            self._disrupted(pod, gone=False)  # stopped in place (the kubelet evicted it)
        uid = pod["metadata"].get("uid", "")
        if pod["metadata"].get("deletionTimestamp") and uid not in self._expected and self._on_terminating:
            self._on_terminating(self.client, pod)  # taken away in the member: its log, while it lasts
        # The phase the front-end pod follows: none while the member pod is going away.
        self._on_change(key, None if pod["metadata"].get("deletionTimestamp") else phase)

    def _drop(self, pod: dict[str, Any]) -> None:
        key = self.origin(pod)
        current = self.by_origin.entry(key)
        if current is not None and current.uid == pod["metadata"].get("uid"):
            del self.by_origin[key]
            self.refs.pop(key, None)
            self.reservations.release(key)
            self._count(current.extra, -1)
            self.noticed.discard(key)
            self._namespace_of.pop(key, None)
        self._deleted[pod["metadata"].get("uid")] = True
        self._disrupted(pod, gone=True)
        self._on_change(key, None)

    def ours(self, pod: dict[str, Any]) -> bool:
        """A member pod this provider made (what the label selector of our own watch picks)."""
        return self.owner.owns((pod.get("metadata") or {}).get("labels") or {})

    # The feed: our pods as listed and watched, by our own watch or by the member's capacity
    # watch (federation.members.watch), which sees every pod anyway: one watch of the member's pods
    # then serves both, and each event is decoded once.

    def relist(self) -> Relist:
        """A fresh list of our pods, taken in pages (vkprovider.kube.relist): each put as it
        comes, then what is gone since dropped. Only pods known before the list began can be
        gone: one we create meanwhile may be younger than the list, and its watch reports it."""
        before = set(self.by_origin)
        return Relist(self._listed_one, lambda seen: self._listed(seen, before))

    def listed(self, items: list[dict[str, Any]]) -> None:
        """A fresh list of our pods, whole."""
        into = self.relist()
        into.page(items)
        into.done()

    def _listed_one(self, pod: dict[str, Any]) -> str:
        self._put(pod)
        return self.origin(pod)

    def _listed(self, seen: set[str], before: set[str]) -> None:
        for _, pod in self.by_origin.scan([k for k in before - seen if k in self.by_origin]):
            self._drop(pod)
        self.synced.set()
        self.failing = False
        if self._on_listed is not None:
            self._on_listed(self.name)

    def relist_in(self, namespace: str) -> Relist:
        """A fresh list of our pods in one member namespace: what is gone from it since is
        dropped (the scope lists each namespace apart)."""
        before = {k for k, ns in self._namespace_of.items() if ns == namespace}
        return Relist(self._listed_one, lambda seen: self._relisted_in(seen, before))

    def _relisted_in(self, seen: set[str], before: set[str]) -> None:
        gone = [k for k in before - seen if k in self.by_origin]
        for _, pod in self.by_origin.scan(gone):
            self._drop(pod)
        self.failing = False
        if self._on_listed is not None:
            self._on_listed(self.name)

    def follow(self, namespace: str) -> None:
        """A namespace readied for our pods: followed from now on (where the scope is ours to keep)."""
        if self.scope is not None:
            self.scope.follow(namespace)

    def event(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._drop(pod)
        else:
            self._put(pod)

    def failed(self, error: Exception) -> None:
        """The list or watch failed: what is held is the last known state, not the present."""
        self.failing = True
        self._log.warning("member pod watch failed", error=str(error))

    async def run(self, *, watch: bool = True) -> None:
        """Hold the member client (for our writes) and, with `watch`, list and watch our pods;
        without, the feed comes from elsewhere (`listed`, `event`, `failed`)."""
        async with KubeClient(self.access, user_agent=f"vkprovider-dispatch/{self.name}", fence=self._fence) as client:
            self.client = client
            if self.scope is not None:
                await self.scope.run(self, client, watch=watch)
            if not watch:
                await asyncio.Event().wait()  # until cancelled
            await self.list_and_watch(client, "/api/v1/pods", self.relist)

    async def list_and_watch(
        self, client: KubeClient, path: str, into: Callable[[], Relist], *, listed: Callable[[], None] | None = None
    ) -> None:
        """List our pods at `path` (into `into()`), then watch them, until cancelled: an expired
        watch lists again, a failure is reported (`failed`) and retried with backoff; `listed`
        is told after each list."""
        params = {"labelSelector": self.owner.selector()}
        failures, expiries = 0, Expiries()
        while True:
            try:
                rv = expiries.listed(await relist(client, path, into(), params=params))
                failures = 0
                if listed is not None:
                    listed()
                while True:
                    async for event in client.watch(path, resource_version=rv, params=params):
                        obj = event["object"]
                        rv = expiries.delivered(obj.get("metadata", {}).get("resourceVersion", rv))
                        if event["type"] != "BOOKMARK":
                            self.event(event["type"], obj)
            except Gone:
                await expiries.wait(self._log, path=path)
            except ApiError as exc:
                failures += 1
                self.failed(exc)
                await asyncio.sleep(min(5.0, 0.25 * 2**failures))
