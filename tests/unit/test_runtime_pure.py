"""Pure parts of the runtime: status mapping, pod equality, work queue, backoff, settings,
kubelet API auth helpers, node objects. No network."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

import pytest

from vkprovider import node, podstatus, settings
from vkprovider.backoff import ExponentialBackoff
from vkprovider.httpapi.auth import subresource_for, subresources_for, user_from_certificate, verb_for
from vkprovider.httpapi.resourcemetrics import resource_metrics
from vkprovider.httpapi.server import log_options
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod
from vkprovider.provider import NodeStatus
from vkprovider.workqueue import ShutDown, WorkQueue


def _pod(**status: Any) -> Pod:
    return {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "1"}, "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "i:1"}], "restartPolicy": "Always"},
        "status": status,  # type: ignore[typeddict-item]
    }


# -- status mapping ------------------------------------------------------------------------------


def test_desired_status_keeps_other_writers_conditions_and_sets_host_ip() -> None:
    api = _pod(
        phase="Pending",
        conditions=[
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"},
            {"type": "DisruptionTarget", "status": "True", "lastTransitionTime": "t1"},
        ],
    )
    provided: Any = {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "hostIP": "192.0.2.1",  # the provider's node: never shown
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t2"}],
    }
    desired = podstatus.desired_status(api, provided, host_ip="127.0.0.1")
    assert desired["hostIP"] == "127.0.0.1" and desired["hostIPs"] == [{"ip": "127.0.0.1"}]
    types = [c["type"] for c in desired["conditions"]]
    assert types == ["DisruptionTarget", "PodScheduled", "Ready"]
    assert desired["phase"] == "Running" and desired["podIP"] == "10.0.0.1"


def test_transition_time_is_kept_while_a_condition_holds() -> None:
    api = _pod(phase="Running", conditions=[{"type": "Ready", "status": "True", "lastTransitionTime": "early"}])
    provided: Any = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "late"}],
    }
    desired = podstatus.desired_status(api, provided, host_ip="h")
    assert desired["conditions"][0]["lastTransitionTime"] == "early"
    flipped: Any = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "x"}]}
    assert podstatus.desired_status(api, flipped, host_ip="h")["conditions"][0]["lastTransitionTime"] == "x"


def test_status_differs_ignores_timestamps_only() -> None:
    a: Any = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "1"}]}
    b = copy.deepcopy(a)
    b["conditions"][0]["lastTransitionTime"] = "2"
    assert not podstatus.status_differs(a, b)
    b["phase"] = "Failed"
    assert podstatus.status_differs(a, b)


def test_status_patch_nulls_fields_that_went_away() -> None:
    current: Any = {"phase": "Pending", "reason": "ProviderFailed", "message": "m"}
    desired: Any = {"phase": "Running", "conditions": []}
    patch = podstatus.status_patch(current, desired)["status"]
    assert patch["reason"] is None and patch["message"] is None and patch["phase"] == "Running"


def test_pods_equal_compares_mutable_fields_only() -> None:
    a = _pod()
    b = copy.deepcopy(a)
    b["spec"]["nodeName"] = "elsewhere"  # immutable once bound: not a change to send
    assert podstatus.pods_equal(a, b)
    b["spec"]["containers"][0]["image"] = "i:2"
    assert not podstatus.pods_equal(a, b)
    c = copy.deepcopy(a)
    c["metadata"]["annotations"] = {"x": "y"}
    assert not podstatus.pods_equal(a, c)


def test_accepted_and_terminal() -> None:
    assert not podstatus.is_accepted(_pod(phase="Pending"))
    assert podstatus.is_accepted(_pod(phase="Running", startTime="2026-01-01T00:00:00Z"))
    assert podstatus.is_terminal(_pod(phase="Failed")) and not podstatus.is_terminal(_pod(phase="Running"))


def test_provider_failed_is_pending_unless_restart_policy_never() -> None:
    pod = _pod()
    assert podstatus.provider_failed_status(pod, "no")["phase"] == "Pending"
    pod["spec"]["restartPolicy"] = "Never"
    status = podstatus.provider_failed_status(pod, "no")
    assert status["phase"] == "Failed" and status["reason"] == "ProviderFailed"


def test_failed_status_terminates_containers_with_the_reason() -> None:
    pod = _pod(containerStatuses=[{"name": "c", "restartCount": 2, "state": {"running": {"startedAt": "s"}}}])
    status = podstatus.failed_status(pod, reason="ProviderPodLost", message="gone")
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert status["phase"] == "Failed" and terminated["exitCode"] == 137 and terminated["startedAt"] == "s"
    assert status["containerStatuses"][0]["restartCount"] == 2


# -- work queue and backoff ------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_forgets() -> None:
    backoff = ExponentialBackoff(base=0.01, cap=0.05)
    assert [backoff.next_delay("k") for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    backoff.forget("k")
    assert backoff.next_delay("k") == 0.01


async def test_queue_deduplicates_and_reprocesses_keys_added_while_processing() -> None:
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    key = await queue.get()
    assert key == "a"
    queue.add("a")  # while processing: not handed out twice at once
    assert await queue.get() == "b"
    assert len(queue) == 0
    queue.done("a")
    assert await queue.get() == "a"
    queue.done("a")
    queue.done("b")


async def test_queue_delayed_adds_keep_the_earliest_deadline() -> None:
    now = [100.0]
    queue = WorkQueue(clock=lambda: now[0])
    queue.add_after("k", 10)
    queue.add_after("k", 2)
    assert queue.delayed == 1
    now[0] = 102.5
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    queue.done("k")


async def test_queue_says_whether_a_run_that_sees_the_present_is_ahead() -> None:
    now = [100.0]
    queue = WorkQueue(clock=lambda: now[0])
    assert not queue.due("k")
    queue.add_after("k", 5)
    assert queue.due("k")  # delayed: its run comes
    now[0] = 106.0
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    assert not queue.due("k")  # under way: it may have read the state before a change
    queue.add("k")
    assert not queue.due("k")
    queue.done("k")
    assert queue.due("k")  # queued again
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    queue.done("k")
    assert not queue.due("k")


async def test_queue_wakes_one_idle_worker_per_key() -> None:
    queue = WorkQueue()
    workers = [asyncio.create_task(queue.get(), name=f"test-worker/{i}") for i in range(8)]
    await asyncio.sleep(0)
    queue.add("k")
    await asyncio.sleep(0.01)
    assert [w.result() for w in workers if w.done()] == ["k"]
    queue.shut_down()
    rest = await asyncio.gather(*(w for w in workers if not w.done()), return_exceptions=True)
    assert len(rest) == 7 and all(isinstance(r, ShutDown) for r in rest)


async def test_queue_a_delayed_key_wakes_a_waiting_worker_on_time() -> None:
    queue = WorkQueue()
    waiter = asyncio.create_task(queue.get(), name="test-waiter")
    queue.add_after("late", 5)
    queue.add_after("soon", 0.05)  # earlier than the timer set: the timer moves
    assert await asyncio.wait_for(waiter, 2) == "soon"
    queue.shut_down()


async def test_queue_a_worker_cancelled_after_its_wake_up_hands_the_key_on() -> None:
    queue = WorkQueue()
    first = asyncio.create_task(queue.get(), name="test-first")
    second = asyncio.create_task(queue.get(), name="test-second")
    await asyncio.sleep(0)
    queue.add("k")  # wakes `first`
    first.cancel()  # before it runs
    assert await asyncio.wait_for(second, 1) == "k"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_queue_observes_how_long_each_key_waited_for_a_worker() -> None:
    now = [100.0]
    waits: list[tuple[float, bool]] = []
    queue = WorkQueue(clock=lambda: now[0], observe_wait=lambda wait, urgent: waits.append((wait, urgent)))
    queue.add("a")
    now[0] = 100.5
    queue.add("a")  # already waiting: its wait counts from the first add
    now[0] = 101.0
    assert await queue.get() == "a"
    queue.add("a")  # while processing: waits from `done`, not from here
    now[0] = 103.0
    queue.done("a")
    now[0] = 103.25
    assert await queue.get() == "a"
    queue.done("a")
    queue.add("b", urgent=True)
    assert await queue.get() == "b"
    assert waits == [(1.0, False), (0.25, False), (0.0, True)]


async def test_loop_lag_probe_sees_a_task_that_held_the_loop() -> None:
    metrics = Metrics()
    probe = asyncio.create_task(metrics.probe_loop_lag(interval=0.02), name="test-loop-lag")
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 (holds the loop, as a long synchronous pass would)
    await asyncio.sleep(0.05)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    buckets = {
        sample.labels["le"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "vkprovider_event_loop_lag_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }
    assert buckets["0.1"] < buckets["+Inf"]  # one wake-up came more than 0.1 s late


async def test_queue_shutdown_stops_workers() -> None:
    queue = WorkQueue()
    waiter = asyncio.create_task(queue.get(), name="test-waiter")
    await asyncio.sleep(0)
    queue.shut_down()
    with pytest.raises(ShutDown):
        await waiter


# -- settings ------------------------------------------------------------------------------------


def test_settings_precedence_file_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("node:\n  name: from-file\n  lease_duration: 30\npods:\n  workers: 4\n")
    monkeypatch.setenv("VKPROVIDER_PODS__WORKERS", "8")
    loaded = settings.load(config=config, overrides=["http.port=1234"], **{"node.name": "from-flag"})
    assert loaded.node.name == "from-flag"
    assert loaded.node.lease_duration == 30
    assert loaded.pods.workers == 8
    assert loaded.http.port == 1234


def test_settings_errors_are_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(settings.SettingsError, match="does not exist"):
        settings.load(config=tmp_path / "missing.yaml")
    with pytest.raises(settings.SettingsError, match=r"node\.lease_duration"):
        settings.load(overrides=["node.lease_duration=soon"])
    with pytest.raises(settings.SettingsError, match=r"section\.key=value"):
        settings.load(overrides=["nonsense"])


def test_every_setting_is_documented() -> None:
    for section in settings.Settings.model_fields.values():
        model = section.annotation
        for name, field in model.model_fields.items():  # type: ignore[union-attr]
            if name in ("taint_effect", "format", "level", "type", "memory", "federation", "capacity"):
                continue
            assert field.description, f"{model.__name__}.{name} has no description"  # type: ignore[union-attr]


# -- kubelet API helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "subresource"),
    [
        ("/stats/summary", "stats"),
        ("/metrics/resource", "metrics"),
        ("/logs/x", "log"),
        ("/containerLogs/a/b/c", "proxy"),
        ("/pods", "proxy"),
        ("/exec/a/b/c", "proxy"),
    ],
)
def test_subresources(path: str, subresource: str) -> None:
    assert subresource_for(path) == subresource


@pytest.mark.parametrize(
    ("method", "path", "verb", "subresources"),
    [
        # What a request does decides its verb: a WebSocket exec is a GET, and still `create`.
        ("GET", "/exec/ns/pod/c", "create", ("proxy",)),
        ("POST", "/exec/ns/pod/c", "create", ("proxy",)),
        ("GET", "/attach/ns/pod/c", "create", ("proxy",)),
        ("GET", "/portForward/ns/pod", "create", ("proxy",)),
        ("GET", "/run/ns/pod/c", "create", ("proxy",)),
        ("GET", "/stats/summary", "get", ("stats",)),
        ("GET", "/metrics/resource", "get", ("metrics",)),
        ("GET", "/containerLogs/ns/pod/c", "get", ("proxy",)),
        ("GET", "/pods", "get", ("pods", "proxy")),
        ("GET", "/runningpods/", "get", ("pods", "proxy")),
        ("GET", "/healthz", "get", ("healthz", "proxy")),
    ],
)
def test_authorized_by_what_the_request_does(method: str, path: str, verb: str, subresources: tuple[str, ...]) -> None:
    assert verb_for(method, path) == verb
    assert subresources_for(path) == subresources


def test_user_from_certificate() -> None:
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kube-apiserver"),))}
    user = user_from_certificate(cert)
    assert user is not None and user.name == "kube-apiserver" and user.groups == ("system:masters",)
    assert user_from_certificate(None) is None


def test_log_options_parse_and_refuse() -> None:
    options = log_options({"follow": "true", "tailLines": "10", "timestamps": "1"})
    assert options.follow and options.tail_lines == 10 and options.timestamps
    from aiohttp import web

    with pytest.raises(web.HTTPBadRequest):
        log_options({"tailLines": "many"})
    with pytest.raises(web.HTTPBadRequest):
        log_options({"sinceSeconds": "5", "sinceTime": "2026-01-01T00:00:00Z"})


def test_resource_metrics_text() -> None:
    summary = {
        "node": {
            "cpu": {"usageCoreNanoSeconds": 2e9, "time": "2026-01-01T00:00:00Z"},
            "memory": {"workingSetBytes": 5},
        },
        "pods": [
            {
                "podRef": {"name": "p", "namespace": "n"},
                "containers": [{"name": "c", "cpu": {"usageCoreNanoSeconds": 1e9}, "memory": {"workingSetBytes": 7}}],
            }
        ],
    }
    text = resource_metrics(summary)
    assert "node_cpu_usage_seconds_total 2 1767225600000" in text
    assert 'container_memory_working_set_bytes{container="c",namespace="n",pod="p"} 7' in text


# -- node object ---------------------------------------------------------------------------------


def test_node_object_labels_taint_and_conditions() -> None:
    node_settings = settings.NodeSettings(name="vk", labels={"team": "ml"})
    built = node.build_node(node_settings, NodeStatus(capacity={"cpu": "10"}), port=10250, now="t")
    labels = built["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet" and labels["kubernetes.io/role"] == "agent" and labels["team"] == "ml"
    assert built["spec"]["taints"] == [
        {"key": "virtual-kubelet.io/provider", "value": "memory", "effect": "NoSchedule"}
    ]
    assert built["status"]["allocatable"] == {"cpu": "10"}
    assert {c["type"] for c in built["status"]["conditions"]} == set(node.OWN_CONDITIONS)


def test_node_conditions_keep_transition_and_remove_vanished_resources() -> None:
    node_settings = settings.NodeSettings(name="vk")
    current = {
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "first"}],
        "capacity": {"cpu": "10", "nvidia.com/gpu": "8"},
    }
    status = node.node_status(node_settings, NodeStatus(capacity={"cpu": "12"}), current=current, port=1, now="now")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "first" and ready["lastHeartbeatTime"] == "now"
    assert status["capacity"] == {"cpu": "12", "nvidia.com/gpu": None}


def test_status_tables_render_the_view() -> None:
    from vkprovider.status import render

    view = {
        "members": {
            "m1": {
                "source": "direct",
                "reachable": False,
                "enabled": True,
                "nodes": {"eligible": 2, "total": 3},
                "lent": {"cpu": "12"},
                "used": {"cpu": "2"},
                "free": {"cpu": "10", "memory": str(4 * 2**30)},
                "gpusByModel": {"T4": 4},
            }
        },
        "virtualNodes": {
            "vk": {
                "members": ["m1"],
                "capacity": {"cpu": "10", "memory": str(2**30)},
                "conditions": [{"type": "MembersReachable", "status": "False", "message": "m1"}],
            }
        },
    }
    text = render(view)
    assert "m1" in text and "NO" in text and "4Gi" in text and "T4=4" in text and "False (m1)" in text
    header, row = text.splitlines()[:2]
    assert header.split()[4:8] == ["LENT", "CPU", "USED", "CPU"], header
    assert row.split()[4:7] == ["12", "2", "10"], row  # lent = used + free


@pytest.mark.parametrize(
    ("current", "wanted", "patch"),
    [
        (None, {"a/m": "x"}, {"a/m": "x"}),
        ({"a/m": "x"}, {"a/m": "x"}, {}),
        ({"a/m": "x"}, {"a/m": "y"}, {"a/m": "y"}),
        ({"a/m": "x", "other": "1"}, {"a/m": None}, {"a/m": None}),
        ({"other": "1"}, {"a/m": None}, {}),  # nothing to remove: no write
    ],
)
def test_annotation_changes(
    current: dict[str, str] | None, wanted: dict[str, str | None], patch: dict[str, str | None]
) -> None:
    assert podstatus.annotation_changes(current, wanted) == patch


async def test_queue_urgent_keys_go_first_and_keep_their_lane_through_a_rerun() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "c"):
        queue.add(key)
    queue.add("c", urgent=True)  # already queued: it moves ahead, once
    queue.add("d", urgent=True)
    assert len(queue) == 4
    assert [await queue.get() for _ in range(2)] == ["c", "d"]
    queue.add("c", urgent=True)  # while processing: the rerun is urgent too
    queue.done("c")
    assert await queue.get() == "c"
    assert [await queue.get() for _ in range(2)] == ["a", "b"]
    assert len(queue) == 0
    for key in ("a", "b", "c", "d"):
        queue.done(key)
    queue.add("a")
    assert await queue.get() == "a"  # the stale entry "c" left in the plain lane is skipped
    assert len(queue) == 0


async def test_workers_of_the_urgent_lane_take_only_urgent_keys_and_are_woken_first() -> None:
    """With every plain worker busy, an urgent key still finds a worker: the urgent lane's own."""
    queue = WorkQueue()
    status = asyncio.create_task(queue.get(urgent_only=True), name="test/status-worker")
    plain = asyncio.create_task(queue.get(), name="test/plain-worker")
    await asyncio.sleep(0)
    queue.add("create")  # a plain key: never the status worker's
    assert await asyncio.wait_for(plain, 1) == "create"
    assert not status.done()
    queue.add("running", urgent=True)
    assert await asyncio.wait_for(status, 1) == "running"
    queue.add("other")
    queue.add("other", urgent=True)  # queued plain, then made urgent: an urgent worker may take it
    assert await asyncio.wait_for(queue.get(urgent_only=True), 1) == "other"
    queue.add("last")
    waiting = asyncio.create_task(queue.get(urgent_only=True), name="test/idle-status-worker")
    await asyncio.sleep(0)
    assert not waiting.done()  # "last" is plain
    assert await queue.get() == "last"
    queue.shut_down()
    with pytest.raises(ShutDown):
        await waiting


def test_status_renders_the_reclaims_kept() -> None:
    from vkprovider.status import render_reclaims

    body = {
        "summary": {"count": 2, "with_notice": 1, "acknowledged": 1},
        "reclaims": [
            {"at": 0.0, "member": "m1", "node": "n1", "pod": "ns/a", "band": "worker-max", "cause": "planner",
             "notice_seconds": 29.6, "acknowledged": True},
            {"at": 61.0, "member": "m2", "node": "", "pod": "ns/b", "band": "worker-min", "cause": "NodeLost",
             "notice_seconds": None, "acknowledged": False},
        ],
    }  # fmt: skip
    head, header, first, second = render_reclaims(body, "1h").splitlines()
    assert head == "over the last 1h: 2 pods given back, 1 with notice, 1 acknowledged"
    assert header.split()[:3] == ["TIME", "(UTC)", "MEMBER"]
    assert first.split() == ["1970-01-01", "00:00:00", "m1", "n1", "ns/a", "worker-max", "planner", "30s", "yes"]
    assert second.split() == ["1970-01-01", "00:01:01", "m2", "-", "ns/b", "worker-min", "NodeLost", "none", "no"]
    assert render_reclaims({"reclaims": []}, "1h").startswith("no pod was given back over the last 1h")
