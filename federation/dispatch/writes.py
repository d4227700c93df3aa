"""What dispatch writes in a member cluster: a job's member pods, forged from the front-end
pods, and its gang object; their deletion when a front-end pod goes or a gang is rolled back.

Before a member pod is created, its member namespace is made ready (a `NamespaceFence`: the
provider hands in federation.tenancy.namespaces, which writes the namespace with its
pod-security labels, the service account and a tenant's RoleBinding and quota) and what it
refers to is copied there (federation.dispatch.reflector). Each pod's room in the member is held
from the create until the member's watch reports the pod (federation.capacity.reservations), so
a placement running meanwhile is not offered it again. Deciding where a job goes, and when, is
federation.dispatch.dispatcher's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from federation import jobs, labels, podsecurity
from federation.capacity.inventory import pod_requests
from federation.config import MemberConfig
from federation.dispatch import forge
from federation.dispatch.jobstate import Job
from federation.dispatch.reflector import Reflector
from federation.jobs import JobRef, role_of
from federation.members.pods import MemberPods
from vkprovider.events import EventRecorder
from vkprovider.kube import AlreadyExists, Conflict, KubeClient, NotFound
from vkprovider.objects import Pod, pod_key
from vkprovider.provider import ProviderError


class NamespaceFence(Protocol):
    """Makes a member namespace ready for our pods (`known`: the member's cache of namespaces
    ready, namespace -> pod-security level)."""

    async def ensure(
        self, member: str, config: MemberConfig, client: KubeClient, namespace: str, known: dict[str, str] | None
    ) -> None: ...


class MemberWriter:
    def __init__(
        self,
        *,
        owner: labels.Owner,
        members: Callable[[], dict[str, Any]],
        front: Callable[[], KubeClient | None],
        events: Callable[[], EventRecorder | None],
        notify: Callable[[str], None],
        namespaces: NamespaceFence,
    ) -> None:
        self.owner = owner
        self._members = members  # name -> provider Member (config + pods watcher)
        self._events = events
        self._notify = notify
        #: Copies of what member pods refer to, and their garbage collection.
        self.reflector = Reflector(owner=owner, members=members, front=front)
        self.namespaces = namespaces
        #: The pod-security level each pod needs, worked out once per pod.
        self.needs = podsecurity.NeededLevels()

    async def _ensure_namespace(self, member: str, client: KubeClient, namespace: str) -> None:
        entry = self._members()[member]
        pods: MemberPods | None = getattr(entry, "pods", None)
        known = pods.namespaces if pods is not None else None
        await self.namespaces.ensure(member, entry.config, client, namespace, known)
        if pods is not None:
            pods.follow(namespace)

    async def create_pod(self, job: Job, pod: Pod, member: str, *, in_gang: bool) -> None:
        """The member pod of `pod`, in the member's view of the job's gang when `in_gang`;
        nothing when it exists already (created before a restart)."""
        entry = self._members()[member]
        pods: MemberPods = entry.pods
        if pods.client is None:
            raise ProviderError(f"member {member} is not connected")
        config = entry.config
        if not podsecurity.admits(config.pod_security, self.needs(pod)):
            refused = podsecurity.check(pod, config.pod_security)
            # Dispatch checked the pod against this member, and placement skips members that
            # refuse a job's pods: only a level changed since gets here. Its own sync fails it.
            self._notify(pod_key(pod))
            raise ProviderError(
                f"pod security of member {member} ({config.pod_security}) now forbids {pod_key(pod)}: "
                f"{podsecurity.describe(refused)}"
            )
        body = forge.to_member(
            pod,
            job=job.ref,
            gang=job.member_gang,
            role=role_of(pod),  # type: ignore[arg-type]
            member=member,
            owner=self.owner,
            namespace_prefix=config.namespace_prefix,
            gang_api=config.gang_api,
            scheduler_name=config.scheduler_name,
            service_account=config.service_account,
            colocation=config.capacity.model == "colocation",
            placement=job.place,
            network_pod_label=config.network_pod_label,
            in_gang=in_gang,
            gang_role=job.role,
        )
        namespace = body["metadata"]["namespace"]
        await self._ensure_namespace(member, pods.client, namespace)
        await self.reflector.copy_for(pods.client, body, front_namespace=pod["metadata"].get("namespace", ""))
        events = self._events()
        if events is not None and (pod["spec"].get("serviceAccountName") or "default") != config.service_account:
            await events.emit(
                pod,
                reason="ServiceAccountNotCarried",
                message=f"runs in member {member} as its service account {config.service_account!r}; "
                "front-end service-account tokens are not carried",
            )
        key = pod_key(pod)
        pods.reservations.hold(key, pod_requests(pod["spec"]))
        try:
            created = await pods.client.create(f"/api/v1/namespaces/{namespace}/pods", body)
        except AlreadyExists:
            pods.reservations.release(key)
            return  # created before a restart: the watch reports it
        except BaseException:
            pods.reservations.release(key)
            raise
        pods.created(created)

    async def create_gang(self, job: Job, member: str) -> None:
        """The member's gang object for the job (kept if it exists)."""
        entry = self._members()[member]
        config = entry.config
        client: KubeClient = entry.pods.client
        namespace = forge.member_namespace(job.ref.namespace, config.namespace_prefix)
        await self._ensure_namespace(member, client, namespace)
        body = forge.gang_object(
            job.ref,
            job.member_gang,
            namespace=namespace,
            gang_api=config.gang_api,
            placement=job.place,
            network_pod_label=config.network_pod_label,
            owner=self.owner,
            role=job.role,
        )
        api_version, plural = forge.GANG_PATHS[config.gang_api]
        with contextlib.suppress(AlreadyExists):
            await client.create(f"/apis/{api_version}/namespaces/{namespace}/{plural}", body)

    async def delete_gang(self, job: JobRef, member: str) -> None:
        """The job's member pods and gang object gone from `member` (a gang rolled back)."""
        entry = self._members().get(member)
        if entry is None or entry.pods.client is None:
            return
        client: KubeClient = entry.pods.client
        config = entry.config
        namespace = forge.member_namespace(job.namespace, config.namespace_prefix)
        label = jobs.job_hash(job)
        selector = {"labelSelector": self.owner.selector({labels.JOB_LABEL: label})}
        for key in entry.pods.keys_of(label):
            entry.pods.expect_deletion(entry.pods.by_origin.uid(key) or "")
        with contextlib.suppress(NotFound):
            await client.delete(f"/api/v1/namespaces/{namespace}/pods", params={**selector, "gracePeriodSeconds": 0})
        api_version, plural = forge.GANG_PATHS[config.gang_api]
        with contextlib.suppress(NotFound):
            await client.delete(f"/apis/{api_version}/namespaces/{namespace}/{plural}/{forge.gang_name(job)}")

    async def delete_pod(self, member: str, member_pod: dict[str, Any], *, grace: int | None) -> None:
        """The member pod of a front-end pod being deleted, with its grace period (its UID as
        the precondition: a newer pod of the name is not touched)."""
        entry = self._members().get(member)
        pods: MemberPods | None = getattr(entry, "pods", None)
        client = pods.client if pods is not None else None
        if client is None or pods is None:
            raise ProviderError(f"member {member} is not connected")
        meta = member_pod["metadata"]
        pods.expect_deletion(meta.get("uid", ""))
        body: dict[str, Any] = {"preconditions": {"uid": meta.get("uid")}}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        with contextlib.suppress(NotFound, Conflict):
            await client.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body=body)
