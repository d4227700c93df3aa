"""Member namespaces ready for our pods: the offline PriorityClasses, the namespace with its Pod
Security labels, its service account, and for a tenant (federation.tenancy.policy) its record in
the tenant's registry, the RoleBinding that gives the provider its rights there, the tenant's
quota and its NetworkPolicy, in that order.

Done once per member namespace and level; `known` (the member's cache, namespace -> level)
remembers what is done, so a pod's create costs no request here once its namespace is ready.
Concurrent creates for one namespace wait for the first to finish instead of each repeating its
writes (a burst of a new namespace's pods made 5 namespace and 15 PriorityClass creates per member).
"""

from __future__ import annotations

import asyncio
import contextlib

from federation import bands, labels, podsecurity
from federation.config import MemberConfig, TenancyConfig
from federation.tenancy import policy
from vkprovider.kube import AlreadyExists, Forbidden, KubeClient, NotFound, ensure_namespace, wait_for_account
from vkprovider.provider import ProviderError

ACCOUNT_WAIT = 15.0
RBAC_WAIT = 5.0  # seconds for the tenant's new RoleBinding to take effect


class MemberNamespaces:
    def __init__(self) -> None:
        self._priority_classes: set[str] = set()  # members whose classes this run created
        self._busy: dict[tuple[str, str], asyncio.Lock] = {}  # (member, namespace) -> its readying

    async def ensure(
        self,
        member: str,
        config: MemberConfig,
        client: KubeClient,
        namespace: str,
        known: dict[str, str] | None,
    ) -> None:
        if known is not None and known.get(namespace) == config.pod_security:
            return
        # One lock per member namespace ever readied: as few as the namespaces themselves.
        async with self._busy.setdefault((member, namespace), asyncio.Lock()):
            await self._ensure(member, config, client, namespace, known)

    async def _ensure(
        self, member: str, config: MemberConfig, client: KubeClient, namespace: str, known: dict[str, str] | None
    ) -> None:
        level = config.pod_security
        if known is not None and known.get(namespace) == level:
            return  # readied while this one waited
        account = config.service_account
        if config.tenancy is not None:
            # Onboarding made the PriorityClasses; the tenant's account may not.
            await self._tenant_namespace(client, namespace, config.tenancy, level)
            # The account's read is the first request the new RoleBinding allows: waiting through
            # its refusals also waits until the binding reached the authorizer, so the quota's
            # create after it is not refused (CI saw a 403 on a create made at once).
            ready = await wait_for_account(client, namespace, account, timeout=ACCOUNT_WAIT, forbidden_for=RBAC_WAIT)
            if ready:
                await self._tenant_fences(client, namespace, config.tenancy)
        else:
            await self._priority_classes_of(member, config, client)
            # Ours from before (or labelled for another level) are relabelled; a namespace
            # someone else made in the member keeps its own labels.
            wanted = {labels.MANAGED: "true", **podsecurity.namespace_labels(level)}
            ready = await ensure_namespace(
                client, namespace, labels=wanted, owned_by=labels.MANAGED, service_account=account
            )
        if not ready:
            raise ProviderError(f"service account {account!r} does not exist in {member}/{namespace}")
        if known is not None:
            known[namespace] = level

    async def _priority_classes_of(self, member: str, config: MemberConfig, client: KubeClient) -> None:
        if member in self._priority_classes:
            return
        reclaim = config.reclaim
        for body in bands.priority_classes(
            threshold=reclaim.online_threshold, offline_preemption=reclaim.offline_preemption
        ):
            with contextlib.suppress(AlreadyExists):
                await client.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
        self._priority_classes.add(member)

    @staticmethod
    async def _tenant_fences(client: KubeClient, namespace: str, tenancy: TenancyConfig) -> None:
        """Once the tenant's RoleBinding is in effect: the quota the member granted, and the
        NetworkPolicy that admits only the tenant's own namespaces (and the monitoring ones)."""
        if tenancy.quota:
            quota = policy.resource_quota(tenancy.tenant, namespace, tenancy.quota)
            with contextlib.suppress(AlreadyExists):
                await client.create(f"/api/v1/namespaces/{namespace}/resourcequotas", quota)
        fence = policy.Fence(tuple(tenancy.allowed_tolerations), tuple(tenancy.monitoring_namespaces))
        with contextlib.suppress(AlreadyExists):
            await client.create(
                f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
                policy.network_policy(tenancy.tenant, namespace, fence),
            )

    @staticmethod
    async def _tenant_namespace(
        client: KubeClient, namespace: str, tenancy: TenancyConfig, level: podsecurity.Level
    ) -> None:
        """A tenant's provider has no rights in a namespace until it binds its role there
        (federation.tenancy.policy): the namespace first, recorded in the tenant's registry, then
        the RoleBinding (the quota and NetworkPolicy follow once the binding is in effect)."""
        wanted = {labels.MANAGED: "true", policy.TENANT: tenancy.tenant, **podsecurity.namespace_labels(level)}
        try:
            try:
                await client.create("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": wanted}})
            except AlreadyExists:
                # No read on namespaces (other tenants' names are not ours to see): patch blind;
                # the member's policy refuses it if the namespace is not this tenant's.
                await client.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": wanted}})
        except Forbidden as exc:
            raise ProviderError(f"namespace {namespace} refused for tenant {tenancy.tenant}: {exc}") from exc
        # Recorded before anything of ours goes there: a tenant may not list namespaces, and its
        # provider, restarted, finds its pods in the namespaces this registry names.
        registry = labels.tenant_registry(tenancy.tenant)
        try:
            await client.patch(registry, {"data": {namespace: ""}})
        except (Forbidden, NotFound) as exc:
            raise ProviderError(
                f"tenant {tenancy.tenant}: namespace {namespace} cannot be recorded in {policy.REGISTRY} "
                f"({exc}); run `vkprovider onboard` again for this member"
            ) from exc
        binding = policy.role_binding(tenancy.tenant, namespace)
        binding["roleRef"]["name"] = tenancy.cluster_role
        binding["subjects"] = [{"kind": "ServiceAccount", **tenancy.service_account.model_dump()}]
        with contextlib.suppress(AlreadyExists):
            await client.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", binding)
