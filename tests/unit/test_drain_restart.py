"""Drains that outlive the process (issue 43): a member added disabled is drained first when our
pods may run there (federation.members.fleet), and MemberCluster objects carry our finalizer so a
deletion waits for the drain (federation.members.objects). Stand-ins for the member's watches
and the front end; the real thing, with kill -9, is tests/e2e/test_drain_restart.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from federation.config import FederationConfig, MemberConfig
from federation.members.fleet import Fleet
from federation.members.member import Member
from federation.members.objects import FINALIZER, MemberObjects, finalizers_patch, release
from vkprovider.kube import ClusterAccess, Conflict, NotFound

PATH = "/apis/vkprovider.io/v1alpha1/memberclusters/m1"


# -- the finalizer's patches -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finalizers", "held", "expected"),
    [
        (None, True, [FINALIZER]),
        (["other"], True, ["other", FINALIZER]),
        ([FINALIZER], True, None),
        ([FINALIZER], False, []),
        (["other", FINALIZER], False, ["other"]),
        (["other"], False, None),
        (None, False, None),
    ],
)
def test_finalizers_patch(finalizers: list[str] | None, held: bool, expected: list[str] | None) -> None:
    meta: dict[str, Any] = {"name": "m1", "resourceVersion": "7"}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    body = finalizers_patch({"metadata": meta}, held=held)
    if expected is None:
        assert body is None
    else:
        assert body == {"metadata": {"finalizers": expected, "resourceVersion": "7"}}


class _Front:
    """MemberCluster objects by path; merge patches of finalizers, checked against the
    resourceVersion as the apiserver does (`conflicts`: that many refused first)."""

    def __init__(self, obj: dict[str, Any] | None, *, conflicts: int = 0) -> None:
        self.objects = {PATH: obj} if obj else {}
        self.conflicts = conflicts
        self.patches: list[dict[str, Any]] = []

    async def get(self, path: str, **_: Any) -> dict[str, Any]:
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    async def patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(409, "Conflict", path)
        self.patches.append(body)
        meta = self.objects[path]["metadata"]
        assert body["metadata"]["resourceVersion"] == meta["resourceVersion"]
        meta["finalizers"] = body["metadata"]["finalizers"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if meta.get("deletionTimestamp") and not meta["finalizers"]:
            del self.objects[path]
        return copy.deepcopy(self.objects.get(path, {}))


def _obj(*, finalizers: list[str], deleting: bool = False, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "m1", "resourceVersion": "1", "finalizers": finalizers}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"source": "agent", "agentAddress": "a:1", **spec}}


async def test_release_takes_ours_off_and_keeps_the_rest() -> None:
    front = _Front(_obj(finalizers=["other", FINALIZER], deleting=True), conflicts=2)
    assert await release(front, "m1")  # type: ignore[arg-type]
    assert front.objects[PATH]["metadata"]["finalizers"] == ["other"]
    gone = _Front(_obj(finalizers=[FINALIZER], deleting=True))
    assert await release(gone, "m1")  # type: ignore[arg-type]
    assert not gone.objects  # the deleted object went with its last finalizer
    assert await release(_Front(None), "m1")  # type: ignore[arg-type]
    assert not await release(_Front(_obj(finalizers=[FINALIZER]), conflicts=10), "m1")  # type: ignore[arg-type]


# -- MemberObjects: held while in use, a deleted object drained, then let go ----------------------


class _Members:
    def __init__(self, existing: Member | None = None, *, drains: bool = True) -> None:
        self.members = {"m1": existing} if existing else {}
        self.started = asyncio.Event()
        self.drains = drains
        self.calls: list[str] = []
        self.drained_away: list[Any] = []

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
        self.calls.append(f"add enabled={config.enabled} removed={removed} settled={settled}")

    def notify_drained_away(self, callback: Any) -> None:
        self.drained_away.append(callback)

    def remove_member(self, name: str, *, quiet: bool = False) -> None:
        self.calls.append("remove")
        self.members.pop(name, None)

    def drain(self, member: Member, config: MemberConfig, *, removed: bool) -> bool:
        self.calls.append(f"drain removed={removed}")
        return self.drains

    def reconfigure(self, member: Member, config: MemberConfig) -> None:
        self.calls.append("reconfigure")


class _Source:
    name = "m1"


def _member(**fields: Any) -> Member:
    config = MemberConfig(**{"name": "m1", "source": "agent", "agent_address": "a:1", **fields})
    return Member(config=config, source=_Source(), from_object=True)  # type: ignore[arg-type]


async def test_an_object_in_use_gets_our_finalizer() -> None:
    front = _Front(_obj(finalizers=["other"]))
    members = _Members()
    await MemberObjects(members, front, selector="", node="vk").apply(front.objects[PATH])  # type: ignore[arg-type]
    assert front.objects[PATH]["metadata"]["finalizers"] == ["other", FINALIZER]
    assert members.calls == ["add enabled=True removed=False settled=False"]


async def test_a_deleted_object_whose_member_drains_is_let_go_only_once_drained() -> None:
    front = _Front(_obj(finalizers=[FINALIZER], deleting=True))
    members = _Members(_member(), drains=True)
    objects = MemberObjects(members, front, selector="", node="vk")  # type: ignore[arg-type]
    await objects.apply(front.objects[PATH])
    assert members.calls == ["drain removed=True"] and PATH in front.objects
    members.members.clear()  # drained away (Fleet._finish_drain), which it says:
    members.drained_away[0]("m1")
    await objects.write_statuses()
    assert not front.objects


async def test_a_deleted_object_without_our_pods_is_let_go_at_once() -> None:
    front = _Front(_obj(finalizers=[FINALIZER], deleting=True))
    members = _Members(_member(), drains=False)
    await MemberObjects(members, front, selector="", node="vk").apply(front.objects[PATH])  # type: ignore[arg-type]
    assert members.calls == ["drain removed=True", "remove"] and not front.objects


async def test_a_deleted_object_found_after_a_restart_is_drained_again() -> None:
    # Reached through a kubeconfig Secret: our pods may be there, so it is added to be drained.
    obj = _obj(finalizers=[FINALIZER], deleting=True, kubeconfigSecretRef={"namespace": "d", "name": "s"})
    secret = "/api/v1/namespaces/d/secrets/s"
    front = _Front(obj)
    kubeconfig = (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://m1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    import base64

    front.objects[secret] = {"metadata": {"name": "s"}, "data": {"kubeconfig": base64.b64encode(kubeconfig.encode())}}
    members = _Members()
    objects = MemberObjects(members, front, selector="", node="vk")  # type: ignore[arg-type]
    await objects.apply(obj)
    assert members.calls == ["add enabled=False removed=True settled=False"] and PATH in front.objects
    # Its Secret deleted too: nothing can reach the member, the object is let go.
    del front.objects[secret]
    members.calls.clear()
    await objects.apply(obj)
    assert members.calls == [] and PATH not in front.objects


async def test_a_deleted_object_that_never_was_ours_is_left_alone() -> None:
    front = _Front(_obj(finalizers=["other"], deleting=True))
    members = _Members()
    await MemberObjects(members, front, selector="", node="vk").apply(front.objects[PATH])  # type: ignore[arg-type]
    assert members.calls == [] and front.objects[PATH]["metadata"]["finalizers"] == ["other"]


# -- Fleet: a member added disabled is drained first ---------------------------------------------


class _Pods:
    def __init__(self, access: ClusterAccess, held: dict[str, Any]) -> None:
        self.access = access
        self.synced = asyncio.Event()
        self.by_origin = held

    async def run(self, *, watch: bool = True) -> None:
        await asyncio.Event().wait()


class _WatchedSource:
    def __init__(self, config: MemberConfig) -> None:
        self.name = config.name
        self.synced = asyncio.Event()
        self.last_error = None
        self.last_contact_wall = None

    def unreachable_for(self) -> float:
        return 0.0

    async def run(self) -> None:
        await asyncio.Event().wait()


ACCESS = ClusterAccess(server="https://m1:6443")


def _fleet(held: dict[str, Any]) -> tuple[Fleet, list[_Pods], list[str]]:
    made: list[_Pods] = []
    drained_away: list[str] = []

    def new_pods(config: MemberConfig, access: ClusterAccess) -> _Pods:
        made.append(_Pods(access, held))
        return made[-1]

    fleet = Fleet(
        FederationConfig(),
        instance="vk",
        new_source=lambda config, access, changed: _WatchedSource(config),  # type: ignore[arg-type,return-value]
        new_pods=new_pods,  # type: ignore[arg-type]
        on_reachability=lambda member, before: None,
    )
    fleet.notify_drained_away(drained_away.append)
    return fleet, made, drained_away


async def _stopped(fleet: Fleet) -> None:
    tasks = [t for m in fleet.members.values() for t in (m.task, m.pods_task) if t is not None]
    fleet.stop()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("removed", [False, True])
async def test_a_member_added_disabled_is_drained_before_it_is_kept_without_watches(removed: bool) -> None:
    held: dict[str, Any] = {"ns/a": {}}
    fleet, made, drained_away = _fleet(held)
    config = MemberConfig(name="m1", enabled=False)
    try:
        fleet.add_member(config, ACCESS, from_object=True, removed=removed)
        member = fleet.members["m1"]
        assert member.draining and member.removed == removed and member.task is not None
        assert fleet.serving() == {"m1": member}  # its pods followed, and reclaimed as drained
        made[0].synced.set()
        fleet.refresh()
        assert fleet.members["m1"] is member and member.draining  # ns/a is still there
        held.clear()
        fleet.refresh()
        if removed:
            assert "m1" not in fleet.members and drained_away == ["m1"]
        else:
            kept = fleet.members["m1"]
            assert not kept.draining and kept.pods is None and kept.task is None and drained_away == []
            fleet.refresh()  # settled: not drained again
            assert fleet.members["m1"] is kept and len(made) == 1
    finally:
        await _stopped(fleet)


async def test_a_member_added_disabled_with_none_of_ours_is_settled_after_one_list() -> None:
    fleet, made, _ = _fleet({})
    try:
        fleet.add_member(MemberConfig(name="m1", enabled=False), ACCESS, from_object=True)
        assert fleet.members["m1"].draining
        fleet.refresh()
        assert fleet.members["m1"].draining  # not listed yet: it cannot tell
        made[0].synced.set()
        fleet.refresh()
        assert not fleet.members["m1"].draining and fleet.members["m1"].pods is None
    finally:
        await _stopped(fleet)


async def test_a_disabled_member_our_pods_cannot_reach_is_not_drained() -> None:
    fleet, made, _ = _fleet({})
    try:
        fleet.add_member(MemberConfig(name="m1", enabled=False, source="agent", agent_address="a:1"), None)
        assert not fleet.members["m1"].draining and not made
    finally:
        await _stopped(fleet)
