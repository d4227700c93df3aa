"""Giving capacity back on purpose: the I/O shell around the planner (federation.reclaim.planner).

Twice a second, for each member whose pods and inventory are known, the planner is asked which
of our pods must go: because our pods hold more than the member lends now (online load grew
into the reserve, a time window closed, a cap fell), because online pods that will not preempt
wait there for room, or because the member is being drained (disabled or removed). A victim is
noticed only when two rounds in a row choose it (a moment's lag between watches gives no
needless notice); a round's notices go out together, and pods whose deadline has come are
deleted together, so a gang is noticed and deleted all at once; a notice no plan needs for
CANCEL_HOLD seconds is withdrawn. The writes themselves (notice, deletion, withdrawal) are
federation.reclaim.notices'; telling the jobs what they lost, federation.reclaim.reports'.

All state lives in the member pods' annotations, so a restart resumes the same notices with the
same deadlines: no pod is deleted early, twice or never.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from federation import labels
from federation.capacity import quantities
from federation.capacity.inventory import pod_requests, unusable_reason
from federation.capacity.summary import TRACKED, ours_canonical
from federation.members.member import Member
from federation.members.pods import MemberPods
from federation.reclaim import planner
from federation.reclaim.answers import Answers
from federation.reclaim.jobnotice import JobNotices
from federation.reclaim.metrics import ReclaimMetrics
from federation.reclaim.notices import Notices, rfc3339
from federation.reclaim.reports import JobReports
from federation.reclaim.terms import parse_time
from vkprovider import logs
from vkprovider.events import EventRecorder
from vkprovider.kube import ApiError, KubeClient

#: Seconds after a round that chose new victims before the round that confirms them: long
#: enough for the member's watches to catch up with each other, short enough not to keep a
#: waiting online pod waiting.
CONFIRM_AFTER = 0.2
#: Seconds a notice stays while no plan needs it, before it is withdrawn (plans are recomputed
#: every second; a brief dip of online load does not flap notices).
CANCEL_HOLD = 3.0
#: Seconds back a restarted provider looks for disrupted pods whose job was never told.
UNTOLD_HORIZON = 3600.0


class Reclaimer:
    def __init__(
        self,
        *,
        members: Callable[[], Mapping[str, Member]],
        instance: str,
        interval: float = 0.5,
        metrics: ReclaimMetrics | None = None,
        keep_logs: Callable[[Member, dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self._members = members
        self._instance = instance
        self._interval = interval
        self.front: KubeClient | None = None
        self.events: EventRecorder | None = None
        self.metrics = metrics or ReclaimMetrics()
        self.notices = Notices(
            front=lambda: self.front,
            events=lambda: self.events,
            metrics=lambda: self.metrics,
            instance=instance,
            keep_logs=keep_logs,
        )
        self.reports = JobReports(
            members=members, front=lambda: self.front, events=lambda: self.events, metrics=lambda: self.metrics
        )
        self._unneeded_since: dict[str, float] = {}
        #: Victims the last round chose but did not notice yet: a pod is noticed only when two
        #: rounds in a row choose it, so a moment's lag between watches gives no needless notice.
        self._chosen_before: dict[str, set[str]] = {}
        self._pending_since: dict[str, float] = {}  # online pod key -> first seen waiting
        #: Members whose every pod this run looked at once: until then a round may not be
        #: skipped, for a notice half-written before a restart shows only at the front end.
        self._swept: set[str] = set()
        #: The runtime's front-end pods (set by the provider): a notice is written there first.
        self.front_pods: Any = None
        self.front_listed: asyncio.Event | None = None
        self._fronts: dict[str, dict[str, str]] = {}  # this round: member pod key -> front annotations
        #: Member pod keys whose front-end pod carried a notice when last read: read again each
        #: round (a front-end notice without its member half is what a restart can leave).
        self._front_noticed: set[str] = set()
        self.answers = Answers(notices=self.notices, events=lambda: self.events)
        self.reports.acknowledged = self.answers.acknowledged
        self.job_notices = JobNotices(front=lambda: self.front, instance=instance)
        #: What the resource view and `vkprovider status` show: per member, the plan now.
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self._log = logs.get("reclaim", instance=instance)

    # -- the loop --------------------------------------------------------------------------------

    def _next_round(self) -> float:
        """Seconds to the next round: the interval; sooner when a notice's deadline comes, or when
        the last round chose victims the next must confirm (a demand waits meanwhile)."""
        now = time.time()
        soonest = self.notices.next_deadline(now) or now + self._interval
        wait = min(self._interval, soonest - now + 0.005)
        if any(self._chosen_before.values()):
            wait = min(wait, CONFIRM_AFTER)
        return max(0.01, wait)

    def sweep_untold(self) -> None:
        """Once after a start: the disrupted front-end pods of ours whose job was not told (the
        run that ended them died before its report landed) are reported again."""
        if self.front_pods is None:
            return
        horizon = time.time() - UNTOLD_HORIZON
        for _, front in self.front_pods.scan():
            meta = front["metadata"]
            annotations = meta.get("annotations") or {}
            member = annotations.get(labels.MEMBER)
            if not member or labels.JOB_TOLD in annotations or (front.get("status") or {}).get("phase") != "Failed":
                continue
            for cond in (front.get("status") or {}).get("conditions") or []:
                at = parse_time(cond.get("lastTransitionTime") or "") or 0.0
                if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True" and at >= horizon:
                    self.reports.disrupted_front(member, front)

    async def run(self) -> None:
        swept = False
        while True:
            await asyncio.sleep(self._next_round())
            if not swept and self.front_listed is not None and self.front_listed.is_set():
                self.sweep_untold()
                swept = True
            for member in list(self._members().values()):
                try:
                    await self.reconcile(member)
                except ApiError as exc:
                    self._log.warning("reclaim round failed", cluster=member.name, error=str(exc))
            try:
                await self.reports.flush()
            except ApiError as exc:
                self._log.warning("reclaim report failed", error=str(exc))

    # -- one member ------------------------------------------------------------------------------

    def front_of(self, key: str, member_pod: dict[str, Any]) -> dict[str, str]:
        """The front-end pod's annotations, read once per round (decoding a cached pod costs)."""
        found = self._fronts.get(key)
        if found is None:
            found = self._fronts[key] = self.front_annotations(member_pod)
            if found.get(labels.RECLAIM_AT):
                self._front_noticed.add(key)
            else:
                self._front_noticed.discard(key)
        return found

    def front_annotations(self, member_pod: dict[str, Any]) -> dict[str, str]:
        """The annotations of the front-end pod a member pod runs, as the runtime's cache holds
        it (empty when it does not, or holds another pod of that name)."""
        if self.front_pods is None:
            return {}
        front = self.front_pods.get(MemberPods.origin(member_pod))
        if front is None:
            return {}
        meta = front.get("metadata") or {}
        if meta.get("uid") != (member_pod["metadata"].get("labels") or {}).get(labels.ORIGIN_UID):
            return {}
        return dict(meta.get("annotations") or {})

    async def _our_pods(
        self, member: Member, pods: Any
    ) -> tuple[list[planner.OurPod], dict[str, dict[str, Any]], dict[str, int]]:
        """Our live pods there for the planner, the member pods by key, and what pods already
        on their way out still hold (given back: no other pod needs to go for it)."""
        out: list[planner.OurPod] = []
        by_key: dict[str, dict[str, Any]] = {}
        self._fronts = {}
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
            key = f"{meta['namespace']}/{meta['name']}"
            # Every front-end pod once after a start; then only those a notice may stand on.
            sweep = member.name not in self._swept or key in self._front_noticed
            front_ann = self.front_of(key, member_pod) if sweep or annotations.get(labels.RECLAIM_AT) else {}
            noticed = self.notices.stands(uid, annotations, front_ann)
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

    async def _plan(self, member: Member, ours: list[planner.OurPod], leaving: dict[str, int]) -> planner.Plan:
        """The member's plan. Its inputs are copied here, on the loop (watch events change the
        inventory in place); the arithmetic and the planner run in a worker thread, as they take
        tens of milliseconds on a member of thousands of nodes and our pods."""
        if member.draining:
            reason = f"member {member.name} is being drained"
            return planner.Plan(victims=[planner.Victim(p, reason) for p in ours])
        inventory = member.inventory()
        summary = member.summary
        if inventory is None or summary is None:
            return planner.Plan()
        tolerations = tuple(member.config.capacity.tolerations)
        nodes = [
            planner.NodeView.of(
                n, online_used=dict(inventory.online_used.get(n.name, {})), unusable=unusable_reason(n, tolerations)
            )
            for n in inventory.nodes.values()
        ]
        # Our pods on nodes we may not use are the planner's first victims, and what they free
        # counts towards the deficit, which already leaves those nodes out: not asked twice.
        allowed = {k: v for k, v in summary.allowed.items() if k in TRACKED}
        threshold = member.config.reclaim.online_threshold
        pending = [
            planner.PendingPod(r.name, dict(r.requests), r.priority, r.constraints)
            for r in inventory.pending.values()
            if r.priority >= threshold
        ]
        now = time.monotonic()
        for one in pending:
            self._pending_since.setdefault(one.key, now)
        keys = {p.key for p in pending}
        for gone in [k for k in self._pending_since if k not in keys]:
            del self._pending_since[gone]

        def decide() -> planner.Plan:
            # What our live pods hold, from the same watch as the pods themselves (the inventory's
            # separate watch can lag a pod's deletion by a moment and would ask for it twice).
            held: dict[str, int] = {}
            for pod in ours:
                held = quantities.add(held, ours_canonical(dict(pod.requests)))
            need = planner.deficit({k: v for k, v in held.items() if k in TRACKED}, allowed)
            return planner.plan(nodes=nodes, pods=ours, deficit=need, pending=pending)

        return await asyncio.to_thread(decide)

    def _nothing_to_do(self, member: Member, pods: Any) -> bool:
        """The usual case, cheaply (without looking at every pod): nothing held beyond what the
        member allows, nobody waiting for room, no notice standing or about to be given."""
        if member.draining or pods.noticed or self._chosen_before.get(member.name) or member.name not in self._swept:
            return False
        inventory, summary = member.inventory(), member.summary
        if inventory is None or summary is None or inventory.pending:
            return False
        if summary.nodes_eligible < summary.nodes_total and inventory.ours_on_unusable(
            tuple(member.config.capacity.tolerations)
        ):
            return False  # our pods on a node we may not use: they go first
        held = {k: v for k, v in summary.ours_used.items() if k in TRACKED}
        return not planner.deficit(held, summary.allowed)

    async def reconcile(self, member: Member) -> None:
        pods = member.pods
        if pods is None or pods.client is None or not pods.synced.is_set() or not member.reachable:
            return
        if self._nothing_to_do(member, pods):
            self.pending[member.name] = []
            return
        ours, by_key, leaving = await self._our_pods(member, pods)
        self._swept.add(member.name)
        plan = await self._plan(member, ours, leaving)
        now = time.time()
        view: list[dict[str, Any]] = []
        fresh: set[str] = set()
        to_notice: list[tuple[dict[str, Any], planner.Victim]] = []
        to_delete: list[tuple[dict[str, Any], planner.Victim]] = []
        for victim in plan.victims:
            member_pod = by_key.get(victim.pod.key)
            if member_pod is None:
                continue
            uid = member_pod["metadata"].get("uid", "")
            front = self.front_of(victim.pod.key, member_pod)
            self._unneeded_since.pop(uid, None)
            deadline = self.notices.deadline(member_pod, front)
            if deadline is None and uid not in self._chosen_before.get(member.name, set()):
                fresh.add(uid)  # chosen for the first time: noticed if the next round agrees
                continue
            if deadline is None or not self.notices.armed(member_pod):
                to_notice.append((member_pod, victim))  # new, or a front-end half to complete
            elif await self.answers.release_now(member, member_pod, front) or (
                now >= (self.notices.deadline(member_pod, front) or deadline) and self.notices.front_served(uid, now)
            ):
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
        await asyncio.gather(
            *(self.notices.give(member, mp, v, now=now, front_ann=self.front_of(v.pod.key, mp)) for mp, v in to_notice)
        )
        await self._tell_jobs(member, ours, by_key)
        await asyncio.gather(*(self._execute(member, mp, v, plan) for mp, v in to_delete))
        await self._withdraw_unneeded(member, ours, by_key, {v.pod.key for v in plan.victims})
        self.pending[member.name] = view
        self._chosen_before[member.name] = fresh
        self.notices.forget_seen(by_key, lambda key: self.front_of(key, by_key[key]))

    async def _withdraw_unneeded(
        self, member: Member, ours: list[planner.OurPod], by_key: dict[str, dict[str, Any]], wanted: set[str]
    ) -> None:
        """Notices no plan has needed for CANCEL_HOLD seconds, withdrawn."""
        for pod in ours:
            if not pod.noticed or pod.key in wanted:
                continue
            member_pod = by_key[pod.key]
            uid = member_pod["metadata"].get("uid", "")
            since = self._unneeded_since.setdefault(uid, time.monotonic())
            if time.monotonic() - since >= CANCEL_HOLD and await self.notices.withdraw(member, member_pod):
                self._unneeded_since.pop(uid, None)

    async def _tell_jobs(self, member: Member, ours: list[planner.OurPod], by_key: dict[str, dict[str, Any]]) -> None:
        """Every pod of a job with pods under notice learns which leave and when."""
        leaving: dict[str, dict[str, str]] = {}
        for pod in ours:
            member_pod = by_key[pod.key]
            annotations = member_pod["metadata"].get("annotations") or {}
            job_key = annotations.get(labels.JOB_KEY) or ""
            front = self._fronts.get(pod.key, {})  # as read this round (all of them after a start)
            self.job_notices.seen(member.name, job_key, front)
            if not pod.noticed:
                continue
            deadline = self.notices.deadline(member_pod, front)
            if job_key and deadline is not None and self.notices.armed(member_pod):
                name = MemberPods.origin(member_pod).partition("/")[2]
                leaving.setdefault(job_key, {})[name] = rfc3339(deadline)
        await self.job_notices.update(member, leaving)

    async def _execute(
        self, member: Member, member_pod: dict[str, Any], victim: planner.Victim, plan: planner.Plan
    ) -> None:
        """The victim deleted (at its deadline, or released); how long the online pods it
        served waited."""
        if not await self.notices.execute(member, member_pod, victim):
            return
        now = time.monotonic()
        for key in plan.served:
            since = self._pending_since.get(key)
            if since is not None:
                self.metrics.pending_to_freed.labels(member.name).observe(now - since)

    def view(self) -> dict[str, list[dict[str, Any]]]:
        return {m: v for m, v in self.pending.items() if v}


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
