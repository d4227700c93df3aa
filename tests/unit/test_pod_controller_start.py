"""The pod controller right after a restart, before its first list: a provider that reports
its pods at once must not have them deleted as "gone from the API" (found by the kill -9
gang trials in tests/e2e/test_dispatch.py, which hit it once in ten). The apiserver is faked
here because the race needs a list that answers late on purpose; everything else about the
controller is tested against the lab."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from vkprovider.events import EventRecorder
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod
from vkprovider.pods import PodController
from vkprovider.provider import PodChanged
from vkprovider.settings import PodSettings

POD: Pod = {
    "metadata": {"namespace": "ns", "name": "p", "uid": "u1", "resourceVersion": "5"},
    "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "i"}]},
    "status": {"phase": "Running", "startTime": "2026-11-30T00:00:00Z", "hostIP": "127.0.0.1"},
}


class SlowApi:
    """Answers the first pod list only when `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[str] = []

    async def pages(self, path: str, *, params: Any = None, **_: Any) -> AsyncIterator[dict[str, Any]]:
        await self.release.wait()
        yield {"metadata": {"resourceVersion": "10"}, "items": [POD]}

    async def watch(self, path: str, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        await asyncio.sleep(3600)
        yield {}  # pragma: no cover

    async def patch(self, path: str, body: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(f"PATCH {path}")
        return {"metadata": {"resourceVersion": "11", "uid": "u1"}}

    async def delete(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(f"DELETE {path}")
        return {}

    async def create(self, path: str, body: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class EagerProvider:
    """Has the pod (from before the restart) and says so at once."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.callbacks: list[PodChanged] = []

    def notify_pods(self, callback: PodChanged) -> None:
        self.callbacks.append(callback)
        callback({"metadata": {"namespace": "ns", "name": "p"}, "spec": {}})

    async def create_pod(self, pod: Pod) -> None:
        raise AssertionError("a pod the provider has is never created again")

    async def update_pod(self, pod: Pod) -> None:
        pass

    async def delete_pod(self, pod: Pod) -> None:
        self.deleted.append(pod["metadata"]["name"])

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        return {"metadata": POD["metadata"], "spec": POD["spec"], "status": dict(POD["status"])}  # type: ignore[return-value]

    async def get_pod_status(self, namespace: str, name: str) -> Any:
        return POD["status"]

    async def list_pods(self) -> list[Pod]:
        return [POD]


async def test_a_pod_reported_before_the_first_list_is_not_deleted() -> None:
    api, provider = SlowApi(), EagerProvider()
    controller = PodController(
        client=api,  # type: ignore[arg-type]
        provider=provider,
        node_names=["vk"],
        host_ip="127.0.0.1",
        settings=PodSettings(),
        events=EventRecorder(api, component="test", host="vk"),  # type: ignore[arg-type]
        metrics=Metrics(),
    )
    running = asyncio.create_task(controller.run(), name="test/pod-controller")
    try:
        await asyncio.sleep(0.5)  # the provider's notification is processed meanwhile
        assert provider.deleted == [] and api.calls == []
        api.release.set()
        await asyncio.wait_for(controller.ready.wait(), timeout=5)
        await asyncio.sleep(0.5)
        assert provider.deleted == []
        assert not [c for c in api.calls if c.startswith("DELETE")]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
