"""Pod security in the dispatcher and the runtime, against dict apiservers: a pod no member
may run is refused before any member sees it (ProviderInvalid with our reason, which the
runtime writes as the Failed pod's reason and its Event's), placement skips members whose level
refuses the job, and member namespaces get (or are brought to) their member's PSA labels.
The same paths run against real apiservers in tests/e2e/test_pod_security.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from federation import labels, podsecurity
from federation.capacity.summary import MemberCapacity, NodeFree
from federation.config import MemberConfig
from federation.dispatch.dispatcher import Dispatcher
from federation.labels import MANAGED
from federation.members.pods import MemberPods
from federation.tenancy.namespaces import MemberNamespaces
from tests.unit.fakeapi import FakeApi
from vkprovider.metrics import Metrics
from vkprovider.pods import PodController
from vkprovider.provider import ProviderInvalid
from vkprovider.settings import PodSettings

pytestmark = pytest.mark.asyncio(loop_scope="function")

NS = "team"
NAMESPACES = "/api/v1/namespaces"


def pod_names(api: FakeApi) -> list[str]:
    return sorted(k.rsplit("/", 1)[1] for k in api.objects if "/pods/" in k)


def front_pod(name: str, owner: str | None = None, **spec: Any) -> Any:
    meta: dict[str, Any] = {"namespace": NS, "name": name, "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "controller": True, "uid": "j"}]
    body: dict[str, Any] = {
        "metadata": meta,
        "spec": {
            "nodeName": "vk",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    body["spec"].update(spec)
    return body


HOSTPATH: dict[str, Any] = {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}


class World:
    """The front end and members m1 (weight 2, preferred), m2 (weight 1), each with its level."""

    def __init__(self, **levels: str) -> None:
        self.front = FakeApi()
        self.apis = {name: FakeApi() for name in ("m1", "m2")}
        self.members: dict[str, Any] = {}
        for name, api in self.apis.items():
            pods = MemberPods(name, None, owner=labels.Owner("vk"), on_change=lambda key, phase: None)  # type: ignore[arg-type]
            pods.client = api  # type: ignore[assignment]
            pods.synced.set()
            weight = 2 if name == "m1" else 1
            config = MemberConfig.model_validate(
                {"name": name, "weight": weight, "podSecurity": levels.get(name, "baseline")}
            )
            self.members[name] = SimpleNamespace(config=config, pods=pods)
        node = NodeFree("n0", {"cpu": 96_000, "memory": 2**40, "pods": 110}, None, None, None)
        self.dispatcher = Dispatcher(
            owner=labels.Owner("vk"),
            members=lambda: self.members,
            capacities=lambda: {n: MemberCapacity(name=n, nodes=[node]) for n in self.apis},
            notify=lambda key: None,
            namespaces=MemberNamespaces(),
        )
        self.dispatcher.front = self.front  # type: ignore[assignment]

    def placed(self) -> dict[str, list[str]]:
        return {name: pod_names(api) for name, api in self.apis.items()}


async def test_a_pod_no_member_admits_is_refused_before_any_member_sees_it() -> None:
    world = World()
    with pytest.raises(ProviderInvalid) as refused:
        await world.dispatcher.create(front_pod("h", **HOSTPATH))
    assert refused.value.reason == podsecurity.REASON == "ForbiddenByMemberPolicy"
    message = str(refused.value)
    assert "m1, m2 (baseline)" in message and "spec.volumes[0].hostPath" in message, message
    assert world.placed() == {"m1": [], "m2": []}
    assert not any(api.creates for api in world.apis.values()), "a member was written to"
    assert world.dispatcher.jobs == {} and world.dispatcher.job_of_pod == {}
    assert world.dispatcher.reports.status(f"{NS}/h") == (None, None)


async def test_placement_skips_members_whose_level_refuses_the_pod() -> None:
    world = World(m2="privileged")
    await world.dispatcher.create(front_pod("h", **HOSTPATH))
    await world.dispatcher.create(front_pod("plain"))
    # m1 is preferred (weight 2) but baseline: the hostPath pod goes to m2.
    assert world.placed() == {"m1": ["plain"], "m2": ["h"]}
    labels = {n: api.objects[f"{NAMESPACES}/{NS}"]["metadata"]["labels"] for n, api in world.apis.items()}
    assert labels["m1"] == {MANAGED: "true", **podsecurity.namespace_labels("baseline")}
    assert labels["m2"] == {MANAGED: "true", **podsecurity.namespace_labels("privileged")}


async def test_a_pinned_job_is_checked_against_its_member_only() -> None:
    world = World(m2="privileged")
    await world.dispatcher.create(front_pod("w0", owner="train"))
    assert world.placed() == {"m1": ["w0"], "m2": []}
    with pytest.raises(ProviderInvalid) as refused:
        await world.dispatcher.create(front_pod("w1", owner="train", hostNetwork=True))
    message = str(refused.value)
    assert "member m1 (baseline)" in message and "spec.hostNetwork" in message and "m2" not in message, message
    assert world.placed() == {"m1": ["w0"], "m2": []}
    assert list(world.dispatcher.jobs[f"{NS}/owner/Job/train"].pods) == [f"{NS}/w0"]


async def test_a_restricted_member_takes_only_hardened_pods() -> None:
    world = World(m1="restricted", m2="restricted")
    with pytest.raises(ProviderInvalid) as refused:
        await world.dispatcher.create(front_pod("plain"))
    assert "m1, m2 (restricted)" in str(refused.value)
    assert "spec.containers[0].securityContext.allowPrivilegeEscalation" in str(refused.value)
    context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    hardened = front_pod(
        "hardened",
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        containers=[{"name": "c", "image": "i", "securityContext": context}],
    )
    await world.dispatcher.create(hardened)
    assert world.placed() == {"m1": ["hardened"], "m2": []}


async def test_namespaces_of_ours_are_relabelled_and_others_left_alone() -> None:
    world = World()
    m1 = world.apis["m1"]
    stale = {MANAGED: "true", "pod-security.kubernetes.io/enforce": "privileged", "team": "a"}
    m1.objects[f"{NAMESPACES}/{NS}"] = {"metadata": {"name": NS, "labels": dict(stale)}}
    m1.objects[f"{NAMESPACES}/other"] = {"metadata": {"name": "other", "labels": {"team": "b"}}}
    await world.dispatcher.create(front_pod("a"))
    expected = {**stale, **podsecurity.namespace_labels("baseline")}
    assert m1.objects[f"{NAMESPACES}/{NS}"]["metadata"]["labels"] == expected
    # One patch with only what differed.
    (path, body), *more = m1.patches
    assert not more and path == f"{NAMESPACES}/{NS}"
    assert body["metadata"]["labels"] == {k: v for k, v in expected.items() if stale.get(k) != v}

    foreign = front_pod("b")
    foreign["metadata"]["namespace"] = "other"
    await world.dispatcher.create(foreign)
    assert m1.objects[f"{NAMESPACES}/other"]["metadata"]["labels"] == {"team": "b"}
    assert len(m1.patches) == 1

    # A level changed at run time: the namespace is relabelled before the next pod goes there.
    world.members["m1"].config = world.members["m1"].config.model_copy(update={"pod_security": "restricted"})
    context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    await world.dispatcher.create(front_pod("c", containers=[{"name": "c", "image": "i", "securityContext": context}]))
    labels = m1.objects[f"{NAMESPACES}/{NS}"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert pod_names(world.apis["m1"]) == ["a", "b", "c"]


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []

    async def emit(self, obj: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


class Refusing:
    def __init__(self, error: ProviderInvalid) -> None:
        self.error = error

    async def create_pod(self, pod: Any) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "reason", "event"),
    [
        (ProviderInvalid("member m1 forbids it", reason="ForbiddenByMemberPolicy"), "ForbiddenByMemberPolicy", None),
        (ProviderInvalid("bad pod"), "ProviderFailed", "ProviderCreateFailed"),
    ],
)
async def test_the_runtime_fails_a_refused_pod_with_the_providers_reason(
    error: ProviderInvalid, reason: str, event: str | None
) -> None:
    api = FakeApi()
    pod = front_pod("p")
    pod["metadata"]["resourceVersion"] = "1"
    api.objects[f"/api/v1/namespaces/{NS}/pods/p/status"] = {"metadata": {"name": "p", "resourceVersion": "1"}}
    recorder = Recorder()
    controller = PodController(
        client=api,  # type: ignore[arg-type]
        provider=Refusing(error),  # type: ignore[arg-type]
        node_names=["vk"],
        host_ip="127.0.0.1",
        settings=PodSettings(),
        events=recorder,  # type: ignore[arg-type]
        metrics=Metrics(),
    )
    assert await controller._create(f"{NS}/p", pod) is False  # not retried
    (_, body), *_ = api.patches
    assert body["status"]["phase"] == "Failed" and body["status"]["reason"] == reason
    assert body["status"]["message"] == str(error)
    assert recorder.events == [(event or reason, str(error), True)]
