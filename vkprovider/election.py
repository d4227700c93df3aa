"""Leader election on a coordination.k8s.io Lease, so several replicas can run and one writes.

Expiry is judged by this replica's own clock from the moment it last saw the record change
(as client-go does), never by comparing clocks across machines. A leader steps down, closing
the process's write fence first so no client of it writes again:
- when no renewal has succeeded for `renew_deadline`, counted from the moment the last
  successful attempt began (the renewTime it wrote is no older) and enforced even while an
  attempt hangs. A standby takes over only `lease_duration` after it saw that renewal, so with
  renew_deadline < lease_duration the old leader has stopped before the new one starts;
- at once when the lease names another holder (taken over by hand, or by a replica whose
  clock ran fast): unlike client-go, which keeps writing until its renew deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from vkprovider import logs
from vkprovider.kube import AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from vkprovider.lease import micro_time
from vkprovider.settings import LeaderElectionSettings


class LostLeadership(Exception):
    """This replica could not renew its lease in time and must stop writing."""


class LeaderElector:
    def __init__(
        self,
        client: KubeClient,
        settings: LeaderElectionSettings,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._settings = settings
        self._name = name
        self._clock = clock
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases/{name}"
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0  # when the last successful acquire or renewal attempt began
        self.is_leader = False
        self._log = logs.get("election", lease=name, identity=settings.identity)

    @property
    def identity(self) -> str:
        return self._settings.identity

    def _record(self, lease: dict[str, Any], *, transitions: int) -> dict[str, Any]:
        now = micro_time()
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = transitions
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self._settings.lease_duration),
            renewTime=now,
        )
        return lease

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self._client.get(self._path)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._settings.namespace},
            }
            try:
                await self._client.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{self._settings.namespace}/leases",
                    self._record(body, transitions=0),
                )
            except (AlreadyExists, Conflict):
                return False
            self._observed_at = self._clock()
            return True
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity") or ""
        seen = (holder, str(spec.get("renewTime")))
        if seen != self._observed:
            self._observed, self._observed_at = seen, self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self._settings.lease_duration)
        held_by_other = holder and holder != self.identity
        if held_by_other and self._clock() < self._observed_at + duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if held_by_other else 0)
        try:
            await self._client.replace(self._path, self._record(lease, transitions=transitions))
        except Conflict:
            return False
        self._observed_at = self._clock()
        return True

    async def acquire(self) -> None:
        """Return once this replica holds the lease."""
        waiting_logged = False
        while True:
            began = self._clock()
            try:
                if await self.try_acquire_or_renew():
                    self._renewed_at = began
                    self.is_leader = True
                    self._log.info("became leader")
                    return
            except ApiError as exc:
                self._log.warning("election attempt failed", error=str(exc))
            if not waiting_logged:
                self._log.info("waiting for the leader lease", holder=self._observed[0] if self._observed else None)
                waiting_logged = True
            await asyncio.sleep(self._settings.retry_period)

    def _step_down(self, why: str) -> LostLeadership:
        self.is_leader = False
        if self._client.fence is not None:
            self._client.fence.close(f"leadership of {self._name} lost: {why}")
        self._log.warning("stepping down", reason=why)
        return LostLeadership(f"lease {self._name}: {why}")

    async def hold(self) -> None:
        """Renew until cancelled; raise LostLeadership (after closing the write fence) when the
        lease names another holder, or no renewal has succeeded for `renew_deadline`."""
        deadline = self._settings.renew_deadline
        valid_until = self._renewed_at + deadline
        while True:
            await asyncio.sleep(max(0.0, min(self._settings.retry_period, valid_until - self._clock())))
            began = self._clock()
            if began >= valid_until:
                raise self._step_down(f"no renewal succeeded for {deadline:.0f}s")
            try:
                renewed = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=valid_until - began)
            except TimeoutError:
                raise self._step_down(f"renewal did not answer within the {deadline:.0f}s deadline") from None
            except ApiError as exc:
                self._log.warning("lease renewal failed", error=str(exc))
                continue
            if renewed:
                self._renewed_at = began
                valid_until = began + deadline
                continue
            holder = self._observed[0] if self._observed else ""
            if holder and holder != self.identity:
                raise self._step_down(f"the lease is held by {holder}")

    async def release(self) -> None:
        """Give the lease up on a clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = await self._client.get(self._path)
            if lease.get("spec", {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["leaseDurationSeconds"] = 1
                await self._client.replace(self._path, lease)
        except ApiError as exc:
            self._log.warning("could not release the lease", error=str(exc))
        self.is_leader = False
