"""Which provider changes wake a pod's sync (vkprovider.pods): a change that leaves a new pod
Pending before its first status write waits for the settle timer already set, since that run
sees it and nothing would be written before. Pure queue bookkeeping, so no apiserver here; the
writes themselves are tested against the lab (tests/e2e/test_runtime.py, the settle tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from vkprovider.events import EventRecorder
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod
from vkprovider.pods import PodController
from vkprovider.settings import PodSettings
from vkprovider.workqueue import WorkQueue


def _change(phase: str | None = None) -> Pod:
    pod: Pod = {"metadata": {"namespace": "ns", "name": "p"}, "spec": {}}
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod


def _controller() -> PodController:
    api: Any = object()
    controller = PodController(
        client=api,
        provider=object(),  # type: ignore[arg-type]
        node_names=["vk"],
        host_ip="127.0.0.1",
        settings=PodSettings(status_settle=1.0),
        events=EventRecorder(api, component="test", host="vk"),
        metrics=Metrics(),
    )
    controller.queue = WorkQueue()
    return controller


async def test_a_pending_change_of_a_settling_pod_waits_for_its_timer() -> None:
    controller = _controller()
    queue = controller.queue
    assert queue is not None
    controller._settling.created("ns/p", asyncio.get_running_loop().time())
    queue.add_after("ns/p", 30)  # what the create's sync leaves behind
    controller._on_provider_change(_change("Pending"))
    assert len(queue) == 0
    for woken in (_change("Running"), _change(None)):  # a change that may be written, or unknown
        controller._on_provider_change(woken)
        assert len(queue) == 1
        assert await queue.get() == "ns/p"
        queue.done("ns/p")


async def test_a_pending_change_wakes_a_pod_with_no_run_ahead_or_already_written() -> None:
    controller = _controller()
    queue = controller.queue
    assert queue is not None
    controller._on_provider_change(_change("Pending"))  # not settling: written pods follow every change
    assert len(queue) == 1
    assert await queue.get() == "ns/p"
    controller._settling.created("ns/p", asyncio.get_running_loop().time())
    controller._on_provider_change(_change("Pending"))  # its run under way may have read the state before
    queue.done("ns/p")
    assert len(queue) == 1
