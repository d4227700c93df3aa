"""Giving capacity back on purpose: the I/O shell around the planner (federation.planner).

Twice a second, for each member whose pods and inventory are known, the planner is asked which
of our pods must go: because our pods hold more than the member lends now (online load grew
into the reserve, a time window closed, a cap fell), because online pods that will not preempt
wait there for room, or because the member is being drained (disabled or removed). For each
victim, in order:

1. notice: the member pod, then the front-end pod, get `vkprovider.io/reclaim-at` (the RFC 3339
   deadline, readable through a downward-API volume) and the front-end pod a Warning Event
   ReclaimNotice saying why it was chosen. The notice period is the pod's
   `vkprovider.io/checkpoint-seconds`, else its job's PodGroup's (carried onto member pods at
   dispatch), else the member's default, capped by the member's maximum;
2. at the deadline the member pod is deleted gracefully (its own terminationGracePeriodSeconds:
   SIGTERM and its grace), with a UID precondition; the front-end pod ends Failed with reason
   Reclaimed once the member pod is gone (federation.disruption);
3. a notice no longer needed (online load fell back) is withdrawn: annotations removed, a Normal
   Event ReclaimCancelled, the pod keeps running.

All state lives in the member pods' annotations, so a restart resumes the same notices with the
same deadlines: no pod is deleted early, twice or never. Writes made in this run are also
remembered until the member watch reflects them, so a plan recomputed meanwhile cannot notice a
pod twice. Member pods that any cause takes away are reported to their job: a Warning Event
PodsReclaimed on the job's group object (or owner) and `vkprovider.io/last-reclaim` on the job's
remaining pods, so a PS can checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from federation import jobs, labels
from federation.capacity import quantities
from federation.capacity.inventory import Inventory, pod_requests
from federation.capacity.summary import TRACKED, MemberCapacity, eligible, ours_canonical
from federation.config import MemberConfig
from federation.jobs import GROUP_RESOURCES, JobRef
from federation.members import disruption
from federation.members.pods import MemberPods
from federation.reclaim import planner
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, Conflict, KubeClient, NotFound

#: Seconds added to every notice for the notice writes themselves, so the front-end pod has
#: carried its notice for at least the notice period when the member pod is deleted.
NOTICE_MARGIN = 2.0
#: Seconds after a round that chose new victims before the round that confirms them: long
#: enough for the member's watches to catch up with each other, short enough not to keep a
#: waiting online pod waiting.
CONFIRM_AFTER = 0.2
#: Seconds a notice stays while no plan needs it, before it is withdrawn (plans are recomputed
#: every second; a brief dip of online load does not flap notices).
CANCEL_HOLD = 3.0
#: Where a job's controlling owner lives, by kind (the object PodsReclaimed is recorded on).
OWNER_PATHS = {"Job": "batch/v1/jobs", "ReplicaSet": "apps/v1/replicasets", "StatefulSet": "apps/v1/statefulsets"}
NOTICE_BUCKETS = (5, 10, 30, 60, 120, 300, 600)
FREED_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600)


def rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(ts: float) -> str:
    """RFC 3339 with milliseconds: a deadline is kept to the millisecond, not rounded."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def notice_seconds(annotations: dict[str, str], config: MemberConfig) -> float:
    """The pod's (or its job's, carried onto the member pod) notice period, within the member's
    maximum; the member's default otherwise."""
    wanted = annotations.get(labels.CHECKPOINT_SECONDS)
    seconds = config.reclaim.notice_seconds
    if wanted:
        with contextlib.suppress(ValueError):
            seconds = max(0.0, float(wanted))
    return min(seconds, config.reclaim.max_notice_seconds)


class MemberView(Protocol):
    """What the reclaimer needs of one member (federation.provider.Member)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> MemberConfig: ...

    @property
    def draining(self) -> bool: ...

    @property
    def summary(self) -> MemberCapacity | None: ...

    @property
    def reachable(self) -> bool: ...

    def inventory(self) -> Inventory | None: ...

    def pods_index(self) -> Any: ...  # federation.memberpods.MemberPods


@dataclass
class _Notice:
    deadline: float
    seconds: float
    front_at: float | None = None  # when the front-end pod got it (this run)


@dataclass
class ReclaimMetrics:
    registry: CollectorRegistry | None = None
    notices: Counter = field(init=False)
    cancelled: Counter = field(init=False)
    reclaimed: Counter = field(init=False)
    lost: Counter = field(init=False)
    notice_length: Histogram = field(init=False)
    pending_to_freed: Histogram = field(init=False)

    def __post_init__(self) -> None:
        r = self.registry or CollectorRegistry()
        self.notices = Counter(
            "vkprovider_reclaim_notices",
            "Checkpoint notices given, by member and band.",
            ["member", "band"],
            registry=r,
        )
        self.cancelled = Counter(
            "vkprovider_reclaim_notices_cancelled", "Notices withdrawn as no longer needed.", ["member"], registry=r
        )
        self.reclaimed = Counter(
            "vkprovider_reclaimed_pods",
            "Member pods taken away, by member, band and cause (planner or the member's own).",
            ["member", "band", "cause"],
            registry=r,
        )
        self.lost = Counter(
            "vkprovider_lost_pod_seconds",
            "How long the pods taken away had run (work lost unless checkpointed), by member, band and cause.",
            ["member", "band", "cause"],
            registry=r,
        )
        self.notice_length = Histogram(
            "vkprovider_reclaim_notice_seconds", "Notice periods given.", ["member"], buckets=NOTICE_BUCKETS, registry=r
        )
        self.pending_to_freed = Histogram(
            "vkprovider_reclaim_pending_to_freed_seconds",
            "From an online pod waiting for room to its victims' deletion.",
            ["member"],
            buckets=FREED_BUCKETS,
            registry=r,
        )


class Reclaimer:
    def __init__(
        self,
        *,
        members: Callable[[], dict[str, MemberView]],
        instance: str,
        interval: float = 0.5,
        metrics: ReclaimMetrics | None = None,
    ) -> None:
        self._members = members
        self._instance = instance
        self._interval = interval
        self.front: KubeClient | None = None
        self.events: EventRecorder | None = None
        self.metrics = metrics or ReclaimMetrics()
        self._notices: dict[str, _Notice] = {}  # member pod uid -> notice given in this run
        self._cancelled: set[str] = set()  # uids whose notice this run withdrew (until seen)
        self._deleted: set[str] = set()  # uids this run deleted
        self._unneeded_since: dict[str, float] = {}
        #: Victims the last round chose but did not notice yet: a pod is noticed only when two
        #: rounds in a row choose it, so a moment's lag between watches gives no needless notice.
        self._chosen_before: dict[str, set[str]] = {}
        self._pending_since: dict[str, float] = {}  # online pod key -> first seen waiting
        self._job_reports: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (member, job key) -> pods
        #: What the resource view and `vkprovider status` show: per member, the plan now.
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self._log = logs.get("reclaim", instance=instance)

    # -- the loop --------------------------------------------------------------------------------

    def _next_round(self) -> float:
        """Seconds to the next round: the interval; sooner when a notice's deadline comes, or when
        the last round chose victims the next must confirm (a demand waits meanwhile)."""
        now = time.time()
        soonest = min((n.deadline for n in self._notices.values() if n.deadline > now), default=now + self._interval)
        wait = min(self._interval, soonest - now + 0.005)
        if any(self._chosen_before.values()):
            wait = min(wait, CONFIRM_AFTER)
        return max(0.01, wait)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._next_round())
            for member in list(self._members().values()):
                try:
                    await self.reconcile(member)
                except ApiError as exc:
                    self._log.warning("reclaim round failed", cluster=member.name, error=str(exc))
            try:
                await self._report_jobs()
            except ApiError as exc:
                self._log.warning("reclaim report failed", error=str(exc))

    # -- one member ------------------------------------------------------------------------------

    async def _our_pods(
        self, member: MemberView, pods: Any
    ) -> tuple[list[planner.OurPod], dict[str, dict[str, Any]], dict[str, int]]:
        """Our live pods there for the planner, the member pods by key, and what pods already
        on their way out still hold (given back: no other pod needs to go for it)."""
        out: list[planner.OurPod] = []
        by_key: dict[str, dict[str, Any]] = {}
        leaving: dict[str, int] = {}
        inventory = member.inventory()
        # Bound live pods only: the others are not decoded at all.
        live = [k for k, e in pods.by_origin.entries() if e.node and e.phase not in ("Succeeded", "Failed")]
        async for _, member_pod in pods.by_origin.walk(live):
            meta = member_pod["metadata"]
            spec = member_pod.get("spec") or {}
            phase = (member_pod.get("status") or {}).get("phase")
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                continue
            if meta.get("deletionTimestamp"):
                leaving = quantities.add(leaving, pod_requests(spec))
                continue
            uid = meta.get("uid", "")
            annotations = meta.get("annotations") or {}
            noticed = (bool(annotations.get(labels.RECLAIM_AT)) or uid in self._notices) and uid not in self._cancelled
            key = f"{meta['namespace']}/{meta['name']}"
            try:
                gang_min = int(annotations.get(labels.GANG_MIN) or 0)
                cost = int(annotations.get(labels.DELETION_COST) or 0)
            except ValueError:
                gang_min, cost = 0, 0
            record = inventory.pods.get(uid) if inventory is not None else None
            requests = dict(record.requests) if record is not None else pod_requests(spec)
            out.append(
                planner.OurPod(
                    key=key,
                    node=spec["nodeName"],
                    requests=requests,
                    band=annotations.get(labels.BAND) or "worker-min",
                    job=(meta.get("labels") or {}).get(labels.JOB_LABEL, key),
                    gang_min=gang_min,
                    deletion_cost=cost,
                    numa_zone=_numa_zone(annotations),
                    noticed=noticed,
                )
            )
            by_key[key] = member_pod
        return out, by_key, leaving

    def _plan(self, member: MemberView, ours: list[planner.OurPod], leaving: dict[str, int]) -> planner.Plan:
        if member.draining:
            reason = f"member {member.name} is being drained"
            return planner.Plan(victims=[planner.Victim(p, reason) for p in ours])
        inventory = member.inventory()
        summary = member.summary
        if inventory is None or summary is None:
            return planner.Plan()
        policy = member.config.capacity.policy()
        nodes = [
            planner.NodeView(
                name=n.name,
                allocatable=n.allocatable,
                online_used=inventory.online_used.get(n.name, {}),
                ready=n.ready,
                schedulable=n.schedulable,
                network_pod=n.network_pod,
                gpu_model=n.gpu_product,
                zone=n.zone,
            )
            for n in inventory.nodes.values()
        ]
        # What our live pods hold, from the same watch as the pods themselves (the inventory's
        # separate watch can lag a pod's deletion by a moment and would ask for it twice).
        held: dict[str, int] = {}
        for pod in ours:
            held = quantities.add(held, ours_canonical(dict(pod.requests)))
        held = {k: v for k, v in held.items() if k in TRACKED}
        # Our pods on nodes we do not lend (cordoned, tainted) hold nothing we may keep there.
        allowed = {k: v for k, v in summary.allowed.items() if k in TRACKED}
        stranded = [p for p in ours if p.node in inventory.nodes and not eligible(inventory.nodes[p.node], policy)]
        need = planner.deficit(held, allowed)
        for p in stranded:
            need = quantities.add(need, dict(p.requests))
        threshold = member.config.reclaim.online_threshold
        pending = [
            planner.PendingPod(r.name, dict(r.requests), r.priority, dict(r.node_selector))
            for r in inventory.pending.values()
            if r.priority >= threshold
        ]
        now = time.monotonic()
        for one in pending:
            self._pending_since.setdefault(one.key, now)
        keys = {p.key for p in pending}
        for gone in [k for k in self._pending_since if k not in keys]:
            del self._pending_since[gone]
        return planner.plan(nodes=nodes, pods=ours, deficit=need, pending=pending)

    def _nothing_to_do(self, member: MemberView, pods: Any) -> bool:
        """The usual case, cheaply (without looking at every pod): nothing held beyond what the
        member allows, nobody waiting for room, no notice standing or about to be given."""
        if member.draining or pods.noticed or self._chosen_before.get(member.name):
            return False
        inventory, summary = member.inventory(), member.summary
        if inventory is None or summary is None or inventory.pending:
            return False
        held = {k: v for k, v in summary.ours_used.items() if k in TRACKED}
        return not planner.deficit(held, summary.allowed)

    async def reconcile(self, member: MemberView) -> None:
        pods = member.pods_index()
        if pods is None or pods.client is None or not pods.synced.is_set() or not member.reachable:
            return
        if self._nothing_to_do(member, pods):
            self.pending[member.name] = []
            return
        ours, by_key, leaving = await self._our_pods(member, pods)
        plan = self._plan(member, ours, leaving)
        now = time.time()
        wanted = {v.pod.key for v in plan.victims}
        view: list[dict[str, Any]] = []
        fresh: set[str] = set()
        to_notice: list[tuple[dict[str, Any], planner.Victim]] = []
        to_delete: list[tuple[dict[str, Any], planner.Victim]] = []
        for victim in plan.victims:
            member_pod = by_key.get(victim.pod.key)
            if member_pod is None:
                continue
            uid = member_pod["metadata"].get("uid", "")
            self._unneeded_since.pop(uid, None)
            deadline = self._deadline(member_pod)
            if deadline is None and uid not in self._chosen_before.get(member.name, set()):
                fresh.add(uid)  # chosen for the first time: noticed if the next round agrees
                continue
            if deadline is None:
                to_notice.append((member_pod, victim))
            elif now >= deadline and self._front_notice_served(uid, now):
                to_delete.append((member_pod, victim))
            view.append(
                {
                    "pod": MemberPods.origin(member_pod),
                    "node": victim.pod.node,
                    "band": victim.pod.band,
                    "reclaimAt": rfc3339(deadline) if deadline else None,
                    # Why it was chosen when noticed (a later round only says it is under notice).
                    "why": (member_pod["metadata"].get("annotations") or {}).get(labels.RECLAIM_REASON)
                    or victim.reason,
                }
            )
        # A round's notices go out together, with one deadline per notice length, and pods whose
        # deadline has come go together: a gang is noticed and deleted all at once.
        await asyncio.gather(*(self._notice(member, mp, v, now=now) for mp, v in to_notice))
        await asyncio.gather(*(self._execute(member, mp, v, plan) for mp, v in to_delete))
        for pod in ours:
            if not pod.noticed or pod.key in wanted:
                continue
            member_pod = by_key[pod.key]
            uid = member_pod["metadata"].get("uid", "")
            since = self._unneeded_since.setdefault(uid, time.monotonic())
            if time.monotonic() - since >= CANCEL_HOLD:
                await self._cancel(member, member_pod)
        self.pending[member.name] = view
        self._chosen_before[member.name] = fresh
        self._forget_seen(by_key)

    def _deadline(self, member_pod: dict[str, Any]) -> float | None:
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        if uid in self._cancelled:
            return None
        notice = self._notices.get(uid)
        if notice is not None:
            return notice.deadline
        stamp = (meta.get("annotations") or {}).get(labels.RECLAIM_AT)
        return parse_time(stamp) if stamp else None

    def _front_notice_served(self, uid: str, now: float) -> bool:
        notice = self._notices.get(uid)
        if notice is None or notice.front_at is None:
            return True  # given before a restart: the deadline alone rules
        return now >= notice.front_at + notice.seconds

    def _forget_seen(self, by_key: dict[str, dict[str, Any]]) -> None:
        """Drop this run's memory of writes the member watch now reflects."""
        for member_pod in by_key.values():
            meta = member_pod["metadata"]
            uid = meta.get("uid", "")
            has = bool((meta.get("annotations") or {}).get(labels.RECLAIM_AT))
            if uid in self._cancelled and not has:
                self._cancelled.discard(uid)

    # -- writes ----------------------------------------------------------------------------------

    def _front_stub(self, member_pod: dict[str, Any]) -> dict[str, Any]:
        meta = member_pod["metadata"]
        annotations = meta.get("annotations") or {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": annotations.get(labels.ORIGIN_NAMESPACE, ""),
                "name": annotations.get(labels.ORIGIN_NAME, ""),
                "uid": (meta.get("labels") or {}).get(labels.ORIGIN_UID, ""),
            },
        }

    async def _patch_front(self, member_pod: dict[str, Any], annotations: dict[str, str | None]) -> None:
        assert self.front is not None
        stub = self._front_stub(member_pod)
        meta = stub["metadata"]
        body = {"metadata": {"annotations": annotations, "uid": meta["uid"]}}
        with contextlib.suppress(NotFound, Conflict):
            await self.front.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)

    async def _patch_member(self, member: MemberView, member_pod: dict[str, Any], annotations: dict[str, Any]) -> bool:
        client: KubeClient = member.pods_index().client
        meta = member_pod["metadata"]
        body = {"metadata": {"annotations": annotations, "uid": meta.get("uid")}}
        try:
            await client.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
        except (NotFound, Conflict):
            return False
        return True

    async def _notice(
        self, member: MemberView, member_pod: dict[str, Any], victim: planner.Victim, *, now: float
    ) -> float:
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        seconds = notice_seconds(meta.get("annotations") or {}, member.config)
        # A margin for the notice writes themselves; milliseconds, as written.
        stamp = rfc3339_ms(now + seconds + NOTICE_MARGIN)
        deadline = parse_time(stamp) or now + seconds + NOTICE_MARGIN
        reason = victim.reason[:500]
        if not await self._patch_member(member, member_pod, {labels.RECLAIM_AT: stamp, labels.RECLAIM_REASON: reason}):
            return deadline
        notice = _Notice(deadline=deadline, seconds=seconds)
        self._notices[uid] = notice
        self._cancelled.discard(uid)
        await self._patch_front(member_pod, {labels.RECLAIM_AT: stamp})
        notice.front_at = time.time()
        if self.events is not None:
            message = (
                f"reclaim at {stamp} (notice {seconds:.0f}s): member {member.name} node {victim.pod.node} "
                f"gives capacity back to online load; chosen because: {reason}"
            )
            await self.events.emit(self._front_stub(member_pod), reason="ReclaimNotice", message=message, warning=True)
        self.metrics.notices.labels(member.name, victim.pod.band).inc()
        self.metrics.notice_length.labels(member.name).observe(seconds)
        self._log.info(
            "reclaim notice", cluster=member.name, pod=MemberPods.origin(member_pod), deadline=stamp, why=reason
        )
        return deadline

    async def _cancel(self, member: MemberView, member_pod: dict[str, Any]) -> None:
        uid = member_pod["metadata"].get("uid", "")
        if not await self._patch_member(member, member_pod, {labels.RECLAIM_AT: None, labels.RECLAIM_REASON: None}):
            return
        self._notices.pop(uid, None)
        self._cancelled.add(uid)
        self._unneeded_since.pop(uid, None)
        await self._patch_front(member_pod, {labels.RECLAIM_AT: None})
        if self.events is not None:
            await self.events.emit(
                self._front_stub(member_pod),
                reason="ReclaimCancelled",
                message=f"member {member.name} no longer needs the capacity back; the pod keeps running",
            )
        self.metrics.cancelled.labels(member.name).inc()
        self._log.info("reclaim notice withdrawn", cluster=member.name, pod=MemberPods.origin(member_pod))

    async def _execute(
        self, member: MemberView, member_pod: dict[str, Any], victim: planner.Victim, plan: planner.Plan
    ) -> None:
        meta = member_pod["metadata"]
        uid = meta.get("uid", "")
        if uid in self._deleted:
            return
        client: KubeClient = member.pods_index().client
        # No gracePeriodSeconds: the pod's own terminationGracePeriodSeconds (SIGTERM, its grace).
        body = {"preconditions": {"uid": uid}}
        try:
            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
        except (NotFound, Conflict):
            pass
        self._deleted.add(uid)
        now = time.monotonic()
        for key in plan.served:
            since = self._pending_since.get(key)
            if since is not None:
                self.metrics.pending_to_freed.labels(member.name).observe(now - since)
        self._log.info("reclaimed", cluster=member.name, pod=MemberPods.origin(member_pod), node=victim.pod.node)

    # -- telling the job -------------------------------------------------------------------------

    def disrupted(self, member: str, member_pod: dict[str, Any], what: disruption.Disruption) -> None:
        """A member pod of ours was taken away (any cause): its job hears of it (batched)."""
        meta = member_pod["metadata"]
        annotations = meta.get("annotations") or {}
        band = annotations.get(labels.BAND) or "worker-min"
        cause = "planner" if what.cause == disruption.PLANNER_REASON else what.cause
        self.metrics.reclaimed.labels(member, band, cause).inc()
        started = parse_time((member_pod.get("status") or {}).get("startTime") or "")
        if started is not None:
            self.metrics.lost.labels(member, band, cause).inc(max(0.0, time.time() - started))
        job = annotations.get(labels.JOB_KEY) or ""
        origin = MemberPods.origin(member_pod)
        self._job_reports.setdefault((member, job), []).append((origin, what.pod_reason))

    async def _report_jobs(self) -> None:
        reports, self._job_reports = self._job_reports, {}
        members = self._members()
        for (member_name, job_key), taken in reports.items():
            member = members.get(member_name)
            stamp = rfc3339(time.time())
            names = ", ".join(sorted(k.split("/", 1)[-1] for k, _ in taken))
            message = f"{len(taken)} pod(s) taken back by member {member_name}: {names}; checkpoint now"
            target = await self.job_object(job_key, taken[0][0])
            if self.events is not None and target is not None:
                await self.events.emit(target, reason="PodsReclaimed", message=message[:1000], warning=True)
            if member is None or not job_key:
                continue
            value = json.dumps({"at": stamp, "count": len(taken)}, separators=(",", ":"))
            pods = member.pods_index()
            label = jobs.job_hash(_job_ref(job_key))
            for _, member_pod in pods.by_origin.scan(pods.keys_of(label)) if pods is not None else ():
                if member_pod["metadata"].get("deletionTimestamp"):
                    continue
                await self._patch_member(member, member_pod, {labels.LAST_RECLAIM: value})
                await self._patch_front(member_pod, {labels.LAST_RECLAIM: value})

    async def job_object(self, job_key: str, front_key: str) -> dict[str, Any] | None:
        """The object to tell: the job's group object, else its owner, else the pod."""
        assert self.front is not None
        namespace, _, name = front_key.partition("/")
        ref = _job_ref(job_key) if job_key else None
        paths = []
        if ref is not None and ref.source in GROUP_RESOURCES:
            api_version, plural = GROUP_RESOURCES[ref.source]
            paths.append(f"/apis/{api_version}/namespaces/{ref.namespace}/{plural}/{ref.name}")
        if ref is not None and ref.source == "owner":
            kind, _, owner = ref.name.partition("/")
            if kind in OWNER_PATHS:
                group_version, _, resource = OWNER_PATHS[kind].rpartition("/")
                paths.append(f"/apis/{group_version}/namespaces/{ref.namespace}/{resource}/{owner}")
        paths.append(f"/api/v1/namespaces/{namespace}/pods/{name}")
        for path in paths:
            with contextlib.suppress(ApiError):
                return await self.front.get(path)
        return None

    def view(self) -> dict[str, list[dict[str, Any]]]:
        return {m: v for m, v in self.pending.items() if v}


def _job_ref(job_key: str) -> JobRef:
    namespace, source, name = [*job_key.split("/", 2), "", ""][:3]
    return JobRef(namespace, source, name)


def _numa_zone(annotations: dict[str, str]) -> str | None:
    """The NUMA zone a member's topology-aware scheduler reports the pod in, where it does
    (Koordinator's resource-status); unknown otherwise."""
    status = annotations.get("scheduling.koordinator.sh/resource-status")
    if not status:
        return None
    try:
        nodes = json.loads(status).get("numaNodeResources") or []
    except (ValueError, AttributeError):
        return None
    zones = sorted(str(n.get("node")) for n in nodes if isinstance(n, dict) and "node" in n)
    return ",".join(zones) or None
