"""The pod controller's cache across its own status write: a newer pod the watch brings while the
write is in flight stays cached (found by test_runtime's Deployment scale-down, which failed in
about one full run in four: the pod marked for deletion was replaced in the cache by the answer
to the write made just before, the sync its event queued read the pod from before, and the
deletion was never carried out). The apiserver is faked because the race needs a watch event
delivered before the write's answer, on purpose; the controller is otherwise tested on the lab."""

from __future__ import annotations

import copy
from typing import Any

from vkprovider.events import EventRecorder
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod
from vkprovider.pods import PodController
from vkprovider.settings import PodSettings
from vkprovider.workqueue import WorkQueue

RUNNING: Pod = {
    "metadata": {"namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": "10"},
    "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "i"}]},
    "status": {"phase": "Pending"},
}


class RacingApi:
    """Answers a status write only after the watch has delivered `meanwhile` (if set)."""

    def __init__(self) -> None:
        self.controller: PodController | None = None
        self.meanwhile: Pod | None = None

    async def patch(self, path: str, body: Any, **kwargs: Any) -> dict[str, Any]:
        answer = copy.deepcopy(RUNNING)
        answer["metadata"]["resourceVersion"] = "11"
        answer["status"] = {"phase": "Running"}
        if self.meanwhile is not None:
            assert self.controller is not None
            self.controller._observe(self.meanwhile)  # the watch is faster than the answer
        return answer  # type: ignore[return-value]


async def controller_with(api: RacingApi) -> PodController:
    controller = PodController(
        client=api,  # type: ignore[arg-type]
        provider=None,  # type: ignore[arg-type]
        node_names=["vk"],
        host_ip="127.0.0.1",
        settings=PodSettings(),
        events=EventRecorder(api, component="test", host="vk"),  # type: ignore[arg-type]
        metrics=Metrics(),
    )
    controller.queue = WorkQueue()
    api.controller = controller
    controller.cache["ns/p"] = copy.deepcopy(RUNNING)
    return controller


async def test_a_newer_pod_the_watch_brought_during_a_write_is_kept() -> None:
    api = RacingApi()
    controller = await controller_with(api)
    deleting = copy.deepcopy(RUNNING)
    deleting["metadata"]["resourceVersion"] = "12"
    deleting["metadata"]["deletionTimestamp"] = "2026-12-04T18:00:00Z"
    deleting["status"] = {"phase": "Running"}
    api.meanwhile = deleting
    await controller._write_status(controller.cache["ns/p"], {"phase": "Running"})
    cached = controller.cache["ns/p"]
    assert cached["metadata"]["resourceVersion"] == "12"
    assert cached["metadata"].get("deletionTimestamp"), "the deletion was lost from the cache"


async def test_the_answer_refreshes_the_pod_it_was_written_from() -> None:
    api = RacingApi()
    controller = await controller_with(api)
    await controller._write_status(controller.cache["ns/p"], {"phase": "Running"})
    assert controller.cache["ns/p"]["metadata"]["resourceVersion"] == "11"
