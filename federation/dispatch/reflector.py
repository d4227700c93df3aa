"""Reflections: the ConfigMaps, Secrets and headless Services our member pods need, copied from
the front end into their member namespaces.

- Before a member pod is created, what it refers to is copied (`copy_for`), so it starts as it
  would at the front end; a missing source is left for the pod to wait on, as a kubelet would.
- Every few seconds (`run`), copies no pod of ours refers to any more are deleted and the rest
  refreshed from their sources. What the pods refer to comes from `MemberPods.refs`: no member
  pod is decoded for it. Copies younger than GC_MIN_AGE stay, so none goes before its pod exists.
The pure parts (which objects, what a copy holds) are in federation.dispatch.reflect.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Callable
from typing import Any

from federation import labels
from federation.dispatch import reflect
from federation.members.pods import MemberPods
from vkprovider import logs
from vkprovider.kube import AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from vkprovider.objects import references

GC_MIN_AGE = 20.0  # seconds a reflected copy lives at least, so none goes before its pod exists


def _age(obj: dict[str, Any]) -> float:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return 0.0
    when = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    return (datetime.datetime.now(datetime.UTC) - when).total_seconds()


class Reflector:
    def __init__(
        self,
        *,
        owner: labels.Owner,
        members: Callable[[], dict[str, Any]],
        front: Callable[[], KubeClient | None],
    ) -> None:
        self.owner = owner
        self._members = members  # name -> provider Member (config + pods watcher)
        self._front = front
        self._services: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._services_lock: dict[str, asyncio.Lock] = {}
        self._log = logs.get("reflector", instance=owner.instance)

    def _pods_in(self, member: str) -> MemberPods | None:
        entry = self._members().get(member)
        return getattr(entry, "pods", None)

    async def copy_for(self, client: KubeClient, member_pod: dict[str, Any], *, front_namespace: str) -> None:
        """ConfigMaps, Secrets and headless Services the pod needs, copied before it starts."""
        front = self._front()
        assert front is not None
        namespace = member_pod["metadata"]["namespace"]
        configmaps, secrets = references(member_pod["spec"])
        wanted = [("configmaps", n) for n in sorted(configmaps)] + [("secrets", n) for n in sorted(secrets)]
        for plural, name in wanted:
            try:
                source = await front.get(f"/api/v1/namespaces/{front_namespace}/{plural}/{name}")
            except NotFound:
                continue  # the member pod waits for it, as a kubelet would
            await self._put_copy(client, plural, reflect.copy_of(source, namespace=namespace, owner=self.owner))
        for svc in reflect.headless_services_for(
            member_pod["metadata"].get("labels") or {}, await self._front_services(front_namespace)
        ):
            copy = reflect.service_copy(svc, namespace=namespace, owner=self.owner)
            with contextlib.suppress(AlreadyExists):
                await client.create(f"/api/v1/namespaces/{namespace}/services", copy)

    async def _front_services(self, namespace: str) -> list[dict[str, Any]]:
        """The front-end namespace's Services, listed at most every 5 s, and once for a burst of
        pods that all ask at the same moment."""
        front = self._front()
        assert front is not None
        async with self._services_lock.setdefault(namespace, asyncio.Lock()):
            services = self._services.get(namespace)
            if services is None or time.monotonic() - services[0] > 5:
                listed = await front.list(f"/api/v1/namespaces/{namespace}/services")
                services = (time.monotonic(), listed["items"])
                self._services[namespace] = services
            return services[1]

    @staticmethod
    async def _put_copy(client: KubeClient, plural: str, copy: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{copy['metadata']['namespace']}/{plural}"
        try:
            await client.create(path, copy)
        except AlreadyExists:
            current = await client.get(f"{path}/{copy['metadata']['name']}")
            if not reflect.same_content(current, copy):
                copy["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await client.replace(f"{path}/{copy['metadata']['name']}", copy)

    async def collect_garbage(self) -> None:
        """Delete reflected objects no pod of ours needs any more; refresh the others."""
        front = self._front()
        assert front is not None
        selector = {"labelSelector": self.owner.selector({labels.REFLECTED: "true"})}
        for name in list(self._members()):
            pods = self._pods_in(name)
            if pods is None or pods.client is None or not pods.synced.is_set():
                continue
            client = pods.client
            # What the pods refer to comes from MemberPods' index: no member pod is decoded for it.
            used: dict[str, tuple[set[str], set[str]]] = {}
            origin: dict[str, str] = {}
            for key, (ns, cms, secrets) in list(pods.refs.items()):
                known = used.setdefault(ns, (set(), set()))
                known[0].update(cms)
                known[1].update(secrets)
                origin[ns] = key.partition("/")[0]
            # A tenant may not list across the member: its namespaces, one by one.
            namespaces = sorted(pods.scope.namespaces) if pods.scope is not None else [""]

            async def listed_in(
                plural: str, client: KubeClient = client, namespaces: list[str] = namespaces
            ) -> list[dict[str, Any]]:
                out: list[dict[str, Any]] = []
                for ns in namespaces:
                    path = f"/api/v1/namespaces/{ns}/{plural}" if ns else f"/api/v1/{plural}"
                    out.extend((await client.list(path, params=selector))["items"])
                return out

            for plural, index in (("configmaps", 0), ("secrets", 1)):
                for obj in await listed_in(plural):
                    ns, obj_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
                    path = f"/api/v1/namespaces/{ns}/{plural}/{obj_name}"
                    if obj_name not in used.get(ns, (set(), set()))[index]:
                        if _age(obj) > GC_MIN_AGE:  # a copy made for a pod being created now is young
                            with contextlib.suppress(NotFound):
                                await client.delete(path)
                        continue
                    try:
                        source = await front.get(f"/api/v1/namespaces/{origin[ns]}/{plural}/{obj_name}")
                    except NotFound:
                        continue
                    copy = reflect.copy_of(source, namespace=ns, owner=self.owner)
                    if not reflect.same_content(obj, copy):
                        copy["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                        with contextlib.suppress(Conflict, NotFound):
                            await client.replace(path, copy)
            services = await listed_in("services")
            wanted = {svc["metadata"]["namespace"] for svc in services}
            by_namespace: dict[str, list[dict[str, Any]]] = {}
            if services:
                async for _, member_pod in pods.by_origin.walk():
                    if member_pod["metadata"]["namespace"] in wanted:
                        by_namespace.setdefault(member_pod["metadata"]["namespace"], []).append(member_pod)
            for svc in services:
                ns = svc["metadata"]["namespace"]
                members = by_namespace.get(ns, [])
                in_use = any(reflect.headless_services_for(p["metadata"].get("labels") or {}, [svc]) for p in members)
                if not in_use and _age(svc) > GC_MIN_AGE:
                    with contextlib.suppress(NotFound):
                        await client.delete(f"/api/v1/namespaces/{ns}/services/{svc['metadata']['name']}")

    async def run(self, *, interval: float = 3.0) -> None:
        """Collect every `interval` seconds until cancelled; a failed round is logged and retried."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect_garbage()
            except ApiError as exc:
                self._log.warning("reflected objects not collected", error=str(exc))
