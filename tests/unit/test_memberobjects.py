"""What a MemberCluster object's new state means for its member (federation.members.objects.change),
and that MemberObjects asks the provider for exactly that. Pure logic: the provider is a
recording stand-in; the real watch is in tests/e2e/test_federation_capacity.py and
test_reclaim.py (members added, changed, disabled and removed at run time)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from federation.config import CapacityConfig, MemberConfig
from federation.members.member import Member
from federation.members.objects import MemberObjects, change
from vkprovider.kube import ClusterAccess


class _Source:
    name = "m1"


def member(*, from_object: bool = True, draining: bool = False, **fields: Any) -> Member:
    return Member(
        config=config(**fields),
        source=_Source(),  # type: ignore[arg-type]
        from_object=from_object,
        draining=draining,
    )


def config(**fields: Any) -> MemberConfig:
    return MemberConfig(**{"name": "m1", "source": "agent", "agent_address": "a:1", **fields})


@pytest.mark.parametrize(
    ("existing", "new", "expected"),
    [
        (None, config(), "add"),
        (member(from_object=False), config(weight=2), "ignore"),
        (member(), config(), "unchanged"),
        (member(), config(enabled=False), "drain"),
        (member(), config(weight=3, capacity=CapacityConfig(reserve_percent=20)), "in_place"),
        (member(enabled=False, draining=True), config(), "in_place"),  # re-enabled while draining
        (member(enabled=False), config(), "add"),  # re-enabled once drained: watches start again
        (member(), config(agent_address="b:1"), "add"),  # reached another way
        (member(enabled=False), config(enabled=False, weight=2), "add"),
    ],
)
def test_change(existing: Member | None, new: MemberConfig, expected: str) -> None:
    assert change(existing, new) == expected


class _Members:
    """Records what MemberObjects asks of the provider."""

    def __init__(self, existing: Member | None, *, drains: bool) -> None:
        self.members = {"m1": existing} if existing else {}
        self.started = asyncio.Event()
        self.drains = drains
        self.calls: list[str] = []

    def add_member(
        self,
        config: MemberConfig,
        access: ClusterAccess | None,
        *,
        from_object: bool = False,
        store: Any = None,
        removed: bool = False,
        settled: bool = False,
    ) -> None:
        self.calls.append(f"add enabled={config.enabled}" + (" settled" if settled else ""))

    def notify_drained_away(self, callback: Any) -> None:
        pass

    def remove_member(self, name: str, *, quiet: bool = False) -> None:
        self.calls.append("remove")

    def drain(self, member: Member, config: MemberConfig, *, removed: bool) -> bool:
        self.calls.append(f"drain removed={removed}")
        return self.drains

    def reconfigure(self, member: Member, config: MemberConfig) -> None:
        self.calls.append(f"reconfigure weight={config.weight}")


def _object(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "m1", "finalizers": ["vkprovider.io/drain"]},
        "spec": {"source": "agent", "agentAddress": "a:1", **spec},
    }


@pytest.mark.parametrize(
    ("spec", "drains", "calls"),
    [
        ({"enabled": False}, True, ["drain removed=False"]),
        ({"enabled": False}, False, ["drain removed=False", "add enabled=False settled"]),  # none of ours there
        ({"weight": 4}, True, ["reconfigure weight=4"]),
        ({}, True, []),
    ],
)
async def test_apply_asks_the_provider_for_the_change(spec: dict[str, Any], drains: bool, calls: list[str]) -> None:
    members = _Members(member(), drains=drains)
    await MemberObjects(members, None, selector="", node="vk").apply(_object(**spec))  # type: ignore[arg-type]
    assert members.calls == calls


async def test_a_deleted_object_drains_its_member_or_removes_it_at_once() -> None:
    for drains, calls in ((True, ["drain removed=True"]), (False, ["drain removed=True", "remove"])):
        members = _Members(member(), drains=drains)
        MemberObjects(members, None, selector="", node="vk")._gone("m1")  # type: ignore[arg-type]
        assert members.calls == calls
    settings_member = _Members(member(from_object=False), drains=True)
    MemberObjects(settings_member, None, selector="", node="vk")._gone("m1")  # type: ignore[arg-type]
    assert settings_member.calls == []
