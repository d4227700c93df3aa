"""The tests' member watch (tests/e2e/memberwatch.py) cannot go blind unnoticed: it carries on
through a member's apiserver outage, reporting what changed meanwhile, and a watch that could
not watch for longer than it may fails the test that relies on it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from e2e import lab as lab_mod
from e2e.fixtures import Lab
from tests.e2e.helpers import eventually, pod
from tests.e2e.memberwatch import PODS, MemberWatch

# Stops member-3 and uses nothing else.
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session"), pytest.mark.lab_turn(alone=["member-3"])]


async def test_member_watch_sees_through_an_outage_and_fails_when_blind(lab: Lab) -> None:
    tag = uuid.uuid4().hex[:6]
    selector = f"mw={tag}"
    patient = MemberWatch(lab=lab, members=["member-3"], selector=selector, paths=(PODS,), max_blind=120)
    impatient = MemberWatch(lab=lab, members=["member-3"], selector=selector, paths=(PODS,), max_blind=2)
    async with lab.client("member-3") as member:
        # The default namespace: its service account exists, whereas a new namespace's comes from
        # a controller manager that may still be re-listing after an earlier test's outage.
        ns = "default"
        try:
            await patient.start()
            await impatient.start()
            await member.create(f"/api/v1/namespaces/{ns}/pods", pod("a", labels={"mw": tag}))

            async def seen(name: str, kind: str) -> bool:
                return any(s.name == name and s.type == kind for s in patient.history)

            await eventually(lambda: seen("a", "ADDED"), timeout=30, what="pod a seen")
            await asyncio.to_thread(lab_mod.stop_cluster, lab.state_dir, "member-3")
            try:
                # Down for longer than the impatient watch may be blind: it must say so.
                await eventually(lambda: _failed(impatient), timeout=30, what="the impatient watch failing")
            finally:
                await lab_mod.start_cluster(lab.state_dir, "member-3")
            await member.delete(f"/api/v1/namespaces/{ns}/pods/a", params={"gracePeriodSeconds": 0})
            await member.create(f"/api/v1/namespaces/{ns}/pods", pod("b", labels={"mw": tag}))
            await eventually(lambda: seen("a", "DELETED"), timeout=60, what="pod a's deletion seen after the outage")
            await eventually(lambda: seen("b", "ADDED"), timeout=60, what="pod b seen after the outage")
            patient.check()
            assert [p["metadata"]["name"] for p in patient.holding("member-3")] == ["b"]
            with pytest.raises(AssertionError, match="could not watch member-3"):
                impatient.check()
        finally:
            await patient.stop()
            impatient.failures.clear()
            await impatient.stop()
            await member.delete(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector})


async def _failed(watch: MemberWatch) -> bool:
    return bool(watch.failures)
