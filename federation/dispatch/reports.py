"""What dispatch tells the runtime about each front-end pod: where it runs (its member pod, the
member it is pinned to), how it was taken away, and the status it reports.

Reads only: the jobs are the dispatcher's (federation.dispatch.dispatcher), the member pods each
member's index (federation.members.pods), the tombstones those indexes leave when a member takes
a pod away. The status itself is a pure translation (federation.dispatch.jobstate); this module
finds its inputs. The streams (logs, exec, attach, port-forward) find member pods here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from federation import labels
from federation.dispatch.jobstate import Job, reported_status
from federation.members import disruption, outages
from federation.members.pods import MemberPods, Tombstones, new_tombstones
from vkprovider.objects import Pod, PodStatus


class StatusReports:
    def __init__(
        self,
        *,
        members: Callable[[], dict[str, Any]],
        jobs: dict[str, Job],
        job_of_pod: dict[str, str],
        outage: Callable[[str], outages.Outage | None],
    ) -> None:
        self._members = members  # name -> provider Member (config + pods watcher)
        self._jobs = jobs
        self._job_of_pod = job_of_pod
        self._outage = outage
        #: Pods a member took away (shared with every member's MemberPods).
        self.tombstones: Tombstones = new_tombstones()
        #: Where each pod was last seen running (front-end ns/name -> member), so a pod whose
        #: member is removed or lost fails with that reason instead of vanishing.
        self.placed: dict[str, str] = {}

    def pods_in(self, member: str) -> MemberPods | None:
        entry = self._members().get(member)
        return getattr(entry, "pods", None)

    def member_pod(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """(member, member pod) of front-end pod `key`, if some member runs it."""
        for name in self._members():
            pods = self.pods_in(name)
            if pods is not None and key in pods.by_origin:
                return name, pods.by_origin[key]
        return None

    def running_job(self, label: str) -> str | None:
        """A member that runs pods of the job with this label (its durable record after a restart)."""
        for name in self._members():
            pods = self.pods_in(name)
            if pods is not None and label in pods.jobs:
                return name
        return None

    def job_of(self, key: str) -> Job | None:
        job_key = self._job_of_pod.get(key)
        return self._jobs.get(job_key) if job_key else None

    def tombstone(self, key: str) -> tuple[dict[str, Any], disruption.Disruption] | None:
        """The last state of the pod's member pod and why it was taken away, if it was."""
        return self.tombstones.get(key)

    def pin_of(self, key: str) -> str | None:
        """The member a front-end pod is pinned to now (its vkprovider.io/member annotation)."""
        found = self.member_pod(key)
        if found is not None:
            return found[0]
        job = self.job_of(key)
        return job.member if job is not None and key in job.pods else None

    def status(self, key: str) -> tuple[Pod | None, PodStatus | None]:
        """(front-end pod as last seen, the status to report), or (None, None) if unknown."""
        job = self.job_of(key)
        pod = job.pods.get(key) if job else None
        found = self.member_pod(key)
        if found is not None:
            self.placed[key] = found[0]
        status = reported_status(
            key,
            job,
            pod,
            member_pod=found,
            outage=self._outage(found[0]) if found is not None else None,
            tomb=self.tombstone(key) if found is None else None,
            gone_from=self.placed.get(key),
            members=self._members,
        )
        return (pod, status) if status is not None else (None, None)

    def pod(self, key: str) -> Pod | None:
        """The front-end pod with the status it reports, or None when there is nothing to report."""
        front, status = self.status(key)
        if status is None:
            return None
        if front is None:
            # A pod this run did not create (adopted after a restart): its UID is on its member
            # pod, or on the last state of one taken away. Without it the runtime would take the
            # pod for an older one of the same name and delete it, and with it the tombstone.
            found = self.member_pod(key)
            tomb = self.tombstone(key)
            source = found[1] if found else (tomb[0] if tomb else None)
            uid = ((source or {}).get("metadata", {}).get("labels") or {}).get(labels.ORIGIN_UID, "")
            namespace, _, name = key.partition("/")
            front = {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "spec": {}}
        return {"metadata": front["metadata"], "spec": front["spec"], "status": status}
