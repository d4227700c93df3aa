"""A gang's clock read from the clusters (federation.dispatch.jobstate: bound_at, nth_time,
to_monotonic, wait_start), so a restarted provider counts a gang's timeout from the same moment as
the one it replaces; and the gang timer (federation.dispatch.gang) of a provider started in the
middle of a wait. The same restart runs end to end in tests/e2e/test_gang_restart.py."""

from __future__ import annotations

import datetime
import time
from typing import Any, cast

import pytest

from federation.dispatch import gang
from federation.dispatch.gang import TOLD, Gangs
from federation.dispatch.jobstate import (
    Job,
    bound_at,
    created_at,
    first_time,
    nth_time,
    parse_time,
    to_monotonic,
    wait_start,
)
from federation.dispatch.nativepods import NativePods
from federation.jobs import GangSpec, JobRef
from vkprovider.events import EventRecorder
from vkprovider.objects import Pod
from vkprovider.podstore import PodOverlay, PodSubset

T0 = datetime.datetime(2025, 3, 1, 10, tzinfo=datetime.UTC).timestamp()  # 2025-03-01T10:00:00Z


def rfc3339(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat()


def pod(
    name: str,
    *,
    scheduled: str | None = None,
    status: str = "True",
    created: str = "2025-03-01T09:00:00Z",
    node: str = "vk",
    annotations: dict[str, str] | None = None,
) -> Pod:
    conditions = (
        [] if scheduled is None else [{"type": "PodScheduled", "status": status, "lastTransitionTime": scheduled}]
    )
    return cast(
        Pod,
        {
            "metadata": {
                "namespace": "team",
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": created,
                "annotations": annotations or {},
            },
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Pending", "conditions": conditions},
        },
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-03-01T10:00:00Z", T0),
        ("2025-03-01T10:00:30Z", T0 + 30),
        ("2025-03-01T10:00:00.250000+00:00", T0 + 0.25),
        ("2025-03-01T10:00:00", T0),  # no zone: the API's times are UTC
        ("", None),
        (None, None),
        ("yesterday", None),
    ],
)
def test_api_times_parse_to_epoch_seconds(value: object, expected: float | None) -> None:
    assert parse_time(value) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # Bound by the front end's scheduler: when it bound the pod, not when the pod was created.
        (pod("a", scheduled="2025-03-01T10:00:00Z"), T0),
        # Created bound (spec.nodeName set, no scheduler): its creation.
        (pod("b", created="2025-03-01T10:00:05Z"), T0 + 5),
        # Not bound yet, or nothing says when.
        (pod("c", scheduled="2025-03-01T10:00:00Z", status="False", node=""), None),
        (pod("d", node=""), None),
        # A PodScheduled condition without a time: the pod's creation, as when created bound.
        (
            cast(
                Pod,
                {
                    **pod("e", created="2025-03-01T10:00:07Z"),
                    "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
                },
            ),
            T0 + 7,
        ),
    ],
)
def test_a_pod_was_bound_when_its_scheduler_says(given: Pod, expected: float | None) -> None:
    assert bound_at(given) == expected


def test_a_member_pod_was_created_when_its_member_says() -> None:
    assert created_at({"metadata": {"creationTimestamp": "2025-03-01T10:00:02Z"}}) == T0 + 2
    assert created_at({"metadata": {}}) is None


@pytest.mark.parametrize(
    ("times", "n", "expected"),
    [
        ([3.0, 1.0, 2.0], 1, 1.0),  # an incomplete gang: its first pod's binding
        ([3.0, 1.0, 2.0], 2, 2.0),  # a minimum of 2: the second binding made it up
        ([3.0, 1.0, 2.0], 3, 3.0),
        ([3.0, None, 1.0], 3, 3.0),  # fewer known than the minimum: the latest known
        ([None, None], 2, None),
        ([], 1, None),
        ([5.0, 4.0], 0, 4.0),  # the native pods alone make the minimum: from the first
    ],
)
def test_a_gang_was_complete_at_its_minimum_th_binding(
    times: list[float | None], n: int, expected: float | None
) -> None:
    assert nth_time(times, n) == expected


def test_the_first_known_time() -> None:
    assert first_time([None, 4.0, 2.0]) == 2.0
    assert first_time([None]) is None


@pytest.mark.parametrize(
    ("wall", "expected"),
    [
        (T0 - 40, 60.0),  # bound 40 s ago: 40 s before now on the monotonic clock
        (T0, 100.0),
        (T0 + 3, 100.0),  # another cluster's clock ahead of ours: now, never in the future
    ],
)
def test_wall_times_become_monotonic_times_by_their_age(wall: float, expected: float) -> None:
    assert to_monotonic(wall, wall_now=T0, monotonic_now=100.0) == expected


def job(**fields: Any) -> Job:
    out = Job(ref=JobRef("team", "native", "g"), gang=GangSpec(min_member=2, timeout=60), pods=PodSubset(PodOverlay()))
    for name, value in fields.items():
        setattr(out, name, value)
    return out


@pytest.mark.parametrize(
    ("fields", "adopted", "expected"),
    [
        ({}, None, 100.0),  # nothing known: from now
        ({"waiting_since": 10.0}, None, 10.0),  # incomplete: its first wait
        ({"waiting_since": 10.0, "ready_at": 20.0}, None, 20.0),  # complete, waiting for room
        ({"waiting_since": 10.0, "ready_at": 20.0, "member": "m", "dispatched_at": 30.0}, None, 30.0),
        # Found in its member after a restart: its member pods' creation.
        ({"waiting_since": 10.0, "ready_at": 20.0, "member": "m"}, 25.0, 25.0),
        ({"ready_at": 20.0, "member": "m", "dispatched_at": 30.0}, 25.0, 30.0),  # sent again since
        ({"ready_at": 20.0}, 25.0, 20.0),  # rolled back (no member): the adoption no longer counts
    ],
)
def test_the_timeout_counts_from_the_last_wait_begun(
    fields: dict[str, Any], adopted: float | None, expected: float
) -> None:
    assert wait_start(job(**fields), adopted=adopted, now=100.0) == expected


def test_a_gang_restarted_40s_into_a_60s_wait_has_20s_left() -> None:
    """The done-when line in numbers: bound at T0, a new process (its monotonic clock at 5.0)
    started at T0 + 40 counts the wait from T0 and times out at T0 + 60, not T0 + 100."""
    bound = [bound_at(pod(f"p{i}", scheduled=f"2025-03-01T10:00:0{i}Z")) for i in range(2)]
    ready = to_monotonic(nth_time(bound, 2) or 0.0, wall_now=T0 + 40, monotonic_now=5.0)
    start = wait_start(job(ready_at=ready), adopted=None, now=5.0)
    assert start + 60 - 5.0 == pytest.approx(21.0)  # the second pod was bound at T0 + 1


# -- the timer of a provider started in the middle of a wait -----------------------------------


class NoRoom:
    """A dispatcher no member has room with."""

    def __init__(self) -> None:
        self.notified = 0

    async def dispatch(self, job: Job, *, retry: bool = False) -> None:
        return None

    async def unplace(self, job: Job, member: str) -> None:
        raise AssertionError("nothing was placed")

    def notify_job(self, job: Job) -> None:
        self.notified += 1


class Told:
    def __init__(self) -> None:
        self.reasons: list[tuple[str, str]] = []

    async def emit(self, obj: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.reasons.append((obj["metadata"]["name"], reason))


def gangs(told: Told) -> Gangs:
    return Gangs(
        NoRoom(),
        native_pods=NativePods(lambda: None, lambda: []),
        pods_in=lambda member: None,
        events=lambda: cast(EventRecorder, told),
        instance="test",
    )


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gang, "TICK", 0.02)
    monkeypatch.setattr(gang, "SETTLE", 0.0)


@pytest.mark.usefixtures("quick")
async def test_a_restarted_timer_counts_from_the_binding_not_from_its_start() -> None:
    """A gang complete at the front end for 0.6 s of a 1 s timeout when the provider starts:
    it times out 0.4 s later, once, not a whole timeout later."""
    told = Told()
    gate = gangs(told)
    j = job(gang=GangSpec(min_member=2, timeout=1.0))
    bound = rfc3339(time.time() - 0.6)
    for name in ("p0", "p1"):
        j.pods[f"team/{name}"] = pod(name, scheduled=bound)
        gate.arrived(j, j.pods[f"team/{name}"])
    j.ready_at = gate.ready_since(j)
    started = time.monotonic()
    gate.start(j)
    assert j.timer is not None
    await j.timer
    assert 0.25 <= time.monotonic() - started <= 0.7
    assert j.failed == "GangTimeout"
    assert told.reasons == [("p0", "GangTimeout"), ("p1", "GangTimeout")]


@pytest.mark.usefixtures("quick")
async def test_a_gang_told_incomplete_before_a_restart_is_not_told_again() -> None:
    told = Told()
    gate = gangs(told)
    j = job(gang=GangSpec(min_member=3, timeout=0.3))
    bound = rfc3339(time.time() - 5)
    for name in ("p0", "p1"):
        j.pods[f"team/{name}"] = pod(name, scheduled=bound, annotations={TOLD: "2025-03-01T10:00:00Z"})
        gate.arrived(j, j.pods[f"team/{name}"])
    assert j.incomplete_told
    gate.start(j)
    assert j.timer is not None
    await j.timer
    assert told.reasons == [] and j.failed is None  # keeps waiting, told no second time


@pytest.mark.usefixtures("quick")
async def test_a_gang_never_told_is_told_once_at_its_first_wait_plus_the_timeout() -> None:
    told = Told()
    gate = gangs(told)
    j = job(gang=GangSpec(min_member=3, timeout=1.0))
    for name, age in (("p0", 0.7), ("p1", 0.1)):  # the first wait began with p0's binding
        j.pods[f"team/{name}"] = pod(name, scheduled=rfc3339(time.time() - age))
        gate.arrived(j, j.pods[f"team/{name}"])
    started = time.monotonic()
    gate.start(j)
    assert j.timer is not None
    await j.timer
    assert 0.15 <= time.monotonic() - started <= 0.6
    assert told.reasons == [("p0", "GangIncomplete"), ("p1", "GangIncomplete")]
    assert j.incomplete_told and j.timer is None
