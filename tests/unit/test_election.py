"""Leader election against an in-memory Lease (pure logic: the end-to-end handover runs on the
lab in tests/e2e/test_runtime.py). Durations are small real ones; nothing here asserts speed,
only what happens and in which order."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from vkprovider.election import LeaderElector, LostLeadership
from vkprovider.kube import Fenced, Forbidden, NotFound, WriteFence
from vkprovider.settings import LeaderElectionSettings


class FakeLeases:
    """The one Lease the elector reads and writes, with switches to break it."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.fence = WriteFence()
        self.forbid = False
        self.hang = False
        self.writes = 0

    async def _gate(self) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        if self.forbid:
            raise Forbidden(403, "Forbidden", "leases is forbidden")

    async def get(self, path: str) -> dict[str, Any]:
        await self._gate()
        if self.lease is None:
            raise NotFound(404, "NotFound", path)
        return copy.deepcopy(self.lease)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._write(body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._write(body)

    async def _write(self, body: dict[str, Any]) -> dict[str, Any]:
        await self._gate()
        if self.fence.closed:
            raise Fenced(0, "Fenced", self.fence.closed)
        self.writes += 1
        self.lease = copy.deepcopy(body)
        return body

    def take_over(self, holder: str) -> None:
        assert self.lease is not None
        self.lease["spec"]["holderIdentity"] = holder
        self.lease["spec"]["renewTime"] = "2026-11-30T00:00:00.000000Z"


def _settings(identity: str) -> LeaderElectionSettings:
    return LeaderElectionSettings(
        enabled=True, identity=identity, lease_duration=2.0, renew_deadline=0.6, retry_period=0.05
    )


async def _leader(leases: FakeLeases) -> LeaderElector:
    elector = LeaderElector(leases, _settings("a"), name="vk")  # type: ignore[arg-type]
    await asyncio.wait_for(elector.acquire(), timeout=5)
    assert elector.is_leader
    return elector


async def test_a_leader_whose_lease_is_taken_steps_down_at_its_next_renewal() -> None:
    leases = FakeLeases()
    elector = await _leader(leases)
    holding = asyncio.create_task(elector.hold(), name="test/hold")
    await asyncio.sleep(0.2)
    assert not holding.done()
    leases.take_over("b")
    with pytest.raises(LostLeadership, match="held by b"):
        await asyncio.wait_for(holding, timeout=0.5)  # well before the 0.6 s renew deadline
    assert not elector.is_leader
    assert leases.fence.closed and "held by b" in leases.fence.closed
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "b"


async def test_blocked_renewals_step_down_by_the_deadline_before_a_standby_may_take_over() -> None:
    leases = FakeLeases()
    elector = await _leader(leases)
    loop = asyncio.get_running_loop()
    holding = asyncio.create_task(elector.hold(), name="test/hold")
    await asyncio.sleep(0.2)
    leases.forbid = True
    blocked = loop.time()
    with pytest.raises(LostLeadership, match="no renewal succeeded"):
        await asyncio.wait_for(holding, timeout=5)
    stepped_down = loop.time()
    # The last successful renewal began at most a retry period before the block; the standby
    # may take over lease_duration after it saw that renewal, which is later still.
    assert stepped_down - blocked < elector._settings.lease_duration - elector._settings.retry_period
    assert leases.fence.closed


async def test_a_renewal_that_hangs_still_steps_down_at_the_deadline() -> None:
    leases = FakeLeases()
    elector = await _leader(leases)
    holding = asyncio.create_task(elector.hold(), name="test/hold")
    await asyncio.sleep(0.2)
    leases.hang = True
    with pytest.raises(LostLeadership, match="did not answer"):
        await asyncio.wait_for(holding, timeout=5)
    assert leases.fence.closed


async def test_a_standby_waits_for_the_lease_to_expire_by_its_own_clock() -> None:
    leases = FakeLeases()
    leader = await _leader(leases)
    standby = LeaderElector(leases, _settings("b"), name="vk")  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert not await standby.try_acquire_or_renew()  # the leader's claim is fresh
    writes = leases.writes
    await asyncio.wait_for(standby.acquire(), timeout=5)  # the leader stopped renewing
    assert loop.time() - began >= leader._settings.lease_duration - 0.1
    assert leases.writes == writes + 1 and standby.is_leader
